"""Two annotations of the same images (e.g. BCCD's and TXL-PBC's), box by box (notebook 10):
:func:`compare_annotations` sorts the boxes only one has by size and distance to the border (a
cell only one annotation boxes is often a rule, a cell the border cuts, not a mistake)."""
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
    if (value := check_number(value, "iou_thresh", "probability")) == 0:
        raise ConfigError("iou_thresh: 0 is out of range; expected a number in (0, 1]")
    return value


def match_boxes(bbox_a, label_a, bbox_b, label_b, iou_thresh: float = 0.5):
    """Pair boxes ``(y_min, x_min, y_max, x_max)`` of one class overlapping >= ``iou_thresh``,
    highest IoU first, each at most once: ``(pairs (K, 2), unmatched of a, unmatched of b)``."""
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
            table.append([name] + [sum(r[k] for r in self.rows if r["class"] == name)
                                   for k in ("a", "b", "matched", "only_a", "only_b")])
        return table

    def by(self, what: str, bins=None) -> Table:
        """Unmatched boxes per class and annotation by ``what`` (``'size'``, ``'border'``)."""
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
        labels = {"a": label_a, "b": label_b, "matched": label_a[pairs[:, 0]],
                  "only_a": label_a[only_a], "only_b": label_b[only_b]}
        rows += [{"image": image_id, "class": name,
                  **{k: int((v == c).sum()) for k, v in labels.items()}}
                 for c, name in enumerate(a.label_names)]
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
    hwc, colors = np.asarray(img).transpose(1, 2, 0).astype(np.uint8), list(CLASS_COLORS.values())
    for ax, (bbox, label, only), name in zip(np.atleast_1d(fig.subplots(1, len(boxes))), boxes,
                                             names):
        ax.imshow(hwc)
        only = {int(j) for j in only}
        for j, (y0, x0, y1, x1) in enumerate(np.asarray(bbox)):
            width, style = (3.2, "-") if j in only else (1.0, "--")
            ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, linewidth=width,
                                   linestyle=style, edgecolor=colors[int(label[j])]))
        ax.set_title(f"{name}: {len(bbox)} boxes, {len(only)} the other lacks (thick)")
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.95 if title else 1))
    return fig
