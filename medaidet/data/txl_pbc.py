"""TXL-PBC (Gan & Li, arXiv:2407.13214; MIT), a second annotation of BCCD's smears (notebook 10).

Its BCCD images (identical decoded pixels) are shipped with BCCD's split, which decides, as
``manifests/txl-pbc-bccd.tsv`` (:func:`medaidet.data.bccd.bccd_links`; ``tools/txl_links.py``).
The others by size (:data:`SOURCE_BY_SIZE`): PBC, Raabin-WBC, and 219 of 416x416, BCCD's images
resized and often flipped, rotated or recoloured (:func:`reexported_links`): never train on them."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from chainercv.chainer_experimental.datasets.sliceable import GetterDataset

from medaidet.arguments import check_type
from medaidet.errors import ConfigError, DataError
from medaidet.data import BCCD_LABEL_NAMES, OTHER_SOURCES
from medaidet.data.bccd import Link, check_annotation, parse_yolo_labels, read_links, warn_once
from medaidet.data.image import decode_image, read_image_size
from medaidet.data.download import TXL_PBC, resolve_root

__all__ = ["Resemblance", "TXLPBCDataset", "OTHER_SOURCES", "reexported_links", "census",
           "SOURCE_BY_SIZE", "REEXPORTED_FILE", "TXL_SPLITS"]

REEXPORTED_FILE = Path(__file__).parent / "manifests" / "txl-pbc-bccd-reexported.tsv"
#: The source of a TXL-PBC image by its size, (width, height).
SOURCE_BY_SIZE = {(640, 480): "BCCD", (416, 416): "BCCD, re-exported",
                  (360, 363): "PBC", (366, 369): "PBC", (575, 575): "Raabin-WBC"}
TXL_SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Resemblance(Link):
    """A re-exported BCCD image of TXL-PBC and the BCCD image it most resembles (``similarity``:
    rank correlation of 16x16 grey thumbnails, best of eight orientations)."""
    similarity: str


def _txl_images(txl_root, splits=TXL_SPLITS):
    images = Path(txl_root) / "TXL_PBC" / "images"
    for txl_split in splits:
        for path in sorted((images / txl_split).glob("*.jpg")):
            yield txl_split, path, read_image_size(path)[::-1]      # (width, height)


def census(txl_root=None) -> Counter:
    """TXL-PBC's images counted by ``(split, source)``; an unknown size as ``'unknown WxH'``."""
    return Counter((split, SOURCE_BY_SIZE.get(size, f"unknown {size[0]}x{size[1]}"))
                   for split, _, size in _txl_images(resolve_root(txl_root, TXL_PBC)))


def reexported_links(path=REEXPORTED_FILE) -> list[Resemblance]:
    """The shipped table of re-exported BCCD images, at the pinned commit."""
    return read_links(path, Resemblance)


class TXLPBCDataset(GetterDataset):
    """TXL-PBC's images of other laboratories with its boxes: ``(img, bbox, label)`` as
    :class:`~medaidet.data.bccd.BCCDDataset`'s, judged by the same rule.

    Args:
        root: TXL-PBC's root; None: ``$MEDAIDET_TXL_PBC``, else the cache directory.
        split: ``'train'``, ``'val'`` or ``'test'`` (350 / 100 / 50 images of each source).
        sources: some of :data:`OTHER_SOURCES` (BCCD's: ``BCCDDataset(labels='txl-pbc')``).
        strict: raise on a line the default drops or clips.

    ``ids``: ``'<source>/<file stem>'``; :attr:`sources`, :attr:`dropped`, :attr:`clipped`.
    """

    def __init__(self, root=None, split: str = "test", sources=OTHER_SOURCES, strict: bool = False):
        super().__init__()
        sources = ((sources,) if isinstance(sources, str) else
                   tuple(check_type(sources, (list, tuple), "sources", "some of OTHER_SOURCES")))
        if (unknown := [s for s in sources if s not in OTHER_SOURCES]) or not sources:
            raise ConfigError(f"sources: {unknown or 'none'}: expected some of "
                              f"{', '.join(OTHER_SOURCES)} (BCCD's: BCCDDataset(labels='txl-pbc'))")
        if split not in TXL_SPLITS:
            raise ConfigError(f"split: {split!r}; expected one of {', '.join(TXL_SPLITS)}")
        self.root, self.split = resolve_root(root, TXL_PBC), split
        self.label_names = BCCD_LABEL_NAMES
        self.ids, self.sources, self.dropped, self.clipped = [], [], [], []
        self._paths, self._boxes = [], []
        for _, path, (width, height) in _txl_images(self.root, (split,)):
            if (source := SOURCE_BY_SIZE.get((width, height))) not in sources:
                continue
            label_path = self.root / "TXL_PBC" / "labels" / split / f"{path.stem}.txt"
            checked = check_annotation(parse_yolo_labels(label_path, (height, width)),
                                       (height, width), item="line")
            for finding in checked.findings:
                if strict or finding.action == "raise":
                    raise DataError(f"{label_path}: {finding.detail}", finding.kind,
                                    path=label_path, image_id=path.stem,
                                    object_index=finding.index)
                (self.dropped if finding.action == "drop" else self.clipped).append(
                    (path.stem, finding.detail))
            self.ids.append(f"{source}/{path.stem}")
            self.sources.append(source)
            self._paths.append(path)
            self._boxes.append((checked.bbox, checked.label))
        if issues := self.dropped + self.clipped:
            shown = "; ".join(f"{stem}: {detail}" for stem, detail in issues[:3])
            warn_once(f"TXL-PBC {split} ({', '.join(sources)}; {self.root}): dropped "
                      f"{len(self.dropped)} and clipped {len(self.clipped)} line(s): {shown}"
                      f"{'; ...' if len(issues) > 3 else ''}. See "
                      "dataset.dropped / dataset.clipped; strict=True raises instead")
        self.add_getter("img", self._get_image)
        self.add_getter(("bbox", "label"), self._get_annotations)

    def __len__(self):
        return len(self.ids)

    def _get_image(self, i):
        img = decode_image(self._paths[i], self.ids[i]).pixels
        return img.transpose(2, 0, 1).astype(np.float32)

    def _get_annotations(self, i):
        return tuple(array.copy() for array in self._boxes[i])      # (bbox, label)
