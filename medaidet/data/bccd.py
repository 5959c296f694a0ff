"""BCCD as a ChainerCV dataset: ``(img, bbox, label)`` for every image of a split, from the
VOC layout (:mod:`medaidet.data.voc`), each annotation parsed
(:mod:`medaidet.data.annotation`) and checked (:mod:`medaidet.data.annotation_checks`),
each image decoded (:mod:`medaidet.data.image`).

Conventions (the same as ChainerCV's ``VOCBboxDataset``):

* ``img``: float32, shape (3, H, W), RGB, values 0-255.
* ``bbox``: float32, shape (R, 4), ``(y_min, x_min, y_max, x_max)``, 0-based. VOC XML
  stores 1-based inclusive pixel indices; 1 is subtracted from every coordinate.
* ``label``: int32, shape (R,), index into :data:`~medaidet.data.BCCD_LABEL_NAMES`.
* ``difficult``: bool, shape (R,) (only with ``return_difficult=True``).

What the loader does with defective annotations (``validate_dataset`` reports the same
findings, from the same code):

* a defect of the whole file raises, in both modes: XML that is not well-formed or uses a
  DTD/entities, a label that is not rbc/wbc/platelets, ``<size>`` that disagrees with the
  image, a listed id without its files, a bad split list, an unreadable image;
* a defective object is dropped with an :class:`AnnotationWarning` (``strict=True``: raises
  a DataError (of the object's kind)); a box overhanging the image
  by at most a few pixels is clipped. The dataset lists them in :attr:`BCCDDataset.dropped`
  and :attr:`BCCDDataset.clipped`.

Whose boxes (``labels``): BCCD's own (``'bccd'``), or TXL-PBC's re-annotation of the same
smears (``'txl-pbc'``, :mod:`medaidet.data.txl_pbc`; only the 221 images it re-annotated,
read by :mod:`medaidet.data.yolo` and judged by the same checks). BCCD's split lists decide
train/val/test either way.
"""
from __future__ import annotations

import os
import warnings
from collections import Counter
from typing import NamedTuple

import numpy as np
from chainercv.chainer_experimental.datasets.sliceable import GetterDataset

from medaidet.arguments import is_path
from medaidet.errors import ConfigError, DataError
from medaidet.data import BCCD_LABEL_NAMES, CLASS_COLORS, LABELS  # noqa: F401 (CLASS_COLORS)
from medaidet.data.annotation import parse_annotation
from medaidet.data.annotation_checks import (QUIET_ENV, _REPORTED,  # noqa: F401 (here too)
                                             AnnotationWarning, Finding, check_annotation,
                                             warn_once)
from medaidet.data.pinned import TXL_PBC, resolve_root
from medaidet.data.image import decode_image, read_image_size
from medaidet.data.txl_pbc import bccd_links
from medaidet.data.voc import annotation_path, image_path, read_split, split_path
from medaidet.data.yolo import parse_yolo_labels
from medaidet.tables import Table

__all__ = ["CLASS_COLORS", "BCCDDataset", "LABELS", "ObjectIssue", "AnnotationWarning",
           "annotation_report", "quiet_annotation_warnings", "QUIET_ENV"]


class ObjectIssue(NamedTuple):
    """An object the loader dropped or clipped."""
    image_id: str
    index: int               # 0-based position among the file's <object> elements
    kind: str
    detail: str




class BCCDDataset(GetterDataset):
    """BCCD (or any dataset in its VOC layout) for ChainerCV: ``(img, bbox, label)``.

    Args:
        root: dataset root, a str or ``os.PathLike`` (else
            :class:`~medaidet.errors.ConfigError`); None: ``$MEDAIDET_DATA``,
            else the cache directory (:func:`medaidet.data.pinned.resolve_root`).
        split: ``'train'`` (205), ``'val'`` (87), ``'trainval'`` (292) or ``'test'`` (72).
        strict: raise a DataError (of the object's kind) instead of dropping/clipping objects.
        use_difficult: keep objects marked difficult (ChainerCV's default: skip them;
            BCCD marks none).
        return_difficult: also return ``difficult`` (bool, (R,)).
        labels: whose boxes, ``'bccd'`` (BCCD's annotation) or ``'txl-pbc'`` (TXL-PBC's
            re-annotation of the same images; only the images it re-annotated).
        reannotated_only: keep only the images TXL-PBC re-annotated (221 of 364: train
            124, val 57, test 40), whatever ``labels``: both annotations on one image set.
        txl_root: TXL-PBC's root (``labels='txl-pbc'``); None: ``$MEDAIDET_TXL_PBC``, else
            the cache directory.

    Keys: ``img`` (float32 (3, H, W) RGB 0-255), ``bbox`` (float32 (R, 4)
    ``(y_min, x_min, y_max, x_max)``, 0-based), ``label`` (int32 (R,), index into
    :data:`BCCD_LABEL_NAMES`) and, with ``return_difficult``, ``difficult``. Supports
    ChainerCV's ``dataset.slice[:, ('img', 'bbox')]``.

    Every annotation of the split is parsed and checked at construction (well under a
    second for BCCD) and the boxes kept in memory; images are decoded on access.
    Construction raises on file-level defects (see the module docstring); dropped and
    clipped objects are listed in :attr:`dropped` / :attr:`clipped` and announced by one
    :class:`AnnotationWarning`. :attr:`sizes` holds each image's (height, width).
    """

    def __init__(self, root=None, split: str = "train", strict: bool = False,
                 use_difficult: bool = False, return_difficult: bool = False,
                 labels: str = "bccd", reannotated_only: bool = False, txl_root=None):
        super().__init__()
        if root is not None and not is_path(root):
            raise ConfigError(
                f"root: {root!r} is not a folder path; expected a str or os.PathLike naming "
                "the dataset root (the folder with Annotations/), or None for $MEDAIDET_DATA, "
                "else the cache directory")
        if labels not in LABELS:
            raise ConfigError(f"labels: {labels!r} is not one of {', '.join(LABELS)}")
        self.root = resolve_root(root)
        self.split = split
        self.strict = strict
        self.labels = labels
        self.label_names = BCCD_LABEL_NAMES
        self.ids = read_split(self.root, split)
        if labels == "txl-pbc" or reannotated_only:
            links = {link.bccd_id: link for link in bccd_links()}
            self.ids = [image_id for image_id in self.ids if image_id in links]
        if labels == "txl-pbc":
            self.txl_root = resolve_root(txl_root, TXL_PBC)
        self.dropped: list[ObjectIssue] = []
        self.clipped: list[ObjectIssue] = []
        self._image_paths, self.sizes, self._boxes = [], [], []
        for image_id in self.ids:
            label_path = (annotation_path(self.root, image_id) if labels == "bccd" else
                          links[image_id].label_path(self.txl_root))
            self._read(image_id, label_path, use_difficult)
        if self.dropped or self.clipped:
            self._warn_dropped()

        self.add_getter("img", self._get_image)
        self.add_getter(("bbox", "label", "difficult"), self._get_annotations)
        if not return_difficult:
            self.keys = ("img", "bbox", "label")

    def _read(self, image_id: str, label_path, use_difficult: bool) -> None:
        """One image's size and boxes, checked (dropped and clipped objects recorded)."""
        img_path = image_path(self.root, image_id)
        for path, what in ((label_path, "annotation"), (img_path, "image")):
            if not path.is_file():
                raise DataError(
                    f"{split_path(self.root, self.split)} lists {image_id}, but its {what} "
                    f"{path} does not exist: restore the file or remove the id",
                    "missing_file",
                    path=path, image_id=image_id)
        size = read_image_size(img_path, image_id)
        if self.labels == "bccd":
            annotation, item = parse_annotation(label_path), "object"
        else:
            annotation, item = parse_yolo_labels(label_path, size), "line"
        checked = check_annotation(annotation, size, item=item)
        for finding in checked.findings:
            if finding.action == "raise" or self.strict:
                raise self._error(finding, label_path, image_id, annotation)
            record = ObjectIssue(image_id, finding.index, finding.kind, finding.detail)
            (self.dropped if finding.action == "drop" else self.clipped).append(record)
        keep = slice(None) if use_difficult else ~checked.difficult
        self._image_paths.append(img_path)
        self.sizes.append(size)
        self._boxes.append((checked.bbox[keep], checked.label[keep], checked.difficult[keep]))

    def _warn_dropped(self) -> None:
        """One warning for what the loader dropped or clipped (:func:`warn_once`)."""
        shown = "; ".join(f"{d.image_id}: {d.detail}" for d in (self.dropped + self.clipped)[:3])
        more = len(self.dropped) + len(self.clipped) - 3
        warn_once(
            f"BCCD {self.split} ({self.root}"
            f"{', TXL-PBC labels' if self.labels != 'bccd' else ''}): "
            f"dropped {len(self.dropped)} and clipped "
            f"{len(self.clipped)} object(s): {shown}{f'; and {more} more' if more > 0 else ''}"
            ". See dataset.dropped / dataset.clipped; strict=True raises instead",
            stacklevel=4)      # the line that built the dataset

    @staticmethod
    def _error(finding: Finding, path, image_id, annotation) -> DataError:
        message = f"{path}: {finding.detail}"
        if finding.kind == "unknown_label":
            name = annotation.objects[finding.index].name
            return DataError(message + "; fix the name in the XML", "label", path=path,
                             image_id=image_id, object_index=finding.index, name=name)
        if finding.kind == "size_mismatch":
            return DataError(message, "image_size", path=path, image_id=image_id)
        default = "clips" if finding.action == "clip" else "drops"
        return DataError(f"{message} (strict mode; the default {default} it)", finding.kind,
                         path=path, image_id=image_id, object_index=finding.index)

    def __len__(self):
        return len(self.ids)

    def _get_image(self, i):
        path = self._image_paths[i]
        # PIL, not cv2: PIL raises on a truncated file, cv2 only warns and returns the
        # missing part grey.
        img = decode_image(path, self.ids[i]).pixels.transpose(2, 0, 1).astype(np.float32)
        if img.shape[1:] != self.sizes[i]:
            raise DataError(f"{path} changed size since the dataset was built: "
                            f"{img.shape[1:]} != {self.sizes[i]}",
                            "image", path=path, image_id=self.ids[i])
        return img

    def _get_annotations(self, i):
        bbox, label, difficult = self._boxes[i]
        return bbox.copy(), label.copy(), difficult.copy()


def quiet_annotation_warnings() -> None:
    """No more :class:`AnnotationWarning` from the loader, here and in the processes this
    one starts (it sets :data:`QUIET_ENV`). For a notebook that shows
    :func:`annotation_report` once instead of a warning wherever a split is loaded; the
    objects are dropped and clipped all the same, and every dataset still lists them."""
    os.environ[QUIET_ENV] = "1"


def annotation_report(root=None, splits=("train", "val", "test")) -> Table:
    """What the loader drops and clips in each split: one row per split with its images,
    the objects it keeps, the objects dropped and clipped, and why (the checks' kinds, as
    :func:`~medaidet.data.validate.validate_dataset` names them)."""
    table = Table(["split", "images", "objects kept", "dropped", "clipped", "why"])
    for split in splits:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AnnotationWarning)
            dataset = BCCDDataset(root, split)
        kept = sum(len(label) for label in dataset.slice[:, "label"])
        why = Counter(issue.kind for issue in dataset.dropped + dataset.clipped)
        table.append([split, len(dataset), kept, len(dataset.dropped), len(dataset.clipped),
                      ", ".join(f"{kind} {n}" for kind, n in why.items()) or "-"])
    return table
