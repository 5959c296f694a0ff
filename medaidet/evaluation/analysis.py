"""Error analysis: where a detector's misses come from, box by box.

AP and count errors say *how much* a detector misses; this module says *where* each
missed ground-truth box was lost. Every non-difficult ground-truth box of a split gets:

* its outcome at a score threshold ``t``, by VOC matching at IoU 0.5
  (:func:`~medaidet.evaluation.matching.match_detections`, the rule of VOC AP): found or
  missed;
* its size, ``sqrt(h * w)`` at the model's ``input_size`` x ``input_size`` input (as
  :func:`~medaidet.evaluation.box_sizes.gt_box_sizes`);
* its **crowding**: how many *other* ground-truth boxes of its class overlap it with IoU
  ``> crowd_iou`` (default 0: any overlap of positive area). A box in a clump of red cells
  has several; a lone platelet none;
* the **best score** of a same-class candidate covering it (IoU ``>= 0.5``) at each stage
  of prediction (:class:`medaidet.ssd.predict.Candidates`): among all candidates (class
  score ``>= 0.01`` in the 'evaluate' preset), after the ``top_k`` cap per class, after
  NMS, after the ``keep_top_k`` cap (the detections). 0 where none covers it.

From the best scores follows, for any threshold ``t``, the **stage** at which a missed
box was lost (the first that holds, in this order):

* ``"no_candidate"``: no same-class candidate covers it at any score (``>= 0.01``): the
  model did not localise it (or called it another class);
* ``"low_score"``: candidates cover it, but all score ``< t``: ranked, not believed;
* ``"top_k"``: a candidate scoring ``>= t`` covered it, but the cap of ``top_k``
  candidates per class before NMS removed every such one;
* ``"nms"``: one survived the cap, but NMS suppressed every such one (a neighbour's box
  overlapped it by ``>= nms_thresh``);
* ``"keep_top_k"``: one survived NMS, but the image's cap of ``keep_top_k`` detections
  removed it;
* ``"matching"``: a detection scoring ``>= t`` covers it, but VOC's greedy matching gave
  that detection to another box (each detection matches one box, its best-overlapping).

Every count can be taken on all images, or without the images the validator flags as
missing a class (:func:`images_missing_class`: ``missing_class`` findings of
:func:`medaidet.data.validate.validate_dataset`), where unboxed cells turn correct
detections into false positives.

Boxes are ``(y_min, x_min, y_max, x_max)`` in image pixels, float32, shape (R, 4); labels
int32 (R,), indices into the label names; scores float32 (R,).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from chainercv.utils import bbox_iou
from matplotlib.figure import Figure

from medaidet.arguments import check_number, check_type, checked_bins
from medaidet.data.bccd import CLASS_COLORS
from medaidet.data.validate import validate_dataset
from medaidet.errors import ConfigError
from medaidet.evaluation.predictions import Predictions
from medaidet.evaluation.protocol import IOU_THRESH
from medaidet.evaluation.box_sizes import image_sizes_of
from medaidet.evaluation.matching import match_predictions, voc_iou
from medaidet.ssd.predict import Candidates

__all__ = ["STAGES", "LOST_STAGES", "CANDIDATE_SETS", "BoxOutcomes", "images_missing_class",
           "recall_precision", "detection_scores", "plot_detection_scores", "box_outcomes",
           "stage_counts", "missed_by"]

#: Candidate sets, in the order prediction narrows them (see :class:`BoxOutcomes`).
CANDIDATE_SETS = ("all", "top_k", "nms", "kept")
#: Where a missed box was lost, earliest first (see the module docs).
LOST_STAGES = ("no_candidate", "low_score", "top_k", "nms", "keep_top_k", "matching")
#: Every outcome of a box: found, or lost at one stage.
STAGES = ("found",) + LOST_STAGES


# --------------------------------------------------------------------------- image sets

def images_missing_class(ids=None, report=None, root=None, brief: bool = False) -> dict:
    """The images the validator flags as missing a class, and why.

    Args:
        ids: only these image ids (e.g. ``predictions.ids``); default: every flagged image.
        report: a :class:`medaidet.data.validation_report.ValidationReport`; default:
            ``validate_dataset(root)`` (under a second on BCCD).

    Returns:
        ``{image id: [detail, ...]}`` of the ``missing_class`` findings, e.g.
        ``{"BloodImage_00134": ["no rbc box, while 96% of images ... have one; ..."]}``;
        with ``brief``, ``{image id: "no rbc box"}`` (the first clause of each detail), as
        :func:`medaidet.evaluation.count.count_cells` takes it for ``set_aside``.
    """
    if report is None:
        report = validate_dataset(root)
    wanted = None if ids is None else set(ids)
    out = {}
    for issue in report.by_kind("missing_class"):
        if wanted is None or issue.image in wanted:
            out.setdefault(issue.image, []).append(issue.detail)
    if brief:
        return {image: "; ".join(d.split(";")[0].split(",")[0] for d in details)
                for image, details in out.items()}
    return out


# --------------------------------------------------------------------------- detections

def recall_precision(predictions: Predictions, score_threshs=(0.5, 0.6),
                     iou_thresh: float = IOU_THRESH) -> list:
    """Recall and precision per class at each score threshold, VOC matching.

    A detection scoring ``>= t`` is a true positive when
    :func:`~medaidet.evaluation.matching.match_detections` matches it to a box of its
    class at IoU ``>= iou_thresh``, a false positive otherwise (duplicates included); one
    on a difficult box is neither. Recall = TP / non-difficult boxes, precision =
    TP / (TP + FP); NaN where the denominator is 0.

    Returns:
        a list of dicts, one per (threshold, class): ``score_thresh``, ``class``,
        ``n_gt``, ``tp``, ``fp``, ``missed``, ``recall``, ``precision``.
    """
    names = predictions.label_names
    rows = []
    for t in score_threshs:
        tp = np.zeros(len(names), int)
        fp = np.zeros(len(names), int)
        n_gt = np.zeros(len(names), int)
        for i, m in enumerate(match_predictions(predictions, t, iou_thresh)):
            pl = np.asarray(predictions.pred_labels[i])
            gl = np.asarray(predictions.gt_labels[i])
            gd = np.asarray(predictions.gt_difficults[i], dtype=bool)
            for l in range(len(names)):
                tp[l] += int((m.tp & (pl == l)).sum())
                fp[l] += int((m.fp & (pl == l)).sum())
                n_gt[l] += int(((gl == l) & ~gd).sum())
        for l, name in enumerate(names):
            rows.append({"score_thresh": float(t), "class": name, "n_gt": int(n_gt[l]),
                         "tp": int(tp[l]), "fp": int(fp[l]), "missed": int(n_gt[l] - tp[l]),
                         "recall": tp[l] / n_gt[l] if n_gt[l] else math.nan,
                         "precision": tp[l] / (tp[l] + fp[l]) if tp[l] + fp[l] else math.nan})
    return rows


def detection_scores(predictions: Predictions, score_thresh: float | None = None,
                     iou_thresh: float = IOU_THRESH) -> dict:
    """The scores of the true and of the false positives, per class, for histograms.

    Detections scoring ``>= score_thresh`` (default: all the predictions hold) are matched
    as VOC AP matches them at that threshold: a detection is a TP when it is the
    highest-scoring one on a free box of its class, so a duplicate of a found cell is a FP.

    Returns:
        ``{class name: {"tp": float64 array, "fp": float64 array}}``.
    """
    t = predictions.score_thresh if score_thresh is None else score_thresh
    out = {n: {"tp": [], "fp": []} for n in predictions.label_names}
    for i, m in enumerate(match_predictions(predictions, t, iou_thresh)):
        pl = np.asarray(predictions.pred_labels[i])
        ps = np.asarray(predictions.pred_scores[i], dtype=np.float64)
        for l, name in enumerate(predictions.label_names):
            out[name]["tp"].extend(ps[m.tp & (pl == l)])
            out[name]["fp"].extend(ps[m.fp & (pl == l)])
    return {n: {k: np.asarray(v, dtype=np.float64) for k, v in d.items()}
            for n, d in out.items()}


def plot_detection_scores(scores: dict, thresholds=(0.5, 0.6), split: str | None = None):
    """Histograms of the true and false positives' scores per class (from
    :func:`detection_scores`), log counts, ``thresholds`` dotted. A class whose true
    positives sit left of a threshold is found by the detector but not counted at it.

    Returns a matplotlib ``Figure``.
    """

    names = list(scores)
    fig = Figure(figsize=(4.3 * len(names), 3.6), layout="constrained")
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    bins = np.linspace(0, 1, 26)
    for ax, name in zip(axes, names):
        tp, fp = scores[name]["tp"], scores[name]["fp"]
        ax.hist(tp, bins=bins, color=CLASS_COLORS.get(name, "C0"), alpha=0.85,
                label=f"true positives ({len(tp)})")
        ax.hist(fp, bins=bins, histtype="step", color="black", lw=1.5,
                label=f"false positives ({len(fp)})")
        for t in thresholds:
            ax.axvline(t, color="0.4", ls=":", lw=1)
        ax.set_yscale("log")
        ax.set(title=name, xlabel="detection score", ylabel="detections (log scale)")
        ax.legend(fontsize="x-small")
    where = f", {split}" if split else ""
    fig.suptitle(f"Scores of true vs false positives (VOC matching at IoU 0.5){where}; "
                 f"dotted: {', '.join(f'{t:g}' for t in thresholds)}", fontsize=9)
    return fig


# --------------------------------------------------------------------------- boxes

@dataclass
class BoxOutcomes:
    """One entry per non-difficult ground-truth box of the split (B boxes in all).

    ``image_id``: object array (B,) of image ids; ``label``: int (B,); ``size``: float64
    (B,), ``sqrt(h * w)`` at ``input_size`` x ``input_size`` px; ``crowding``: int (B,),
    other boxes of the class overlapping it with IoU ``> crowd_iou``; ``best``: candidate
    set name (:data:`CANDIDATE_SETS`) -> float64 (B,), the highest score of a same-class
    candidate of that set covering the box (IoU ``>= iou_thresh``, VOC's integer-pixel
    IoU), 0 if none (all NaN when no candidates were given); ``found``: threshold ->
    bool (B,), matched by a detection scoring ``>=`` it.
    """
    label_names: tuple
    image_id: np.ndarray
    label: np.ndarray
    size: np.ndarray
    crowding: np.ndarray
    best: dict
    found: dict
    input_size: int = 300
    crowd_iou: float = 0.0
    iou_thresh: float = IOU_THRESH
    split: str | None = None

    def __len__(self):
        return len(self.label)

    def stage(self, score_thresh: float) -> np.ndarray:
        """Object array (B,): ``"found"`` or the stage the box was lost at (module docs).

        Needs candidates (``box_outcomes(..., candidates=...)``); ``score_thresh`` must be
        one of the thresholds the outcomes were computed at.
        """
        found = self._found(score_thresh)
        if np.isnan(self.best["all"]).any():
            raise ConfigError("these outcomes were computed without candidates: pass "
                             "candidates= to box_outcomes (predict_weights(..., return_candidates=True))")
        t = score_thresh
        out = np.full(len(self), "matching", dtype=object)
        # from the last stage to the first: the earliest that holds wins
        out[self.best["kept"] < t] = "keep_top_k"
        out[self.best["nms"] < t] = "nms"
        out[self.best["top_k"] < t] = "top_k"
        out[self.best["all"] < t] = "low_score"
        out[self.best["all"] <= 0] = "no_candidate"
        out[found] = "found"
        return out

    def _found(self, score_thresh):
        key = float(score_thresh)
        if key not in self.found:
            raise ConfigError(f"score_thresh {score_thresh}: the outcomes hold thresholds "
                             f"{sorted(self.found)}; pass it to box_outcomes(score_threshs=)")
        return self.found[key]

    def without(self, image_ids) -> "BoxOutcomes":
        """The boxes of the images not in ``image_ids``."""
        keep = ~np.isin(self.image_id, list(image_ids))
        return BoxOutcomes(self.label_names, self.image_id[keep], self.label[keep],
                           self.size[keep], self.crowding[keep],
                           {k: v[keep] for k, v in self.best.items()},
                           {k: v[keep] for k, v in self.found.items()}, self.input_size,
                           self.crowd_iou, self.iou_thresh, self.split)


def _best_scores(cand: Candidates, gt_bbox, gt_label, iou_thresh) -> dict:
    """Per candidate set, float64 (G,): the best same-class candidate score covering each
    box (0: none)."""
    masks = {"all": np.ones(len(cand.score), bool), "top_k": np.asarray(cand.in_top_k),
             "nms": np.asarray(cand.after_nms), "kept": np.asarray(cand.kept)}
    out = {k: np.zeros(len(gt_label)) for k in CANDIDATE_SETS}
    c_label = np.asarray(cand.label)
    c_score = np.asarray(cand.score, dtype=np.float64)
    for l in np.unique(gt_label):
        g = np.flatnonzero(gt_label == l)
        c = np.flatnonzero(c_label == l)
        if not len(c):
            continue
        covers = voc_iou(cand.bbox[c], gt_bbox[g]) >= iou_thresh       # (C_l, G_l)
        for name, mask in masks.items():
            s = np.where(covers & mask[c][:, None], c_score[c][:, None], 0.0)
            out[name][g] = s.max(axis=0)
    return out


def _size_and_crowding(gb, gl, use, image_size, input_size: int, crowd_iou: float):
    """Each box's size at the model's input (the square root of height x width) and how many
    other boxes of its class (difficult ones left out) overlap it with IoU ``> crowd_iou``."""
    h_img, w_img = image_size
    h = (gb[:, 2] - gb[:, 0]).astype(np.float64) * input_size / h_img
    w = (gb[:, 3] - gb[:, 1]).astype(np.float64) * input_size / w_img
    size = np.sqrt(np.clip(h, 0, None) * np.clip(w, 0, None))
    # crowding: plain IoU of the annotated boxes (their overlap as drawn)
    iou = bbox_iou(gb, gb) if len(gb) else np.zeros((0, 0))
    same = gl[:, None] == gl[None, :]
    np.fill_diagonal(same, False)
    return size, ((iou > crowd_iou) & same & use[None, :]).sum(axis=1)


def box_outcomes(predictions: Predictions, candidates=None, score_threshs=(0.5, 0.6),
                 iou_thresh: float = IOU_THRESH, crowd_iou: float = 0.0,
                 input_size: int = 300, image_sizes=None, root=None) -> BoxOutcomes:
    """Size, crowding, best candidate scores and outcome of every non-difficult box.

    Args:
        predictions: the detections (from
            :func:`~medaidet.evaluation.runs.predict_weights` with ``return_candidates=True``,
            or any :class:`Predictions` when no candidates are given).
        candidates: a list of :class:`medaidet.ssd.predict.Candidates`, one per image,
            boxes in image pixels, whose ``kept`` candidates are the predictions'
            detections; None: ``best`` is NaN and :meth:`BoxOutcomes.stage` unavailable.
        score_threshs: the thresholds ``found`` is computed at.
        crowd_iou: a box overlapping another of its class with IoU ``>`` this counts it
            as a neighbour (0: any positive overlap).
        input_size: the model's input side (300 for the small SSD and SSD300).
        image_sizes: ``(H, W)`` of each image; default: read from the image files'
            headers in ``root`` (else ``$MEDAIDET_DATA``).
    """
    if candidates is not None and len(candidates) != len(predictions):
        raise ConfigError(f"candidates: {len(candidates)} entries for {len(predictions)} "
                         "images")
    found = {check_number(t, "score_threshs", "probability"): []
             for t in np.atleast_1d(score_threshs)}
    matches = {t: match_predictions(predictions, t, iou_thresh) for t in found}
    sizes = image_sizes_of(predictions, image_sizes, None, root)
    cols = {k: [] for k in ("image_id", "label", "size", "crowding")}
    best = {k: [] for k in CANDIDATE_SETS}
    for i, image_id in enumerate(predictions.ids):
        gb = np.asarray(predictions.gt_bboxes[i], dtype=np.float32).reshape(-1, 4)
        gl = np.asarray(predictions.gt_labels[i], dtype=np.int32).reshape(-1)
        gd = np.asarray(predictions.gt_difficults[i], dtype=bool).reshape(-1)
        use = ~gd
        size, crowding = _size_and_crowding(gb, gl, use, sizes[i], input_size, crowd_iou)
        cols["image_id"] += [image_id] * int(use.sum())
        cols["label"].append(gl[use])
        cols["size"].append(size[use])
        cols["crowding"].append(crowding[use])
        for t in found:
            found[t].append(matches[t][i].found[use])
        if candidates is None:
            for k in best:
                best[k].append(np.full(int(use.sum()), np.nan))
        else:
            b = _best_scores(candidates[i], gb, gl, iou_thresh)
            for k in best:
                best[k].append(b[k][use])
    cat = (lambda parts, dtype: np.concatenate(parts).astype(dtype) if parts
           else np.zeros(0, dtype))
    return BoxOutcomes(tuple(predictions.label_names),
                       np.asarray(cols["image_id"], dtype=object),
                       cat(cols["label"], np.int32), cat(cols["size"], np.float64),
                       cat(cols["crowding"], np.int64),
                       {k: cat(v, np.float64) for k, v in best.items()},
                       {t: cat(v, bool) for t, v in found.items()}, int(input_size),
                       float(crowd_iou), float(iou_thresh), predictions.split)


def stage_counts(outcomes: BoxOutcomes, score_thresh: float) -> dict:
    """``{class name: {stage: number of boxes}}`` over :data:`STAGES` (module docs), plus
    ``"n_gt"`` and ``"recall"`` per class."""
    stage = check_type(outcomes, BoxOutcomes, "outcomes", "BoxOutcomes").stage(score_thresh)
    out = {}
    for l, name in enumerate(outcomes.label_names):
        of = outcomes.label == l
        row = {s: int((stage[of] == s).sum()) for s in STAGES}
        row["n_gt"] = int(of.sum())
        row["recall"] = row["found"] / row["n_gt"] if row["n_gt"] else math.nan
        out[name] = row
    return out


def missed_by(outcomes: BoxOutcomes, score_thresh: float, by: str, bins) -> dict:
    """Boxes found and missed per class and bin of ``by`` (``"size"`` or ``"crowding"``).

    ``bins``: increasing bin edges; bin ``j`` holds ``bins[j] <= value < bins[j + 1]``
    (values outside every bin are left out; use ``np.inf`` as the last edge).

    Returns:
        ``{class name: [{"bin": (lo, hi), "n": boxes, "missed": missed boxes,
        "miss_rate": missed / n (NaN when n is 0)}, ...]}``.
    """
    if by not in ("size", "crowding"):
        raise ConfigError(f"by: {by!r}; expected 'size' or 'crowding'")
    bins = checked_bins(bins)
    values = getattr(check_type(outcomes, BoxOutcomes, "outcomes", "BoxOutcomes"), by)
    found = outcomes._found(score_thresh)
    out = {}
    for l, name in enumerate(outcomes.label_names):
        rows = []
        for lo, hi in zip(bins[:-1], bins[1:]):
            sel = (outcomes.label == l) & (values >= lo) & (values < hi)
            n, missed = int(sel.sum()), int((sel & ~found).sum())
            rows.append({"bin": (lo, hi), "n": n, "missed": missed,
                         "miss_rate": missed / n if n else math.nan})
        out[name] = rows
    return out
