"""The counting frame: count each cell once and whole, and report densities (notebook 05).

An image's edge cuts the cells that lie across it. A cut cell is a sliver that one annotator
boxes and another leaves out, and that a detector finds or misses at random, so a count of
every box in the image depends on where the edge fell. Quantitative microscopy counts by a
rule that gives every cell of the smear exactly one chance instead (the unbiased counting
frame, Gundersen 1977). This module uses its simplest form for boxes:

* the **inner frame** is the image set back by a guard margin on every side, one margin per
  class (:func:`frame_margins`: half the class's large boxes on train, so a counted cell
  lies wholly inside the image and its box does not depend on the cut);
* a cell **counts when the centre of its box lies inside the inner frame** (on its top or
  left line included, on its bottom or right line not: frames laid side by side over a
  smear then count every centre exactly once).

Gundersen's own frame counts a cell whose outline touches its two *inclusion* edges and not
its *exclusion* lines; that needs the outline, which a box only approximates. The centre
rule needs one point per cell, the same for an annotation and a prediction.

:func:`frame_predictions` keeps what counts on both sides, :func:`frame_errors` names each
count error left (a false or missed cell in the frame, or a detection and its cell on either
side of the frame's line), :func:`plot_frame` draws the frame on an image.

Counts become **densities**: cells per 10,000 px² of the inner frame, or per mm² where the
pixel size is known. A smear is spread to a monolayer of unknown thickness: a density on it
is cells per area of the slide, not a concentration per µL.

Boxes are ``(y_min, x_min, y_max, x_max)`` in image pixels; an image size is ``(H, W)``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from medaidet.arguments import (check_number, check_type, checked_boxes, checked_size,
                                checked_sizes)
from medaidet.colors import CLASS_COLORS
from medaidet.errors import ConfigError

__all__ = ["PER_AREA", "frame_margins", "margin_per_class", "in_frame",
           "frame_predictions", "FrameError", "frame_errors", "frame_area", "densities",
           "plot_frame"]

PER_AREA = 10_000     # densities are cells per this many px² (100 x 100 px)


def frame_margins(bboxes, labels, label_names, quantile: float = 0.95) -> dict:
    """``{class name: guard margin in px}``: half the ``quantile`` of the class's box sizes
    (the longer side) over ``bboxes``/``labels`` (one array each per image: train's boxes),
    rounded up. A class without a box gets a margin of 0 and a cell centred on the edge
    still counts once per frame (never twice)."""
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
    """float (C,): ``margins[name]`` of each class in ``label_names``, each checked (a named
    ConfigError for a class without one, or a negative or non-finite margin)."""
    check_type(margins, dict, "margins", "a dict {class name: guard margin in px}")
    missing = [n for n in _checked_names(label_names) if n not in margins]
    if missing:
        raise ConfigError(f"margins: no guard margin for {', '.join(missing)}; give one per "
                          f"class ({', '.join(label_names)}), in pixels")
    values = np.array([check_number(margins[n], f"margins[{n!r}]", "non-negative")
                       for n in label_names], dtype=float)
    return values


def _checked_names(label_names) -> tuple:
    if isinstance(label_names, str) or not all(
            isinstance(n, str) for n in check_type(label_names, (list, tuple), "label_names",
                                                   "a list of class names")):
        raise ConfigError(f"label_names: {label_names!r}; expected a list of class names")
    return tuple(label_names)


def in_frame(bbox, label, size, margins: dict, label_names) -> np.ndarray:
    """bool (R,): which of an image's boxes count, their centre inside the inner frame of an
    image of ``size`` ``(H, W)`` set back by ``margins[class]`` px (top/left line in,
    bottom/right line out). A class whose margins leave no frame counts nothing. Written in
    notebook 05, section 4."""
    height, width = checked_size(size)
    bbox, label = checked_boxes(bbox, label, len(label_names))
    margin = margin_per_class(margins, label_names)[label]
    cy, cx = (bbox[:, 0] + bbox[:, 2]) / 2, (bbox[:, 1] + bbox[:, 3]) / 2
    return (cy >= margin) & (cy < height - margin) & (cx >= margin) & (cx < width - margin)


def frame_predictions(predictions, sizes, margins: dict):
    """``predictions`` (:class:`~medaidet.evaluation.predictions.Predictions`) with only the
    detections and annotated boxes that count in the frame: every count, error and
    threshold choice made on it follows the counting frame. ``sizes``: one ``(H, W)`` per
    image, or one for all."""
    from medaidet.evaluation.predictions import Predictions

    names = check_type(predictions, Predictions, "predictions", "Predictions").label_names
    sizes = checked_sizes(sizes, len(predictions))

    def kept(bboxes, labels, *others):
        masks = [in_frame(b, lb, s, margins, names) for b, lb, s in zip(bboxes, labels, sizes)]
        return [[x[m] for x, m in zip(column, masks)] for column in (bboxes, labels, *others)]

    pb, pl, ps = kept(predictions.pred_bboxes, predictions.pred_labels, predictions.pred_scores)
    gb, gl, gd = kept(predictions.gt_bboxes, predictions.gt_labels, predictions.gt_difficults)
    return Predictions(**{**predictions.__dict__, "pred_bboxes": pb, "pred_labels": pl,
                          "pred_scores": ps, "gt_bboxes": gb, "gt_labels": gl,
                          "gt_difficults": gd})


class FrameError(NamedTuple):
    """One count error in the frame: image ``index``, class ``label``, ``kind``, the
    ``box`` it is about and a ``score`` (see :func:`frame_errors`)."""
    index: int
    label: int
    kind: str
    box: np.ndarray
    score: float


def frame_errors(predictions, thresholds: dict, sizes, margins: dict) -> list:
    """Every count error of ``predictions`` (whole images) in the counting frame, each
    class counted at ``thresholds[class]``, as :class:`FrameError`. Detections and boxes
    are matched on the whole image, as AP matches them, and then looked at in the frame:

    * ``"false"``: a detection in the frame that matches no box (its score);
    * ``"missed"``: a box in the frame that no kept detection matches (the best score a
      detection of its class reached on it at IoU >= 0.5, at any threshold; 0 for none);
    * ``"line +"``/``"line -"``: a detection and its box on either side of the frame's line,
      the detection in (counted, its cell not) or out (its cell counted, the detection not);
      the box is the annotated one, the score the detection's.

    Per image and class, the framed count error is (line +) - (line -) + false - missed."""
    from medaidet.evaluation.matching import match_detections, voc_iou
    from medaidet.evaluation.predictions import Predictions

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
        taken = set(int(d) for d in match.matched_by if d >= 0)
        errors += [FrameError(i, int(pl[d]), "false", pb[d], float(ps[d]))
                   for d in np.flatnonzero(p_in) if int(d) not in taken]
        every, labels, scores = (getattr(predictions, f"pred_{k}")[i]
                                 for k in ("bboxes", "labels", "scores"))
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
    """Cells per :data:`PER_AREA` px² (or per mm² with ``pixel_um``, the side of a pixel in
    µm) of each class's inner frame: float (N images, C classes) from framed ``counts``
    (N, C) and one ``(H, W)`` per image (or one for all). NaN where a frame has no area."""
    try:
        counts = np.asarray(counts, dtype=float).reshape(-1, len(_checked_names(label_names)))
    except (TypeError, ValueError):
        raise ConfigError(f"counts: {counts!r:.60}; expected (images, {len(label_names)}) "
                          "numbers, one count per class") from None
    sizes = checked_sizes(sizes, len(counts))
    margin = margin_per_class(margins, label_names)
    area = np.array([[frame_area(s, m) for m in margin] for s in sizes]).reshape(counts.shape)
    if pixel_um is None:
        unit = PER_AREA
    else:
        pixel_um = check_number(pixel_um, "pixel_um", "positive")
        unit = 1e6 / pixel_um ** 2            # px² in one mm²
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(area > 0, counts / area * unit, np.nan)


def plot_frame(img, bbox, label, margins: dict, label_names, title: str = "") -> Figure:
    """One panel per class: the image (float (3, H, W) RGB 0-255), the class's inner frame
    dashed in its colour, each of its boxes solid when it counts, dash-dotted dark grey when
    not, and its centre as a dot (the point the rule looks at)."""
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
            ax.plot((x0 + x1) / 2, (y0 + y1) / 2, "o", ms=3.5,
                    color=color if counted[k] else "0.2")
        ax.set(xticks=[], yticks=[], title=f"{name}: {int(counted[ours].sum())} counted, "
               f"{int((~counted[ours]).sum())} not (margin {m:g} px)")
    fig.suptitle(title or "The counting frame: a cell counts when its centre (dot) lies inside "
                 "its class's frame (dashed); solid counted, dash-dotted grey not")
    return fig
