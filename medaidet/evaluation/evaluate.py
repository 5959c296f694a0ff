"""Evaluate a trained SSD on a BCCD split: VOC AP at IoU 0.5, two protocols, PR curves.

Notebook 04, sections 2 and 3; the predictions it scores come from
:mod:`medaidet.evaluation.predictions` (section 1).

The course computed its published test mAP (0.719) with the model in ChainerCV's default
'visualize' preset: only detections scoring at least 0.6 were scored. AP integrates
precision over *all* recall levels, so the detector must hand over its low-scoring
detections too; the 'evaluate' preset (score >= 0.01, NMS IoU 0.45) does. The model
predicts once, in the 'evaluate' preset, and two protocols are scored from the same
predictions:

* ``"evaluate"``: every detection (score >= 0.01) -- the correct protocol;
* ``"course"``: only detections scoring >= 0.6, as the original course did (by mistake).

Filtering the 0.01 predictions at 0.6 gives exactly what a forward pass at 0.6 would have
given: greedy NMS keeps or drops a box by looking only at higher-scoring boxes, and the
caps of :func:`medaidet.ssd.predict.predict` remove only the lowest-scoring candidates.

Both metrics are ChainerCV's (:func:`chainercv.evaluations.eval_detection_voc`): VOC area
AP (``use_07_metric=False``, what the course reported) and VOC2007's 11-point AP
(``use_07_metric=True``). A class with boxes but no detection has AP 0; a class without
any box in the split has AP NaN (``null`` in JSON) and is left out of the mean; a split
without any box at all has nothing to score and raises :class:`ConfigError`.
"""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field

import numpy as np
from chainercv.evaluations import calc_detection_voc_prec_rec, eval_detection_voc
from matplotlib.figure import Figure

from medaidet.colors import line_style
from medaidet.errors import ConfigError
from medaidet.evaluation.predictions import Predictions
from medaidet.evaluation.protocol import COURSE_PUBLISHED, IOU_THRESH, PROTOCOLS
from medaidet.numbers import finite_or_none
from medaidet.tables import Table

__all__ = ["ProtocolResult", "EvaluationResult", "evaluate", "plot_pr_curves", "n_scored_boxes"]


def n_scored_boxes(difficults) -> int:
    """Ground-truth boxes that count in AP (difficult ones are ignored), from each image's
    ``difficult`` flags."""
    return sum(int((~np.asarray(d, dtype=bool)).sum()) for d in difficults)


@dataclass
class ProtocolResult:
    """AP of one protocol. Arrays are per class (NaN: no box of the class in the split).

    ``precision[l]``/``recall[l]``: ChainerCV's PR curve of class ``l`` (detections in
    descending score order), ``None`` when the class has no box.
    """
    name: str
    score_thresh: float
    ap_voc: np.ndarray
    ap_voc07: np.ndarray
    n_gt: np.ndarray
    n_detections: np.ndarray
    precision: list
    recall: list

    @property
    def map_voc(self) -> float:
        return _nanmean(self.ap_voc)

    @property
    def map_voc07(self) -> float:
        return _nanmean(self.ap_voc07)


def _nanmean(values) -> float:
    values = np.asarray(values, dtype=float)
    return float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")


def _pad(values, n, fill=np.nan):
    out = np.full(n, fill, dtype=float)
    values = np.asarray(values, dtype=float)[:n]
    out[:len(values)] = values
    return out


def _score_protocol(preds: Predictions, name: str) -> ProtocolResult:

    n_class = len(preds.label_names)
    n_gt = np.zeros(n_class, dtype=int)
    n_det = np.zeros(n_class, dtype=int)
    for gl, gd in zip(preds.gt_labels, preds.gt_difficults):
        n_gt += np.bincount(gl[~gd], minlength=n_class)[:n_class]
    for pl in preds.pred_labels:
        n_det += np.bincount(pl, minlength=n_class)[:n_class]
    args = (preds.pred_bboxes, preds.pred_labels, preds.pred_scores,
            preds.gt_bboxes, preds.gt_labels, preds.gt_difficults)
    # ChainerCV sizes its arrays by the largest label seen: pad to every class.
    ap = _pad(eval_detection_voc(*args, iou_thresh=IOU_THRESH,
                                 use_07_metric=False)["ap"], n_class)
    ap07 = _pad(eval_detection_voc(*args, iou_thresh=IOU_THRESH,
                                   use_07_metric=True)["ap"], n_class)
    precision, recall = calc_detection_voc_prec_rec(*args, iou_thresh=IOU_THRESH)
    precision = (list(precision) + [None] * n_class)[:n_class]
    recall = (list(recall) + [None] * n_class)[:n_class]
    return ProtocolResult(name, preds.score_thresh, ap, ap07, n_gt, n_det,
                          precision, recall)


@dataclass(repr=False)
class EvaluationResult:
    """AP per class and mean for each protocol (see the module docs).

    ``protocols``: name -> :class:`ProtocolResult` (``"evaluate"``, ``"course"``).
    Shows as a table in Jupyter (``_repr_html_``) and in a terminal (``str``);
    :meth:`to_dict` / :meth:`to_json` for files.
    """
    label_names: tuple
    protocols: dict
    n_images: int
    split: str | None = None
    info: dict = field(default_factory=dict)

    def __getitem__(self, name) -> ProtocolResult:
        return self.protocols[name]

    def _rows(self):
        """(row name, [AP values in column order]) for every class and the mean."""
        rows = []
        for l, name in enumerate(self.label_names):
            rows.append((name, [v for p in self.protocols.values()
                                for v in (p.ap_voc[l], p.ap_voc07[l])],
                         int(next(iter(self.protocols.values())).n_gt[l])))
        rows.append(("mean", [v for p in self.protocols.values()
                              for v in (p.map_voc, p.map_voc07)], None))
        return rows

    def _columns(self):
        return [f"{kind} {name} (score>={p.score_thresh:g})"
                for name, p in self.protocols.items() for kind in ("AP", "AP07")]

    def __str__(self):
        head = (f"VOC AP at IoU {IOU_THRESH} on {self.split or 'the split'} "
                f"({self.n_images} images); AP = area (use_07_metric=False), "
                "AP07 = VOC2007 11-point")
        cols = ["class", "boxes"] + self._columns()
        table = [cols] + [[name, "" if n is None else str(n)] + [_fmt(v) for v in vals]
                          for name, vals, n in self._rows()]
        widths = [max(len(r[i]) for r in table) for i in range(len(cols))]
        lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                           for i, (c, w) in enumerate(zip(r, widths))) for r in table]
        return "\n".join([head] + lines + [_COURSE_NOTE])

    def __repr__(self):      # the text view, also what a notebook stores beside the HTML
        return str(self)

    def _repr_html_(self):
        esc = html.escape
        head = "".join(f"<th>{esc(c)}</th>" for c in ["class", "boxes"] + self._columns())
        body = "".join(
            "<tr><td>" + esc(name) + "</td><td>" + ("" if n is None else str(n)) + "</td>"
            + "".join(f"<td>{_fmt(v)}</td>" for v in vals) + "</tr>"
            for name, vals, n in self._rows())
        caption = esc(f"VOC AP at IoU {IOU_THRESH}, {self.split or 'split'}, "
                      f"{self.n_images} images")
        return (f"<table><caption>{caption}</caption><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table><p>{esc(_COURSE_NOTE)}</p>")

    def summary_table(self, published: bool = True) -> Table:
        """mAP and AP per class (VOC area), one row per protocol; first, with
        ``published``, the original course's published numbers at its score >= 0.6."""
        names = list(self.label_names)
        table = Table(["", "mAP", *names])
        if published:
            table.append(["original course (score >= 0.6, published)", COURSE_PUBLISHED["map"],
                          *(COURSE_PUBLISHED["ap"][c] for c in names)])
        for name, p in self.protocols.items():
            table.append([f"this model, {name} protocol (score >= {p.score_thresh:g})",
                          p.map_voc, *(float(v) for v in p.ap_voc)])
        return table

    def to_dict(self) -> dict:
        """JSON-ready: NaN (no box of a class) becomes ``None``."""
        protocols = {}
        for name, p in self.protocols.items():
            protocols[name] = {
                "score_thresh": p.score_thresh,
                "map_voc": finite_or_none(p.map_voc),
                "map_voc07": finite_or_none(p.map_voc07),
                "ap_voc": {c: finite_or_none(v) for c, v in zip(self.label_names, p.ap_voc)},
                "ap_voc07": {c: finite_or_none(v)
                             for c, v in zip(self.label_names, p.ap_voc07)},
                "n_gt": {c: int(v) for c, v in zip(self.label_names, p.n_gt)},
                "n_detections": {c: int(v) for c, v in zip(self.label_names, p.n_detections)},
            }
        return {"split": self.split, "n_images": self.n_images, "iou_thresh": IOU_THRESH,
                "label_names": list(self.label_names), "protocols": protocols,
                "course_published": COURSE_PUBLISHED, **self.info}

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), indent=2, **kwargs)


_COURSE_NOTE = ("The course published mAP 0.719 (rbc 0.760, wbc 0.965, platelets 0.432) "
                "with the 'course' protocol: score >= 0.6 hides low-scoring detections, "
                "truncates the PR curves and understates AP. Report the 'evaluate' protocol.")


def _fmt(value) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.3f}"


def evaluate(predictions: Predictions, label_names=None, protocols=None) -> EvaluationResult:
    """VOC area AP and VOC07 11-point AP at IoU 0.5 for each protocol.

    Args:
        predictions: from :func:`~medaidet.evaluation.predictions.predict_split`
            (scores ``>= 0.01``).
        label_names: default ``predictions.label_names``.
        protocols: name -> score threshold; default :data:`PROTOCOLS`. Each protocol
            keeps the detections scoring ``>=`` its threshold.

    Raises :class:`ConfigError` when no image has a ground-truth box.
    """
    if label_names is not None:
        predictions = Predictions(**{**predictions.__dict__, "label_names": tuple(label_names)})
    if not n_scored_boxes(predictions.gt_difficults):
        where = (f"split {predictions.split} has" if predictions.split else
                 "these predictions have")
        raise ConfigError(
            f"{where} no objects: nothing to evaluate. None of the {len(predictions)} "
            "images has a ground-truth box (difficult ones are ignored), so AP is undefined "
            "for every class. Evaluate images with boxes (`medaidet data validate ROOT` "
            "finds splits without objects)", "nothing_to_evaluate")
    protocols = PROTOCOLS if protocols is None else protocols
    results = {name: _score_protocol(predictions.filter(thresh), name)
               for name, thresh in protocols.items()}
    return EvaluationResult(predictions.label_names, results, len(predictions),
                            predictions.split)


def plot_pr_curves(result: EvaluationResult):
    """Precision-recall curve per class (one panel each), one line per protocol.

    The 'course' line stops where its recall runs out: everything below score 0.6 is lost.
    Returns a matplotlib ``Figure`` (not shown; ``fig.savefig(...)`` to write it).
    """

    n = len(result.label_names)
    fig = Figure(figsize=(4.2 * n, 4.0), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    styles = {proto: dict(line_style(k), marker=None, lw=2)     # no class colour: greys
              for k, proto in enumerate(result.protocols)}
    for l, (ax, name) in enumerate(zip(axes, result.label_names)):
        for proto, p in result.protocols.items():
            prec, rec = p.precision[l], p.recall[l]
            label = f"{proto} (score>={p.score_thresh:g}) AP {_fmt(p.ap_voc[l])}"
            if prec is None or rec is None or len(prec) == 0:    # no box or no detection
                ax.plot([], [], label=label + " (no curve)", **styles.get(proto, {}))
                continue
            ax.plot(np.nan_to_num(rec), np.nan_to_num(prec), label=label,
                    **styles.get(proto, {}))
        ax.set(title=f"{name} ({int(result[next(iter(result.protocols))].n_gt[l])} boxes)",
               xlabel="recall", ylabel="precision", xlim=(0, 1.02), ylim=(0, 1.02))
        ax.grid(alpha=0.3)
        ax.legend(loc="lower left", fontsize="small")
    fig.suptitle(f"Precision-recall at IoU {IOU_THRESH}, {result.split or 'split'} "
                 f"({result.n_images} images)")
    return fig


