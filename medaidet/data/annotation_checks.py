"""Is an annotation usable as written: the one rule the loader applies and the validator
reports (:func:`check_annotation`).

A defect of the whole file raises: a label that is not rbc/wbc/platelets
(a ``"label"`` DataError), ``<size>`` that disagrees with the image (an ``"image_size"``
one). A defective object is dropped (``strict``: raises a DataError of the object's kind):
missing ``<bndbox>`` or coordinate, non-numeric coordinate,
reversed coordinates, zero width or height, more than :data:`BOUNDS_TOLERANCE` px outside the
image, a duplicate (IoU >= :data:`NEAR_DUPLICATE_IOU`, same class; an exact copy too) of an
earlier box. A box overhanging the image by at most :data:`BOUNDS_TOLERANCE` px is clipped.
"""
from __future__ import annotations

import os
import warnings
from typing import NamedTuple

import numpy as np

from medaidet.data import BCCD_LABEL_NAMES
from medaidet.data.annotation import Annotation

__all__ = ["check_annotation", "Finding", "CheckedAnnotation", "BOUNDS_TOLERANCE",
           "NEAR_DUPLICATE_IOU", "AnnotationWarning", "QUIET_ENV", "warn_once"]

#: Pixels a box may overhang the image and be clipped rather than dropped
#: (0-based exports write ``xmin = 0``; VOC's smallest index is 1).
BOUNDS_TOLERANCE = 2
#: Two boxes of one class overlapping at least this much (IoU) are the same cell boxed twice.
NEAR_DUPLICATE_IOU = 0.9


class AnnotationWarning(UserWarning):
    """Objects were dropped or clipped while loading (see ``.dropped`` / ``.clipped``)."""


#: Set (not empty, not "0") in the environment: no :class:`AnnotationWarning`, in this process
#: and in the processes it starts (data workers, MPI ranks). See
#: :func:`medaidet.data.bccd.quiet_annotation_warnings`.
QUIET_ENV = "MEDAIDET_QUIET_ANNOTATIONS"
# Every split is loaded several times in a run (a notebook, the training recipe, the
# evaluator): its report is shown the first time only, wherever the loading happens (a
# record of our own: Python's "once" filter forgets whenever warning filters change).
_REPORTED = set()


def warn_once(message: str, stacklevel: int = 3) -> None:
    """An :class:`AnnotationWarning` with ``message``, once per process and message, unless
    :data:`QUIET_ENV` is set: a loader built again (every split, every rank) says it once."""
    if message not in _REPORTED and os.environ.get(QUIET_ENV, "") in ("", "0"):
        _REPORTED.add(message)
        warnings.warn(AnnotationWarning(message), stacklevel=stacklevel)


class Finding(NamedTuple):
    """One defect :func:`check_annotation` found and what the loader does with it."""
    index: int | None        # object index (0-based, order in the file); None: the whole file
    kind: str                # unknown_label, size_mismatch, bad_coordinates, zero_area, ...
    detail: str
    action: str              # "raise" | "drop" | "clip"


class CheckedAnnotation(NamedTuple):
    """The boxes the loader keeps, in ChainerCV's convention, and the findings.

    bbox: float32 (R, 4) ``(y_min, x_min, y_max, x_max)``, 0-based. label: int32 (R,).
    difficult: bool (R,). index: int64 (R,), the object index of each kept box.
    """
    bbox: np.ndarray
    label: np.ndarray
    difficult: np.ndarray
    index: np.ndarray
    findings: tuple[Finding, ...]


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _iou(box, others):
    """IoU of ``box`` (4,) with each of ``others`` (N, 4), both
    ``(y_min, x_min, y_max, x_max)``: shape (N,); 0 for empty unions."""
    tl = np.maximum(box[:2], others[:, :2])
    br = np.minimum(box[2:], others[:, 2:])
    inter = np.prod(np.clip(br - tl, 0, None), axis=1)
    union = np.prod(box[2:] - box[:2]) + np.prod(others[:, 2:] - others[:, :2], axis=1) - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def _duplicates(bbox, labels, threshold):
    """Yield ``(j, k, iou)`` for each box ``j`` (in order) that repeats an earlier kept box
    ``k`` of its class: the first with IoU >= ``threshold``. A box yielded is not kept.

    ``bbox``: float32 (R, 4) ``(y_min, x_min, y_max, x_max)``, no empty box; ``labels``:
    int (R,). Memory is O(R), whatever R (an all-pairs IoU matrix of 10,000 boxes takes
    GBs). Only boxes whose ``y_min`` lie within a band are compared: for IoU >= t > 0,
    the intersection is at most ``(h - d) * w`` of the upper box (height ``h``, width
    ``w``, ``d`` the difference of the ``y_min``), so ``d <= (1 - t) * h``.
    """
    boxes = bbox.astype(np.float64)
    keep = np.ones(len(boxes), dtype=bool)
    if len(boxes) < 2:
        return
    band = ((1 - threshold) * float(np.max(boxes[:, 2] - boxes[:, 0])) + 1e-6
            if threshold > 0 else np.inf)
    order = np.argsort(boxes[:, 0], kind="stable")
    tops = boxes[order, 0]
    for j in range(1, len(boxes)):
        lo = np.searchsorted(tops, boxes[j, 0] - band, side="left")
        hi = np.searchsorted(tops, boxes[j, 0] + band, side="right")
        near_by = np.sort(order[lo:hi])
        near_by = near_by[near_by < j]
        earlier = near_by[keep[near_by] & (labels[near_by] == labels[j])]
        if not len(earlier):
            continue
        iou = _iou(boxes[j], boxes[earlier])
        near = np.flatnonzero(iou >= threshold)
        if len(near):
            keep[j] = False
            yield j, int(earlier[near[0]]), float(iou[near[0]])


def _check_object(obj, height: int, width: int, tolerance: float, item: str, names: str):
    """``(findings, box)`` of one object: its box 0-based ``(y_min, x_min, y_max, x_max)``
    (clipped when it was within ``tolerance`` of the image), or None when it is not kept."""
    i = obj.index
    if obj.label is None:
        why = ("has no <name>" if obj.name is None else
               f"is named {obj.name!r}, not one of {names} (case-insensitive)")
        return [Finding(i, "unknown_label", f"{item} {i} {why}", "raise")], None
    if obj.bndbox is None:
        return [Finding(i, "bad_coordinates", f"{item} {i} ({obj.name.strip()}): "
                        f"{obj.problem}", "drop")], None
    xmin, ymin, xmax, ymax = obj.bndbox
    where = f"{item} {i} ({obj.name.strip()}, x {_fmt(xmin)}..{_fmt(xmax)}, " \
            f"y {_fmt(ymin)}..{_fmt(ymax)})"
    if xmax < xmin or ymax < ymin:
        axis = "xmax < xmin" if xmax < xmin else "ymax < ymin"
        return [Finding(i, "bad_coordinates", f"{where}: reversed ({axis})", "drop")], None
    if xmax == xmin or ymax == ymin:
        which = ("width and height" if xmax == xmin and ymax == ymin else
                 "width" if xmax == xmin else "height")
        return [Finding(i, "zero_area", f"{where}: zero {which}", "drop")], None
    over = max(1 - xmin, 1 - ymin, xmax - width, ymax - height)
    if over > tolerance:
        return [Finding(i, "out_of_bounds", f"{where}: {_fmt(over)} px outside the "
                        f"{width}x{height} image (VOC pixels are 1..{width}, "
                        f"1..{height})", "drop")], None
    findings = []
    if over > 0:
        xmin, ymin = max(xmin, 1), max(ymin, 1)
        xmax, ymax = min(xmax, width), min(ymax, height)
        if xmax <= xmin or ymax <= ymin:
            return [Finding(i, "out_of_bounds", f"{where}: outside the {width}x"
                            f"{height} image (nothing left after clipping)", "drop")], None
        findings.append(Finding(i, "out_of_bounds", f"{where}: {_fmt(over)} px outside the "
                                f"{width}x{height} image (within {tolerance} px: clipped)",
                                "clip"))
    return findings, (ymin - 1, xmin - 1, ymax - 1, xmax - 1)


def check_annotation(annotation: Annotation, image_size, label_names=BCCD_LABEL_NAMES,
                     tolerance: float = BOUNDS_TOLERANCE,
                     near_duplicate_iou: float = NEAR_DUPLICATE_IOU,
                     item: str = "object") -> CheckedAnnotation:
    """Judge every object of ``annotation`` against the real ``image_size`` (height, width).
    ``item`` is what the findings call an object (a YOLO file's objects are its lines).

    Rules, in order, on the VOC coordinates as written (1-based inclusive):
    unknown or missing name -> ``unknown_label`` (raise); missing/non-numeric coordinate ->
    ``bad_coordinates`` (drop); ``xmax < xmin`` or ``ymax < ymin`` -> ``bad_coordinates``
    (drop); ``xmax == xmin`` or ``ymax == ymin`` -> ``zero_area`` (drop); outside
    ``1..W`` x ``1..H`` by more than ``tolerance`` px -> ``out_of_bounds`` (drop), by at
    most ``tolerance`` -> ``out_of_bounds`` (clip); IoU >= ``near_duplicate_iou`` with an
    earlier kept box of the same class (an exact copy: IoU 1) -> ``near_duplicate_box``
    (drop). ``<size>`` disagreeing with ``image_size`` ->
    ``size_mismatch`` (raise).
    """
    height, width = image_size
    findings = []
    if annotation.size is not None and annotation.size != (height, width):
        findings.append(Finding(None, "size_mismatch",
                                f"<size> says {annotation.size[1]}x{annotation.size[0]} but "
                                f"the image is {width}x{height}: the boxes were drawn for "
                                "another image (resized copy?)", "raise"))
    names = ", ".join(label_names)
    candidates = []            # (index, label, box 0-based, difficult)
    for obj in annotation.objects:
        found, box = _check_object(obj, height, width, tolerance, item, names)
        findings += found
        if box is not None:
            candidates.append((obj.index, obj.label, box, obj.difficult))

    bbox = np.array([c[2] for c in candidates], dtype=np.float32).reshape(-1, 4)
    labels = np.array([c[1] for c in candidates], dtype=np.int32)
    keep = np.ones(len(candidates), dtype=bool)
    named = {obj.index: obj.name for obj in annotation.objects}
    for j, k, iou in _duplicates(bbox, labels, near_duplicate_iou):
        name = named[candidates[j][0]].strip()
        detail = (f"{item} {candidates[j][0]} ({name}) overlaps {item} {candidates[k][0]} "
                  f"({name}) with IoU {iou:.2f}: the same cell boxed twice")
        findings.append(Finding(candidates[j][0], "near_duplicate_box", detail, "drop"))
        keep[j] = False
    return CheckedAnnotation(
        bbox=bbox[keep], label=labels[keep],
        difficult=np.array([c[3] for c in candidates], dtype=bool).reshape(-1)[keep],
        index=np.array([c[0] for c in candidates], dtype=np.int64).reshape(-1)[keep],
        findings=tuple(findings))
