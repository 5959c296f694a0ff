"""TXL-PBC, a second annotation of BCCD's smears: which of its images are BCCD's.

TXL-PBC (Gan & Li, arXiv:2407.13214; MIT) re-labelled 1,440 blood-smear images from four public
sources, BCCD among them, and named every image by a UUID: nothing in its files says which BCCD
image one is, nor which source any image came from. :func:`find_bccd_images` finds the BCCD
ones by identity of the decoded pixels (every TXL-PBC image of BCCD's 640x480 size is decoded
and compared with BCCD's 364). The answer is shipped as ``manifests/txl-pbc-bccd.tsv``
(:func:`bccd_links` reads it, no image decoded); ``tests/data/test_txl_pbc.py`` derives it again
from the real data and compares.

Each link also carries BCCD's own split: BCCD's splits decide train/val/test in the course, not
TXL-PBC's, which put some of BCCD's val and test images into its training split.
"""
from __future__ import annotations

import csv
import hashlib
import io
from dataclasses import astuple, dataclass, fields
from pathlib import Path

from medaidet.data.image import decode_image, read_image_size
from medaidet.data.voc import image_path, read_split
from medaidet.errors import MedaidetError

__all__ = ["Link", "find_bccd_images", "bccd_links", "links_tsv", "LINKS_FILE", "TXL_SPLITS"]

LINKS_FILE = Path(__file__).parent / "manifests" / "txl-pbc-bccd.tsv"
TXL_SPLITS = ("train", "val", "test")
BCCD_SPLITS = ("train", "val", "test")
BCCD_SIZE = (480, 640)       # (height, width) of every BCCD image, as read_image_size gives it


@dataclass(frozen=True)
class Link:
    """One TXL-PBC image that is a BCCD image: TXL-PBC's split and file stem, BCCD's id and
    BCCD's split."""

    txl_split: str
    txl_name: str
    bccd_id: str
    bccd_split: str

    def label_path(self, txl_root) -> Path:
        """TXL-PBC's label file of this image under ``txl_root``."""
        return Path(txl_root) / "TXL_PBC" / "labels" / self.txl_split / f"{self.txl_name}.txt"


def _pixels_digest(path) -> str:
    return hashlib.sha256(decode_image(path).pixels.tobytes()).hexdigest()


def find_bccd_images(txl_root, bccd_root) -> list[Link]:
    """Every image of TXL-PBC (``txl_root``: the folder holding ``TXL_PBC/``) whose decoded
    pixels equal a BCCD image's (``bccd_root``), sorted by BCCD id. Raises
    :class:`MedaidetError` when one TXL-PBC image equals two BCCD images, or two TXL-PBC images
    the same one (the link would not say which annotation belongs to which image)."""
    bccd_root = Path(bccd_root)
    images = Path(txl_root) / "TXL_PBC" / "images"
    split_of = {image_id: split for split in BCCD_SPLITS
                for image_id in read_split(bccd_root, split)}
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


def links_tsv(links) -> str:
    """The links as the shipped table's text: a header line, then one tab-separated line each."""
    out = io.StringIO()
    writer = csv.writer(out, delimiter="\t", lineterminator="\n")
    writer.writerow([f.name for f in fields(Link)])
    writer.writerows(astuple(link) for link in links)
    return out.getvalue()


def bccd_links(path=LINKS_FILE) -> list[Link]:
    """The shipped table (:func:`find_bccd_images`'s answer on TXL-PBC at its pinned commit)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    header = [f.name for f in fields(Link)]
    if not rows or rows[0] != header:
        raise MedaidetError(f"{path}: expected the header {header}, found "
                            f"{rows[0] if rows else 'an empty file'}")
    return [Link(*row) for row in rows[1:]]
