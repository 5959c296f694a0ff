"""Matching detections to the ground truth the way VOC AP does, image by image.

:func:`match_detections` is the rule of ChainerCV's ``calc_detection_voc_prec_rec``,
exposed per detection and per box: which detections are true positives, which are false,
which boxes were missed. Drawing (:mod:`medaidet.evaluation.visualize`), the box sizes
(:mod:`medaidet.evaluation.box_sizes`), the error analysis and the count audits all match
with it, so a box called missed in one place is missed in every other.

Boxes are ``(y_min, x_min, y_max, x_max)`` in image pixels, float32, shape (R, 4); labels
int32 (R,), indices into the label names; scores float32 (R,).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from chainercv.utils import bbox_iou

from medaidet.arguments import check_number
from medaidet.errors import ConfigError
from medaidet.evaluation.predictions import Predictions, checked
from medaidet.evaluation.protocol import COUNT_SCORE_THRESH, IOU_THRESH

__all__ = ["DetectionMatch", "match_detections", "match_predictions", "voc_iou", "as_boxes"]


@dataclass
class DetectionMatch:
    """The outcome of every detection and ground-truth box of one image.

    Over the R detections (bool, shape (R,)): ``kept`` (score ``>= score_thresh``), ``tp``,
    ``fp`` and ``ignored`` (matched to a *difficult* box: neither, as in VOC). A detection
    below the threshold is none of ``tp``/``fp``/``ignored``. Over the G ground-truth boxes:
    ``missed`` (bool (G,): a non-difficult box no kept detection matched) and ``matched_by``
    (int (G,): the index of the detection that matched it, -1 if none).
    """
    kept: np.ndarray
    tp: np.ndarray
    fp: np.ndarray
    ignored: np.ndarray
    missed: np.ndarray
    matched_by: np.ndarray

    @property
    def found(self) -> np.ndarray:
        """bool (G,): ground-truth boxes matched by a true positive."""
        return self.matched_by >= 0

    @property
    def n_tp(self) -> int:
        return int(self.tp.sum())

    @property
    def n_fp(self) -> int:
        return int(self.fp.sum())

    @property
    def n_missed(self) -> int:
        return int(self.missed.sum())


def as_boxes(bbox) -> np.ndarray:
    """float32 (R, 4); an empty list or array becomes (0, 4)."""
    return np.asarray(bbox, dtype=np.float32).reshape(-1, 4)


def _matched_inputs(pred_bbox, pred_label, pred_score, gt_bbox, gt_label, gt_difficult):
    """:func:`match_detections`' arguments as arrays, their lengths checked."""
    pred_bbox = as_boxes(pred_bbox)
    gt_bbox = as_boxes(gt_bbox)
    pred_label = np.asarray(pred_label, dtype=np.int32).reshape(-1)
    pred_score = np.asarray(pred_score, dtype=np.float32).reshape(-1)
    gt_label = np.asarray(gt_label, dtype=np.int32).reshape(-1)
    gt_difficult = (np.zeros(len(gt_label), dtype=bool) if gt_difficult is None
                    else np.asarray(gt_difficult, dtype=bool).reshape(-1))
    r, g = len(pred_bbox), len(gt_bbox)
    if not (len(pred_label) == len(pred_score) == r and len(gt_label) == len(gt_difficult) == g):
        raise ConfigError(f"match_detections: {r} predicted boxes with {len(pred_label)} labels "
                         f"and {len(pred_score)} scores; {g} ground-truth boxes with "
                         f"{len(gt_label)} labels and {len(gt_difficult)} difficult flags: "
                         "each box needs one of each")
    return pred_bbox, pred_label, pred_score, gt_bbox, gt_label, gt_difficult


def voc_iou(a, b):
    """IoU of boxes ``a`` (N, 4) and ``b`` (M, 4) with VOC's integer-pixel convention
    (``y_max``/``x_max`` + 1), in their own dtype, as ChainerCV's
    ``calc_detection_voc_prec_rec`` computes it; (N, M)."""
    a = np.array(a).reshape(-1, 4)
    b = np.array(b).reshape(-1, 4)
    if not len(a) or not len(b):
        return np.zeros((len(a), len(b)))
    a[:, 2:] += 1
    b[:, 2:] += 1
    return bbox_iou(a, b)


def match_detections(pred_bbox, pred_label, pred_score, gt_bbox, gt_label,
                     gt_difficult=None, iou_thresh: float = IOU_THRESH,
                     score_thresh: float = COUNT_SCORE_THRESH) -> DetectionMatch:
    """Match one image's detections to its ground truth, the way VOC AP does.

    The detections scoring ``>= score_thresh`` are taken class by class in descending
    score order; each goes to the ground-truth box of its class it overlaps most
    (:func:`chainercv.utils.bbox_iou`). If that IoU is ``>= iou_thresh`` and the box is
    still free, the detection is a true positive and takes the box; if the box is taken
    already (a duplicate), or the best IoU is below the threshold, it is a false positive.
    A box is matched at most once; boxes no detection took are missed. This is ChainerCV's
    ``calc_detection_voc_prec_rec`` rule exactly, including VOC's integer-pixel
    convention (``y_max``/``x_max`` + 1 before the IoU) and its handling of difficult
    boxes (a detection on one is ignored; the box is never missed).

    Args:
        pred_bbox: float32 (R, 4), ``(y_min, x_min, y_max, x_max)`` in image pixels.
        pred_label: int32 (R,). pred_score: float32 (R,).
        gt_bbox: float32 (G, 4), ``(y_min, x_min, y_max, x_max)``. gt_label: int32 (G,).
        gt_difficult: bool (G,) or None (none difficult).
        iou_thresh: the IoU a match needs (VOC: 0.5).
        score_thresh: detections below it are not drawn, counted or matched.

    Returns:
        :class:`DetectionMatch`: masks over the detections and over the boxes.
    """
    pred_bbox, pred_label, pred_score, gt_bbox, gt_label, gt_difficult = _matched_inputs(
        pred_bbox, pred_label, pred_score, gt_bbox, gt_label, gt_difficult)
    r, g = len(pred_bbox), len(gt_bbox)
    kept = pred_score >= score_thresh
    tp, fp, ignored = (np.zeros(r, dtype=bool) for _ in range(3))
    matched_by = np.full(g, -1, dtype=np.int64)
    taken = np.zeros(g, dtype=bool)
    for label in np.unique(pred_label[kept]):
        pred_idx = np.flatnonzero(kept & (pred_label == label))
        # ChainerCV's order, ties included: argsort()[::-1]
        pred_idx = pred_idx[pred_score[pred_idx].argsort()[::-1]]
        gt_idx = np.flatnonzero(gt_label == label)
        if len(gt_idx) == 0:
            fp[pred_idx] = True
            continue
        iou = voc_iou(pred_bbox[pred_idx], gt_bbox[gt_idx])
        best = iou.argmax(axis=1)
        best[iou.max(axis=1) < iou_thresh] = -1
        for p, b in zip(pred_idx, best):
            if b < 0:
                fp[p] = True
                continue
            box = gt_idx[b]
            if gt_difficult[box]:
                ignored[p] = True
            elif not taken[box]:
                tp[p] = True
                matched_by[box] = p
            else:
                fp[p] = True
            taken[box] = True
    missed = (matched_by < 0) & ~gt_difficult
    return DetectionMatch(kept, tp, fp, ignored, missed, matched_by)


def match_predictions(predictions: Predictions, score_thresh: float = COUNT_SCORE_THRESH,
                      iou_thresh: float = IOU_THRESH) -> list:
    """:func:`match_detections` of every image of ``predictions``, in order."""
    predictions = checked(predictions)
    score_thresh = check_number(score_thresh, "score_thresh", "probability")
    iou_thresh = check_number(iou_thresh, "iou_thresh", "probability")
    return [match_detections(*(getattr(predictions, k)[i] for k in (
        "pred_bboxes", "pred_labels", "pred_scores", "gt_bboxes", "gt_labels",
        "gt_difficults")), iou_thresh=iou_thresh, score_thresh=score_thresh)
        for i in range(len(predictions))]
