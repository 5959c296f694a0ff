"""A whole training run: :func:`train` is the recipe plus what the course adds.

:func:`train` checks what the run reads and writes before any work
(:func:`prepare_run`), seeds every random number generator, builds the recipe with
:class:`~medaidet.training.recipe.Recipe` in ChainerCV's order, runs it (stopping at the
first nan or inf: :mod:`medaidet.training.divergence`), and writes to ``config.out``:

* ``model.npz`` + ``model.npz.sha256``: model-only weights
  (:func:`medaidet.ssd.weights.save_weights`), what evaluation, counting and
  ``build_ssd(pretrained=PATH)`` load;
* ``snapshot_latest.npz``: the whole trainer with the random states
  (:mod:`medaidet.training.snapshot`), every ``snapshot_interval`` epochs and at the end;
  ``train(config, resume=PATH)`` continues from it;
* ``metrics.json``: the log and the final numbers (:func:`~medaidet.training.result.run_metrics`);
* ``loss.png`` and ``map.png``: the loss curves and the validation AP;
* ``config.json``: the config the run used.

Validation uses the 'evaluate' preset (score threshold 0.01; the original course measured at
0.6) and VOC area AP at IoU 0.5, with the capped predictor of :mod:`medaidet.ssd.predict`.
Under ``mpiexec``, :func:`medaidet.extras.mpi.train` runs :func:`train` as one rank of a
ChainerMN run (``comm``); rank 0 writes the files.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import chainer
import numpy as np

from medaidet import compat
from medaidet.arguments import prepare_output_dir
from medaidet.data.pinned import TXL_PBC, resolve_root
from medaidet.device import resolve_device
from medaidet.files import write_files
from medaidet.ssd import PRETRAINED
from medaidet.ssd.precision import use_tf32
from medaidet.ssd.weights import save_weights
from medaidet.training.recipe import Recipe
from medaidet.training.config import WEIGHTS_NAME, TrainConfig
from medaidet.errors import ConfigError, WeightsError
from medaidet.training.divergence import stop_on_divergence
from medaidet.training.extensions import write_plots
from medaidet.training.memory_fit import fit_batch
from medaidet.training.result import TrainResult, run_metrics
from medaidet.training.seeding import seed_everything
from medaidet.training.snapshot import (SNAPSHOT_NAME, check_snapshot_file, check_weights_file,
                                        load_snapshot)

__all__ = ["train", "prepare_run", "initial_weights"]


def prepare_run(config: TrainConfig, resume=None) -> tuple[Path, Path]:
    """Check, before any model or data is built, what a run of ``config`` reads and
    writes: the dataset root exists, the output folder can be written (created now) and
    is not inside the datasets it reads, the ``resume`` snapshot and the ``pretrained`` file are
    readable ``.npz`` files. The messages name the field (``out: ...``; the command line
    puts its flag there). Returns the output folder and the dataset root, both resolved
    (once: the recipe reads the data from this root). Raises
    :class:`~medaidet.errors.ConfigError`, a ``"snapshot"`` WeightsError,
    :class:`medaidet.ssd.weights.WeightsError` or
    a ``"not_found"`` DataError."""
    if resume is not None and config.communicator is not None:
        raise WeightsError("resume: resuming a multi-process (ChainerMN) run is not "
                           "supported: each rank's data order and random state would have to "
                           "be restored. Start a new run from its weights "
                           "(pretrained='.../model.npz').", "snapshot")
    root = resolve_root(config.root)
    read = (root, resolve_root(None, TXL_PBC)) if config.labels == "txl-pbc" or config.other_sources \
        else (root,)
    out = prepare_output_dir(config.out, "out", inputs=read)
    if resume is not None:
        check_snapshot_file(resume, "resume")
    if config.pretrained is not None and config.pretrained not in PRETRAINED:
        check_weights_file(config.pretrained, "pretrained")
    return out, root


def initial_weights(config: TrainConfig) -> dict:
    """The weights a seeded run of ``config`` starts from, ``{save_npz name: array}``
    (rank 0's, for a multi-process run): the seed set as :func:`train` sets it, then the
    model built the same way. To see how far training moved each array. Needs
    ``config.seed``; reseeds the global RNGs
    (:func:`medaidet.training.seeding.seed_everything`)."""
    if config.seed is None:
        raise ConfigError("initial_weights needs a seeded config (seed=...): without a "
                          "seed the initial weights are not reproducible")
    seed_everything(config.seed, deterministic=config.deterministic)
    serializer = chainer.serializers.DictionarySerializer()
    serializer.save(Recipe(config).model())
    return dict(serializer.target)


def train(config: TrainConfig | None = None, resume=None, progress: bool = True,
          log=print, comm=None, device=None) -> TrainResult:
    """Train an SSD as ``config`` says (default: the course recipe); see the module docs.

    Args:
        config: a :class:`~medaidet.training.config.TrainConfig`.
        resume: path of a trainer snapshot (``snapshot_latest.npz``) to continue from; the
            config must use the same training images and batch size.
        progress: show a progress bar (tqdm: a widget in Jupyter with ipywidgets, text
            elsewhere).
        log: where messages go (``print``).
        comm, device: this process as one rank of a ChainerMN run, and its device
            (:func:`medaidet.extras.mpi.train` passes them; ``medaidet train
            --communicator`` calls it). None: one process on ``config.device``.

    Returns a :class:`~medaidet.training.result.TrainResult`. Raises
    :class:`~medaidet.errors.DeviceError`, a ``"snapshot"`` WeightsError,
    :class:`~medaidet.errors.DivergedError` (a nan/inf loss or
    gradient: which iteration, and the snapshot left intact),
    a ``"missing"`` WeightsError (``pretrained='imagenet'`` offline: the
    message says where to put the file),
    :class:`~medaidet.training.recipe.ConfigError` (no box in the training images,
    before any iteration), and the dataset's errors.
    """
    compat.apply()
    config = config if config is not None else TrainConfig()
    if config.communicator is not None and comm is None:
        raise ConfigError(f"communicator: {config.communicator!r} is a multi-process "
                          "(ChainerMN) run: start it with `mpiexec -n N python -m medaidet "
                          f"train --communicator {config.communicator}` (notebook 08), or "
                          "call medaidet.extras.mpi.train")
    out, root = prepare_run(config, resume)
    device = resolve_device(config.device) if device is None else device
    fit = None
    if comm is None:      # before seeding: it builds a model of its own
        config, fit = fit_batch(config, root, device, log)
    elif comm.rank != 0:
        log = _silent
    if config.precision != "float32":
        log(f"train: precision {config.precision}: {_precision_note(config, device)}")
    return _run(config, Recipe(config, root, comm, device), out, resume, progress, log, fit)


def _silent(*args, **kwargs) -> None:
    """The log of every rank but rank 0."""


def _precision_note(config: TrainConfig, device) -> str:
    """What ``config.precision`` does on ``device``, switching TF32 on where it can (for
    the device's cuBLAS handle in this thread: the one that trains)."""
    if config.precision == "tf32":
        device.use()
        return ("TF32 tensor cores for float32 matrix products" if use_tf32() else
                "float32 products (TF32 needs an NVIDIA GPU of compute capability 8.0+)")
    note = "float16 convolutions on float32 weights, dynamic loss scaling"
    if device.xp is np:
        note += " (on the CPU about 85x slower than float32: NumPy has no float16 BLAS)"
    return note


def _run(config: TrainConfig, recipe: Recipe, out: Path, resume, progress: bool, log,
         fit=None) -> TrainResult:
    """:func:`train`'s body, top to bottom: seed, build, run, save. ``fit``: the
    :class:`~medaidet.training.memory_fit.MemoryFit` that chose ``config.accumulate``."""
    rank = 0 if recipe.comm is None else recipe.comm.rank
    if config.seed is not None:   # each rank its own stream; the weights are rank 0's
        seed_everything(config.seed + rank, [recipe.device], config.deterministic)
        log(f"train: seeded Python, NumPy and CuPy with {config.seed + rank}; "
            f"cudnn_deterministic {config.deterministic}")

    built = recipe.build(log, progress)
    model, data, iterators = built.model, built.data, built.iterators
    updater, trainer, extensions = built.updater, built.trainer, built.extensions
    if model.weights_report is not None:
        log(f"train: {model.weights_report.summary()}")
    if resume is not None:
        load_snapshot(trainer, resume, len(data.images), config.batch_size)
        log(f"train: resumed from {resume} at iteration {updater.iteration}")
    if recipe.main:
        write_files({out / "config.json": json.dumps(config.to_dict(), indent=2) + "\n"})

    start_iteration, start = updater.iteration, time.perf_counter()
    try:
        with stop_on_divergence(updater, out / SNAPSHOT_NAME):
            trainer.run(show_loop_exception_msg=False)
    finally:
        extensions.monitor.finalize()
        if hasattr(iterators.train, "finalize"):
            iterators.train.finalize()
    seconds = time.perf_counter() - start

    snapshot = out / SNAPSHOT_NAME if recipe.comm is None else None
    if not recipe.main:
        return TrainResult(out=out, weights=out / WEIGHTS_NAME, sha256="", snapshot=snapshot,
                           metrics={"rank": rank}, model=model)
    sha256 = save_weights(model, out / WEIGHTS_NAME)
    metrics = run_metrics(config, recipe, data, iterators, updater, extensions,
                          start_iteration=start_iteration, seconds=seconds, resume=resume,
                          weights=out / WEIGHTS_NAME, sha256=sha256, snapshot=snapshot,
                          plots=write_plots(extensions.log_report.log, out, config.val_split,
                                            extensions.lr_step_iterations))
    metrics["memory_fit"] = fit.to_dict() if fit is not None else None
    if iterators.n_processes == 0:
        stats = data.transform.stats
        log(f"train: augmentation dropped {stats.dropped} of {stats.boxes_in} boxes "
            f"(too small {stats.too_small}, non-finite {stats.non_finite}); "
            f"{stats.cropped_out} left the random crop (the recipe's own behaviour)")
    write_files({out / "metrics.json": json.dumps(metrics, indent=2) + "\n"})
    result = TrainResult(out=out, weights=out / WEIGHTS_NAME, sha256=sha256,
                         snapshot=snapshot, metrics=metrics, model=model)
    log(result.summary())
    return result
