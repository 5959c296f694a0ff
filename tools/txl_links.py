"""How the shipped TXL-PBC tables were derived (and are again by tests/data/test_txl_pbc.py).

    python tools/txl_links.py TXL_ROOT BCCD_ROOT    # writes both tables into the package
"""
from __future__ import annotations

import csv
import hashlib
import io
from dataclasses import astuple, fields
from pathlib import Path

import numpy as np
from PIL import Image

from medaidet.data.bccd import Link, LINKS_FILE, image_path, read_split
from medaidet.data.image import decode_image, read_image_size
from medaidet.data.txl_pbc import (REEXPORTED_FILE, SOURCE_BY_SIZE, TXL_SPLITS, Resemblance,
                                   _txl_images)
from medaidet.errors import MedaidetError

BCCD_SPLITS = ("train", "val", "test")
BCCD_SIZE = (480, 640)       # (height, width) of every BCCD image, as read_image_size gives it


def _pixels_digest(path) -> str:
    return hashlib.sha256(decode_image(path).pixels.tobytes()).hexdigest()


def _split_of(bccd_root) -> dict:
    return {image_id: split for split in BCCD_SPLITS for image_id in read_split(bccd_root, split)}


def find_bccd_images(txl_root, bccd_root) -> list[Link]:
    """TXL-PBC images whose decoded pixels equal a BCCD image's, by BCCD id; an ambiguous
    match (1 to 2 or 2 to 1) raises :class:`MedaidetError`."""
    bccd_root = Path(bccd_root)
    images = Path(txl_root) / "TXL_PBC" / "images"
    split_of = _split_of(bccd_root)
    by_digest = {}
    for image_id in sorted(split_of):
        digest = _pixels_digest(image_path(bccd_root, image_id))
        if digest in by_digest:
            raise MedaidetError(f"BCCD images {by_digest[digest]} and {image_id} have the same "
                                f"pixels: a TXL-PBC image equal to them cannot be linked to one")
        by_digest[digest] = image_id
    links = {}
    for txl_split in TXL_SPLITS:
        for path in sorted((images / txl_split).glob("*.jpg")):
            if read_image_size(path) != BCCD_SIZE:
                continue
            image_id = by_digest.get(_pixels_digest(path))
            if image_id is None:
                continue
            if image_id in links:
                raise MedaidetError(f"TXL-PBC images {links[image_id].txl_split}/"
                                    f"{links[image_id].txl_name} and {txl_split}/{path.stem} "
                                    f"are both BCCD's {image_id}")
            links[image_id] = Link(txl_split, path.stem, image_id, split_of[image_id])
    return [links[k] for k in sorted(links)]


def _thumbnail(path, n=16) -> np.ndarray:
    with Image.open(path) as img:
        return np.asarray(img.convert("L").resize((n, n), Image.BILINEAR), dtype=np.float64)


def _ranks(a) -> np.ndarray:
    r = a.ravel().argsort().argsort().astype(np.float64)
    r -= r.mean()
    return r / np.linalg.norm(r)


def find_reexported_bccd(txl_root, bccd_root) -> list[Resemblance]:
    """For each 416x416 TXL-PBC image, the BCCD image it most resembles (grey-level ranks,
    which colour changes leave alone; all eight flips and rotations)."""
    bccd_root = Path(bccd_root)
    split_of = _split_of(bccd_root)
    ids = sorted(split_of)
    bccd = np.stack([_ranks(_thumbnail(image_path(bccd_root, i))) for i in ids])
    found = []
    for txl_split, path, size in _txl_images(txl_root):
        if SOURCE_BY_SIZE.get(size) != "BCCD, re-exported":
            continue
        t = _thumbnail(path)
        turns = [np.rot90(t, k) for k in range(4)]
        views = turns + [v[:, ::-1] for v in turns]
        best = np.max([bccd @ _ranks(v) for v in views], axis=0)
        image_id = ids[int(best.argmax())]
        found.append(Resemblance(txl_split, path.stem, image_id, split_of[image_id],
                                 f"{best.max():.3f}"))
    return found


def links_tsv(links) -> str:
    """The links as the shipped table's text: a header line, then one tab-separated line each."""
    out = io.StringIO()
    writer = csv.writer(out, delimiter="\t", lineterminator="\n")
    writer.writerow([f.name for f in fields(links[0] if links else Link)])
    writer.writerows(astuple(link) for link in links)
    return out.getvalue()


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description="Derive the shipped TXL-PBC link tables "
                                     "again and write them into the package.")
    parser.add_argument("txl", metavar="TXL_ROOT")
    parser.add_argument("bccd", metavar="BCCD_ROOT")
    args = parser.parse_args()
    txl, bccd = args.txl, args.bccd
    LINKS_FILE.write_text(links_tsv(find_bccd_images(txl, bccd)), encoding="utf-8")
    REEXPORTED_FILE.write_text(links_tsv(find_reexported_bccd(txl, bccd)), encoding="utf-8")
