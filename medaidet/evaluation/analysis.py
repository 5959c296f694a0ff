"""What a detector gets right and wrong, box by box (notebooks 04 and 05): VOC matching
(:func:`match_detections`), drawings, box sizes and where each missed box was lost
(:func:`box_outcomes`), at the first stage that holds: ``"no_candidate"`` (no same-class
candidate covers it at IoU >= 0.5), ``"low_score"`` (every covering score < t), ``"top_k"`` (the
per-class cap before NMS), ``"nms"`` (suppressed by a neighbour), ``"keep_top_k"`` (the image's
cap), ``"matching"`` (VOC matching gave the covering detection to another box). Boxes: float32
(R, 4) ``(y_min, x_min, y_max, x_max)`` in pixels; labels int32 (R,); scores float32 (R,).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from chainercv.utils import bbox_iou
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from medaidet.arguments import check_number, check_type, checked_bins, checked_sizes
from medaidet.colors import OUTCOME_LABELS, OUTCOME_STYLES, bar_style
from medaidet.data.bccd import AnnotationWarning, BCCDDataset, CLASS_COLORS, image_path
from medaidet.data.image import read_image_size
from medaidet.data.download import resolve_root
from medaidet.data.validate import validate_dataset
from medaidet.errors import ConfigError
from medaidet.evaluation.evaluate import Predictions, checked
from medaidet.evaluation.protocol import COUNT_SCORE_THRESH, IOU_THRESH
from medaidet.ssd.predict import Candidates

__all__ = [
    "DetectionMatch", "match_detections", "match_predictions", "voc_iou", "as_boxes",
    "BoxSizes", "gt_box_sizes", "plot_box_sizes", "image_sizes_of", "STYLES",
    "draw_detections", "plot_detections", "STAGES", "LOST_STAGES", "CANDIDATE_SETS",
    "BoxOutcomes", "images_missing_class", "recall_precision", "detection_scores",
    "plot_detection_scores", "box_outcomes", "stage_counts", "missed_by"]


@dataclass
class DetectionMatch:
    """One image's outcomes. bool (R,): ``kept`` (score ``>= score_thresh``), ``tp``, ``fp``,
    ``ignored`` (on a difficult box); ``missed`` bool (G,); ``matched_by`` int (G,), -1: none."""
    kept: np.ndarray
    tp: np.ndarray
    fp: np.ndarray
    ignored: np.ndarray
    missed: np.ndarray
    matched_by: np.ndarray

    @property
    def found(self) -> np.ndarray:      # bool (G,): boxes matched by a true positive
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
    pred_bbox, gt_bbox = as_boxes(pred_bbox), as_boxes(gt_bbox)
    pl, gl = (np.asarray(x, dtype=np.int32).reshape(-1) for x in (pred_label, gt_label))
    ps = np.asarray(pred_score, dtype=np.float32).reshape(-1)
    gd = np.asarray(np.zeros(len(gl)) if gt_difficult is None else gt_difficult,
                    dtype=bool).reshape(-1)
    if not (len(pl) == len(ps) == len(pred_bbox) and len(gl) == len(gd) == len(gt_bbox)):
        raise ConfigError(f"match_detections: {len(pred_bbox)} predicted boxes with {len(pl)} "
                          f"labels and {len(ps)} scores, {len(gt_bbox)} ground-truth boxes with "
                          f"{len(gl)} labels and {len(gd)} difficult flags; expected one each")
    return pred_bbox, pl, ps, gt_bbox, gl, gd


def voc_iou(a, b):
    """(N, M) IoU of ``a`` (N, 4) and ``b`` (M, 4), VOC's ``y_max``/``x_max`` + 1 as ChainerCV's."""
    a, b = (np.array(x).reshape(-1, 4) for x in (a, b))
    a[:, 2:] += 1
    b[:, 2:] += 1
    return bbox_iou(a, b)


def match_detections(pred_bbox, pred_label, pred_score, gt_bbox, gt_label,
                     gt_difficult=None, iou_thresh: float = IOU_THRESH,
                     score_thresh: float = COUNT_SCORE_THRESH) -> DetectionMatch:
    """:class:`DetectionMatch` of one image as VOC AP matches: per class by descending score, a
    detection is a TP if its best box (:func:`voc_iou` ``>= iou_thresh``) is free, else a FP;
    one on a difficult box is ignored, and a difficult box is never missed."""
    pred_bbox, pred_label, pred_score, gt_bbox, gt_label, gt_difficult = _matched_inputs(
        pred_bbox, pred_label, pred_score, gt_bbox, gt_label, gt_difficult)
    kept = pred_score >= score_thresh
    tp, fp, ignored = (np.zeros(len(pred_bbox), dtype=bool) for _ in range(3))
    matched_by = np.full(len(gt_bbox), -1, dtype=np.int64)
    for label in np.unique(pred_label[kept]):
        pred_idx = np.flatnonzero(kept & (pred_label == label))
        pred_idx = pred_idx[pred_score[pred_idx].argsort()[::-1]]     # ChainerCV's order, ties too
        gt_idx = np.flatnonzero(gt_label == label)
        if len(gt_idx) == 0:
            fp[pred_idx] = True
            continue
        iou = voc_iou(pred_bbox[pred_idx], gt_bbox[gt_idx])
        for p, b, covered in zip(pred_idx, iou.argmax(axis=1), iou.max(axis=1) >= iou_thresh):
            box = gt_idx[b]
            if covered and gt_difficult[box]:
                ignored[p] = True
            elif covered and matched_by[box] < 0:      # a free box
                tp[p], matched_by[box] = True, p
            else:
                fp[p] = True
    missed = (matched_by < 0) & ~gt_difficult
    return DetectionMatch(kept, tp, fp, ignored, missed, matched_by)


def match_predictions(predictions: Predictions, score_thresh: float = COUNT_SCORE_THRESH,
                      iou_thresh: float = IOU_THRESH) -> list:
    """:func:`match_detections` of every image of ``predictions``, in order."""
    p = checked(predictions)
    score_thresh = check_number(score_thresh, "score_thresh", "probability")
    iou_thresh = check_number(iou_thresh, "iou_thresh", "probability")
    return [match_detections(*image, iou_thresh=iou_thresh, score_thresh=score_thresh)
            for image in zip(p.pred_bboxes, p.pred_labels, p.pred_scores, p.gt_bboxes,
                             p.gt_labels, p.gt_difficults)]


@dataclass
class BoxSizes:
    """Non-difficult ground-truth box sizes per class, ``found[name]``/``missed[name]``: float64
    ``sqrt(h * w)`` in px in the image resized to ``input_size`` x ``input_size``."""
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
        below = {n: (int((self.found[n] < size).sum()), int((self.missed[n] < size).sum()))
                 for n in self.label_names}
        return {n: m / (f + m) if f + m else math.nan for n, (f, m) in below.items()}

    def __str__(self):
        def median(value):
            return "" if math.isnan(value) else f" (median {value:5.1f} px)"

        return "\n".join([f"Ground-truth box sizes sqrt(h*w) at {self.input_size}x"
                          f"{self.input_size} px, detections at score >= {self.score_thresh:g}"]
                         + [f"{r['class']:>10}: found {r['found']:4d}{median(r['median_found'])}"
                            f", missed {r['missed']:4d}{median(r['median_missed'])}"
                            for r in self.rows()])


def image_sizes_of(predictions: Predictions, image_sizes, dataset, root):
    """(H, W) per image: ``image_sizes``, else read from the image files' headers under ``root``."""
    if image_sizes is not None:
        return [tuple(int(v) for v in size)
                for size in checked_sizes(image_sizes, len(checked(predictions)), "image_sizes")]
    root = resolve_root(getattr(dataset, "root", None) if root is None else root)
    return [read_image_size(image_path(root, image_id), image_id) for image_id in predictions.ids]


def gt_box_sizes(predictions: Predictions, score_thresh: float = COUNT_SCORE_THRESH,
                 iou_thresh: float = IOU_THRESH, input_size: int = 300, image_sizes=None,
                 dataset=None, root=None) -> BoxSizes:
    """:class:`BoxSizes` of the boxes found (matched at ``score_thresh``) and missed."""
    checked(predictions)
    score_thresh = check_number(score_thresh, "score_thresh", "probability")
    boxes = box_outcomes(predictions, None, (score_thresh,), iou_thresh, 0.0, input_size,
                         image_sizes_of(predictions, image_sizes, dataset, root))
    found, names = boxes.found[score_thresh], boxes.label_names
    return BoxSizes(names, {n: boxes.size[(boxes.label == l) & found] for l, n in enumerate(names)},
                    {n: boxes.size[(boxes.label == l) & ~found] for l, n in enumerate(names)},
                    int(input_size), score_thresh, float(iou_thresh))


def plot_box_sizes(sizes: BoxSizes, default_box_sizes=(), classes=None):
    """A ``Figure``: found vs missed box sizes per class, a line at each ``default_box_sizes``."""
    names = list(classes or sizes.label_names)
    fig = Figure(figsize=(4.2 * len(names), 3.6), layout="constrained")
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    for ax, name in zip(axes, names):
        f, m = sizes.found[name], sizes.missed[name]
        both = np.concatenate([f, m])
        bins = np.linspace(both.min(), both.max() + 1, 21) if len(both) else 10
        counts_found, edges, _ = ax.hist(f, bins=bins, label=f"found ({len(f)})", **bar_style(0))
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


#: ``Rectangle`` keywords per outcome: no class colour, told apart by line style.
STYLES = OUTCOME_STYLES


def _class_index(class_filter, label_names):
    if class_filter is None:
        return None
    names = [n.lower() for n in label_names]
    if isinstance(class_filter, str) and class_filter.lower() in names:
        return names.index(class_filter.lower())
    if not isinstance(class_filter, str) and 0 <= int(class_filter) < len(names):
        return int(class_filter)
    raise ConfigError(f"class_filter: {class_filter!r} is not a class; expected one of "
                      f"{', '.join(label_names)} or its index, 0 to {len(names) - 1}")


def _of_class(labels, class_index) -> np.ndarray:
    """bool mask of ``labels`` equal to ``class_index`` (all True for None)."""
    labels = np.asarray(labels).reshape(-1)
    return np.ones(len(labels), dtype=bool) if class_index is None else labels == class_index


def _legend_handles(totals):
    return [Patch(facecolor="none", label=f"{OUTCOME_LABELS[kind]} ({totals[kind]})",
                  **STYLES[kind]) for kind in ("tp", "fp", "missed")]


def draw_detections(ax, img, pred_bbox, pred_label, pred_score, gt_bbox, gt_label,
                    label_names, score_thresh: float = COUNT_SCORE_THRESH,
                    iou_thresh: float = IOU_THRESH, gt_difficult=None, class_filter=None,
                    title: str | None = None, legend: bool = True,
                    show_scores: bool = False) -> DetectionMatch:
    """Draw ``img`` and its TP, FP and missed boxes on ``ax`` (:data:`STYLES`, notebook 04), of
    ``class_filter`` (a name or index) only; returns the :class:`DetectionMatch` of all classes."""
    label_names = tuple(label_names)
    pred_bbox, pred_label, pred_score, gt_bbox, gt_label, gt_difficult = _matched_inputs(
        pred_bbox, pred_label, pred_score, gt_bbox, gt_label, gt_difficult)
    match = match_detections(pred_bbox, pred_label, pred_score, gt_bbox, gt_label,
                             gt_difficult, iou_thresh, score_thresh)
    only = _class_index(class_filter, label_names)
    img = np.asarray(img)
    if img.ndim != 3 or img.shape[0] not in (1, 3):
        raise ConfigError(f"img: shape {img.shape}; expected float (3, H, W) RGB 0-255")
    ax.imshow(np.clip(np.broadcast_to(img, (3, *img.shape[1:])).transpose(1, 2, 0), 0, 255)
              .astype(np.uint8))
    tags = [n[:1].upper() for n in label_names]       # class initials, or names if two collide
    tags = tags if len(set(tags)) == len(tags) else list(label_names)
    drawn = {}
    for kind, boxes, labels, mask in (
            ("missed", gt_bbox, gt_label, match.missed & _of_class(gt_label, only)),
            ("fp", pred_bbox, pred_label, match.fp & _of_class(pred_label, only)),
            ("tp", pred_bbox, pred_label, match.tp & _of_class(pred_label, only))):
        style, missed = STYLES[kind], kind == "missed"
        drawn[kind] = int(mask.sum())
        for i in np.flatnonzero(mask):
            text = tags[labels[i]] if 0 <= labels[i] < len(tags) else str(labels[i])
            if show_scores and not missed:
                text += f" {pred_score[i]:.2f}"
            y0, x0, y1, x1 = (float(v) for v in boxes[i])
            ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, gid=kind, **style))
            # missed boxes tagged below their corner, detections above: an FP on one readable
            ax.text(x0 + 1, (y1 - 1) if missed else (y0 + 1), text, fontsize=8, fontweight="bold",
                    color="black" if missed else "white", va="bottom" if missed else "top",
                    bbox=dict(facecolor="white" if missed else style["edgecolor"],
                              edgecolor=style["edgecolor"] if missed else "none", pad=0.6,
                              alpha=0.85), clip_on=True)
    # kept detections / annotated boxes per class: "rbc 18/21 · wbc 1/1 · platelets 0/2"
    counts = " · ".join(f"{label_names[l]} {int(np.sum(match.kept & (pred_label == l)))}"
                        f"/{int(np.sum(gt_label == l))}"
                        for l in (range(len(label_names)) if only is None else [only]))
    ax.set_title(counts if not title else f"{title}\n{counts}", fontsize=9)
    ax.set_axis_off()
    if legend:
        ax.legend(handles=_legend_handles(drawn), loc="upper right", fontsize="x-small",
                  framealpha=0.8)
    return match


def _dataset(predictions: Predictions, dataset, root):
    """``dataset``, or by default the BCCD split the predictions were made on."""
    if dataset is not None:
        return dataset
    if predictions.split is None:
        raise ConfigError("plot_detections: the predictions do not say their split; pass "
                          "dataset= (e.g. BCCDDataset(root, 'test')), whose images they are")
    with warnings.catch_warnings():     # predicting warned about these annotations already
        warnings.simplefilter("ignore", AnnotationWarning)
        return BCCDDataset(root, predictions.split, use_difficult=True)


def _image(dataset, index, position, image_id):
    if index is not None:
        if image_id not in index:
            raise ConfigError(f"image {image_id!r} of the predictions is not in the dataset "
                              "given: pass the dataset they were made on")
        position = index[image_id]
    if hasattr(dataset, "slice") and "img" in getattr(dataset, "keys", ()):
        return dataset.slice[:, "img"][position]     # decodes the image only
    item = dataset[position]
    return item[0] if isinstance(item, tuple) else item


def _chosen(predictions: Predictions, indices, n: int, sort_by, outcomes) -> list:
    """The positions :func:`plot_detections` shows: ``indices`` checked, or the first ``n``."""
    if indices is None:
        order = list(range(len(predictions)))
        if sort_by is not None:     # outcomes: (tp, missed, fp) per image
            weights = {"missed": (0, 1, 0), "fp": (0, 0, 1), "errors": (0, 1, 1)}
            if sort_by not in weights:
                raise ConfigError(f"sort_by: {sort_by!r}; expected 'missed', 'fp' or 'errors'")
            order.sort(key=lambda i: -np.dot(weights[sort_by], outcomes[i]))  # stable
        return order[:n]
    position = {image_id: i for i, image_id in enumerate(predictions.ids)}
    indices = [position[i] if isinstance(i, str) and i in position else i for i in indices]
    bad = [i for i in indices
           if isinstance(i, str) or not -len(predictions) <= int(i) < len(predictions)]
    if bad:
        raise ConfigError(f"indices: {bad} are neither positions (0 to {len(predictions) - 1}) "
                          "nor image ids of the predictions")
    return [int(i) % len(predictions) for i in indices]


def plot_detections(predictions: Predictions, indices=None, n: int = 6, label_names=None,
                    score_thresh: float = COUNT_SCORE_THRESH, class_filter=None,
                    dataset=None, root=None, sort_by: str | None = None, ncols: int = 3,
                    iou_thresh: float = IOU_THRESH, show_scores: bool = False):
    """A ``Figure`` of :func:`draw_detections` panels of ``indices`` (positions or ids; default
    the first ``n``, or with most ``sort_by``); ``score_thresh``: one or one per class."""
    label_names = tuple(label_names or predictions.label_names)
    if isinstance(score_thresh, dict):
        at = "scores >= " + ", ".join(f"{n} {t:g}" for n, t in score_thresh.items())
        predictions = predictions.filter(score_thresh)
        score_thresh = predictions.score_thresh
    else:
        at = f"score >= {score_thresh:g}"
        if score_thresh < predictions.score_thresh:
            raise ConfigError(f"score_thresh: {score_thresh} is below the predictions' lowest "
                              f"score, {predictions.score_thresh:g}")
    only = _class_index(class_filter, label_names)
    # per image, of class only (None: all): (tp, missed, fp)
    outcomes = [(int((m.tp & _of_class(pl, only)).sum()),
                 int((m.missed & _of_class(gl, only)).sum()),
                 int((m.fp & _of_class(pl, only)).sum()))
                for m, pl, gl in zip(match_predictions(predictions, score_thresh, iou_thresh),
                                     predictions.pred_labels, predictions.gt_labels)]
    indices = _chosen(predictions, indices, n, sort_by, outcomes)
    if not indices:
        raise ConfigError("plot_detections: no image to show (empty predictions or indices)")
    dataset = _dataset(predictions, dataset, root)
    ids = getattr(dataset, "ids", None)
    index = None if ids is None else {image_id: i for i, image_id in enumerate(ids)}
    ncols = max(1, min(int(ncols), len(indices)))
    nrows = math.ceil(len(indices) / ncols)
    fig = Figure(figsize=(4.6 * ncols, 3.9 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    p = predictions
    for ax, i in zip(axes, indices):
        draw_detections(ax, _image(dataset, index, i, p.ids[i]), p.pred_bboxes[i],
                        p.pred_labels[i], p.pred_scores[i], p.gt_bboxes[i], p.gt_labels[i],
                        label_names, score_thresh, iou_thresh, p.gt_difficults[i], class_filter,
                        title=str(p.ids[i]), legend=False, show_scores=show_scores)
    for ax in axes[len(indices):]:
        ax.set_axis_off()
    totals = dict(zip(("tp", "missed", "fp"), np.sum([outcomes[i] for i in indices], axis=0)))
    what = "" if only is None else f"{label_names[only]} only; "
    fig.suptitle(f"Detections at {at} vs ground truth ({what}{predictions.split or 'split'}, "
                 f"IoU >= {iou_thresh:g}); titles: predicted/annotated per class")
    fig.legend(handles=_legend_handles(totals), loc="outside lower center", ncols=3,
               fontsize="small")
    return fig


def images_missing_class(ids=None, report=None, root=None, brief: bool = False) -> dict:
    """``{image id: [detail, ...]}`` of ``report``'s (default ``validate_dataset(root)``)
    ``missing_class`` findings; with ``brief``, ``{image id: "no rbc box"}`` (for count_cells)."""
    report = validate_dataset(root) if report is None else report
    wanted = None if ids is None else set(ids)
    out = {}
    for issue in report.by_kind("missing_class"):
        if wanted is None or issue.image in wanted:
            out.setdefault(issue.image, []).append(issue.detail)
    if brief:
        return {image: "; ".join(d.split(";")[0].split(",")[0] for d in details)
                for image, details in out.items()}
    return out


def recall_precision(predictions: Predictions, score_threshs=(0.5, 0.6),
                     iou_thresh: float = IOU_THRESH) -> list:
    """Recall and precision (NaN: 0 / 0) of VOC matching, a dict per score threshold and class:
    ``score_thresh``, ``class``, ``n_gt``, ``tp``, ``fp``, ``missed``, ``recall``, ``precision``."""
    names = predictions.label_names
    n_gt = [sum(int(((np.asarray(gl) == l) & ~np.asarray(gd, dtype=bool)).sum())
                for gl, gd in zip(predictions.gt_labels, predictions.gt_difficults))
            for l in range(len(names))]
    rows = []
    for t in score_threshs:
        scores = detection_scores(predictions, check_number(t, "score_thresh", "probability"),
                                  iou_thresh)
        for l, name in enumerate(names):
            tp, fp = len(scores[name]["tp"]), len(scores[name]["fp"])
            rows.append({"score_thresh": float(t), "class": name, "n_gt": n_gt[l], "tp": tp,
                         "fp": fp, "missed": n_gt[l] - tp,
                         "recall": tp / n_gt[l] if n_gt[l] else math.nan,
                         "precision": tp / (tp + fp) if tp + fp else math.nan})
    return rows


def detection_scores(predictions: Predictions, score_thresh: float | None = None,
                     iou_thresh: float = IOU_THRESH) -> dict:
    """``{class name: {"tp": float64 scores, "fp": float64 scores}}`` at ``score_thresh``."""
    t = predictions.score_thresh if score_thresh is None else score_thresh
    out = {n: {"tp": [], "fp": []} for n in predictions.label_names}
    for i, m in enumerate(match_predictions(predictions, t, iou_thresh)):
        pl = np.asarray(predictions.pred_labels[i])
        ps = np.asarray(predictions.pred_scores[i], dtype=np.float64)
        for l, name in enumerate(predictions.label_names):
            out[name]["tp"].extend(ps[m.tp & (pl == l)])
            out[name]["fp"].extend(ps[m.fp & (pl == l)])
    return {n: {k: np.asarray(v, dtype=np.float64) for k, v in d.items()} for n, d in out.items()}


def plot_detection_scores(scores: dict, thresholds=(0.5, 0.6), split: str | None = None):
    """A ``Figure``: histograms of :func:`detection_scores` per class, ``thresholds`` dotted."""
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
        ax.set(yscale="log", title=name, xlabel="detection score", ylabel="detections (log scale)")
        ax.legend(fontsize="x-small")
    where = f", {split}" if split else ""
    fig.suptitle(f"Scores of true vs false positives (VOC matching at IoU 0.5){where}; "
                 f"dotted: {', '.join(f'{t:g}' for t in thresholds)}", fontsize=9)
    return fig


#: Candidate sets, in the order prediction narrows them (see :class:`BoxOutcomes`).
CANDIDATE_SETS = ("all", "top_k", "nms", "kept")
#: Where a missed box was lost, earliest first (module docs).
LOST_STAGES = ("no_candidate", "low_score", "top_k", "nms", "keep_top_k", "matching")
#: Every outcome of a box: found, or lost at one stage.
STAGES = ("found",) + LOST_STAGES


@dataclass
class BoxOutcomes:
    """Per non-difficult box (B): ``image_id``, ``label``, ``size`` (as :class:`BoxSizes`),
    ``crowding`` (same-class boxes with IoU ``> crowd_iou``); ``best``: set -> float64 (B,), best
    covering candidate score (0: none, NaN: no candidates); ``found``: threshold -> bool (B,)."""
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
        """Object array (B,): ``"found"`` or the stage each box was lost at (module docs)."""
        found = self._found(score_thresh)
        if np.isnan(self.best["all"]).any():
            raise ConfigError("stage: these outcomes were computed without candidates; pass "
                              "box_outcomes candidates= (predict_weights(return_candidates=True))")
        out = np.full(len(self), "matching", dtype=object)
        # from the last stage to the first: the earliest that holds wins
        for stage, best in (("keep_top_k", "kept"), ("nms", "nms"), ("top_k", "top_k"),
                            ("low_score", "all")):
            out[self.best[best] < score_thresh] = stage
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
        return BoxOutcomes(self.label_names, self.image_id[keep], self.label[keep], self.size[keep],
                           self.crowding[keep], {k: v[keep] for k, v in self.best.items()},
                           {k: v[keep] for k, v in self.found.items()}, self.input_size,
                           self.crowd_iou, self.iou_thresh, self.split)


def _best_scores(cand: Candidates, gt_bbox, gt_label, iou_thresh) -> dict:
    """Per candidate set, float64 (G,): best same-class candidate score covering each box."""
    covers = ((voc_iou(cand.bbox, gt_bbox) >= iou_thresh)
              & (np.asarray(cand.label)[:, None] == gt_label[None, :]))       # (C, G)
    score = np.asarray(cand.score, dtype=np.float64)[:, None]
    masks = {"all": np.ones(len(score), bool), "top_k": cand.in_top_k, "nms": cand.after_nms,
             "kept": cand.kept}
    return {k: np.where(covers & np.asarray(masks[k])[:, None], score, 0.0).max(0, initial=0.0)
            for k in CANDIDATE_SETS}


def box_outcomes(predictions: Predictions, candidates=None, score_threshs=(0.5, 0.6),
                 iou_thresh: float = IOU_THRESH, crowd_iou: float = 0.0,
                 input_size: int = 300, image_sizes=None, root=None) -> BoxOutcomes:
    """:class:`BoxOutcomes`, found at each ``score_threshs``; ``candidates``: per image, or None."""
    if candidates is not None and len(candidates) != len(predictions):
        raise ConfigError(f"candidates: {len(candidates)} entries for {len(predictions)} images")
    found = {check_number(t, "score_threshs", "probability"): []
             for t in np.atleast_1d(score_threshs)}
    matches = {t: match_predictions(predictions, t, iou_thresh) for t in found}
    sizes = image_sizes_of(predictions, image_sizes, None, root)
    cols = {k: [] for k in ("image_id", "label", "size", "crowding", *CANDIDATE_SETS)}
    for i, image_id in enumerate(predictions.ids):
        gb = as_boxes(predictions.gt_bboxes[i])
        gl = np.asarray(predictions.gt_labels[i], dtype=np.int32).reshape(-1)
        use = ~np.asarray(predictions.gt_difficults[i], dtype=bool).reshape(-1)
        (height, width), (y0, x0, y1, x1) = sizes[i], gb.astype(np.float64).T
        size = np.sqrt(np.clip((y1 - y0) * input_size / height, 0, None)
                       * np.clip((x1 - x0) * input_size / width, 0, None))
        # crowding: plain IoU of the annotated boxes (overlap as drawn), difficult ones left out
        iou = bbox_iou(gb, gb)
        same = (gl[:, None] == gl[None, :]) & ~np.eye(len(gl), dtype=bool)
        best = (dict.fromkeys(CANDIDATE_SETS, np.full(len(gl), np.nan)) if candidates is None
                else _best_scores(candidates[i], gb, gl, iou_thresh))
        for k, v in {"image_id": np.full(len(gl), image_id, dtype=object), "label": gl,
                     "size": size, "crowding": ((iou > crowd_iou) & same & use).sum(axis=1),
                     **best}.items():
            cols[k].append(v[use])
        for t in found:
            found[t].append(matches[t][i].found[use])

    def cat(parts, dtype):
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

    return BoxOutcomes(tuple(predictions.label_names), cat(cols["image_id"], object),
                       cat(cols["label"], np.int32), cat(cols["size"], np.float64),
                       cat(cols["crowding"], np.int64),
                       {k: cat(cols[k], np.float64) for k in CANDIDATE_SETS},
                       {t: cat(v, bool) for t, v in found.items()}, int(input_size),
                       float(crowd_iou), float(iou_thresh), predictions.split)


def stage_counts(outcomes: BoxOutcomes, score_thresh: float) -> dict:
    """``{class name: {stage: boxes}}`` over :data:`STAGES`, plus ``"n_gt"`` and ``"recall"``."""
    stage = check_type(outcomes, BoxOutcomes, "outcomes", "BoxOutcomes").stage(score_thresh)
    out = {}
    for l, name in enumerate(outcomes.label_names):
        of = outcomes.label == l
        row, n_gt = {s: int((stage[of] == s).sum()) for s in STAGES}, int(of.sum())
        out[name] = {**row, "n_gt": n_gt, "recall": row["found"] / n_gt if n_gt else math.nan}
    return out


def missed_by(outcomes: BoxOutcomes, score_thresh: float, by: str, bins) -> dict:
    """``{class name: [{"bin": (lo, hi), "n", "missed", "miss_rate"}, ...]}`` of the boxes whose
    ``by`` (``"size"`` or ``"crowding"``) is in each bin, ``lo <= value < hi``."""
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
