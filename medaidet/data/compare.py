"""Two annotations of the same images, box by box: what each one has that the other lacks.

:func:`compare_annotations` matches the boxes of every image (:func:`match_boxes`), e.g. BCCD's
and TXL-PBC's, and sorts the unmatched by size and distance to the border: a cell only one
annotation boxes is often a rule (a cell the border cuts), not a mistake. To compare two
detectors, use :func:`medaidet.evaluation.evaluate.paired_bootstrap`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from chainercv.utils import bbox_iou
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from medaidet.arguments import check_number, checked_bins, checked_boxes
from medaidet.colors import CLASS_COLORS
from medaidet.errors import ConfigError
from medaidet.tables import Table

__all__ = ["match_boxes", "compare_annotations", "Comparison", "draw_both",
           "SIZE_BINS", "BORDER_BINS"]

#: Box size (square root of the area, px) and distance to the border (px) bins of the tables.
SIZE_BINS = (0, 40, 70, 100, np.inf)
BORDER_BINS = (0, 2, 30, np.inf)      # [0, 2): touches the border, a cell the border cuts


def _iou_thresh(value) -> float:
    """An IoU to match at: in (0, 1]."""
    value = check_number(value, "iou_thresh", "probability")
    if value == 0:
        raise ConfigError("iou_thresh: 0 is out of range; expected a number in (0, 1] (at 0 "
                          "any two boxes of a class would be one cell)")
    return value


def match_boxes(bbox_a, label_a, bbox_b, label_b, iou_thresh: float = 0.5):
    """Pair boxes of the same class overlapping at least ``iou_thresh``, highest IoU first,
    each box at most once. Boxes: ``(y_min, x_min, y_max, x_max)``. Returns
    ``(pairs (K, 2) of indices into a and b, unmatched a indices, unmatched b indices)``."""
    iou_thresh = _iou_thresh(iou_thresh)
    bbox_a, label_a = checked_boxes(bbox_a, label_a, name="bbox_a")
    bbox_b, label_b = checked_boxes(bbox_b, label_b, name="bbox_b")
    with np.errstate(divide="ignore", invalid="ignore"):    # two empty boxes: no IoU, no pair
        iou = bbox_iou(bbox_a, bbox_b)
    ii, jj = np.nonzero((label_a[:, None] == label_b) & (iou >= iou_thresh))
    order = np.argsort(-iou[ii, jj], kind="stable")        # highest IoU first
    free_a, free_b, pairs = np.ones(len(bbox_a), bool), np.ones(len(bbox_b), bool), []
    for i, j in zip(ii[order], jj[order]):
        if free_a[i] and free_b[j]:
            free_a[i] = free_b[j] = False
            pairs.append((i, j))
    return (np.array(pairs, dtype=int).reshape(-1, 2), np.flatnonzero(free_a),
            np.flatnonzero(free_b))


@dataclass
class Comparison:
    """:func:`compare_annotations`'s result: ``rows``, one dict per image and class;
    ``unmatched``, one dict per box only one annotation has (size, border distance in px)."""
    names: tuple
    label_names: tuple
    rows: list
    unmatched: list

    def table(self) -> Table:
        """Per class: boxes in each annotation, matched, only in each."""
        a, b = self.names
        table = Table(["class", f"boxes {a}", f"boxes {b}", "matched", f"only {a}", f"only {b}"])
        for name in self.label_names:
            rows = [r for r in self.rows if r["class"] == name]
            table.append([name] + [sum(r[k] for r in rows)
                                   for k in ("a", "b", "matched", "only_a", "only_b")])
        return table

    def by(self, what: str, bins=None) -> Table:
        """The unmatched boxes counted by ``what`` (``'size'`` or ``'border'``) in ``bins``,
        per class and annotation."""
        if what not in ("size", "border"):
            raise ConfigError(f"what: {what!r}; expected 'size' or 'border'")
        bins = checked_bins((SIZE_BINS if what == "size" else BORDER_BINS) if bins is None
                            else bins)
        table = Table(["box size" if what == "size" else "distance to the border", "class",
                       *(f"only {n}" for n in self.names)])
        for lo, hi in zip(bins[:-1], bins[1:]):
            label = f"{lo:g}-{hi:g} px" if np.isfinite(hi) else f">= {lo:g} px"
            for name in self.label_names:
                table.append([label, name] + [
                    sum(1 for u in self.unmatched if u["class"] == name and u["which"] == n
                        and lo <= u[what] < hi) for n in self.names])
        return table

    def per_image(self, class_name: str) -> dict:
        """``{image id: (boxes in a, boxes in b)}`` for one class."""
        if class_name not in self.label_names:
            raise ConfigError(f"class_name: {class_name!r}; expected one of "
                              f"{', '.join(self.label_names)}")
        return {r["image"]: (r["a"], r["b"]) for r in self.rows if r["class"] == class_name}


def compare_annotations(a, b, names=("a", "b"), iou_thresh: float = 0.5) -> Comparison:
    """Compare two datasets of the same ``ids`` box by box (no image is decoded)."""
    iou_thresh = _iou_thresh(iou_thresh)
    for name, dataset in (("a", a), ("b", b)):
        if not all(hasattr(dataset, k) for k in ("ids", "sizes", "slice", "label_names")):
            raise ConfigError(f"{name}: got {type(dataset).__name__}; expected a dataset "
                              "(BCCDDataset, or TXLPBCDataset) of one split")
    if isinstance(names, str) or np.shape(names) != (2,):
        raise ConfigError(f"names: {names!r}; expected two names, one per annotation")
    if not len(a.ids):
        raise ConfigError("a: the datasets hold no image; compare two annotations of one split")
    if list(a.ids) != list(b.ids):
        raise ConfigError("compare_annotations: the two datasets hold different images; load "
                         "both with reannotated_only=True (or labels='txl-pbc')")
    rows, unmatched = [], []
    boxes_a, boxes_b = a.slice[:, ("bbox", "label")], b.slice[:, ("bbox", "label")]
    for i, image_id in enumerate(a.ids):
        (bbox_a, label_a), (bbox_b, label_b), (height, width) = boxes_a[i], boxes_b[i], a.sizes[i]
        pairs, only_a, only_b = match_boxes(bbox_a, label_a, bbox_b, label_b, iou_thresh)
        for c, name in enumerate(a.label_names):
            rows.append({"image": image_id, "class": name,
                         "a": int((label_a == c).sum()), "b": int((label_b == c).sum()),
                         "matched": int((label_a[pairs[:, 0]] == c).sum()),
                         "only_a": int((label_a[only_a] == c).sum()),
                         "only_b": int((label_b[only_b] == c).sum())})
        for which, bbox, label, idx in ((names[0], bbox_a, label_a, only_a),
                                        (names[1], bbox_b, label_b, only_b)):
            box = bbox[idx].reshape(-1, 4)
            box_size = np.sqrt((box[:, 2] - box[:, 0]) * (box[:, 3] - box[:, 1]))
            border = np.maximum(np.min([box[:, 0], box[:, 1], height - 1 - box[:, 2],
                                        width - 1 - box[:, 3]], axis=0), 0)
            unmatched += [{"image": image_id, "class": a.label_names[label[j]], "which": which,
                           "size": float(s), "border": float(f), "bbox": bbox[j].tolist()}
                          for j, s, f in zip(idx, box_size, border)]
    return Comparison(tuple(names), tuple(a.label_names), rows, unmatched)


def draw_both(img, boxes, names, title=None) -> Figure:
    """One image twice, side by side, with each annotation's boxes; ``boxes``: ``[(bbox,
    label, unmatched indices), ...]``, one per annotation (the unmatched drawn thick)."""
    fig = Figure(figsize=(6.4 * len(boxes), 5.2))
    axes = fig.subplots(1, len(boxes))
    hwc = np.asarray(img).transpose(1, 2, 0).astype(np.uint8)
    colors = list(CLASS_COLORS.values())
    for ax, (bbox, label, only), name in zip(np.atleast_1d(axes), boxes, names):
        ax.imshow(hwc)
        only = set(int(j) for j in only)
        for j, (y0, x0, y1, x1) in enumerate(np.asarray(bbox)):
            thick = j in only
            ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False,
                                   edgecolor=colors[int(label[j])],
                                   linewidth=3.2 if thick else 1.0,
                                   linestyle="-" if thick else "--"))
        ax.set_title(f"{name}: {len(bbox)} boxes, {len(only)} the other lacks (thick)")
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.95 if title else 1))
    return fig
