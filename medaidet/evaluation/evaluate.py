"""Evaluating a trained SSD on a BCCD split (notebook 04): VOC AP at IoU 0.5, two protocols.

The model runs once in the 'evaluate' preset (score >= 0.01, NMS IoU 0.45; section 1); higher
thresholds are applied afterwards, as a forward pass at them would. Protocols (sections 2, 3):
``"evaluate"``, every detection (the correct one); ``"course"``, scores >= 0.6, as the course
computed its published mAP 0.719 (by mistake). Metrics: ChainerCV's VOC area AP and VOC2007
11-point AP; a class with boxes but no detection has AP 0, one without boxes NaN (``null`` in
JSON), left out of the mean. Boxes: float32 (R, 4) ``(y_min, x_min, y_max, x_max)`` in pixels.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from chainercv.evaluations import calc_detection_voc_ap, calc_detection_voc_prec_rec
from matplotlib.figure import Figure

from medaidet.arguments import check_number, check_type, prepare_output_dir
from medaidet.colors import line_style
from medaidet.data import BCCD_LABEL_NAMES
from medaidet.data.bccd import BCCDDataset, split_path
from medaidet.data.download import resolve_root
from medaidet.device import DEFAULT_DEVICE, resolve_device
from medaidet.errors import ConfigError, WeightsError
from medaidet.evaluation.protocol import (COURSE_PUBLISHED, EVALUATE_SCORE_THRESH, IOU_THRESH,
                                          PROTOCOLS)
from medaidet.files import png_bytes, write_files
from medaidet.numbers import finite_or_none
from medaidet.ssd.model import build_ssd, model_of_weights
from medaidet.ssd.predict import DEFAULT_KEEP_TOP_K, DEFAULT_TOP_K, predict
from medaidet.ssd.weights import load_weights, shipped_weights
from medaidet.tables import ShownAsTable, Table

__all__ = [
    "Predictions", "checked", "predict_split", "bootstrap", "paired_bootstrap", "load_model",
    "course_weights", "missing_weights_error", "ProtocolResult", "EvaluationResult",
    "evaluate", "plot_pr_curves", "n_scored_boxes", "check_run", "predict_weights",
    "check_ground_truth", "evaluate_weights"]


def missing_weights_error(path: Path) -> WeightsError:
    return WeightsError(f"no trained weights at {path}: run notebook 03_training.ipynb or "
                        "`medaidet train` first, then pass the weights file it writes",
                        "missing", path=path)


_PER_IMAGE = ("ids", "pred_bboxes", "pred_labels", "pred_scores", "gt_bboxes", "gt_labels",
              "gt_difficults")


@dataclass
class Predictions:
    """Detections and ground truth of one split, one list entry per image (module docs);
    ``gt_difficults[i]``: bool (G,); ``score_thresh``: the lowest score the predictions hold."""
    ids: list
    pred_bboxes: list
    pred_labels: list
    pred_scores: list
    gt_bboxes: list
    gt_labels: list
    gt_difficults: list
    label_names: tuple
    score_thresh: float = EVALUATE_SCORE_THRESH
    split: str | None = None
    model: str | None = None          # the model's name (MODEL_NAMES), when known
    seconds: float | None = None      # how long predicting took, when measured

    def __post_init__(self):
        if self.gt_difficults is None:
            self.gt_difficults = [np.zeros(len(lb), dtype=bool) for lb in self.gt_labels]
        for name in _PER_IMAGE[1:]:
            if len(getattr(self, name)) != len(self.ids):
                raise ConfigError(f"Predictions.{name} has {len(getattr(self, name))} "
                                  f"entries for {len(self.ids)} images")
        self.label_names = tuple(self.label_names)

    def __len__(self):
        return len(self.ids)

    def filter(self, score_thresh) -> "Predictions":
        """The detections scoring ``>= score_thresh`` (ground truth unchanged): one threshold,
        or ``{class name: threshold}`` naming every class (notebook 05)."""
        names = self.label_names
        if not isinstance(score_thresh, dict):
            score_thresh = dict.fromkeys(names, check_number(score_thresh, "score_thresh",
                                                             "probability"))
        missing = [n for n in names if n not in score_thresh]
        unknown = [n for n in score_thresh if n not in names]
        if missing or unknown:
            raise ConfigError(f"score_thresh: missing {missing or 'none'}, unknown "
                              f"{unknown or 'none'}; expected one per class of {names}")
        per_class = np.array([check_number(score_thresh[n], f"score_thresh[{n!r}]",
                                           "probability") for n in names])
        lowest = float(per_class.min())
        if lowest < self.score_thresh:
            raise ConfigError(f"score_thresh: {lowest} is below {self.score_thresh}, the lowest "
                              "score these predictions hold: predict again at a lower one")
        keep = [s >= per_class[np.asarray(lb, dtype=int)]
                for s, lb in zip(self.pred_scores, self.pred_labels)]
        return replace(self, ids=list(self.ids), score_thresh=max(lowest, self.score_thresh),
                       **{name: [x[k] for x, k in zip(getattr(self, name), keep)]
                          for name in ("pred_bboxes", "pred_labels", "pred_scores")})

    def take(self, indices) -> "Predictions":
        """The images at ``indices`` (in that order, repeats allowed: a bootstrap sample)."""
        indices = np.asarray(indices)
        if indices.ndim != 1 or indices.size and (indices.dtype.kind not in "iu" or not (
                (-len(self) <= indices) & (indices < len(self))).all()):
            raise ConfigError(f"indices: {indices!r:.60}; expected positions 0 to {len(self) - 1}")
        return replace(self, seconds=None,
                       **{name: [getattr(self, name)[i] for i in indices] for name in _PER_IMAGE})

    def scored_against(self, dataset) -> "Predictions":
        """These detections scored against ``dataset``'s boxes (the same images' other labels)."""
        ids = getattr(dataset, "ids", None)       # a slice of a dataset has none
        if len(dataset) != len(self) or ids is not None and list(ids) != list(self.ids):
            raise ConfigError("scored_against: the dataset holds other images than the predictions")
        boxes = dataset.slice[:, ("bbox", "label")]
        return replace(self, gt_bboxes=[np.asarray(b, np.float32) for b, _ in boxes],
                       gt_labels=[np.asarray(lb, np.int32) for _, lb in boxes], gt_difficults=None)


def checked(predictions, name: str = "predictions") -> Predictions:
    """``predictions`` if it is :class:`Predictions`; else a ConfigError naming ``name``."""
    return check_type(predictions, Predictions, name, "Predictions (from predict_split)")


def _resamples(n_images: int, n: int, seed: int) -> list:
    """``n`` draws of ``n_images`` image indices with replacement."""
    if not n_images:
        raise ConfigError("predictions: no image to resample; a bootstrap needs at least one")
    n = check_number(n, "n", "positive", integer=True)
    rng = np.random.default_rng(check_number(seed, "seed", "seed", integer=True))
    return [rng.integers(0, n_images, n_images) for _ in range(n)]


def _interval(samples, level: float) -> tuple:
    """The percentiles ``(low, high)`` holding ``level`` of ``samples``, NaN left out."""
    samples = np.asarray(samples, dtype=float)
    samples = samples[~np.isnan(samples)]
    if not samples.size:
        return math.nan, math.nan
    low, high = np.percentile(samples, (100 * (1 - level) / 2, 100 * (1 + level) / 2))
    return float(low), float(high)


def bootstrap(predictions: Predictions, statistic, n: int = 1000, seed: int = 0,
              level: float = 0.95):
    """Bootstrap interval of ``statistic(predictions)`` over ``n`` resamples of the images:
    ``(low, high)`` holding ``level`` (a dict-valued statistic: ``{key: (low, high)}``)."""
    level = _checked_statistic(statistic, level)
    values = [statistic(predictions.take(take)) for take in _resamples(len(predictions), n, seed)]
    if isinstance(values[0], dict):
        return {k: _interval([x[k] for x in values], level) for k in values[0]}
    return _interval(values, level)


def paired_bootstrap(a, b, statistic, n: int = 1000, seed: int = 0, level: float = 0.95,
                     statistic_b=None):
    """``(difference, low, high)`` of ``statistic(a) - statistic_b(b)`` (default ``statistic``),
    resampling the same images of both (a dict-valued statistic: ``{key: (...)}``)."""
    if list(a.ids) != list(b.ids):
        raise ConfigError("b: a and b hold different images; expected the same ids in one order")
    level = _checked_statistic(statistic, level)
    statistic_b = statistic_b or statistic
    _checked_statistic(statistic_b, level)
    takes = _resamples(len(a), n, seed)

    def difference(sample_a, sample_b):
        x, y = statistic(sample_a), statistic_b(sample_b)
        if isinstance(x, dict):
            return {k: float(x[k]) - float(y[k]) for k in x}
        return float(x) - float(y)

    whole = difference(a, b)
    samples = [difference(a.take(take), b.take(take)) for take in takes]
    if isinstance(whole, dict):
        return {k: (v, *_interval([s[k] for s in samples], level)) for k, v in whole.items()}
    return (whole, *_interval(samples, level))


def _checked_statistic(statistic, level) -> float:
    if not callable(statistic):
        raise ConfigError(f"statistic: {statistic!r:.60} is not a function; expected one that "
                          "takes Predictions and returns a number or a dict of numbers")
    level = check_number(level, "level", "probability")
    if level in (0, 1):
        raise ConfigError(f"level: {level}; expected a number between 0 and 1, e.g. 0.95")
    return level


def predict_split(model, dataset, batch_size: int = 8, progress: bool = True,
                  top_k=DEFAULT_TOP_K, keep_top_k=DEFAULT_KEEP_TOP_K, ids=None,
                  label_names=None, split=None, return_candidates: bool = False):
    """:class:`Predictions` of ``dataset`` (items ``(img, bbox, label[, difficult])``) in the
    'evaluate' preset, ``top_k``/``keep_top_k`` the caps of :func:`medaidet.ssd.predict.predict`;
    with ``return_candidates``, also each image's ``Candidates`` before the caps and NMS."""
    if progress:    # tqdm.auto warns where Jupyter has no ipywidgets: not imported for nothing
        from tqdm.auto import tqdm
    else:
        from tqdm import tqdm
    batch_size = check_number(batch_size, "batch_size", "positive", integer=True)
    n = len(dataset)
    ids = list(getattr(dataset, "ids", range(n)))[:n] if ids is None else ids
    if label_names is None:
        label_names = getattr(dataset, "label_names", BCCD_LABEL_NAMES)
    # predicted boxes, labels, scores[, candidates]; true boxes, labels, difficult flags
    predicted, (bboxes, labels, difficults) = ([], [], [], []), ([], [], [])
    saved = (model.score_thresh, model.nms_thresh)
    model.use_preset("evaluate")
    began = time.perf_counter()
    try:
        with tqdm(total=n, desc="predict", unit="img", disable=not progress) as bar:
            for first in range(0, n, batch_size):
                items = [dataset[i] for i in range(first, min(first + batch_size, n))]
                for column, values in zip(predicted, predict(
                        model, [it[0] for it in items], top_k=top_k, keep_top_k=keep_top_k,
                        return_candidates=return_candidates)):
                    column += values
                for it in items:     # no difficult flags: none is difficult
                    bboxes.append(np.asarray(it[1], dtype=np.float32).reshape(-1, 4))
                    labels.append(np.asarray(it[2], dtype=np.int32))
                    difficults.append(np.asarray(it[3], dtype=bool) if len(it) > 3
                                      else np.zeros(len(labels[-1]), dtype=bool))
                bar.update(len(items))
        score_thresh = float(model.score_thresh)
    finally:
        model.score_thresh, model.nms_thresh = saved
    preds = Predictions(list(ids), *predicted[:3], bboxes, labels, difficults, tuple(label_names),
                        score_thresh, getattr(dataset, "split", None) if split is None else split,
                        getattr(model, "name", None), time.perf_counter() - began)
    return (preds, predicted[3]) if return_candidates else preds


def load_model(weights_path, model_name: str | None = None, device=DEFAULT_DEVICE):
    """``model_name`` (default: the weights') for BCCD, loaded, on ``device``; sets ``.name``."""
    path = Path(os.fspath(weights_path))
    if not path.is_file():
        raise missing_weights_error(path)
    model_name = model_name or model_of_weights(path)
    model = build_ssd(model_name, n_fg_class=len(BCCD_LABEL_NAMES))
    model.name = model_name
    load_weights(model, path)
    device = resolve_device(device)   # named DeviceError when a GPU is asked for and unusable
    device.use()
    model.to_device(device)
    return model


def course_weights(profile: str, run_dir) -> tuple:
    """``(path, reason)`` of the weights notebooks 04 and 05 use: ``<run_dir>/<profile>/model.npz``
    when notebook 03 trained it (not ``'smoke'``), else the shipped small SSD's."""
    fresh = Path(os.fspath(run_dir)) / profile / "model.npz"
    if profile != "smoke" and fresh.is_file():
        return fresh, f"trained by notebook 03 in the {profile} profile"
    why = ("the smoke run's model is untrained" if profile == "smoke"
           else f"notebook 03 has not trained {fresh} in this runtime")
    return shipped_weights("ssd_small"), f"the small SSD's weights shipped with medaidet: {why}"


def n_scored_boxes(difficults) -> int:
    """Non-difficult ground-truth boxes (those AP counts), from each image's difficult flags."""
    return sum(int((~np.asarray(d, dtype=bool)).sum()) for d in difficults)


@dataclass
class ProtocolResult:
    """AP of one protocol per class (NaN: no box); ``precision``/``recall``: PR curves or None."""
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


def _pad(values, n, fill=None) -> list:
    """``values`` cut or padded to ``n`` (ChainerCV sizes its arrays by the largest label)."""
    return (list(values) + [fill] * n)[:n]


def _score_protocol(preds: Predictions, name: str) -> ProtocolResult:
    n_class = len(preds.label_names)
    n_gt = sum((np.bincount(gl[~gd], minlength=n_class)[:n_class]
                for gl, gd in zip(preds.gt_labels, preds.gt_difficults)), np.zeros(n_class, int))
    n_det = sum((np.bincount(pl, minlength=n_class)[:n_class] for pl in preds.pred_labels),
                np.zeros(n_class, int))
    # eval_detection_voc's two steps, the precision-recall computed once
    precision, recall = calc_detection_voc_prec_rec(
        preds.pred_bboxes, preds.pred_labels, preds.pred_scores, preds.gt_bboxes,
        preds.gt_labels, preds.gt_difficults, iou_thresh=IOU_THRESH)
    ap, ap07 = (np.array(_pad(calc_detection_voc_ap(precision, recall, use_07_metric=m),
                              n_class, np.nan), dtype=float) for m in (False, True))
    return ProtocolResult(name, preds.score_thresh, ap, ap07, n_gt, n_det,
                          _pad(precision, n_class), _pad(recall, n_class))


@dataclass(repr=False)
class EvaluationResult(ShownAsTable):
    """AP per class and mean of each protocol (``protocols``: name -> :class:`ProtocolResult`)."""
    label_names: tuple
    protocols: dict
    n_images: int
    split: str | None = None
    info: dict = field(default_factory=dict)

    def __getitem__(self, name) -> ProtocolResult:
        return self.protocols[name]

    def table(self) -> Table:
        """Boxes and AP per class, and the means, in each protocol: VOC area AP and AP07."""
        ps = self.protocols.values()
        table = Table(["class", "boxes"] + [f"{kind} {name} (score>={p.score_thresh:g})"
                                            for name, p in self.protocols.items()
                                            for kind in ("AP", "AP07")],
                      title=f"VOC AP at IoU {IOU_THRESH} on {self.split or 'the split'} "
                            f"({self.n_images} images); AP = area (use_07_metric=False), "
                            "AP07 = VOC2007 11-point", notes=[_COURSE_NOTE])
        for l, name in enumerate(self.label_names):
            table.append([name, int(next(iter(ps)).n_gt[l])]
                         + [v for p in ps for v in (p.ap_voc[l], p.ap_voc07[l])])
        table.append(["mean", ""] + [v for p in ps for v in (p.map_voc, p.map_voc07)])
        return table

    def summary_table(self, published: bool = True) -> Table:
        """mAP and AP per class (VOC area) per protocol, after the course's (``published``)."""
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
        def per_class(values, convert):
            return {c: convert(v) for c, v in zip(self.label_names, values)}

        protocols = {name: {"score_thresh": p.score_thresh,
                            "map_voc": finite_or_none(p.map_voc),
                            "map_voc07": finite_or_none(p.map_voc07),
                            "ap_voc": per_class(p.ap_voc, finite_or_none),
                            "ap_voc07": per_class(p.ap_voc07, finite_or_none),
                            "n_gt": per_class(p.n_gt, int),
                            "n_detections": per_class(p.n_detections, int)}
                     for name, p in self.protocols.items()}
        return {"split": self.split, "n_images": self.n_images, "iou_thresh": IOU_THRESH,
                "label_names": list(self.label_names), "protocols": protocols,
                "course_published": COURSE_PUBLISHED, **self.info}

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), indent=2, **kwargs)


_COURSE_NOTE = ("The course published mAP 0.719 (rbc 0.760, wbc 0.965, platelets 0.432) "
                "with the 'course' protocol: score >= 0.6 hides low-scoring detections, "
                "truncates the PR curves and understates AP. Report the 'evaluate' protocol.")


def evaluate(predictions: Predictions, label_names=None, protocols=None) -> EvaluationResult:
    """VOC area and VOC07 11-point AP at IoU 0.5 per protocol (name -> score threshold; default
    :data:`PROTOCOLS`); ConfigError when no image has a (non-difficult) ground-truth box."""
    if label_names is not None:
        predictions = replace(predictions, label_names=label_names)
    if not n_scored_boxes(predictions.gt_difficults):
        where = f"split {predictions.split} has" if predictions.split else "these predictions have"
        raise ConfigError(f"{where} no objects: none of the {len(predictions)} images has a "
                          "non-difficult ground-truth box; evaluate images with boxes",
                          "nothing_to_evaluate")
    results = {name: _score_protocol(predictions.filter(thresh), name)
               for name, thresh in (PROTOCOLS if protocols is None else protocols).items()}
    return EvaluationResult(predictions.label_names, results, len(predictions), predictions.split)


def plot_pr_curves(result: EvaluationResult):
    """A ``Figure``: precision-recall curve per class (one panel each), a line per protocol."""
    n = len(result.label_names)
    fig = Figure(figsize=(4.2 * n, 4.0), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    for l, (ax, name) in enumerate(zip(axes, result.label_names)):
        for k, (proto, p) in enumerate(result.protocols.items()):
            prec, rec, ap = p.precision[l], p.recall[l], p.ap_voc[l]
            label = f"{proto} (score>={p.score_thresh:g}) AP " + (
                f"{ap:.3f}" if math.isfinite(ap) else "n/a")
            if prec is None or rec is None or len(prec) == 0:    # no box or no detection
                prec, rec, label = [], [], label + " (no curve)"
            ax.plot(np.nan_to_num(rec), np.nan_to_num(prec), label=label,
                    **dict(line_style(k), marker=None, lw=2))    # no class colour: greys
        ax.set(title=f"{name} ({int(result[next(iter(result.protocols))].n_gt[l])} boxes)",
               xlabel="recall", ylabel="precision", xlim=(0, 1.02), ylim=(0, 1.02))
        ax.grid(alpha=0.3)
        ax.legend(loc="lower left", fontsize="small")
    fig.suptitle(f"Precision-recall at IoU {IOU_THRESH}, {result.split or 'split'} "
                 f"({result.n_images} images)")
    return fig


def check_run(weights_path, root=None, subset=None, batch_size: int = 8, out=None) -> tuple:
    """``(weights, root, subset, batch_size, out)``, checked as the CLI does; ``out`` created."""
    path = Path(os.fspath(weights_path))
    if not path.is_file():
        raise missing_weights_error(path)
    if subset is not None:
        subset = check_number(subset, "--subset", "positive", integer=True)
    batch_size = check_number(batch_size, "--batch-size", "positive", integer=True)
    root = resolve_root(root)
    if out is not None:
        out = prepare_output_dir(out, "--out", inputs=(root,))
    return path, root, subset, batch_size, out


def predict_weights(weights_path, split: str = "test", model_name: str | None = None,
                    root=None, subset=None, device=DEFAULT_DEVICE, batch_size: int = 8,
                    progress: bool = True, return_candidates: bool = False):
    """:func:`predict_split` of ``split`` (its first ``subset`` images) with these weights."""
    path, root, subset, batch_size, _ = check_run(weights_path, root, subset, batch_size)
    model = load_model(path, model_name, device)
    # ChainerCV's evaluation convention: keep difficult boxes, flagged, so they are ignored.
    dataset = BCCDDataset(root, split, use_difficult=True, return_difficult=True)
    ids = list(dataset.ids)[:subset]
    view = dataset if subset is None else dataset.slice[:len(ids)]
    return predict_split(model, view, batch_size=batch_size, progress=progress, ids=ids,
                         label_names=dataset.label_names, split=split,
                         return_candidates=return_candidates)


def check_ground_truth(root, split: str, subset=None):
    """ConfigError when the first ``subset`` images of ``split`` hold no ground-truth box."""
    dataset = BCCDDataset(root, split, use_difficult=True, return_difficult=True)
    difficults = list(dataset.slice[:, "difficult"])
    n = len(difficults[:subset])
    if not n_scored_boxes(difficults[:n]):
        listed = split_path(dataset.root, split)
        if n < len(difficults) and n_scored_boxes(difficults):
            raise ConfigError(f"the first {n} images of split {split} ({listed}) have no "
                              f"objects: evaluate more of its {len(dataset)} images (--subset)",
                              "nothing_to_evaluate")
        raise ConfigError(f"split {split} has no objects: no image in {listed} has a non-difficult "
                          f"box; run `medaidet data validate {dataset.root}`, or evaluate another "
                          "--split", "nothing_to_evaluate")


def evaluate_weights(weights_path, split: str = "test", model_name: str | None = None,
                     root=None, subset=None, device=DEFAULT_DEVICE, out=None,
                     batch_size: int = 8, progress: bool = True) -> EvaluationResult:
    """``medaidet evaluate``: :class:`EvaluationResult`, written to ``out`` (JSON, PR curves)."""
    _, root, subset, _, out = check_run(weights_path, root, subset, batch_size, out)
    check_ground_truth(root, split, subset)
    preds = predict_weights(weights_path, split, model_name, root, subset, device, batch_size,
                            progress)
    result = evaluate(preds)
    result.info.update(weights=str(weights_path), model=preds.model, subset=subset,
                       image_ids=list(preds.ids))
    if out is not None:
        write_files({out / "evaluation.json": result.to_json() + "\n",
                     out / "pr_curves.png": png_bytes(plot_pr_curves(result), dpi=100)})
    return result
