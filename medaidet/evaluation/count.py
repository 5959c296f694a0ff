"""Counting cells with a detector (notebook 05): counts, the count threshold, the counting frame.

Counts (section 1): detections scoring ``>= score_thresh`` vs boxes (difficult included) per
image and class; ``mae`` (cells per image), ``bias`` (> 0 over-counts), ``relative_error`` (``sum
|predicted - annotated| / sum annotated``). The count threshold (section 2): per class, least MAE
on val, used on test. The counting frame (section 4; Gundersen 1977's, for boxes): a cell counts
when its box's centre lies in the image set back by its class's guard margin (top/left lines in,
bottom/right out); densities per 10,000 px² of that frame, or per mm² of slide (not per µL).
Boxes: ``(y_min, x_min, y_max, x_max)`` in pixels; sizes ``(H, W)``.
"""
from __future__ import annotations

import json
import math
import warnings
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from medaidet.arguments import (check_number, check_type, checked_boxes, checked_size,
                                checked_sizes)
from medaidet.colors import CLASS_COLORS
from medaidet.device import DEFAULT_DEVICE
from medaidet.errors import ConfigError
from medaidet.evaluation.analysis import images_missing_class, match_detections, voc_iou
from medaidet.evaluation.evaluate import (Predictions, bootstrap, check_run, checked,
                                          predict_weights)
from medaidet.evaluation.protocol import COUNT_SCORE_THRESH, EVALUATE_SCORE_THRESH
from medaidet.files import png_bytes, write_files
from medaidet.numbers import finite_or_none
from medaidet.tables import ShownAsTable, Table

__all__ = [
    "RBC_NOTE", "CountResult", "count_cells", "count_errors", "images_at_points",
    "plot_counts", "per_image_counts", "predicted_counts", "count_stats", "check_score_thresh",
    "PER_AREA", "frame_margins", "margin_per_class", "in_frame", "frame_predictions",
    "FrameError", "frame_errors", "frame_area", "densities", "plot_frame",
    "DEFAULT_THRESHOLDS", "SWEEP_NOTE", "SweepResult", "threshold_sweep",
    "plot_sweep", "report_count_errors", "count_weights"]


RBC_NOTE = (
    "RBC counts are limited by the annotation, not only by the detector. BCCD's RBC boxes are "
    "incomplete: some images have no RBC box at all although red cells are visible (the "
    "validator's missing_class findings, notebook 01: set aside above when flagged), and cells cut "
    "by the image border or packed in clumps are often left unboxed; where BCCD has two "
    "photographs of the same field, their two RBC annotations disagree in count "
    "(medaidet.data.agreement, notebook 05), and TXL-PBC's independent re-annotation of 221 BCCD "
    "images boxes about twice as many red cells (notebook 10: count against it, labels='txl-pbc'). "
    "A detector that finds unboxed cells is scored as over-counting. Platelet and WBC boxes agree "
    "between such pairs. A class with a high AP but a low count at a fixed threshold is found but "
    "scored below it (a confidence problem: notebook 04 measures whether size plays a part): "
    "choose the threshold per class on val.")


def per_image_counts(labels_per_image, n_class: int) -> np.ndarray:
    """(N images, n_class) ints from each image's labels. Written in notebook 05, section 1."""
    return np.array([np.bincount(np.asarray(lb, dtype=np.int64), minlength=n_class)[:n_class]
                     for lb in labels_per_image], dtype=np.int64).reshape(-1, n_class)


def predicted_counts(preds: Predictions, score_thresh: float) -> np.ndarray:
    """:func:`per_image_counts` of the detections scoring ``>= score_thresh``."""
    kept = [lb[s >= score_thresh] for lb, s in zip(preds.pred_labels, preds.pred_scores)]
    return per_image_counts(kept, len(preds.label_names))


def check_score_thresh(score_thresh, lowest: float, name: str = "score_thresh") -> float:
    """``score_thresh`` as a float from ``lowest`` (the predictions' own) to 1; else ConfigError."""
    value = check_number(score_thresh, name, "probability")
    if value < lowest:
        raise ConfigError(f"{name}: {score_thresh} is below {lowest:g}, the lowest score the "
                          f"predictions hold; expected a number from {lowest:g} to 1")
    return value


def count_stats(predicted: np.ndarray, annotated: np.ndarray):
    """``(mae, bias, relative_error)`` per class from (N images, C classes) counts. Written in
    notebook 05, section 1."""
    error = (predicted - annotated).astype(float)
    n = len(error)
    mae = np.abs(error).mean(axis=0) if n else np.full(error.shape[1], np.nan)
    bias = error.mean(axis=0) if n else np.full(error.shape[1], np.nan)
    total = annotated.sum(axis=0)
    rel = np.where(total > 0, np.abs(error).sum(axis=0) / np.maximum(total, 1), np.nan)
    return mae, bias, rel


@dataclass(repr=False)
class CountResult(ShownAsTable):
    """Counts at one threshold: ``predicted``/``annotated`` int (N images, C classes), errors (C,);
    ``set_aside``: image id -> why."""
    ids: list
    label_names: tuple
    score_thresh: float
    predicted: np.ndarray
    annotated: np.ndarray
    mae: np.ndarray
    bias: np.ndarray
    relative_error: np.ndarray
    split: str | None = None
    info: dict = field(default_factory=dict)
    set_aside: dict = field(default_factory=dict)

    @property
    def error(self) -> np.ndarray:
        """Signed error per image and class, ``predicted - annotated``."""
        return self.predicted - self.annotated

    def without_set_aside(self) -> "CountResult":
        """The same counts on the images not in :attr:`set_aside`."""
        keep = [i for i, image_id in enumerate(self.ids) if image_id not in self.set_aside]
        predicted, annotated = self.predicted[keep], self.annotated[keep]
        return CountResult([self.ids[i] for i in keep], self.label_names, self.score_thresh,
                           predicted, annotated, *count_stats(predicted, annotated),
                           self.split, dict(self.info))

    def rows(self) -> list:
        """The per-image table: one dict per image with ``<class>_pred``/``_true``/``_error``."""
        return [{"image": image_id,
                 **{f"{name}_{k}": int(v[l]) for l, name in enumerate(self.label_names)
                    for k, v in (("pred", p), ("true", a), ("error", p - a))}}
                for image_id, p, a in zip(self.ids, self.predicted, self.annotated)]

    def set_aside_reasons(self) -> dict:
        """``{reason: set-aside images}``, most first; an image can count under two reasons."""
        reasons = Counter(part.strip() for why in self.set_aside.values()
                          for part in str(why).split(";") if part.strip())
        return dict(reasons.most_common())

    def table(self) -> Table:
        """Totals and errors per class (with images set aside, also the errors without)."""
        views, notes = [self], []
        cols = ["class", "annotated", "predicted", "MAE", "rel. error", "bias"]
        if self.set_aside:
            views.append(self.without_set_aside())
            n = len(self.ids) - len(self.set_aside)
            cols += [f"{c} ({n} kept)" for c in ("MAE", "rel. error", "bias")]
            tally = ", ".join(f"{k} {why}" for why, k in self.set_aside_reasons().items())
            notes.append(f"Set aside ({len(self.set_aside)} images the validator flags "
                         f"missing_class; {tally}): "
                         + "; ".join(f"{i}: {why}" for i, why in self.set_aside.items()))
        table = Table(cols, title=f"Cell counts at score >= {self.score_thresh:g}, "
                                  f"{self.split or 'split'} ({len(self.ids)} images); MAE and "
                                  "bias in cells per image", notes=notes + [RBC_NOTE])
        for l, name in enumerate(self.label_names):
            table.append([name, int(self.annotated[:, l].sum()), int(self.predicted[:, l].sum())]
                         + [v for r in views for v in (_fmt(r.mae[l]),
                                                       _fmt(r.relative_error[l], pct=True),
                                                       _fmt(r.bias[l], sign=True))])
        return table

    def _per_class(self) -> dict:
        return {name: {"annotated_total": int(self.annotated[:, l].sum()),
                       "predicted_total": int(self.predicted[:, l].sum()),
                       **{k: finite_or_none(getattr(self, k)[l])
                          for k in ("mae", "bias", "relative_error")}}
                for l, name in enumerate(self.label_names)}

    def to_dict(self) -> dict:
        out = {"split": self.split, "score_thresh": self.score_thresh, "n_images": len(self.ids),
               "label_names": list(self.label_names), "per_class": self._per_class(),
               "per_image": self.rows(), "rbc_note": RBC_NOTE, **self.info}
        if self.set_aside:
            rest = self.without_set_aside()
            out.update(set_aside=dict(self.set_aside),
                       without_set_aside={"n_images": len(rest.ids),
                                          "per_class": rest._per_class()})
        return out

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), indent=2, **kwargs)


def _fmt(value, pct=False, sign=False) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{100 * value:.1f}%" if pct else f"{value:+.2f}" if sign else f"{value:.2f}"


def count_cells(predictions: Predictions, score_thresh: float = COUNT_SCORE_THRESH,
                set_aside=None) -> CountResult:
    """Counts at ``score_thresh``; ``set_aside``: ``{image id: why}`` of images to report apart."""
    score_thresh = check_score_thresh(score_thresh, checked(predictions).score_thresh)
    predicted = predicted_counts(predictions, score_thresh)
    annotated = per_image_counts(predictions.gt_labels, len(predictions.label_names))
    ids = list(predictions.ids)
    return CountResult(ids, predictions.label_names, float(score_thresh), predicted, annotated,
                       *count_stats(predicted, annotated), predictions.split,
                       set_aside={i: why for i, why in (set_aside or {}).items() if i in ids})


def count_errors(predictions: Predictions, thresholds: dict) -> dict:
    """``{class: relative error}``, each class counted at its own ``thresholds[class]``."""
    kept = checked(predictions).filter(check_type(thresholds, dict, "thresholds",
                                                  "a dict {class name: score threshold}"))
    annotated = per_image_counts(predictions.gt_labels, len(predictions.label_names))
    relative = count_stats(predicted_counts(kept, kept.score_thresh), annotated)[2]
    return {name: float(relative[c]) for c, name in enumerate(predictions.label_names)}


#: :func:`plot_counts`: a dot's area in points² per image at its place.
AREA_PER_IMAGE = 20.0


def images_at_points(annotated, predicted):
    """``(points (P, 2), n_images (P,))``: distinct ``(annotated, predicted)`` pairs and counts."""
    try:
        pairs = np.stack([np.asarray(annotated, dtype=np.int64).ravel(),
                          np.asarray(predicted, dtype=np.int64).ravel()], axis=1)
    except (TypeError, ValueError):
        raise ConfigError(f"annotated, predicted: {annotated!r:.40}, {predicted!r:.40}; "
                          "expected two arrays of whole counts of the same shape") from None
    return np.unique(pairs, axis=0, return_counts=True)


def plot_counts(result: CountResult):
    """A ``Figure``: predicted vs annotated count per class; a dot's area: the images on it."""
    n = len(result.label_names)
    fig = Figure(figsize=(4.2 * n, 4.8), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    for l, (ax, name) in enumerate(zip(axes, result.label_names)):
        points, n_images = images_at_points(result.annotated[:, l], result.predicted[:, l])
        x, y = points[:, 0], points[:, 1]
        top = max(1, int(x.max(initial=0)), int(y.max(initial=0))) * 1.05 + 1
        ax.plot([0, top], [0, top], color="0.5", ls="--", lw=1, label="y = x")
        ax.scatter(x, y, s=AREA_PER_IMAGE * n_images, alpha=0.6,
                   color=CLASS_COLORS.get(name, f"C{l}"), edgecolors="white", linewidths=0.5,
                   label="images (area and number: how many)")
        for (px, py), k in zip(points, n_images):
            if k > 1:
                ax.annotate(str(k), (px, py), textcoords="offset points", ha="left", va="bottom",
                            fontsize="x-small", in_layout=False,
                            xytext=(1 + 0.4 * math.sqrt(AREA_PER_IMAGE * k),) * 2)
        ax.set(title=f"{name}: MAE {_fmt(result.mae[l])}, bias {_fmt(result.bias[l], sign=True)}",
               xlabel="annotated count", ylabel="predicted count", xlim=(-0.5, top),
               ylim=(-0.5, top), aspect="equal")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        legend = ax.legend(loc="upper left", fontsize="small", scatterpoints=1)
        handles = getattr(legend, "legend_handles", None) or legend.legendHandles  # < 3.7
        handles[1].set_sizes([2 * AREA_PER_IMAGE])    # a small dot, not the largest one
    fig.suptitle(f"Counts per image at score >= {result.score_thresh:g} "
                 f"({len(result.ids)} images; a dot's area and number: the images on it)")
    return fig


PER_AREA = 10_000     # densities are cells per this many px² (100 x 100 px)


def frame_margins(bboxes, labels, label_names, quantile: float = 0.95) -> dict:
    """``{class name: margin px}``: half the ``quantile`` of its longer box sides, rounded up."""
    quantile = check_number(quantile, "quantile", "probability")
    label_names = _checked_names(label_names)
    bboxes, labels = (check_type(x, (list, tuple), name, "a list of one array per image")
                      for x, name in ((bboxes, "bboxes"), (labels, "labels")))
    sides = {name: [] for name in label_names}
    for bbox, label in zip(bboxes, labels, strict=True):
        bbox, label = checked_boxes(bbox, label, len(label_names), "bboxes")
        longer = np.maximum(bbox[:, 2] - bbox[:, 0], bbox[:, 3] - bbox[:, 1])
        for value, lb in zip(longer, label):
            sides[label_names[lb]].append(value)
    return {name: math.ceil(np.quantile(values, quantile) / 2) if values else 0
            for name, values in sides.items()}


def margin_per_class(margins: dict, label_names) -> np.ndarray:
    """float (C,): ``margins[name]`` per class; ConfigError if missing, negative or not finite."""
    check_type(margins, dict, "margins", "a dict {class name: guard margin in px}")
    missing = [n for n in _checked_names(label_names) if n not in margins]
    if missing:
        raise ConfigError(f"margins: no guard margin for {', '.join(missing)}; give one per "
                          f"class ({', '.join(label_names)}), in pixels")
    return np.array([check_number(margins[n], f"margins[{n!r}]", "non-negative")
                     for n in label_names], dtype=float)


def _checked_names(label_names) -> tuple:
    check_type(label_names, (list, tuple), "label_names", "a list of class names")
    if not all(isinstance(n, str) for n in label_names):
        raise ConfigError(f"label_names: {label_names!r}; expected a list of class names")
    return tuple(label_names)


def in_frame(bbox, label, size, margins: dict, label_names) -> np.ndarray:
    """bool (R,): which of an image's boxes count in the frame set back by ``margins[class]``
    px (module docs). Written in notebook 05, section 4."""
    height, width = checked_size(size)
    bbox, label = checked_boxes(bbox, label, len(label_names))
    margin = margin_per_class(margins, label_names)[label]
    cy, cx = (bbox[:, 0] + bbox[:, 2]) / 2, (bbox[:, 1] + bbox[:, 3]) / 2
    return (cy >= margin) & (cy < height - margin) & (cx >= margin) & (cx < width - margin)


def frame_predictions(predictions, sizes, margins: dict):
    """``predictions`` with only what counts in the frame; ``sizes``: (H, W) per image, or one."""
    names = check_type(predictions, Predictions, "predictions", "Predictions").label_names
    sizes = checked_sizes(sizes, len(predictions))

    def kept(bboxes, labels, *others):
        masks = [in_frame(b, lb, s, margins, names) for b, lb, s in zip(bboxes, labels, sizes)]
        return [[x[m] for x, m in zip(column, masks)] for column in (bboxes, labels, *others)]

    pb, pl, ps = kept(predictions.pred_bboxes, predictions.pred_labels, predictions.pred_scores)
    gb, gl, gd = kept(predictions.gt_bboxes, predictions.gt_labels, predictions.gt_difficults)
    return replace(predictions, pred_bboxes=pb, pred_labels=pl, pred_scores=ps, gt_bboxes=gb,
                   gt_labels=gl, gt_difficults=gd)


class FrameError(NamedTuple):
    """One count error in the frame (see :func:`frame_errors`)."""
    index: int
    label: int
    kind: str
    box: np.ndarray
    score: float


def frame_errors(predictions, thresholds: dict, sizes, margins: dict) -> list:
    """Every :class:`FrameError` in the frame at ``thresholds[class]``, matched on the whole image:
    ``"false"`` (matching no box), ``"missed"`` (score: best same-class score on the box, 0 if
    none), ``"line +"``/``"line -"`` (detection in/out, its box the other side). Framed count
    error = line+ - line- + false - missed."""
    names = check_type(predictions, Predictions, "predictions", "Predictions").label_names
    kept = predictions.filter(check_type(thresholds, dict, "thresholds",
                                         "a dict {class name: score threshold}"))
    sizes = checked_sizes(sizes, len(predictions))
    errors = []
    for i, size in enumerate(sizes):
        pb, pl, ps = kept.pred_bboxes[i], kept.pred_labels[i], kept.pred_scores[i]
        gb, gl = kept.gt_bboxes[i], kept.gt_labels[i]
        match = match_detections(pb, pl, ps, gb, gl, score_thresh=kept.score_thresh)
        p_in, g_in = in_frame(pb, pl, size, margins, names), in_frame(gb, gl, size, margins, names)
        for g, d in enumerate(match.matched_by):
            if d >= 0 and p_in[d] != g_in[g]:
                errors.append(FrameError(i, int(gl[g]), "line +" if p_in[d] else "line -",
                                         gb[g], float(ps[d])))
        errors += [FrameError(i, int(pl[d]), "false", pb[d], float(ps[d]))
                   for d in np.flatnonzero(p_in & ~match.tp)]
        every, labels, scores = (predictions.pred_bboxes[i], predictions.pred_labels[i],
                                 predictions.pred_scores[i])
        for g in np.flatnonzero(g_in & (match.matched_by < 0)):
            on = (voc_iou(gb[g], every)[0] >= 0.5) & (labels == gl[g])
            errors.append(FrameError(i, int(gl[g]), "missed", gb[g],
                                     float(scores[on].max()) if on.any() else 0.0))
    return errors


def frame_area(size, margin) -> float:
    """px² of the inner frame of an image of ``size`` ``(H, W)`` set back by ``margin``."""
    height, width = checked_size(size)
    margin = check_number(margin, "margin", "non-negative")
    return max(height - 2 * margin, 0.0) * max(width - 2 * margin, 0.0)


def densities(counts, sizes, margins: dict, label_names, pixel_um=None) -> np.ndarray:
    """float (N, C): ``counts`` per :data:`PER_AREA` px² of frame (per mm² with ``pixel_um``)."""
    try:
        counts = np.asarray(counts, dtype=float).reshape(-1, len(_checked_names(label_names)))
    except (TypeError, ValueError):
        raise ConfigError(f"counts: {counts!r:.60}; expected (images, {len(label_names)}) "
                          "numbers, one count per class") from None
    sizes = checked_sizes(sizes, len(counts))
    margin = margin_per_class(margins, label_names)
    area = np.array([[frame_area(s, m) for m in margin] for s in sizes]).reshape(counts.shape)
    unit = (PER_AREA if pixel_um is None     # else px² in one mm²
            else 1e6 / check_number(pixel_um, "pixel_um", "positive") ** 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(area > 0, counts / area * unit, np.nan)


def plot_frame(img, bbox, label, margins: dict, label_names, title: str = "") -> Figure:
    """A ``Figure``, a panel per class: ``img`` (float (3, H, W)), its frame, the boxes counted."""
    height, width = img.shape[1:]
    label = np.asarray(label, dtype=int)
    counted = in_frame(bbox, label, (height, width), margins, label_names)
    fig = Figure(figsize=(4.6 * len(label_names), 3.9), layout="constrained")
    for c, (ax, name) in enumerate(zip(fig.subplots(1, len(label_names)), label_names)):
        ax.imshow(np.clip(img.transpose(1, 2, 0), 0, 255).astype(np.uint8))
        m, color = margins[name], CLASS_COLORS.get(name, f"C{c}")
        ax.add_patch(Rectangle((m, m), width - 2 * m, height - 2 * m, fill=False, ec=color,
                               ls="--", lw=2))
        ours = np.flatnonzero(label == c)
        for k in ours:
            y0, x0, y1, x1 = np.asarray(bbox[k], dtype=float)
            style = (dict(ec=color, lw=1.8) if counted[k] else dict(ec="0.2", ls="-.", lw=1.2))
            ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, **style))
            ax.plot((x0 + x1) / 2, (y0 + y1) / 2, "o", ms=3.5, color=color if counted[k] else "0.2")
        ax.set(xticks=[], yticks=[], title=f"{name}: {int(counted[ours].sum())} counted, "
               f"{int((~counted[ours]).sum())} not (margin {m:g} px)")
    fig.suptitle(title or "The counting frame: a cell counts when its centre (dot) lies inside "
                 "its class's frame (dashed); solid counted, dash-dotted grey not")
    return fig


DEFAULT_THRESHOLDS = tuple(np.round(np.arange(0.05, 0.96, 0.05), 2))
#: :func:`plot_sweep`'s axis fits the thresholds from here up (lower ones may run off it)...
SWEEP_AXIS_FROM = 0.2
#: ... when a lower one's MAE is more than this many times the highest of the rest.
SWEEP_FLATTENS = 3.0
SWEEP_NOTE = (
    "The best threshold is chosen on the same images it is scored on: on the test split "
    "that is optimistic. Choose the threshold on the val split and report test counts at it.")


@dataclass(repr=False)
class SweepResult(ShownAsTable):
    """Count errors, (T thresholds, C classes); ``best_threshold``: least MAE (middle of ties)."""
    thresholds: np.ndarray
    label_names: tuple
    mae: np.ndarray
    bias: np.ndarray
    relative_error: np.ndarray
    split: str | None = None

    @property
    def best_threshold(self) -> dict:
        out = {}
        for l, name in enumerate(self.label_names):
            mae = self.mae[:, l]       # all NaN without images: the first threshold, as argmin
            tied = np.flatnonzero(mae == np.nanmin(mae)) if np.isfinite(mae).any() else [0]
            out[name] = float(self.thresholds[tied[len(tied) // 2]])
        return out

    @property
    def best_mae(self) -> dict:
        return {name: float(np.min(self.mae[:, l])) for l, name in enumerate(self.label_names)}

    def table(self) -> Table:
        """Count MAE per class at each threshold; the best threshold of each class below."""
        best = ", ".join(f"{n} {t:g} (MAE {self.best_mae[n]:.2f})"
                         for n, t in self.best_threshold.items())
        return Table(["score>="] + [f"{n} MAE" for n in self.label_names],
                     [[f"{t:g}", *self.mae[i]] for i, t in enumerate(self.thresholds)], ".2f",
                     notes=[f"best threshold on {self.split or 'these images'}: {best}",
                            SWEEP_NOTE])

    def to_dict(self) -> dict:
        return {"split": self.split, "thresholds": self.thresholds.tolist(),
                "label_names": list(self.label_names),
                **{k: {n: getattr(self, k)[:, l].tolist() for l, n in enumerate(self.label_names)}
                   for k in ("mae", "bias")},
                "best_threshold": self.best_threshold, "best_mae": self.best_mae,
                "note": SWEEP_NOTE}


def threshold_sweep(predictions: Predictions, thresholds=DEFAULT_THRESHOLDS) -> SweepResult:
    """Count errors per class at each threshold; a UserWarning on test (:data:`SWEEP_NOTE`)."""
    lowest = checked(predictions).score_thresh
    thresholds = np.sort([check_score_thresh(t, lowest, "thresholds")
                          for t in np.asarray(thresholds, dtype=object).ravel()])
    if thresholds.size == 0:
        raise ConfigError(f"thresholds: none given; expected score thresholds from {lowest:g} to 1")
    if predictions.split == "test":
        warnings.warn("threshold_sweep on the test split: " + SWEEP_NOTE, UserWarning, stacklevel=2)
    annotated = per_image_counts(predictions.gt_labels, len(predictions.label_names))
    stats = np.stack([count_stats(predicted_counts(predictions, t), annotated)
                      for t in thresholds], axis=1)      # (3 statistics, T, C)
    return SweepResult(thresholds, predictions.label_names, *stats, predictions.split)


def report_count_errors(val, test, n: int = 1000, seed: int = 0) -> dict:
    """Per class the threshold chosen on ``val``, the count error on ``test`` with its bootstrap
    interval and cells: ``{class: {"threshold", "error", "low", "high", "cells"}}``. Written in
    notebook 05, section 4."""
    chosen = threshold_sweep(val).best_threshold
    errors = count_errors(test, chosen)
    spread = bootstrap(test, lambda p: count_errors(p, chosen), n=n, seed=seed)
    cells = per_image_counts(test.gt_labels, len(test.label_names)).sum(axis=0)
    return {name: {"threshold": chosen[name], "error": errors[name], "low": spread[name][0],
                   "high": spread[name][1], "cells": int(cells[c])}
            for c, name in enumerate(test.label_names)}


def plot_sweep(sweep: SweepResult):
    """A ``Figure``: count MAE vs threshold, a panel per class on its own scale, best starred."""
    n = len(sweep.label_names)
    fig = Figure(figsize=(3.6 * n, 3.6), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False, sharex=True)[0]
    best = sweep.best_threshold
    for l, (ax, name) in enumerate(zip(axes, sweep.label_names)):
        color, mae = CLASS_COLORS.get(name, f"C{l}"), sweep.mae[:, l]
        ax.plot(sweep.thresholds, mae, marker="o", ms=3, color=color)
        ax.plot([best[name]], [sweep.best_mae[name]], marker="*", ms=12, color=color,
                linestyle="none", label=f"best {best[name]:g} (MAE {sweep.best_mae[name]:.2f})")
        # the lowest thresholds' MAEs (background by the hundred) would flatten the rest
        rest = float(np.nanmax(mae[sweep.thresholds >= SWEEP_AXIS_FROM], initial=0.0))
        highest = float(np.nanmax(mae, initial=0.0))
        if rest > 0 and highest > SWEEP_FLATTENS * rest:
            ax.set_ylim(0, 1.3 * rest)
            ax.text(0.02, 0.02, f"below score {SWEEP_AXIS_FROM:g}: off the scale\n(MAE up to "
                    f"{highest:.0f})", transform=ax.transAxes, va="bottom", fontsize="x-small")
        else:
            ax.set_ylim(0, 1.1 * highest if highest > 0 else 1)
        ax.set(title=name, xlabel="score threshold",
               ylabel="count MAE (cells per image)" if l == 0 else "")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="upper center")
    fig.suptitle(f"Count error vs threshold ({sweep.split or 'split'}; choose on val); "
                 "each panel on its own scale")
    return fig


def count_weights(weights_path, split: str = "test", score_thresh=COUNT_SCORE_THRESH,
                  model_name: str | None = None, root=None, subset=None, device=DEFAULT_DEVICE,
                  out=None, thresholds=DEFAULT_THRESHOLDS, batch_size: int = 8,
                  progress: bool = True):
    """``medaidet count``: ``(CountResult, SweepResult)`` at ``score_thresh`` (``missing_class``
    images set aside) and over ``thresholds``, written to ``out``, all or none."""
    score_thresh = check_score_thresh(score_thresh, EVALUATE_SCORE_THRESH, "--score-thresh")
    for t in np.asarray(thresholds, dtype=object).ravel():
        check_score_thresh(t, EVALUATE_SCORE_THRESH, "thresholds")
    _, root, subset, _, out = check_run(weights_path, root, subset, batch_size, out)
    preds = predict_weights(weights_path, split, model_name, root, subset, device, batch_size,
                            progress)
    result = count_cells(preds, score_thresh,
                         set_aside=images_missing_class(preds.ids, root=root, brief=True))
    result.info.update(weights=str(weights_path), model=preds.model, subset=subset)
    with warnings.catch_warnings():
        if split != "test":
            warnings.simplefilter("ignore", UserWarning)
        sweep = threshold_sweep(preds, thresholds)
    if out is not None:
        counts = json.dumps({**result.to_dict(), "sweep": sweep.to_dict()}, indent=2) + "\n"
        write_files({out / "counts.json": counts,
                     out / "counts.png": png_bytes(plot_counts(result), dpi=100),
                     out / "count_sweep.png": png_bytes(plot_sweep(sweep), dpi=100)})
    return result, sweep
