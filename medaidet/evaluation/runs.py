"""A weight file in, results out: what ``medaidet evaluate`` and ``medaidet count`` run.

Each run checks every argument first (:func:`check_run`: the weight file, the numbers, the
dataset root, the output folder, created now), so a mistake costs nothing; then it loads the
model, predicts the split once (:func:`predict_run`) and scores the predictions:
:func:`evaluate_weights` (VOC AP, :mod:`medaidet.evaluation.evaluate`) and
:func:`count_weights` (counts and the threshold sweep, :mod:`~medaidet.evaluation.count`,
:mod:`~medaidet.evaluation.count`), each writing its JSON and figures all together or
not at all. Errors name the arguments as the command line spells them (``--subset``,
``--out``).
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np

from medaidet.arguments import check_number, prepare_output_dir
from medaidet.data.bccd import BCCDDataset, split_path
from medaidet.data.download import resolve_root
from medaidet.device import DEFAULT_DEVICE
from medaidet.errors import ConfigError
from medaidet.evaluation.analysis import images_missing_class
from medaidet.evaluation.count import check_score_thresh, count_cells, plot_counts
from medaidet.evaluation.evaluate import (EvaluationResult, evaluate, n_scored_boxes,
                                          plot_pr_curves)
from medaidet.evaluation.evaluate import load_model, missing_weights_error, predict_split
from medaidet.evaluation.protocol import COUNT_SCORE_THRESH, EVALUATE_SCORE_THRESH
from medaidet.evaluation.count import DEFAULT_THRESHOLDS, plot_sweep, threshold_sweep
from medaidet.files import png_bytes, write_files

__all__ = ["CheckedRun", "check_run", "predict_run", "predict_weights", "check_ground_truth",
           "evaluate_weights", "count_weights"]


class CheckedRun(NamedTuple):
    """The arguments of an evaluate/count run after :func:`check_run`: the weight file, the
    dataset root and ``out`` resolved (``out`` ``None`` when not given), the numbers as ints."""

    weights: Path
    root: Path
    subset: int | None
    batch_size: int
    out: Path | None


def check_run(weights_path, root=None, subset=None, batch_size: int = 8,
              out=None) -> CheckedRun:
    """The cheap checks of an evaluate/count run, done once, before the model is built and
    the split predicted, so that a mistake costs nothing: the weight file exists, ``subset``
    and ``batch_size`` are whole numbers > 0, the dataset is there and ``out`` can be
    written (created now; it may not lie inside the dataset). Errors name the arguments as
    the command line spells them (``--subset``, ``--out``). Returns a :class:`CheckedRun`
    for :func:`predict_run`.
    """

    path = Path(os.fspath(weights_path))
    if not path.is_file():
        raise missing_weights_error(path)
    if subset is not None:
        subset = check_number(subset, "--subset", "positive", integer=True)
    batch_size = check_number(batch_size, "--batch-size", "positive", integer=True)
    root = resolve_root(root)
    if out is not None:
        out = prepare_output_dir(out, "--out", inputs=(root,))
    return CheckedRun(path, root, subset, batch_size, out)


def predict_weights(weights_path, split: str = "test", model_name: str | None = None,
                    root=None, subset=None, device=DEFAULT_DEVICE, batch_size: int = 8,
                    progress: bool = True, return_candidates: bool = False):
    """Load weights and predict ``split`` (its first ``subset`` images when given); with
    ``return_candidates`` also the candidates before the caps and NMS (see
    :func:`~medaidet.evaluation.evaluate.predict_split`). The arguments are checked
    first (:func:`check_run`)."""
    return predict_run(check_run(weights_path, root, subset, batch_size), split, model_name,
                       device, progress, return_candidates)


def predict_run(run: CheckedRun, split: str = "test", model_name: str | None = None,
                device=DEFAULT_DEVICE, progress: bool = True,
                return_candidates: bool = False):
    """:func:`predict_weights` for arguments :func:`check_run` has checked."""

    root, subset, batch_size = run.root, run.subset, run.batch_size
    model = load_model(run.weights, model_name, device)
    # ChainerCV's evaluation convention: keep difficult boxes, flagged, so they are ignored.
    dataset = BCCDDataset(root, split, use_difficult=True, return_difficult=True)
    ids = list(dataset.ids)
    if subset is not None:
        ids = ids[:subset]
        view = dataset.slice[:len(ids)]
    else:
        view = dataset
    return predict_split(model, view, batch_size=batch_size, progress=progress, ids=ids,
                         label_names=dataset.label_names, split=split,
                         return_candidates=return_candidates)



def check_ground_truth(root, split: str, subset=None):
    """Raise :class:`ConfigError` when the images to evaluate (the first
    ``subset`` of ``split``) hold no ground-truth box: before any model is built. Reads
    the annotations only. Images without boxes are fine as long as some image has one."""

    dataset = BCCDDataset(root, split, use_difficult=True, return_difficult=True)
    difficults = list(dataset.slice[:, "difficult"])
    n = len(difficults) if subset is None else min(subset, len(difficults))
    if n_scored_boxes(difficults[:n]):
        return
    listed = split_path(dataset.root, split)
    if n < len(difficults) and n_scored_boxes(difficults):
        raise ConfigError(
            f"the first {n} images of split {split} ({listed}) have no objects: nothing to "
            f"evaluate (--subset {subset}). Evaluate more of the split's {len(dataset)} "
            "images (a larger --subset, or none)", "nothing_to_evaluate")
    raise ConfigError(
        f"split {split} has no objects: nothing to evaluate. None of the {len(dataset)} "
        f"images listed in {listed} has a ground-truth box (difficult ones are ignored), so "
        f"AP is undefined for every class. Check Annotations/<id>.xml of the ids in that "
        f"list, or run `medaidet data validate {dataset.root}`; or evaluate another split "
        "(--split)", "nothing_to_evaluate")


def evaluate_weights(weights_path, split: str = "test", model_name: str | None = None,
                     root=None, subset=None, device=DEFAULT_DEVICE, out=None,
                     batch_size: int = 8, progress: bool = True) -> EvaluationResult:
    """Load, predict, evaluate; write ``evaluation.json`` and ``pr_curves.png`` to ``out``.

    Every argument is checked before the model is built
    (:func:`check_run`); ``out`` is
    created then, so a folder that cannot be written fails at once, not after predicting.

    Raises:
        WeightsError: ``"missing"``: ``weights_path`` does not exist.
        medaidet.errors.ConfigError: ``subset`` or ``batch_size`` is not > 0.
        medaidet.errors.ConfigError: ``out`` is a file, cannot be created or
            written, or lies inside the dataset.
        ConfigError: the images to evaluate hold no ground-truth box
            (:func:`check_ground_truth`, before the model is built).
    """
    run = check_run(weights_path, root, subset, batch_size, out)
    check_ground_truth(run.root, split, run.subset)
    preds = predict_run(run, split, model_name, device, progress)
    result = evaluate(preds)
    result.info.update(weights=str(weights_path), model=preds.model,
                       subset=run.subset, image_ids=list(preds.ids))
    out = run.out
    if out is not None:  # both or neither: a full disk leaves no result without its figure
        write_files({out / "evaluation.json": result.to_json() + "\n",
                     out / "pr_curves.png": png_bytes(plot_pr_curves(result), dpi=100)})
    return result



def count_weights(weights_path, split: str = "test", score_thresh=COUNT_SCORE_THRESH,
                  model_name: str | None = None, root=None, subset=None, device=DEFAULT_DEVICE,
                  out=None, thresholds=DEFAULT_THRESHOLDS, batch_size: int = 8,
                  progress: bool = True):
    """Load, predict once, count at ``score_thresh`` and sweep ``thresholds``. The images
    the validator flags ``missing_class`` are set aside (reported apart, named with why).

    Writes ``counts.json`` (counts and sweep), ``counts.png`` and ``count_sweep.png`` to
    ``out`` when given. Returns ``(CountResult, SweepResult)``.

    Every argument is checked before the model is built (names as on the command line:
    ``--score-thresh`` from 0.01 to 1, ``--subset``, ``--batch-size``, ``--out``, which is
    created now), so a mistake fails at once, not after predicting the split.
    """
    score_thresh = check_score_thresh(score_thresh, EVALUATE_SCORE_THRESH, "--score-thresh")
    for t in np.asarray(thresholds, dtype=object).ravel():
        check_score_thresh(t, EVALUATE_SCORE_THRESH, "thresholds")
    run = check_run(weights_path, root, subset, batch_size, out)
    preds = predict_run(run, split, model_name, device, progress)
    result = count_cells(preds, score_thresh,
                         set_aside=images_missing_class(preds.ids, root=run.root, brief=True))
    result.info.update(weights=str(weights_path), model=preds.model, subset=run.subset)
    out = run.out
    with warnings.catch_warnings():
        if split != "test":
            warnings.simplefilter("ignore", UserWarning)
        sweep = threshold_sweep(preds, thresholds)
    if out is not None:  # all or none: a full disk leaves no result without its figures
        write_files({
            out / "counts.json": json.dumps({**result.to_dict(), "sweep": sweep.to_dict()},
                                            indent=2) + "\n",
            out / "counts.png": png_bytes(plot_counts(result), dpi=100),
            out / "count_sweep.png": png_bytes(plot_sweep(sweep), dpi=100)})
    return result, sweep

