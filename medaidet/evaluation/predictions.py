"""Predict once: a trained SSD's detections on every image of a split, kept with the ground truth.

Notebook 04, section 1. :func:`predict_split` runs the model in the 'evaluate' preset (score
>= 0.01, NMS IoU 0.45) over a dataset and returns :class:`Predictions`: per image the
detections and the annotated boxes, everything :mod:`medaidet.evaluation.evaluate` (AP),
:mod:`~medaidet.evaluation.count` (counts) and the drawings need, so the model runs once
and every threshold is applied afterwards (:meth:`Predictions.filter`). :func:`load_model`
builds the model a weight file was saved from (:mod:`medaidet.evaluation.runs` starts
from a weight file and checks a command's arguments first).

Boxes are ``(y_min, x_min, y_max, x_max)`` in image pixels, float32, shape (R, 4);
labels int32 (R,), indices into the label names; scores float32 (R,).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from medaidet.arguments import check_number, check_type
from medaidet.data import BCCD_LABEL_NAMES
from medaidet.device import DEFAULT_DEVICE, resolve_device
from medaidet.errors import ConfigError, WeightsError
from medaidet.evaluation.protocol import EVALUATE_SCORE_THRESH
from medaidet.ssd.model import build_ssd, model_of_weights
from medaidet.ssd.predict import DEFAULT_KEEP_TOP_K, DEFAULT_TOP_K, predict
from medaidet.ssd.weights import load_weights, shipped_weights

__all__ = ["Predictions", "checked", "predict_split", "bootstrap", "paired_bootstrap",
           "load_model", "course_weights", "missing_weights_error"]


def missing_weights_error(path: Path) -> WeightsError:
    return WeightsError(
        f"no trained weights at {path}: run notebook 03_training.ipynb or `medaidet train` "
        f"first (it writes model-only weights and a .sha256 sidecar), then pass that file "
        f"here (expected {path})", "missing", path=path)


@dataclass
class Predictions:
    """Detections and ground truth of one split, one entry per image.

    ``pred_bboxes[i]``: float32 (R, 4) ``(y_min, x_min, y_max, x_max)`` in image pixels;
    ``pred_labels[i]``: int32 (R,); ``pred_scores[i]``: float32 (R,). ``gt_bboxes[i]``,
    ``gt_labels[i]``, ``gt_difficults[i]`` (bool (G,)): the annotation. ``score_thresh``:
    the lowest score the predictions were made with (every kept score is ``>=`` it).
    """
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
        n = len(self.ids)
        for name in ("pred_bboxes", "pred_labels", "pred_scores", "gt_bboxes", "gt_labels"):
            if len(getattr(self, name)) != n:
                raise ConfigError(f"Predictions.{name} has {len(getattr(self, name))} "
                                 f"entries for {n} images")
        if self.gt_difficults is None:
            self.gt_difficults = [np.zeros(len(lb), dtype=bool) for lb in self.gt_labels]
        if len(self.gt_difficults) != n:
            raise ConfigError(f"Predictions.gt_difficults has {len(self.gt_difficults)} "
                             f"entries for {n} images")
        self.label_names = tuple(self.label_names)

    def __len__(self):
        return len(self.ids)

    def filter(self, score_thresh) -> "Predictions":
        """The detections scoring ``>= score_thresh`` (ground truth unchanged).

        ``score_thresh``: one threshold, or one per class as ``{class name: threshold}``
        (every class named; e.g. the thresholds notebook 05 chooses on val). The result's
        ``score_thresh`` is the lowest of them.
        """
        if isinstance(score_thresh, dict):
            missing = [n for n in self.label_names if n not in score_thresh]
            unknown = [n for n in score_thresh if n not in self.label_names]
            if missing or unknown:
                raise ConfigError(f"score_thresh: per-class thresholds need exactly the "
                                  f"classes {', '.join(self.label_names)}; missing "
                                  f"{missing or 'none'}, unknown {unknown or 'none'}")
            per_class = np.array([check_number(score_thresh[n], f"score_thresh[{n!r}]",
                                               "probability") for n in self.label_names])
        else:
            per_class = np.full(len(self.label_names),
                                check_number(score_thresh, "score_thresh", "probability"))
        lowest = float(per_class.min())
        if lowest < self.score_thresh:
            raise ConfigError(f"score_thresh: these predictions hold only scores >= "
                              f"{self.score_thresh}; cannot filter at {lowest}: predict again "
                              "with a lower score threshold")
        keep = [s >= per_class[np.asarray(lb, dtype=int)]
                for s, lb in zip(self.pred_scores, self.pred_labels)]
        return Predictions(
            list(self.ids), [b[k] for b, k in zip(self.pred_bboxes, keep)],
            [lb[k] for lb, k in zip(self.pred_labels, keep)],
            [s[k] for s, k in zip(self.pred_scores, keep)],
            self.gt_bboxes, self.gt_labels, self.gt_difficults, self.label_names,
            max(lowest, self.score_thresh), self.split, self.model, self.seconds)


    def take(self, indices) -> "Predictions":
        """The images at ``indices`` (in that order, repeats allowed: a bootstrap sample)."""
        fields = ("ids", "pred_bboxes", "pred_labels", "pred_scores", "gt_bboxes", "gt_labels",
                  "gt_difficults")
        indices = np.asarray(indices)
        if indices.ndim != 1 or indices.size and (indices.dtype.kind not in "iu" or
                                                  not (-len(self) <= indices).all() or
                                                  not (indices < len(self)).all()):
            raise ConfigError(f"indices: {indices!r:.60}; expected image indices from 0 to "
                              f"{len(self) - 1}")
        return Predictions(*([getattr(self, f)[i] for i in indices] for f in fields),
                           self.label_names, self.score_thresh, self.split, self.model)

    def scored_against(self, dataset) -> "Predictions":
        """These detections with ``dataset``'s boxes as the ground truth: the same images
        under another annotation (e.g. ``BCCDDataset(..., labels="txl-pbc")`` for BCCD's
        boxes). Only the annotations are read."""
        ids = getattr(dataset, "ids", None)       # a slice of a dataset has none
        if len(dataset) != len(self) or ids is not None and list(ids) != list(self.ids):
            raise ConfigError("scored_against: the dataset holds other images than these "
                             "predictions")
        boxes = dataset.slice[:, ("bbox", "label")]
        return Predictions(**{**self.__dict__,
                              "gt_bboxes": [np.asarray(b, np.float32) for b, _ in boxes],
                              "gt_labels": [np.asarray(lb, np.int32) for _, lb in boxes],
                              "gt_difficults": None})


def checked(predictions, name: str = "predictions") -> Predictions:
    """``predictions`` if it is :class:`Predictions`; else a ConfigError naming ``name``."""
    return check_type(predictions, Predictions, name, "Predictions (from predict_split)")


def _resamples(n_images: int, n: int, seed: int) -> list:
    """``n`` draws of ``n_images`` image indices with replacement."""
    if not n_images:
        raise ConfigError("predictions: no image to resample; a bootstrap needs at least one")
    n = check_number(n, "n", "positive", integer=True)
    seed = check_number(seed, "seed", "seed", integer=True)
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n_images, n_images) for _ in range(n)]


def _interval(samples, level: float) -> tuple:
    """The percentiles holding ``level`` of ``samples`` (NaN, a resample without a box of a
    class, left out)."""
    samples = np.asarray(samples, dtype=float)
    samples = samples[~np.isnan(samples)]
    if not samples.size:
        return float("nan"), float("nan")
    low, high = np.percentile(samples, (100 * (1 - level) / 2, 100 * (1 + level) / 2))
    return float(low), float(high)


def bootstrap(predictions: Predictions, statistic, n: int = 1000, seed: int = 0,
              level: float = 0.95):
    """How much ``statistic(predictions)`` (a number, or a dict of numbers) could
    differ on another draw of as many images: it is computed on ``n`` resamples of the
    images with replacement; returns the ``(low, high)`` percentiles holding ``level`` of
    them (for a dict, ``{key: (low, high)}``). With 40 test images, a figure's spread is
    as much a part of it as its value."""
    level = _checked_statistic(statistic, level)
    values = [statistic(predictions.take(take)) for take in _resamples(len(predictions), n, seed)]
    if isinstance(values[0], dict):
        return {k: _interval([x[k] for x in values], level) for k in values[0]}
    return _interval(values, level)


def paired_bootstrap(a, b, statistic, n: int = 1000, seed: int = 0, level: float = 0.95,
                     statistic_b=None):
    """How ``statistic(a) - statistic_b(b)`` could differ on another draw of as many images,
    when ``a`` and ``b`` hold the same images (e.g. two detectors' :class:`Predictions` of
    one split): each of ``n`` resamples (with replacement) takes the same images from both,
    and the difference is computed on it. ``statistic_b``: ``b``'s statistic when it differs
    (e.g. each detector's own thresholds); default ``statistic``. ``a`` and ``b``: anything
    with ``len``, ``ids`` and ``take(indices)``.

    Returns ``(difference on all images, low, high)``, ``low`` and ``high`` the percentiles
    holding ``level`` of the resamples' differences (as :func:`bootstrap`); for a
    dict-valued statistic, ``{key: (difference, low, high)}``. An interval that holds 0
    does not tell the two apart on these images.
    """
    if list(a.ids) != list(b.ids):
        raise ConfigError("b: a and b hold different images (ids differ); a paired "
                          "comparison needs the same images in the same order")
    level = _checked_statistic(statistic, level)
    statistic_b = statistic_b or statistic
    _checked_statistic(statistic_b, level)
    takes = _resamples(len(a), n, seed)

    def difference(x, y):
        if isinstance(x, dict):
            return {k: float(x[k]) - float(y[k]) for k in x}
        return float(x) - float(y)

    whole = difference(statistic(a), statistic_b(b))
    samples = [difference(statistic(a.take(take)), statistic_b(b.take(take)))
               for take in takes]
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


def _ground_truth(item):
    """``(bbox, label, difficult)`` of a dataset item: float32 (R, 4), int32 (R,), bool (R,)
    (no difficult flags: none is difficult)."""
    label = np.asarray(item[2], dtype=np.int32)
    difficult = (np.asarray(item[3], dtype=bool) if len(item) > 3
                 else np.zeros(len(label), dtype=bool))
    return np.asarray(item[1], dtype=np.float32).reshape(-1, 4), label, difficult


def predict_split(model, dataset, batch_size: int = 8, progress: bool = True,
                  top_k=DEFAULT_TOP_K, keep_top_k=DEFAULT_KEEP_TOP_K, ids=None,
                  label_names=None, split=None, return_candidates: bool = False):
    """Predict every image of ``dataset`` in the 'evaluate' preset (score 0.01, NMS 0.45).

    Args:
        model: a ChainerCV SSD; its preset is set to 'evaluate' for the call and restored.
        dataset: items ``(img, bbox, label)`` or ``(img, bbox, label, difficult)``, e.g.
            ``BCCDDataset(root, 'test', use_difficult=True, return_difficult=True)``.
        batch_size: images per forward pass.
        progress: show a ``tqdm.auto`` bar (renders in Jupyter and in a terminal).
        top_k, keep_top_k: the caps of :func:`medaidet.ssd.predict.predict`.
        ids: image ids; default ``dataset.ids`` or the indices.
        label_names: default ``dataset.label_names`` or BCCD's.
        split: the split's name, kept with the predictions; default ``dataset.split``.
        return_candidates: also return, per image, the candidates before the caps and NMS
            (:class:`medaidet.ssd.predict.Candidates`, for :mod:`medaidet.evaluation.analysis`).

    Returns:
        :class:`Predictions` (with the split, the model's name and the seconds the loop
        took); with ``return_candidates``, ``(predictions, candidates)``.
    """
    if progress:    # tqdm.auto warns where Jupyter has no ipywidgets: not imported for nothing
        from tqdm.auto import tqdm
    else:
        from tqdm import tqdm

    batch_size = check_number(batch_size, "batch_size", "positive", integer=True)
    n = len(dataset)
    if ids is None:
        ids = list(getattr(dataset, "ids", range(n)))[:n]
    if label_names is None:
        label_names = getattr(dataset, "label_names", BCCD_LABEL_NAMES)
    out = {k: [] for k in ("pb", "pl", "ps", "gb", "gl", "gd", "candidates")}
    saved = (model.score_thresh, model.nms_thresh)
    model.use_preset("evaluate")
    began = time.perf_counter()
    try:
        with tqdm(total=n, desc="predict", unit="img", disable=not progress) as bar:
            for first in range(0, n, batch_size):
                items = [dataset[i] for i in range(first, min(first + batch_size, n))]
                bboxes, labels, scores, *candidates = predict(
                    model, [it[0] for it in items], top_k=top_k, keep_top_k=keep_top_k,
                    return_candidates=return_candidates)
                out["candidates"] += candidates[0] if candidates else []
                out["pb"] += bboxes
                out["pl"] += labels
                out["ps"] += scores
                for it in items:
                    for key, value in zip(("gb", "gl", "gd"), _ground_truth(it)):
                        out[key].append(value)
                bar.update(len(items))
        score_thresh = float(model.score_thresh)
    finally:
        model.score_thresh, model.nms_thresh = saved
    preds = Predictions(list(ids), out["pb"], out["pl"], out["ps"], out["gb"], out["gl"],
                        out["gd"], tuple(label_names), score_thresh,
                        split if split is not None else getattr(dataset, "split", None),
                        getattr(model, "name", None), time.perf_counter() - began)
    return (preds, out["candidates"]) if return_candidates else preds


def load_model(weights_path, model_name: str | None = None, device=DEFAULT_DEVICE):
    """Build ``model_name`` (None: the model the weights were saved from,
    :func:`~medaidet.ssd.model.model_of_weights`) for BCCD's 3 classes, load the trained
    weights, move it to ``device``. ``model.name`` is the model's name."""

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
    """The weights notebooks 04 and 05 look at in ``profile``, and why: ``(path, reason)``.

    * ``'full'`` and ``'cpu'``: ``<run_dir>/<profile>/model.npz`` when notebook 03 trained
      it, else the small SSD's weights that ship with medaidet
      (:func:`~medaidet.ssd.weights.shipped_weights`), so that either notebook also runs
      opened alone (on Colab each notebook has a runtime of its own).
    * ``'smoke'``: the shipped weights: the smoke run's model saw 4 images for 4 iterations
      and has nothing to show.
    """

    fresh = Path(os.fspath(run_dir)) / profile / "model.npz"
    if profile != "smoke" and fresh.is_file():
        return fresh, f"trained by notebook 03 in the {profile} profile"
    why = ("the smoke run's model is untrained" if profile == "smoke"
           else f"notebook 03 has not trained {fresh} in this runtime")
    return shipped_weights("ssd_small"), f"the small SSD's weights shipped with medaidet: {why}"


