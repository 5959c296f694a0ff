"""The sizes of the boxes a detector found and missed, at the model's input scale.

:func:`gt_box_sizes` measures the found and the missed ground-truth boxes at the model's
input (300x300 for SSD300 and the small SSD), to set beside the default boxes' sizes: the
small SSD's smallest is 20 px (:data:`medaidet.ssd.small.SIZES`), SSD300's 30 px; a class
whose missed boxes lie under the smallest default box is missed for its size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure

from medaidet.colors import bar_style
from medaidet.data.pinned import resolve_root
from medaidet.data.image import read_image_size
from medaidet.data.voc import image_path
from medaidet.arguments import checked_sizes
from medaidet.evaluation.predictions import Predictions, checked
from medaidet.evaluation.matching import as_boxes, match_predictions
from medaidet.evaluation.protocol import COUNT_SCORE_THRESH, IOU_THRESH

__all__ = ["BoxSizes", "gt_box_sizes", "plot_box_sizes", "image_sizes_of"]


@dataclass
class BoxSizes:
    """Sizes of the ground-truth boxes, found vs missed, per class.

    Size is ``sqrt(h * w)`` of the box rescaled to the model's ``input_size`` x
    ``input_size`` input (SSD resizes every image to a square, aspect ratio not kept), in
    pixels: the scale the default boxes' sizes are given at. ``found[name]`` /
    ``missed[name]``: float64 arrays (one size per box); difficult boxes are in neither.
    """
    label_names: tuple
    found: dict
    missed: dict
    input_size: int
    score_thresh: float
    iou_thresh: float = IOU_THRESH

    def rows(self) -> list:
        out = []
        for name in self.label_names:
            f, m = self.found[name], self.missed[name]
            out.append({"class": name, "found": len(f), "missed": len(m),
                        "recall": len(f) / (len(f) + len(m)) if len(f) + len(m) else math.nan,
                        "median_found": float(np.median(f)) if len(f) else math.nan,
                        "median_missed": float(np.median(m)) if len(m) else math.nan})
        return out

    def missed_fraction_below(self, size: float) -> dict:
        """Per class: of the boxes smaller than ``size`` px, the fraction missed (NaN: none)."""
        out = {}
        for name in self.label_names:
            f = int((self.found[name] < size).sum())
            m = int((self.missed[name] < size).sum())
            out[name] = m / (f + m) if f + m else math.nan
        return out

    def __str__(self):
        lines = [f"Ground-truth box sizes sqrt(h*w) at {self.input_size}x{self.input_size} "
                 f"px, detections at score >= {self.score_thresh:g}"]
        for r in self.rows():
            lines.append(f"{r['class']:>10}: found {r['found']:4d}{_median(r['median_found'])}, "
                         f"missed {r['missed']:4d}{_median(r['median_missed'])}")
        return "\n".join(lines)


def _median(value: float) -> str:
    return "" if math.isnan(value) else f" (median {value:5.1f} px)"


def image_sizes_of(predictions: Predictions, image_sizes, dataset, root):
    """(height, width) of every image of ``predictions``: ``image_sizes`` when given, else
    from ``dataset`` or the image files' headers under ``root`` (nothing is decoded)."""
    if image_sizes is not None:
        return [tuple(int(v) for v in size)
                for size in checked_sizes(image_sizes, len(checked(predictions)), "image_sizes")]

    root = resolve_root(getattr(dataset, "root", None) if root is None else root)
    # the header only: no image is decoded
    return [read_image_size(image_path(root, image_id), image_id)
            for image_id in predictions.ids]


def gt_box_sizes(predictions: Predictions, score_thresh: float = COUNT_SCORE_THRESH,
                 iou_thresh: float = IOU_THRESH, input_size: int = 300, image_sizes=None,
                 dataset=None, root=None) -> BoxSizes:
    """Sizes of the found and the missed ground-truth boxes per class, at the model's input.

    A box is found when a detection scoring ``>= score_thresh`` matches it
    (:func:`~medaidet.evaluation.matching.match_detections`), missed otherwise. Its size is ``sqrt(h * w)`` after the
    image is resized to ``input_size`` x ``input_size`` (300 for SSD300 and the small SSD,
    512 for SSD512): compare it with the model's default-box sizes (smallest: 20 px for
    the small SSD, :data:`medaidet.ssd.small.SIZES`; 30 px for SSD300).

    Args:
        image_sizes: ``(H, W)`` of each image; default: read from the image files'
            headers in ``root`` (or ``dataset.root``, else ``$MEDAIDET_DATA``).
    """
    matches = match_predictions(predictions, score_thresh, iou_thresh)
    sizes = image_sizes_of(predictions, image_sizes, dataset, root)
    label_names = tuple(predictions.label_names)
    found = {n: [] for n in label_names}
    missed = {n: [] for n in label_names}
    for i, m in enumerate(matches):
        h_img, w_img = sizes[i]
        bbox = as_boxes(predictions.gt_bboxes[i]).astype(np.float64)
        h = (bbox[:, 2] - bbox[:, 0]) * input_size / h_img
        w = (bbox[:, 3] - bbox[:, 1]) * input_size / w_img
        size = np.sqrt(np.clip(h, 0, None) * np.clip(w, 0, None))
        labels = np.asarray(predictions.gt_labels[i]).reshape(-1)
        for l, name in enumerate(label_names):
            found[name].extend(size[(labels == l) & m.found])
            missed[name].extend(size[(labels == l) & m.missed])
    return BoxSizes(label_names, {n: np.asarray(v, dtype=np.float64) for n, v in found.items()},
                    {n: np.asarray(v, dtype=np.float64) for n, v in missed.items()},
                    int(input_size), float(score_thresh), float(iou_thresh))


def plot_box_sizes(sizes: BoxSizes, default_box_sizes=(), classes=None):
    """Histograms of found vs missed box sizes, one panel per class (``classes``: default
    all), stacked, with a vertical line at each of ``default_box_sizes`` (up to four, e.g.
    ``(medaidet.ssd.small.SIZES[0], 30)`` for the small SSD's and SSD300's smallest; at the
    same input scale).

    Returns a matplotlib ``Figure``.
    """

    names = list(classes or sizes.label_names)
    fig = Figure(figsize=(4.2 * len(names), 3.6), layout="constrained")
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    for ax, name in zip(axes, names):
        f, m = sizes.found[name], sizes.missed[name]
        both = np.concatenate([f, m])
        bins = np.linspace(both.min(), both.max() + 1, 21) if len(both) else 10
        # found: solid dark bars; missed: white, dotted, stacked on top (as the drawings)
        counts_found, edges, _ = ax.hist(f, bins=bins, label=f"found ({len(f)})",
                                         **bar_style(0))
        ax.hist(m, bins=edges, bottom=counts_found, label=f"missed ({len(m)})",
                **dict(bar_style(0), color="white", hatch="..."))
        for s, ls in zip(default_box_sizes, ("--", "-.", ":", (0, (5, 1, 1, 1)))):
            ax.axvline(s, color="0.55", ls=ls, lw=1.8, label=f"default box {s:g} px")
        ax.set(title=name, xlabel=f"box size sqrt(h*w) at {sizes.input_size}x"
                                  f"{sizes.input_size} px", ylabel="boxes")
        ax.legend(fontsize="small")
    fig.suptitle(f"Found vs missed ground truth (score >= {sizes.score_thresh:g}, "
                 f"IoU >= {sizes.iou_thresh:g})")
    return fig
