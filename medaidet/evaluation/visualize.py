"""Detections drawn on the images: what was found, what is wrong, what was missed.

AP and count errors say *how much* a detector gets wrong; a picture says *what*. Each
detection scoring ``>= score_thresh`` is matched to the ground truth exactly as VOC AP
matches it (:func:`~medaidet.evaluation.matching.match_detections`, the rule of ChainerCV's
``calc_detection_voc_prec_rec``), and drawn in one of three styles, none in a class's colour
(:data:`medaidet.colors.OUTCOME_STYLES`; told apart by line style too):

* correct (a true positive): solid black, a detection matched to a box of its class;
* false (a false positive): dashed orange, a detection matched to no box (a duplicate, a wrong
  class, a poor overlap, or an unboxed cell: see :data:`~medaidet.evaluation.count.RBC_NOTE`);
* missed: dotted black, a ground-truth box no detection matched.

Each box carries its class's initial (``R``, ``W``, ``P``); each panel's title has the
counts per class, predicted/annotated (``rbc 18/21 · wbc 1/1 · platelets 0/2``), the same
numbers :func:`~medaidet.evaluation.count.count_cells` counts at that threshold.

Boxes are ``(y_min, x_min, y_max, x_max)`` in image pixels, float32, shape (R, 4); labels
int32 (R,), indices into the label names; scores float32 (R,). Images float32 (3, H, W),
RGB, 0-255 (ChainerCV's layout).
"""
from __future__ import annotations

import math
import warnings

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from medaidet.colors import OUTCOME_LABELS, OUTCOME_STYLES
from medaidet.data.bccd import AnnotationWarning, BCCDDataset
from medaidet.errors import ConfigError
from medaidet.evaluation.predictions import Predictions
from medaidet.evaluation.matching import (DetectionMatch, as_boxes, match_detections,
                                          match_predictions)
from medaidet.evaluation.protocol import COUNT_SCORE_THRESH, IOU_THRESH

__all__ = ["STYLES", "draw_detections", "plot_detections"]

#: Drawing style of each outcome (matplotlib ``Rectangle`` keywords): no class colour, and
#: the line styles tell them apart without colour (:mod:`medaidet.colors`).
STYLES = OUTCOME_STYLES
_LEGEND = OUTCOME_LABELS


# --------------------------------------------------------------------------- drawing

def _class_index(class_filter, label_names):
    if class_filter is None:
        return None
    if isinstance(class_filter, str):
        names = [n.lower() for n in label_names]
        if class_filter.lower() not in names:
            raise ConfigError(f"class_filter: {class_filter!r} is not a class; expected one "
                             f"of {', '.join(label_names)} (or its index)")
        return names.index(class_filter.lower())
    index = int(class_filter)
    if not 0 <= index < len(label_names):
        raise ConfigError(f"class_filter: {class_filter} is not a class index; expected 0 to "
                         f"{len(label_names) - 1} ({', '.join(label_names)})")
    return index


def _of_class(labels, class_index) -> np.ndarray:
    """bool mask of ``labels`` equal to ``class_index`` (all True for None)."""
    labels = np.asarray(labels).reshape(-1)
    return np.ones(len(labels), dtype=bool) if class_index is None else labels == class_index


def _tags(label_names):
    """Class initials (``R``, ``W``, ``P``), or the names if two initials collide."""
    initials = [n[:1].upper() for n in label_names]
    return initials if len(set(initials)) == len(initials) else list(label_names)


def _count_title(pred_label, kept, gt_label, label_names, class_index=None) -> str:
    """``rbc 18/21 · wbc 1/1 · platelets 0/2``: kept detections / annotated boxes per class."""
    classes = range(len(label_names)) if class_index is None else [class_index]
    pred_label = np.asarray(pred_label).reshape(-1)
    gt_label = np.asarray(gt_label).reshape(-1)
    return " · ".join(f"{label_names[l]} {int(np.sum(kept & (pred_label == l)))}"
                      f"/{int(np.sum(gt_label == l))}" for l in classes)


def _legend_handles(totals=None):

    return [Patch(facecolor="none", **STYLES[kind],
                  label=_LEGEND[kind] + ("" if totals is None else f" ({totals[kind]})"))
            for kind in ("tp", "fp", "missed")]


def _to_hwc(img) -> np.ndarray:
    img = np.asarray(img)
    if img.ndim != 3 or img.shape[0] not in (1, 3):
        raise ConfigError(f"img: expected float (3, H, W) RGB 0-255 (ChainerCV's layout); "
                         f"got shape {img.shape}")
    hwc = img.transpose(1, 2, 0)
    if hwc.shape[2] == 1:
        hwc = np.repeat(hwc, 3, axis=2)
    return np.clip(hwc, 0, 255).astype(np.uint8)


def _draw_box(ax, kind: str, box, text: str) -> None:
    """One box in the style of its outcome (``"tp"``, ``"fp"``, ``"missed"``), tagged."""
    style = STYLES[kind]
    y0, x0, y1, x1 = (float(v) for v in box)
    ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, gid=kind, **style))
    # missed boxes tagged below their corner, detections above: a TP and the box it
    # matched do not both show, but an FP over a missed box should stay readable;
    # a missed box's tag is black on white inside its dotted outline, a detection's filled
    missed = kind == "missed"
    ax.text(x0 + 1, (y1 - 1) if missed else (y0 + 1), text,
            fontsize=6, color="black" if missed else "white", va="bottom" if missed else "top",
            bbox=dict(facecolor="white" if missed else style["edgecolor"],
                      edgecolor=style["edgecolor"] if missed else "none",
                      pad=0.6, alpha=0.85), clip_on=True)


def draw_detections(ax, img, pred_bbox, pred_label, pred_score, gt_bbox, gt_label,
                    label_names, score_thresh: float = COUNT_SCORE_THRESH,
                    iou_thresh: float = IOU_THRESH, gt_difficult=None, class_filter=None,
                    title: str | None = None, legend: bool = True,
                    show_scores: bool = False) -> DetectionMatch:
    """Draw ``img`` on ``ax`` with its detections matched to its ground truth.

    Correct detections (solid black), false ones (dashed orange) and missed boxes (dotted
    black) are drawn as rectangles (:data:`STYLES`), each tagged with its class's initial
    (and the score with ``show_scores``); the title holds ``title`` (e.g. the image id)
    and, per class, kept detections / annotated boxes. Detections scoring below
    ``score_thresh`` are not drawn; nor are detections on difficult boxes.

    Args:
        ax: a matplotlib ``Axes``.
        img: float32 (3, H, W), RGB, 0-255.
        pred_bbox, pred_label, pred_score: float32 (R, 4) ``(y_min, x_min, y_max, x_max)``,
            int32 (R,), float32 (R,), in ``img``'s pixels.
        gt_bbox, gt_label: float32 (G, 4) ``(y_min, x_min, y_max, x_max)``, int32 (G,).
        label_names: the class names, indexed by label.
        score_thresh, iou_thresh, gt_difficult: as for :func:`match_detections`.
        class_filter: a class name or index: draw and count only that class.
        legend: add a legend (with the number of boxes of each kind) to ``ax``.

    Returns:
        the :class:`DetectionMatch` of all classes (the drawing may show one).
    """
    label_names = tuple(label_names)
    match = match_detections(pred_bbox, pred_label, pred_score, gt_bbox, gt_label,
                             gt_difficult, iou_thresh, score_thresh)
    pred_bbox, gt_bbox = as_boxes(pred_bbox), as_boxes(gt_bbox)
    pred_label = np.asarray(pred_label, dtype=np.int32).reshape(-1)
    pred_score = np.asarray(pred_score, dtype=np.float32).reshape(-1)
    gt_label = np.asarray(gt_label, dtype=np.int32).reshape(-1)
    only = _class_index(class_filter, label_names)
    pred_in, gt_in = _of_class(pred_label, only), _of_class(gt_label, only)
    tags = _tags(label_names)

    ax.imshow(_to_hwc(img))
    drawn = {"tp": [], "fp": [], "missed": []}
    for kind, boxes, labels, mask, scores in (
            ("missed", gt_bbox, gt_label, match.missed & gt_in, None),
            ("fp", pred_bbox, pred_label, match.fp & pred_in, pred_score),
            ("tp", pred_bbox, pred_label, match.tp & pred_in, pred_score)):
        for i in np.flatnonzero(mask):
            text = tags[labels[i]] if 0 <= labels[i] < len(tags) else str(labels[i])
            if show_scores and scores is not None:
                text += f" {scores[i]:.2f}"
            _draw_box(ax, kind, boxes[i], text)
            drawn[kind].append(i)
    counts = _count_title(pred_label, match.kept, gt_label, label_names, only)
    ax.set_title(counts if not title else f"{title}\n{counts}", fontsize=9)
    ax.set_axis_off()
    if legend:
        ax.legend(handles=_legend_handles({k: len(v) for k, v in drawn.items()}),
                  loc="upper right", fontsize="x-small", framealpha=0.8)
    return match


def _images_for(predictions: Predictions, dataset=None, root=None):
    """The dataset whose images the predictions were made on, and an id -> index lookup."""
    if dataset is None:
        if predictions.split is None:
            raise ConfigError("plot_detections: the predictions do not say their split; pass "
                             "dataset= (e.g. BCCDDataset(root, 'test')), whose images they are")
        # predicting read the same annotations and warned about what it dropped already
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AnnotationWarning)
            dataset = BCCDDataset(root, predictions.split, use_difficult=True)
    ids = getattr(dataset, "ids", None)
    index = {image_id: i for i, image_id in enumerate(ids)} if ids is not None else None
    return dataset, index


def _image(dataset, index, position, image_id):
    if index is not None:
        if image_id not in index:
            raise ConfigError(f"image {image_id!r} of the predictions is not in the dataset "
                             "given: pass the dataset the predictions were made on")
        position = index[image_id]
    if hasattr(dataset, "slice") and "img" in getattr(dataset, "keys", ()):
        return dataset.slice[:, "img"][position]     # decodes the image only
    item = dataset[position]
    return item[0] if isinstance(item, tuple) else item


def _at_threshold(predictions: Predictions, score_thresh):
    """``(predictions, score_thresh, "score >= ...")`` for one threshold or one per class
    (``{class name: threshold}``: the predictions filtered, their lowest threshold kept)."""
    at = f"score >= {score_thresh:g}" if not isinstance(score_thresh, dict) else (
        "scores >= " + ", ".join(f"{n} {t:g}" for n, t in score_thresh.items()))
    if isinstance(score_thresh, dict):
        predictions = predictions.filter(score_thresh)
        score_thresh = predictions.score_thresh
    if score_thresh < predictions.score_thresh:
        raise ConfigError(f"score_thresh: {score_thresh} is below {predictions.score_thresh:g}, "
                         "the lowest score the predictions hold")
    return predictions, score_thresh, at


def _chosen(predictions: Predictions, indices, n: int, sort_by, outcomes) -> list:
    """The positions :func:`plot_detections` shows: ``indices`` (positions or image ids)
    checked, or the first ``n`` (by ``sort_by``; ``outcomes``: per image (tp, missed, fp))."""
    if indices is None:
        order = list(range(len(predictions)))
        if sort_by is not None:
            if sort_by not in ("missed", "fp", "errors"):
                raise ConfigError(f"sort_by: {sort_by!r}; expected 'missed', 'fp', 'errors' "
                                 "or None")

            def errors(i):
                missed, fp = outcomes[i][1:]
                return (missed if sort_by != "fp" else 0) + (fp if sort_by != "missed" else 0)

            order.sort(key=lambda i: -errors(i))       # stable: ties keep their order
        return order[:n]
    position = {image_id: i for i, image_id in enumerate(predictions.ids)}
    indices = [position[i] if isinstance(i, str) and i in position else i for i in indices]
    bad = [i for i in indices
           if isinstance(i, str) or not -len(predictions) <= int(i) < len(predictions)]
    if bad:
        raise ConfigError(f"indices: {bad} are neither positions (0 to "
                         f"{len(predictions) - 1}) nor image ids of the predictions")
    return [int(i) % len(predictions) for i in indices]


def _outcomes(predictions: Predictions, score_thresh, iou_thresh, only) -> list:
    """Per image, of the class ``only`` (None: every class): (true positives, missed, false
    positives)."""
    return [(int((m.tp & _of_class(pl, only)).sum()),
             int((m.missed & _of_class(gl, only)).sum()),
             int((m.fp & _of_class(pl, only)).sum()))
            for m, pl, gl in zip(match_predictions(predictions, score_thresh, iou_thresh),
                                 predictions.pred_labels, predictions.gt_labels)]


def _grid(n_panels: int, ncols: int):
    """A figure of ``n_panels`` panels, ``ncols`` a row at most: ``(fig, flat axes)``."""
    ncols = max(1, min(int(ncols), n_panels))
    nrows = math.ceil(n_panels / ncols)
    fig = Figure(figsize=(4.6 * ncols, 3.9 * nrows + 0.6), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False).ravel()


def plot_detections(predictions: Predictions, indices=None, n: int = 6, label_names=None,
                    score_thresh: float = COUNT_SCORE_THRESH, class_filter=None,
                    dataset=None, root=None, sort_by: str | None = None, ncols: int = 3,
                    iou_thresh: float = IOU_THRESH, show_scores: bool = False):
    """A grid of images, each with its detections matched to its ground truth.

    One panel per image (:func:`draw_detections`): true positives, false positives and
    missed boxes in three styles, the image id and the counts per class (predicted /
    annotated) in its title, one legend for the figure with the totals over the panels.

    Args:
        predictions: from :func:`~medaidet.evaluation.predictions.predict_split` or
            :func:`~medaidet.evaluation.runs.predict_weights`.
        indices: positions in ``predictions`` (ints) or image ids (strs) to show;
            default: ``n`` images, the first ones or the first by ``sort_by``.
        label_names: default ``predictions.label_names``.
        score_thresh: detections scoring at least this are drawn (from 0.01, what
            predictions hold, to 1); or one per class, ``{class name: threshold}`` (as
            :meth:`~medaidet.evaluation.predictions.Predictions.filter` takes them).
        class_filter: a class name or index (e.g. ``"platelets"``): only that class.
        dataset: the images: anything with ``(img, ...)`` items (float32 (3, H, W) RGB
            0-255); with an ``ids`` attribute images are looked up by id. Default:
            ``BCCDDataset(root, predictions.split)``.
        sort_by: with ``indices=None``: ``"missed"``, ``"fp"`` or ``"errors"`` (both)
            shows the ``n`` images with the most of them (of ``class_filter`` if given),
            most first; None keeps the predictions' order.

    Returns:
        a matplotlib ``Figure`` (not shown; ``fig.savefig(...)`` to write it).
    """
    label_names = tuple(label_names or predictions.label_names)
    predictions, score_thresh, at = _at_threshold(predictions, score_thresh)
    only = _class_index(class_filter, label_names)
    outcomes = _outcomes(predictions, score_thresh, iou_thresh, only)
    indices = _chosen(predictions, indices, n, sort_by, outcomes)
    if not indices:
        raise ConfigError("plot_detections: no image to show (empty predictions or indices)")
    dataset, index = _images_for(predictions, dataset, root)

    fig, axes = _grid(len(indices), ncols)
    totals = {"tp": 0, "fp": 0, "missed": 0}
    for ax, i in zip(axes, indices):
        image_id = predictions.ids[i]
        img = _image(dataset, index, i, image_id)
        draw_detections(
            ax, img, predictions.pred_bboxes[i], predictions.pred_labels[i],
            predictions.pred_scores[i], predictions.gt_bboxes[i], predictions.gt_labels[i],
            label_names, score_thresh, iou_thresh, predictions.gt_difficults[i], class_filter,
            title=str(image_id), legend=False, show_scores=show_scores)
        for kind, value in zip(("tp", "missed", "fp"), outcomes[i]):
            totals[kind] += value
    for ax in axes[len(indices):]:
        ax.set_axis_off()
    what = "" if only is None else f"{label_names[only]} only; "
    fig.suptitle(f"Detections at {at} vs ground truth "
                 f"({what}{predictions.split or 'split'}, IoU >= {iou_thresh:g}); "
                 "titles: predicted/annotated per class")
    fig.legend(handles=_legend_handles(totals), loc="outside lower center", ncols=3,
               fontsize="small")
    return fig
