"""Findings from the whole dataset's statistics, for the validator (notebook 01, section 6):
boxes far from their class's usual size (``class_size_outlier``), images without a class
nearly every image has (``missing_class``) and files written unlike the rest
(``foreign_annotation``); :mod:`medaidet.data.validation_report` states each rule.

Each check takes the validator's records of the images (``id``, ``size``, ``annotation``
and ``checked``, the :class:`~medaidet.data.bccd.CheckedAnnotation`) and its
``add(image, object, kind, detail, severity=None)``.
"""
from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np

from medaidet.data import BCCD_LABEL_NAMES

__all__ = ["check_class_sizes", "check_missing_classes", "check_foreign_annotations",
           "kept_boxes"]

# class_size_outlier / missing_class / foreign_annotation rules
SIZE_Z = 3.5
SIZE_Z_IMPLAUSIBLE = 5.0
SIZE_MIN_BOXES = 20
SIZE_MAD_FLOOR = 0.05
CLASS_PRESENCE = 0.9
CLASS_MIN_IMAGES = 10
FOREIGN_MAJORITY = 0.8
FOREIGN_MIN_FILES = 10


def kept_boxes(record) -> int:
    """Boxes of ``record`` the training loader keeps: not dropped, not difficult."""
    return int((~record.checked.difficult).sum())


def check_class_sizes(records, add):
    """``class_size_outlier``: boxes whose size is far from their class's (robust z-score of
    the log size over the class's boxes that do not touch the border)."""
    labels, sizes, inner, where = [], [], [], []
    for record in records:
        bbox, label = record.checked.bbox, record.checked.label
        if not len(bbox):
            continue
        height, width = record.size
        h, w = bbox[:, 2] - bbox[:, 0], bbox[:, 3] - bbox[:, 1]
        touches = ((bbox[:, 0] <= 0) | (bbox[:, 1] <= 0) |
                   (bbox[:, 2] >= height - 1) | (bbox[:, 3] >= width - 1))
        labels.append(label)
        sizes.append(np.sqrt(h.astype(np.float64) * w))
        inner.append(~touches)
        where += [(record.id, int(i), int(hh), int(ww))
                  for i, hh, ww in zip(record.checked.index, h, w)]
    if len(labels) < CLASS_MIN_IMAGES:     # too few images to know a class's sizes
        return
    labels, sizes, inner = np.concatenate(labels), np.concatenate(sizes), np.concatenate(inner)
    logs = np.log(sizes)
    stats = {}
    for c in range(len(BCCD_LABEL_NAMES)):
        ref = logs[(labels == c) & inner]
        if len(ref) >= SIZE_MIN_BOXES:
            median = float(np.median(ref))
            mad = max(float(np.median(np.abs(ref - median))), SIZE_MAD_FLOOR)
            stats[c] = (median, mad)
    for c, (median, mad) in stats.items():
        z = 0.6745 * (logs - median) / mad
        flagged = (labels == c) & ((z > SIZE_Z) | ((z < -SIZE_Z) & inner))
        for k in np.flatnonzero(flagged):
            image_id, index, h, w = where[k]
            name = BCCD_LABEL_NAMES[c]
            fits = []
            for other, (m2, d2) in stats.items():
                z2 = 0.6745 * (logs[k] - m2) / d2
                if other != c and abs(z2) < SIZE_Z and abs(z2) < abs(z[k]):
                    fits.append((abs(z2), other, m2))
            implausible = abs(z[k]) >= SIZE_Z_IMPLAUSIBLE
            detail = (f"{name} box {w}x{h} px: size {sizes[k]:.0f} px vs the {name} median "
                      f"{math.exp(median):.0f} px (robust z {z[k]:+.1f}: "
                      f"{'implausible' if implausible else 'unusual'} for {name})")
            if fits:
                _, other, m2 = min(fits)
                detail += (f"; the size fits {BCCD_LABEL_NAMES[other]} (median "
                           f"{math.exp(m2):.0f} px)" + (": mislabel?" if implausible else ""))
            add(image_id, index, "class_size_outlier", detail,
                severity="warning" if implausible else "info")


def check_missing_classes(records, add):
    """``missing_class``: an image with boxes but none of a class nearly every image has."""
    if len(records) < CLASS_MIN_IMAGES:
        return
    has = np.array([[c in r.checked.label for c in range(len(BCCD_LABEL_NAMES))]
                    for r in records])
    share = has.mean(axis=0)
    for c, name in enumerate(BCCD_LABEL_NAMES):
        if share[c] < CLASS_PRESENCE:
            continue
        for record, present in zip(records, has[:, c]):
            if not present and kept_boxes(record):   # no box at all: not a missing class
                boxes = Counter(BCCD_LABEL_NAMES[x] for x in record.checked.label)
                what = ", ".join(f"{n} {k}" for n, k in boxes.items())
                add(record.id, None, "missing_class",
                    f"no {name} box, while {share[c]:.0%} of images "
                    f"({int(has[:, c].sum())} of {len(records)}) have one; "
                    f"its boxes: {what}")


def check_foreign_annotations(records, add):
    """``foreign_annotation``: a file written unlike the rest (another annotator or tool)."""
    records = [r for r in records if r.annotation is not None]
    if len(records) < FOREIGN_MIN_FILES:
        return

    def directory(a):
        if not a.image_path:
            return None
        return "/".join(re.split(r"[\\/]+", a.image_path)[:-1]) or None

    features = {
        "root attributes": lambda a: " ".join(f'{k}="{v}"' for k, v in a.attributes) or
        "none",
        "indentation": lambda a: {"\t": "a tab", "": "none"}.get(
            a.indent, f"{len(a.indent)} spaces" if set(a.indent) == {" "} else repr(a.indent)),
        "<folder>": lambda a: repr(a.folder),
        "<path> directory": lambda a: repr(directory(a)),
    }
    values = {name: [f(r.annotation) for r in records] for name, f in features.items()}
    majority = {}
    for name, column in values.items():
        value, count = Counter(column).most_common(1)[0]
        if count >= FOREIGN_MAJORITY * len(records):
            majority[name] = (value, count)
    for k, record in enumerate(records):
        differs = [f"{name} {values[name][k]} instead of {value}"
                   for name, (value, _) in majority.items() if values[name][k] != value]
        if len(differs) >= 2:
            boxes = Counter(o.name.strip() if o.name else "?"
                            for o in record.annotation.objects)
            what = ", ".join(f"{n} {c}" for n, c in boxes.items()) or "none"
            add(record.id, None, "foreign_annotation",
                f"written unlike the other files ({'; '.join(differs)}): another "
                f"annotator or tool; its boxes: {what}")
