"""Train an SSD on BCCD: the course's recipe as one config, one function and one command.

The recipe (ChainerCV's ``examples/ssd/train.py``, which the course copied) is the default of
:class:`TrainConfig`: SSD300 from ImageNet VGG-16 weights, batch 32, MomentumSGD (lr 1e-3,
momentum 0.9), bias gradients x2, weight decay 5e-4 on the other parameters, 300 epochs with
the learning rate x0.1 at epochs 200 and 250, hard negatives k=3, alpha=1.
``TrainConfig.profile('smoke')`` shrinks it to a few iterations on a few images from random
weights (runs on a CPU in under a minute); ``TrainConfig.profile('full')`` is the recipe.

:func:`train` reads top to bottom like the course: data -> iterator -> model + loss ->
optimizer -> updater -> trainer with extensions -> run -> save. Everything it writes goes to
``config.out``:

* ``model.npz`` + ``model.npz.sha256``: model-only weights (:func:`medaidet.ssd.model.save_weights`),
  what evaluation, counting and ``build_ssd(pretrained=PATH)`` load;
* ``snapshot_latest.npz``: the whole trainer (model, optimizer state, iterator position, the
  log, and the Python and NumPy random states), overwritten every ``snapshot_interval``
  epochs and at the end; ``train(config, resume=PATH)`` continues from it;
* ``metrics.json``: the log and the final numbers (see :class:`TrainResult`);
* ``loss.png`` and ``map.png``: the loss curves and the validation mAP;
* ``config.json``: the config the run used.

Validation uses the 'evaluate' preset (score threshold 0.01: the course measured at 0.6) and
VOC area AP (``use_07_metric=False``) at IoU 0.5, with the capped predictor of
:mod:`medaidet.ssd.predict`.

Reproducibility (:mod:`medaidet.training.seeding`): ``seed`` seeds Python, NumPy, CuPy and the data
workers; ``deterministic`` also avoids worker processes and sets chainer's cuDNN switch. On
the CPU with ``n_processes=0`` the same seed gives bitwise identical weights, and resuming
reproduces an uninterrupted run exactly: the snapshot stores Python's and NumPy's global
random states (chainer's own trainer snapshot does not), which drive the shuffling and the
augmentation. With worker processes, or on a GPU, a rerun or a resumed run is equivalent but
not bitwise identical (the seeding report says why).

Divergence: :class:`StopOnNonFinite` checks the loss and the gradients before every update
and the weights after it; a nan or inf stops training with :class:`TrainingDivergedError`
naming the iteration, before a snapshot of that state is written: the last snapshot is left
as it was, with finite weights.

Bad inputs end before any work, in one named error that names the field or flag, the
value and what is expected: :meth:`TrainConfig.validate` checks every field;
:func:`prepare_run` creates the output folder (refusing a file, an unwritable path or a
folder inside the dataset) and checks the ``resume`` snapshot and the ``pretrained`` file.
An example that fails to load in a data worker process (a truncated JPEG) ends the run with
the same error as without workers (:class:`medaidet.data.bccd.ImageError`), not a hang.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import multiprocessing
import os
import pickle
import random
import sys
import time
import traceback
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from medaidet import compat
from medaidet.arguments import (ArgumentValueError, check_number, is_path, non_negative_int,
                                positive_float, positive_int, prepare_output_dir)
from medaidet.device import DEFAULT_DEVICE, DeviceError, parse_device, resolve_device
from medaidet.errors import MedaidetError

__all__ = ["TrainConfig", "TrainResult", "train", "ConfigError", "ResumeError",
           "PROFILES", "add_train_parser", "config_from_args",
           "RandomStateExtension", "TrainingDivergedError", "StopOnNonFinite",
           "n_processes_for", "DataWorkerError", "prepare_run", "check_snapshot_file",
           "check_weights_file"]

PROFILES = ("smoke", "full")
SNAPSHOT_NAME = "snapshot_latest.npz"
WEIGHTS_NAME = "model.npz"


class ConfigError(ArgumentValueError):
    """A training config (or config file) holds an unknown key or an impossible value; the
    message names the field, the value and what is expected."""


class TrainingDivergedError(MedaidetError, FloatingPointError):
    """The loss or a gradient became nan or inf: training stopped before the update, at
    ``iteration``; the last trainer snapshot (``snapshot``, from ``snapshot_iteration``) was
    written before and is left as it was."""

    def __init__(self, message, iteration=None, snapshot=None, snapshot_iteration=None):
        super().__init__(message)
        self.iteration = iteration
        self.snapshot = snapshot
        self.snapshot_iteration = snapshot_iteration


class ResumeError(MedaidetError):
    """A trainer snapshot cannot be resumed with this config (another dataset size, batch
    size or model), or is not a trainer snapshot (missing, empty, truncated, not an .npz)."""


class DataWorkerError(MedaidetError):
    """A data-loading worker process failed with an error that cannot be sent to the main
    process as itself (it cannot be pickled); the message names its type and its text."""


# --------------------------------------------------------------------------- config

@dataclass
class TrainConfig:
    """Everything a training run depends on. Defaults: the course's recipe.

    Durations: training stops after ``iterations`` if given, else after ``epochs``;
    ``lr_steps`` are epochs; ``eval_interval`` and ``snapshot_interval`` are epochs (``None``:
    only at the end; evaluation and the snapshot always also happen at the end);
    ``log_interval`` is iterations.
    """

    model: str = "ssd300"
    pretrained: str | None = "imagenet"   # None, 'imagenet', 'voc0712' or an .npz path
    batch_size: int = 32
    lr: float = 1e-3
    momentum: float = 0.9
    weight_decay: float = 5e-4
    bias_grad_scale: float = 2.0
    epochs: float = 300
    iterations: int | None = None
    lr_steps: tuple = (200, 250)
    lr_gamma: float = 0.1
    k: int = 3
    alpha: float = 1.0
    eval_interval: float | None = 1
    eval_subset: int | None = None       # first N validation images; None: all
    eval_batch_size: int = 8
    log_interval: int = 10
    snapshot_interval: float | None = 1
    train_split: str = "train"
    val_split: str = "val"
    subset: int | None = None            # first N training images; None: all
    n_processes: int | None = None       # None: min(4, cpu count); 0: SerialIterator
                                         # (deterministic: None means 0)
    seed: int | None = None
    deterministic: bool = False          # bitwise reproducible where possible (needs seed)
    augment: bool = True                 # False: resize + encode only (no random augmentation)
    accumulate: int = 1                  # micro-batches per batch (gradient accumulation)
    communicator: str | None = None      # ChainerMN: 'naive' (CPU/GPU), 'pure_nccl' (GPUs), ...
    device: str | int = DEFAULT_DEVICE   # 'cpu', 'gpu' (= GPU 0), an int, or 'auto'
    root: str | None = None              # BCCD root; None: $MEDAIDET_DATA / the cache
    out: str = "outputs/train"

    def __post_init__(self):
        self.validate()

    # ---- construction

    @classmethod
    def profile(cls, name: str, **overrides) -> "TrainConfig":
        """``'full'``: the recipe. ``'smoke'``: random init, 4 training images, batch 2,
        4 iterations, evaluation on 2 validation images at the end, no worker processes."""
        if name == "full":
            base = {}
        elif name == "smoke":
            base = dict(pretrained=None, subset=4, batch_size=2, iterations=4,
                        eval_interval=None, eval_subset=2, eval_batch_size=2, log_interval=1,
                        snapshot_interval=None, n_processes=0, device="cpu", seed=0,
                        out="outputs/train-smoke")
        else:
            raise ConfigError(f"unknown profile {name!r}: use one of {', '.join(PROFILES)}")
        return cls.from_dict({**base, **overrides})

    @classmethod
    def from_dict(cls, values: dict, base: "TrainConfig | None" = None) -> "TrainConfig":
        """A config from ``values`` (unknown keys raise :class:`ConfigError`), on top of
        ``base`` (default: the recipe)."""
        if not isinstance(values, dict):
            raise ConfigError(f"a training config must be a mapping of option names to "
                              f"values, got {type(values).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(f"unknown training option(s) {', '.join(unknown)}; known: "
                              f"{', '.join(sorted(names))}")
        merged = dataclasses.asdict(base) if base is not None else {}
        merged.update(values)
        if isinstance(merged.get("lr_steps"), list):
            merged["lr_steps"] = tuple(merged["lr_steps"])
        try:
            return cls(**merged)
        except TypeError as exc:
            raise ConfigError(f"bad training config: {exc}") from None

    @classmethod
    def from_file(cls, path, base: "TrainConfig | None" = None) -> "TrainConfig":
        """Read a JSON file (always) or a YAML file (``.yaml``/``.yml``; needs PyYAML)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read the config file {path}: {exc}") from None
        if path.suffix.lower() in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise ConfigError(f"{path} is YAML but PyYAML is not installed: "
                                  "pip install pyyaml, or write the config as JSON") from None
            try:
                values = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise ConfigError(f"{path} is not valid YAML: {exc}") from None
        else:
            try:
                values = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path} is not valid JSON: {exc}") from None
        try:
            return cls.from_dict(values if values is not None else {}, base)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None

    def replace(self, **changes) -> "TrainConfig":
        return self.from_dict(changes, base=self)

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["lr_steps"] = list(self.lr_steps)
        return out

    # ---- checks

    def validate(self) -> None:
        """Check every field; raise :class:`ConfigError` naming the first bad one, its value
        and what is expected. The one place the fields are checked: construction calls it,
        and so do :func:`train` and the ``medaidet train`` command (through the config
        they build). Numbers written as text (YAML reads ``1e-3`` as text) become numbers,
        paths become text (``config.json`` is JSON)."""
        def number(name, rule="positive", integer=False, optional=False):
            value = getattr(self, name)
            if value is None and optional:
                return
            try:
                checked = check_number(value, name, rule, integer)
            except ArgumentValueError as exc:
                raise ConfigError(f"{exc}{' or null' if optional else ''}") from None
            if integer or isinstance(value, str):
                setattr(self, name, checked)

        for name in ("batch_size", "k", "log_interval", "eval_batch_size", "accumulate"):
            number(name, integer=True)
        for name in ("subset", "eval_subset", "iterations"):
            number(name, integer=True, optional=True)
        for name in ("epochs", "lr"):
            number(name)
        for name in ("eval_interval", "snapshot_interval"):
            number(name, optional=True)
        for name in ("momentum", "weight_decay", "bias_grad_scale", "alpha", "lr_gamma"):
            number(name, "non-negative")
        for name in ("n_processes", "seed"):
            number(name, "non-negative", integer=True, optional=True)
        if not isinstance(self.lr_steps, (list, tuple)):
            raise ConfigError(f"lr_steps: {self.lr_steps!r} is not a list; expected a list of "
                              "epochs")
        steps = []
        for i, step in enumerate(self.lr_steps):
            try:
                steps.append(float(check_number(step, f"lr_steps[{i}]", "non-negative")))
            except ArgumentValueError as exc:
                raise ConfigError(str(exc)) from None
        self.lr_steps = tuple(steps)
        for name in ("deterministic", "augment"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ConfigError(f"{name}: {value!r} is not true or false; expected true or "
                                  "false")
        self._check_names()
        if self.batch_size % self.accumulate:
            raise ConfigError(
                f"batch_size {self.batch_size} is not divisible by accumulate "
                f"{self.accumulate}: the batch is split into {self.accumulate} equal "
                f"micro-batches; use a batch size that is a multiple of {self.accumulate}")
        if self.communicator is not None and (not isinstance(self.communicator, str)
                                              or not self.communicator):
            raise ConfigError(f"communicator: {self.communicator!r} is not a communicator "
                              "name; expected a ChainerMN communicator name (naive, "
                              "pure_nccl, ...) or null")
        if self.deterministic and self.seed is None:
            raise ConfigError("deterministic=True needs a seed: set seed (--seed S) too")
        try:
            parse_device(self.device, "device")
        except DeviceError as exc:
            raise ConfigError(str(exc)) from None

    def _check_names(self) -> None:
        """The text fields: the model, the weights, the splits and the folders."""
        from medaidet.ssd.model import MODELS, PRETRAINED

        if not isinstance(self.model, str) or self.model.lower() not in MODELS:
            raise ConfigError(f"model: {self.model!r} is not a model medaidet builds; "
                              f"expected one of {', '.join(MODELS)}")
        self.model = self.model.lower()
        if isinstance(self.pretrained, str) and self.pretrained.strip().lower() == "none":
            self.pretrained = None        # as the command line's --pretrained none
        if self.pretrained is not None:
            if not is_path(self.pretrained):
                raise ConfigError(
                    f"pretrained: {self.pretrained!r} is not a weights name or file; expected "
                    f"null, {', '.join(repr(p) for p in PRETRAINED)} or the path of a "
                    "model-only .npz")
            self.pretrained = os.fspath(self.pretrained)
        for name in ("train_split", "val_split"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(f"{name}: {value!r} is not a split name; expected a split "
                                  "such as 'train'")
        if not is_path(self.out):
            raise ConfigError(f"out: {self.out!r} is not a folder path; expected a folder to "
                              "write the results in")
        self.out = os.fspath(self.out)
        if self.root is not None:
            if not is_path(self.root):
                raise ConfigError(f"root: {self.root!r} is not a folder path; expected null "
                                  "($MEDAIDET_DATA or the cache) or the BCCD root")
            self.root = os.fspath(self.root)


# --------------------------------------------------------------------------- randomness

class RandomStateExtension:
    """Puts Python's and NumPy's global random states into the trainer snapshot.

    Chainer's trainer snapshot restores the model, the optimizer and the iterator position
    but not the random states that shuffle the data (NumPy) and draw the augmentation
    (Python's ``random``): without them a resumed run sees other batches than an
    uninterrupted one. Also records the training set size and batch size, so a snapshot
    taken with another dataset is refused with a clear message. Never triggered itself;
    only its ``serialize`` matters.
    """

    name = "train_state"
    trigger = (10 ** 12, "iteration")
    priority = 0

    def __init__(self, train_size: int, batch_size: int):
        self.train_size = int(train_size)
        self.batch_size = int(batch_size)

    def __call__(self, trainer):
        pass

    def serialize(self, serializer):
        import chainer
        if isinstance(serializer, chainer.serializer.Serializer):
            version, internal, gauss = random.getstate()
            serializer("python_version", np.int64(version))
            serializer("python_state", np.asarray(internal, dtype=np.int64))
            serializer("python_gauss", np.float64(np.nan if gauss is None else gauss))
            kind, keys, pos, has_gauss, cached = np.random.get_state()
            serializer("numpy_keys", np.asarray(keys, dtype=np.uint32))
            serializer("numpy_pos", np.int64(pos))
            serializer("numpy_has_gauss", np.int64(has_gauss))
            serializer("numpy_cached_gaussian", np.float64(cached))
            serializer("train_size", np.int64(self.train_size))
            serializer("batch_size", np.int64(self.batch_size))
            return
        # loading: restore
        internal = serializer("python_state", None)
        version = int(serializer("python_version", None))
        gauss = float(serializer("python_gauss", None))
        random.setstate((version, tuple(int(v) for v in internal),
                         None if math.isnan(gauss) else gauss))
        np.random.set_state(("MT19937", np.asarray(serializer("numpy_keys", None),
                                                   dtype=np.uint32),
                             int(serializer("numpy_pos", None)),
                             int(serializer("numpy_has_gauss", None)),
                             float(serializer("numpy_cached_gaussian", None))))


# --------------------------------------------------------------------------- data

def _subset(dataset, n):
    if n is None or n >= len(dataset):
        return dataset
    return dataset.slice[:n]


def build_datasets(config: TrainConfig, model):
    """``(train_base, train, val, transform)``: the training images, the augmented training
    set, the raw validation set, and the :class:`~medaidet.ssd.transforms.TrainTransform`
    (:class:`~medaidet.ssd.transforms.EncodeTransform` with ``augment=False``; its ``stats``
    count the drops)."""
    from chainer.datasets import TransformDataset

    from medaidet.data.bccd import BCCDDataset
    from medaidet.training.seeding import ReseedingTransform
    from medaidet.ssd.transforms import EncodeTransform, TrainTransform

    train_base = _subset(BCCDDataset(config.root, config.train_split), config.subset)
    val = _subset(BCCDDataset(config.root, config.val_split), config.eval_subset)
    transform = (TrainTransform if config.augment else EncodeTransform).for_model(model)
    return train_base, TransformDataset(train_base, ReseedingTransform(transform, config.seed)), \
        val, transform


def multiprocessing_problem() -> str | None:
    """Why worker processes cannot be used here, or None."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return ("this platform cannot fork (Windows, or a Python without fork): "
                "ChainerCV's datasets would have to be pickled to spawned workers")
    try:
        multiprocessing.get_context().Lock()     # needs POSIX semaphores (/dev/shm)
    except (OSError, ImportError, NotImplementedError) as exc:
        return f"multiprocessing does not work here ({type(exc).__name__}: {exc})"
    return None


def n_processes_for(config: TrainConfig) -> int:
    """Worker processes the config asks for: ``n_processes``, or when None ``min(4, cpu
    count)`` (0 in deterministic mode: workers make the augmentation irreproducible)."""
    if config.n_processes is not None:
        return config.n_processes
    return 0 if config.deterministic else min(4, os.cpu_count() or 1)


def make_train_iterator(dataset, config: TrainConfig, log=print, batch_size=None):
    """``(iterator, n_processes)``: ``MultiprocessIterator`` with
    :func:`n_processes_for` workers, or ``SerialIterator`` (0, or workers impossible: the
    reason is logged). Shuffled by NumPy's global RNG either way. ``batch_size``: this
    process's batch (default ``config.batch_size``; a rank's share with ChainerMN)."""
    import chainer

    batch_size = config.batch_size if batch_size is None else batch_size
    compat.apply()                   # cv2.setNumThreads(0) before any worker forks
    n = n_processes_for(config)
    if n > 0:
        problem = multiprocessing_problem()
        if problem:
            log(f"train: using SerialIterator (no worker processes): {problem}")
            n = 0
    if n == 0:
        return chainer.iterators.SerialIterator(dataset, batch_size), 0
    try:
        return _worker_iterator_class()(
            _CarryErrors(dataset), batch_size, n_processes=n, shared_mem=4 << 20), n
    except Exception as exc:        # noqa: BLE001 (any failure: fall back, say why)
        log(f"train: using SerialIterator: MultiprocessIterator failed "
            f"({type(exc).__name__}: {exc})")
        return chainer.iterators.SerialIterator(dataset, batch_size), 0


# Chainer's MultiprocessIterator loads examples in worker processes driven by a thread in
# the main process; an example that raises kills that thread, and the main process then
# waits forever for its batch. So the workers never raise: they return the error as a
# value (_FailedExample), and the iterator raises it in the main process.

class _WorkerTraceback(Exception):
    """The traceback of an error in a worker process, as text: the ``__cause__`` of the
    error re-raised in the main process (``medaidet --debug`` shows it)."""

    def __str__(self):
        return self.args[0]


class _FailedExample:
    """What a worker returns for an example whose loading raised: the error, pickled in
    the worker (one that cannot be pickled is described by its type and text), and the
    worker's traceback."""

    def __init__(self, index, exc: Exception):
        self.index = index
        self.description = f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
        self.traceback = "".join(traceback.format_exception(type(exc), exc,
                                                            exc.__traceback__))
        try:
            self.pickled = pickle.dumps(exc)
            pickle.loads(self.pickled)            # and back: its __init__ may not accept it
        except Exception:                         # noqa: BLE001 (described instead)
            self.pickled = None

    def error(self) -> Exception:
        """The worker's error (or a :class:`DataWorkerError` describing it), its cause
        the worker's traceback."""
        exc = None
        if self.pickled is not None:
            try:
                exc = pickle.loads(self.pickled)
            except Exception:                     # noqa: BLE001 (described instead)
                exc = None
        if exc is None:
            exc = DataWorkerError(f"a data-loading worker process failed on training example "
                                  f"{self.index}: {self.description}")
        exc.__cause__ = _WorkerTraceback(self.traceback)
        return exc


class _CarryErrors:
    """``dataset`` for worker processes: an example that raises is returned as a
    :class:`_FailedExample` instead."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        try:
            return self.dataset[index]
        except Exception as exc:                  # noqa: BLE001 (re-raised by the iterator)
            return _FailedExample(index, exc)


@functools.lru_cache(maxsize=None)
def _worker_iterator_class():
    import chainer

    class WorkerErrorIterator(chainer.iterators.MultiprocessIterator):
        """MultiprocessIterator over :class:`_CarryErrors`: raises the first error a
        worker met, in the main process."""

        def __next__(self):
            batch = super().__next__()
            for example in batch:
                if isinstance(example, _FailedExample):
                    raise example.error()
            return batch

        next = __next__

    return WorkerErrorIterator


# --------------------------------------------------------------------------- optimizer

def make_optimizer(train_chain, config: TrainConfig, comm=None):
    """MomentumSGD with the recipe's hooks: bias gradients x ``bias_grad_scale``, weight
    decay on every other parameter (as ChainerCV's example); and :class:`StopOnNonFinite`.
    With a ChainerMN ``comm``: wrapped by ``create_multi_node_optimizer`` (rank 0's
    weights are broadcast here, before the first step; gradients are averaged over the
    ranks before every update, so the hooks see the same gradients on every rank)."""
    import chainer
    from chainer.optimizer_hooks import WeightDecay
    from chainercv.links.model.ssd import GradientScaling

    optimizer = chainer.optimizers.MomentumSGD(lr=config.lr, momentum=config.momentum)
    if comm is not None:
        import chainermn
        optimizer = chainermn.create_multi_node_optimizer(optimizer, comm)
    optimizer.setup(train_chain)
    if comm is not None:
        # ChainerMN broadcasts rank 0's weights in the first update() and skips that
        # update: the first batch would be computed and thrown away, and the run would be
        # one step behind a single-process one. Broadcast now (the parameters must have
        # their shapes: materialize the model first).
        optimizer.update()
    for param in train_chain.params():
        if param.name == "b":
            param.update_rule.add_hook(GradientScaling(config.bias_grad_scale))
        else:
            param.update_rule.add_hook(WeightDecay(config.weight_decay))
    optimizer.add_hook(StopOnNonFinite("pre"))
    optimizer.add_hook(StopOnNonFinite("post"))
    return optimizer


def make_updater(train_iter, optimizer, device, accumulate: int = 1, comm=None):
    """``StandardUpdater``, or with ``accumulate > 1`` the
    :class:`medaidet.scaling.memory.AccumulatingUpdater` (the batch in ``accumulate``
    micro-batches, the loss normalised by the whole batch's positives)."""
    from chainer import training

    if accumulate == 1:
        return training.updaters.StandardUpdater(train_iter, optimizer, device=device)
    from medaidet.scaling.memory import AccumulatingUpdater
    return AccumulatingUpdater(train_iter, optimizer, device=device, accumulate=accumulate,
                               comm=comm)


# --------------------------------------------------------------------------- divergence

class _NonFinite(FloatingPointError):
    """Raised by :class:`StopOnNonFinite` inside the update; :func:`train` turns it into a
    :class:`TrainingDivergedError`."""


class StopOnNonFinite:
    """Optimizer hook that stops training at the first nan or inf.

    ``timing='pre'`` (after backward, before the update rule): this iteration's loss
    (``main/loss`` as the train chain reported it) and every gradient. ``timing='post'``
    (after the update): every parameter, so a step that overflows the weights is caught in
    the iteration that made it, before the trainer writes a snapshot of it. One host
    synchronisation each: the per-array checks travel together.
    """

    call_for_each_param = False

    def __init__(self, timing: str = "pre", loss_key: str = "main/loss"):
        if timing not in ("pre", "post"):
            raise ValueError(f"timing must be 'pre' or 'post', got {timing!r}")
        self.timing = timing
        self.name = f"StopOnNonFinite_{timing}"
        self.loss_key = loss_key

    def __call__(self, optimizer):
        import chainer

        if self.timing == "pre":
            try:
                observation = chainer.reporter.get_current_reporter().observation
            except IndexError:                      # no reporter: outside a trainer
                observation = {}
            loss = observation.get(self.loss_key)
            if loss is not None:
                value = float(getattr(loss, "array", loss))
                if not math.isfinite(value):
                    raise _NonFinite(f"the loss is {value}")
            arrays = [(name, p.grad) for name, p in optimizer.target.namedparams()]
            what = "gradient"
        else:
            arrays = [(name, p.array) for name, p in optimizer.target.namedparams()]
            what = "weight array"
        bad = _non_finite([(n, a) for n, a in arrays if a is not None])
        if bad:
            after = " after this iteration's update" if self.timing == "post" else ""
            raise _NonFinite(f"{len(bad)} {what}(s) hold nan or inf{after}, first {bad[0]}")


def _non_finite(named_arrays) -> list:
    """Names of the arrays holding a nan or inf (one transfer to the host)."""
    from chainer import backend

    if not named_arrays:
        return []
    xp = backend.get_array_module(named_arrays[0][1])
    finite = backend.CpuDevice().send(xp.stack([xp.isfinite(a).all() for _, a in named_arrays]))
    return [name for (name, _), ok in zip(named_arrays, finite) if not ok]


def _snapshot_iteration(path: Path):
    try:
        with np.load(path, allow_pickle=False) as npz:
            return int(npz["updater/iteration"])
    except (OSError, KeyError, ValueError):
        return None


def _diverged(cause, iteration: int, snapshot: Path) -> TrainingDivergedError:
    snap_iteration = _snapshot_iteration(snapshot) if snapshot.is_file() else None
    if snap_iteration is None:
        kept = (f"no trainer snapshot had been written yet ({snapshot} does not exist): "
                "set snapshot_interval to keep one")
        snapshot_arg = None
    else:
        kept = (f"the last trainer snapshot, {snapshot} (iteration {snap_iteration}), is "
                "intact")
        snapshot_arg = snapshot
    return TrainingDivergedError(
        f"training diverged at iteration {iteration}: {cause}. Training stopped there: "
        f"model.npz was not written and no snapshot of this state was taken; {kept}. Common causes: a learning rate too high for "
        "this batch size (lower lr, or warm up), or a bad sample (medaidet data validate). "
        "Start again with a lower lr, or resume from the snapshot once the cause is fixed.",
        iteration=iteration, snapshot=snapshot_arg, snapshot_iteration=snap_iteration)


# --------------------------------------------------------------------------- extensions

class _EveryOrEnd:
    """Fires every ``interval`` epochs (``None``: never) and at the end of training."""

    def __init__(self, interval, unit, is_end):
        from chainer.training.triggers import IntervalTrigger
        self.interval = None if interval is None else IntervalTrigger(interval, unit)
        self.is_end = is_end

    def __call__(self, trainer):
        fire = self.interval(trainer) if self.interval is not None else False
        return fire or self.is_end(trainer)

    def serialize(self, serializer):
        if self.interval is not None:
            self.interval.serialize(serializer["interval"])


def _evaluator_class():
    from chainercv.extensions import DetectionVOCEvaluator

    class PresetEvaluator(DetectionVOCEvaluator):
        """DetectionVOCEvaluator in the 'evaluate' preset (score 0.01); the model's own
        thresholds are restored afterwards. Counts the seconds it spends."""

        seconds = 0.0

        def evaluate(self):
            target = self._targets["main"]
            old = target.score_thresh, target.nms_thresh
            start = time.perf_counter()
            target.use_preset("evaluate")
            try:
                return super().evaluate()
            finally:
                target.score_thresh, target.nms_thresh = old
                self.seconds += time.perf_counter() - start

    return PresetEvaluator


def _tqdm_class():
    """tqdm's notebook bar where it can render (Jupyter with ipywidgets), else the text bar
    (a terminal; Jupyter without ipywidgets shows it too)."""
    try:
        import ipywidgets  # noqa: F401
        from tqdm.auto import tqdm
    except ImportError:
        from tqdm import tqdm
    return tqdm


class _Monitor:
    """Each iteration: remember the loss; drive the progress bar (loss and it/s)."""

    trigger = (1, "iteration")
    priority = 50     # after the evaluator (300) and LogReport (200)

    def __init__(self, total: int, progress: bool):
        self.total = total
        self.progress = progress
        self.bar = None
        self.last_loss = None
        self.iterations_run = 0

    def initialize(self, trainer):
        if self.progress and self.bar is None:
            self.bar = _tqdm_class()(total=self.total, initial=trainer.updater.iteration,
                                     desc="train", unit="it", dynamic_ncols=True,
                                     mininterval=0.5, file=sys.stdout)

    def __call__(self, trainer):
        self.iterations_run += 1
        loss = trainer.observation.get("main/loss")
        if loss is not None:
            self.last_loss = float(getattr(loss, "array", loss))
        if self.bar is not None:
            postfix = {"loss": f"{self.last_loss:.3f}"} if self.last_loss is not None else {}
            mean_ap = trainer.observation.get("validation/main/map")
            if mean_ap is not None:
                postfix["val mAP"] = f"{float(mean_ap):.3f}"
            self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(1)

    def write(self, text):
        (self.bar.write if self.bar is not None else print)(text)

    def finalize(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _floats(log, key):
    points = [(entry["iteration"], float(entry[key])) for entry in log if key in entry]
    return [p[0] for p in points], [p[1] for p in points]


def write_plots(log, out) -> dict:
    """``loss.png`` (total, loc and conf loss vs iteration) and ``map.png`` (validation
    mAP and per-class AP vs iteration) from a LogReport log; returns their paths."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out)
    paths = {}
    for name, keys, ylabel in (
            ("loss", ("main/loss", "main/loss/loc", "main/loss/conf"), "loss"),
            ("map", ("validation/main/map",) + tuple(
                f"validation/main/ap/{c}" for c in ("rbc", "wbc", "platelets")),
             "AP (VOC area, IoU 0.5, score >= 0.01)")):
        fig = Figure(figsize=(6, 4), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        for key in keys:
            x, y = _floats(log, key)
            if x:
                ax.plot(x, y, marker="o" if len(x) < 20 else None,
                        label=key.split("/", 1)[1] if key != keys[0] or name == "loss"
                        else "mAP", linewidth=2 if key == keys[0] else 1)
        if not ax.lines:
            ax.text(0.5, 0.5, "no values yet", ha="center", va="center",
                    transform=ax.transAxes)
        else:
            ax.legend()
        ax.set_xlabel("iteration")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path)
        paths[name] = str(path)
    return paths


class _Plotter:
    """After LogReport: redraw the PNGs (at most every ``min_seconds``; always at the end)
    and print each evaluation."""

    priority = 100

    def __init__(self, out, log_report, monitor, is_end, min_seconds=30.0):
        self.out = out
        self.log_report = log_report
        self.monitor = monitor
        self.is_end = is_end
        self.min_seconds = min_seconds
        self._last = -math.inf
        self._evals_shown = 0

    def __call__(self, trainer):
        log = self.log_report.log
        evals = [e for e in log if "validation/main/map" in e]
        for entry in evals[self._evals_shown:]:
            aps = ", ".join(f"{c} {entry.get(f'validation/main/ap/{c}', float('nan')):.3f}"
                            for c in ("rbc", "wbc", "platelets"))
            self.monitor.write(f"iteration {entry['iteration']}: val mAP "
                               f"{entry['validation/main/map']:.3f} ({aps})")
        self._evals_shown = len(evals)
        now = time.monotonic()
        if self.is_end(trainer) or now - self._last >= self.min_seconds:
            write_plots(log, self.out)
            self._last = now


# --------------------------------------------------------------------------- result

@dataclass
class TrainResult:
    """What :func:`train` produced. ``metrics`` is what ``metrics.json`` holds."""

    out: Path
    weights: Path
    sha256: str
    snapshot: Path | None          # None: a multi-process run (no trainer snapshot)
    metrics: dict
    model: object = field(repr=False, default=None)

    @property
    def best_map(self):
        return self.metrics.get("best_val_map")

    def summary(self) -> str:
        m = self.metrics
        best = m.get("best_val_map")
        best = "n/a" if best is None else f"{best:.3f} (iteration {m['best_val_iteration']})"
        return (f"trained {m['iterations']} iterations ({m['iterations_this_run']} in this run, "
                f"{m['seconds']:.0f} s, {m['images_per_second']:.2f} images/s); last loss "
                f"{m['last_loss']}; best val mAP {best}\nweights: {self.weights} "
                f"(sha256 {self.sha256[:12]}...)" +
                (f"\nsnapshot: {self.snapshot}" if self.snapshot is not None else ""))


def _json_number(value):
    value = float(value)
    return value if math.isfinite(value) else None


def _clean_log(log):
    return [{k: (_json_number(v) if isinstance(v, (float, np.floating)) else v)
             for k, v in entry.items()} for entry in log]


# --------------------------------------------------------------------------- train

SNAPSHOT_EXPECTED = "the snapshot_latest.npz of a medaidet train run (in its output folder)"
WEIGHTS_EXPECTED = ("imagenet, voc0712, none or a model-only .npz (the model.npz of a "
                    "medaidet train run)")
_NPY_MAGIC = b"\x93NUMPY"


def _npz_entries(path: Path, name: str, expected: str, error) -> list:
    """The array names in the ``.npz`` at ``path`` (its zip directory only: no array is
    read). Raises ``error`` naming ``name`` when it is missing, a folder, empty, a
    ``.npy``, not a zip, or truncated."""
    def fail(problem):
        return error(f"{name}: {path} {problem}; expected {expected}")

    if not path.exists():
        raise fail("does not exist")
    if path.is_dir():
        raise fail("is a folder")
    try:
        with open(path, "rb") as f:
            head = f.read(len(_NPY_MAGIC))
        if not head:
            raise fail("is empty")
        if head == _NPY_MAGIC:
            raise fail("is a .npy array file, not an .npz archive")
        if not head.startswith(b"PK"):
            raise fail("is not an .npz archive")
        with zipfile.ZipFile(path) as archive:
            return [entry[:-4] if entry.endswith(".npy") else entry
                    for entry in archive.namelist()]
    except zipfile.BadZipFile as exc:
        raise fail(f"is truncated or corrupt ({exc})") from None
    except OSError as exc:
        raise fail(f"cannot be read ({exc.strerror or exc})") from None


def check_snapshot_file(path, name: str = "resume") -> Path:
    """``path`` if it looks like a trainer snapshot (an ``.npz`` with ``updater/``
    entries), else :class:`ResumeError` naming ``name`` (the argument as the user wrote
    it: ``--resume`` on the command line). Reads only the zip directory; whether the
    snapshot fits the config is checked once the data are built."""
    path = Path(path)
    entries = _npz_entries(path, name, SNAPSHOT_EXPECTED, ResumeError)
    if not any(entry.startswith("updater/") for entry in entries):
        raise ResumeError(f"{name}: {path} is not a trainer snapshot (no 'updater/' entries); "
                          f"expected {SNAPSHOT_EXPECTED}; to start from model weights use "
                          "pretrained=PATH (--pretrained PATH) instead")
    return path


def check_weights_file(path, name: str = "pretrained") -> Path:
    """``path`` if it looks like a model-only weight file (an ``.npz``), else
    :class:`medaidet.ssd.model.WeightsNotFoundError` (missing) or
    :class:`~medaidet.ssd.model.WeightsFileError` naming ``name``. Reads only the zip
    directory; :func:`medaidet.ssd.model.load_weights` checks every array when it loads."""
    from medaidet.ssd.model import WeightsFileError, WeightsNotFoundError

    path = Path(path)
    if not path.exists():
        raise WeightsNotFoundError(f"{name}: {path} does not exist; expected "
                                   f"{WEIGHTS_EXPECTED}", path)
    entries = _npz_entries(path, name, WEIGHTS_EXPECTED, WeightsFileError)
    if any(entry.startswith("updater/") for entry in entries):
        raise WeightsFileError(f"{name}: {path} is a trainer snapshot, not model weights; "
                               f"expected {WEIGHTS_EXPECTED}; to continue that run use "
                               "resume=PATH (--resume PATH)")
    return path


def prepare_run(config: TrainConfig, resume=None, names=None) -> Path:
    """Check, before any model or data is built, what a run of ``config`` reads and
    writes: the dataset root exists, the output folder can be written (created now) and
    is not inside the dataset, the ``resume`` snapshot and the ``pretrained`` file are
    readable ``.npz`` files. ``names``: how the user wrote each of ``'out'``,
    ``'resume'`` and ``'pretrained'`` (the command line passes ``--out`` ...); default:
    the config's field names. Returns the output folder (resolved). Raises
    :class:`medaidet.arguments.OutputDirError`, :class:`ResumeError`,
    :class:`medaidet.ssd.model.WeightsError` or
    :class:`medaidet.data.download.DataNotFoundError`."""
    from medaidet.data.download import resolve_root
    from medaidet.ssd.model import PRETRAINED

    names = {"out": "out", "resume": "resume", "pretrained": "pretrained", **(names or {})}
    config.validate()
    if resume is not None and config.communicator is not None:
        raise ResumeError(f"{names['resume']}: resuming a multi-process (ChainerMN) run is not "
                          "supported: each rank's data order and random state would have to "
                          "be restored. Start a new run from its weights "
                          "(pretrained='.../model.npz').")
    out = prepare_output_dir(config.out, names["out"], inputs=(resolve_root(config.root),))
    if resume is not None:
        check_snapshot_file(resume, names["resume"])
    if config.pretrained is not None and config.pretrained not in PRETRAINED:
        check_weights_file(config.pretrained, names["pretrained"])
    return out


def _check_snapshot(path: Path, train_size: int, batch_size: int) -> None:
    try:
        with np.load(path, allow_pickle=False) as npz:
            keys = set(npz.files)
            prefix = f"extensions/{RandomStateExtension.name}/"
            if not any(k.startswith("updater/") for k in keys):
                raise ResumeError(f"{path} is not a trainer snapshot (no 'updater/' entries); "
                                  "to start from model weights use pretrained=PATH instead")
            if prefix + "train_size" not in keys:
                raise ResumeError(f"{path} was not written by medaidet.training.train (it lacks the "
                                  "random states); it cannot be resumed here")
            size, batch = int(npz[prefix + "train_size"]), int(npz[prefix + "batch_size"])
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise ResumeError(f"{path} is not a readable trainer snapshot ({type(exc).__name__}: "
                          f"{exc}); expected {SNAPSHOT_EXPECTED}") from None
    if (size, batch) != (train_size, batch_size):
        raise ResumeError(
            f"{path} was taken training on {size} images with batch size {batch}; this "
            f"config has {train_size} images and batch size {batch_size}. A trainer snapshot "
            "holds the iterator's position in that dataset: resume with the same subset and "
            "batch size, or start a new run from its model weights "
            "(pretrained='.../model.npz').")


def _initial_model(config: TrainConfig):
    from medaidet.data.bccd import BCCD_LABEL_NAMES
    from medaidet.ssd.model import build_ssd, materialize

    model = build_ssd(config.model, config.pretrained, n_fg_class=len(BCCD_LABEL_NAMES))
    return materialize(model)


def initial_weights(config: TrainConfig) -> dict:
    """The weights a seeded run of ``config`` starts from, ``{save_npz name: array}``
    (rank 0's, for a multi-process run): the seed set as :func:`train` sets it, then the
    model built the same way. To see how far training moved each array. Needs
    ``config.seed``; reseeds the global RNGs (:func:`medaidet.training.seeding.seed_everything`)."""
    import chainer

    from medaidet.training.seeding import seed_everything

    if config.seed is None:
        raise ConfigError("initial_weights needs a seeded config (seed=...): without a "
                          "seed the initial weights are not reproducible")
    seed_everything(config.seed, deterministic=config.deterministic)
    serializer = chainer.serializers.DictionarySerializer()
    serializer.save(_initial_model(config))
    return dict(serializer.target)


def train(config: TrainConfig | None = None, resume=None, progress: bool = True,
          log=print) -> TrainResult:
    """Train an SSD as ``config`` says (default: the course recipe); see the module docs.

    Args:
        config: a :class:`TrainConfig`.
        resume: path of a trainer snapshot (``snapshot_latest.npz``) to continue from; the
            config must use the same training images and batch size.
        progress: show a progress bar (tqdm: a widget in Jupyter with ipywidgets, text
            elsewhere).
        log: where messages go (``print``).

    Returns a :class:`TrainResult`. Raises :class:`medaidet.device.DeviceError`, :class:`ResumeError`,
    :class:`TrainingDivergedError` (a nan/inf loss or gradient: which iteration, and the
    snapshot left intact), :class:`medaidet.ssd.model.WeightsNotFoundError`
    (``pretrained='imagenet'`` offline: the message says where to put the file), and the
    dataset's errors.
    """
    compat.apply()
    config = config if config is not None else TrainConfig()
    prepare_run(config, resume)
    if config.communicator is None:
        return _train(config, resume, progress, log, comm=None)
    from medaidet.scaling import distributed

    spec = distributed.communicator_spec(config.communicator)
    wanted = parse_device(config.device)
    if wanted == "auto":
        from chainer.backends import cuda
        wanted = "gpu" if cuda.available else "cpu"
    device_kind = "cpu" if wanted == "cpu" else "gpu"
    comm = distributed.create_communicator(spec.name, device_kind)
    with distributed.abort_on_error(comm):
        return _train(config, None, progress, log, comm=comm)


def _train(config: TrainConfig, resume, progress: bool, log, comm) -> TrainResult:
    """:func:`train`'s body; ``comm``: a ChainerMN communicator (this process is one rank)
    or None. Only rank 0 logs, shows progress and writes files."""
    import chainer
    from chainer import training
    from chainer.training import extensions

    from medaidet.scaling import distributed
    from medaidet.data.bccd import BCCD_LABEL_NAMES
    from medaidet.ssd.loss import DivergedError
    from medaidet.ssd.model import save_weights
    from medaidet.ssd.predict import CappedPredictor
    from medaidet.ssd.train_chain import MultiboxTrainChain

    root = distributed.is_root(comm)
    if not root:
        log, progress = (lambda *_, **__: None), False
    out = Path(config.out)            # created and checked by prepare_run
    if comm is None:
        device = resolve_device(config.device)
        batch_size = config.batch_size
    else:
        device = resolve_device(distributed.rank_device(comm, config.device))
        batch_size = distributed.per_rank_batchsize(config.batch_size, comm.size)
        if batch_size % config.accumulate:
            raise ConfigError(
                f"each of the {comm.size} ranks gets {batch_size} images per batch "
                f"(batch_size {config.batch_size} / {comm.size}), not divisible by "
                f"accumulate {config.accumulate}")
        log(f"train: ChainerMN, communicator {config.communicator}, {comm.size} ranks, "
            f"{batch_size} image{'' if batch_size == 1 else 's'} per rank per iteration "
            f"(batch {config.batch_size} in all)")
    seeding = None
    if config.seed is not None:
        from medaidet.training.seeding import seed_everything
        # each rank its own stream (data order, augmentation); the weights are rank 0's,
        # broadcast by the multi-node optimizer before the first update
        seeding = seed_everything(distributed.rank_seed(config.seed, comm), [device],
                                  config.deterministic, n_processes_for(config))
        log(f"train: {seeding.table()}")

    # model (materialized now: its random initial values come from the seeded RNG in the
    # same order every run, before the iterator draws its first order)
    model = _initial_model(config)
    if model.weights_report is not None:
        log(f"train: {model.weights_report.summary()}")

    # data
    train_base, train_data, val_data, transform = build_datasets(config, model)
    if comm is not None:        # each rank trains on its own share of the images
        train_data = distributed.scatter_dataset(train_data, comm, seed=config.seed or 0)
    train_iter, n_processes = make_train_iterator(train_data, config, log, batch_size)
    val_iter = chainer.iterators.SerialIterator(val_data, config.eval_batch_size,
                                                repeat=False, shuffle=False)

    # loss, optimizer, updater
    train_chain = MultiboxTrainChain(model, alpha=config.alpha, k=config.k, comm=comm)
    train_chain.to_device(device)
    device.use()
    optimizer = make_optimizer(train_chain, config, comm)
    updater = make_updater(train_iter, optimizer, device, config.accumulate, comm)

    if config.iterations is not None:
        stop = (config.iterations, "iteration")
        total = config.iterations

        def is_end(trainer):
            return trainer.updater.iteration >= config.iterations
    else:
        stop = (config.epochs, "epoch")
        total = math.ceil(config.epochs * len(train_base) / config.batch_size)

        def is_end(trainer):
            return trainer.updater.epoch_detail >= config.epochs
    trainer = training.Trainer(updater, stop, out=str(out))

    # extensions
    trainer.extend(extensions.ExponentialShift("lr", config.lr_gamma, init=config.lr),
                   trigger=training.triggers.ManualScheduleTrigger(list(config.lr_steps),
                                                                   "epoch"))
    evaluator = _evaluator_class()(val_iter, CappedPredictor(model), use_07_metric=False,
                                   label_names=BCCD_LABEL_NAMES, comm=comm)
    trainer.extend(evaluator, name="validation",
                   trigger=_EveryOrEnd(config.eval_interval, "epoch", is_end))
    log_report = extensions.LogReport(
        trigger=_EveryOrEnd(config.log_interval, "iteration", is_end))
    monitor = _Monitor(total, progress)
    if root:
        trainer.extend(log_report)
        trainer.extend(extensions.observe_lr(), trigger=(1, "iteration"))
        trainer.extend(monitor, name="monitor")
        trainer.extend(_Plotter(out, log_report, monitor, is_end), name="plots",
                       trigger=_EveryOrEnd(config.log_interval, "iteration", is_end))
    if comm is None:
        trainer.extend(RandomStateExtension(len(train_base), config.batch_size))
        trainer.extend(extensions.snapshot(filename=SNAPSHOT_NAME),
                       trigger=_EveryOrEnd(config.snapshot_interval, "epoch", is_end),
                       priority=-100)
    else:
        log("train: no trainer snapshot in a multi-process run (resume is not supported "
            "there); the weights are saved at the end")

    if resume is not None:
        resume = Path(resume)
        _check_snapshot(resume, len(train_base), config.batch_size)
        try:
            chainer.serializers.load_npz(str(resume), trainer)
        except (KeyError, ValueError, TypeError) as exc:
            raise ResumeError(f"{resume} does not fit this trainer ({type(exc).__name__}: "
                              f"{exc}): was it taken with another model or config?") from None
        except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
            raise ResumeError(f"{resume} is truncated or corrupt ({type(exc).__name__}: "
                              f"{exc}); expected {SNAPSHOT_EXPECTED}") from None
        log(f"train: resumed from {resume} at iteration {updater.iteration}")

    if root:
        (out / "config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    start_iteration = updater.iteration
    start = time.perf_counter()
    try:
        trainer.run(show_loop_exception_msg=False)
    except (_NonFinite, DivergedError) as exc:
        cause = (str(exc) if isinstance(exc, _NonFinite) else
                 f"the network's outputs hold nan or inf ({exc})")
        raise _diverged(cause, updater.iteration + 1, out / SNAPSHOT_NAME) from exc
    finally:
        monitor.finalize()
        if hasattr(train_iter, "finalize"):
            train_iter.finalize()
    seconds = time.perf_counter() - start

    # results
    rank_digests = None
    if comm is not None:          # every rank must end with the same weights
        rank_digests = [distributed.check_ranks_agree(comm, model)] * comm.size
        if not root:
            return TrainResult(out=out, weights=out / WEIGHTS_NAME, sha256="",
                               snapshot=out / SNAPSHOT_NAME,
                               metrics={"rank": comm.rank, "rank_digests": rank_digests},
                               model=model)
    sha256 = save_weights(model, out / WEIGHTS_NAME)
    iterations_run = updater.iteration - start_iteration
    train_seconds = max(seconds - evaluator.seconds, 1e-9)
    entries = _clean_log(log_report.log)
    evals = [e for e in entries if e.get("validation/main/map") is not None]
    best = max(evals, key=lambda e: e["validation/main/map"], default=None)
    last_eval = [e for e in entries if "validation/main/map" in e]
    last_eval = last_eval[-1] if last_eval else {}
    plots = write_plots(log_report.log, out)
    metrics = {
        "iterations": int(updater.iteration),
        "iterations_this_run": int(iterations_run),
        "epochs": float(updater.epoch_detail),
        "resumed_from": None if resume is None else str(resume),
        "seconds": seconds,
        "train_seconds": train_seconds,
        "eval_seconds": evaluator.seconds,
        "images_per_second": iterations_run * config.batch_size / train_seconds,
        "seconds_per_epoch": (train_seconds / (iterations_run * config.batch_size)
                              * len(train_base)) if iterations_run else None,
        "last_loss": None if monitor.last_loss is None else _json_number(monitor.last_loss),
        "best_val_map": None if best is None else best["validation/main/map"],
        "best_val_iteration": None if best is None else best["iteration"],
        "val_map": last_eval.get("validation/main/map"),
        "val_ap": {c: last_eval.get(f"validation/main/ap/{c}") for c in BCCD_LABEL_NAMES},
        "val_images": len(val_data),
        "train_images": len(train_base),
        "transform_stats": transform.stats.to_dict() if n_processes == 0 else None,
        "n_processes": n_processes,
        "accumulate": config.accumulate,
        "communicator": config.communicator,
        "ranks": 1 if comm is None else comm.size,
        "batch_per_rank": batch_size,
        "rank_digests": rank_digests,
        "device": str(device),
        "weights": str(out / WEIGHTS_NAME),
        "sha256": sha256,
        "snapshot": str(out / SNAPSHOT_NAME) if comm is None else None,
        "plots": plots,
        "config": config.to_dict(),
        "seeding": None if seeding is None else seeding.to_dict(),
        "versions": {"chainer": chainer.__version__, "numpy": np.__version__},
        "log": entries,
    }
    if n_processes == 0:
        stats = transform.stats
        log(f"train: augmentation dropped {stats.dropped} of {stats.boxes_in} boxes "
            f"(too small {stats.too_small}, non-finite {stats.non_finite}); "
            f"{stats.cropped_out} left the random crop (the recipe's own behaviour)")
    else:
        metrics["transform_stats_note"] = ("not counted: the transform ran in worker "
                                           "processes; use n_processes=0 to count drops")
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    result = TrainResult(out=out, weights=out / WEIGHTS_NAME, sha256=sha256,
                         snapshot=out / SNAPSHOT_NAME if comm is None else None,
                         metrics=metrics, model=model)
    log(result.summary())
    return result


# --------------------------------------------------------------------------- CLI

def add_train_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``medaidet train`` on an ``argparse`` sub-parsers object; its handler is
    ``args.func`` (returns the exit status)."""
    p = subparsers.add_parser(
        "train", help="train an SSD on BCCD (the course recipe, or the smoke profile)",
        description="Train an SSD on BCCD. Settings: the profile's, then --config FILE, "
                    "then the flags.")
    p.add_argument("--profile", choices=PROFILES, default="full",
                   help="smoke: a few iterations on a few images from random weights; "
                        "full: the course recipe (default: full)")
    p.add_argument("--config", metavar="FILE", default=None,
                   help="JSON (or YAML, with PyYAML) file of TrainConfig options")
    p.add_argument("--device", default=None, help="auto, cpu, gpu (= GPU 0) or a GPU number (default: the profile's, auto)")
    p.add_argument("--out", default=None, help="output directory")
    p.add_argument("--resume", metavar="SNAPSHOT", default=None,
                   help="continue from a trainer snapshot (snapshot_latest.npz)")
    p.add_argument("--iterations", type=positive_int, default=None, help="stop after N iterations")
    p.add_argument("--epochs", type=positive_float, default=None, help="stop after N epochs")
    p.add_argument("--batch-size", type=positive_int, default=None)
    p.add_argument("--subset", type=positive_int, default=None, help="train on the first N images")
    p.add_argument("--seed", type=non_negative_int, default=None,
                   help="seed Python, NumPy, CuPy and the data workers (see medaidet.training.seeding)")
    p.add_argument("--deterministic", action="store_true", default=None,
                   help="bitwise reproducible where possible: no worker processes, "
                        "deterministic cuDNN; needs --seed")
    p.add_argument("--accumulate", type=positive_int, default=None, metavar="N",
                   help="split each batch into N micro-batches (gradient accumulation: the "
                        "memory of batch/N, the gradients of the whole batch)")
    p.add_argument("--communicator", default=None, metavar="NAME",
                   help="ChainerMN multi-process training under mpiexec: naive (CPU or GPU), "
                        "pure_nccl (GPUs), ...; batch size is the total over all ranks")
    p.add_argument("--no-augment", dest="augment", action="store_false", default=None,
                   help="no random augmentation (resize and encode only)")
    p.add_argument("--root", default=None, help="BCCD root (default: $MEDAIDET_DATA, else the cache)")
    p.add_argument("--pretrained", default=None,
                   help="imagenet, voc0712, none, or a model-only .npz")
    p.add_argument("--n-processes", type=non_negative_int, default=None,
                   help="data-loading worker processes (0: none)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_train_command)
    return p


def config_from_args(args) -> TrainConfig:
    """The config of a ``medaidet train`` command line: profile, then file, then flags."""
    config = TrainConfig.profile(args.profile)
    if args.config:
        config = TrainConfig.from_file(args.config, base=config)
    flags = {"device": args.device, "out": args.out, "iterations": args.iterations,
             "epochs": args.epochs, "batch_size": args.batch_size, "subset": args.subset,
             "seed": args.seed, "root": args.root, "n_processes": args.n_processes,
             "deterministic": args.deterministic, "augment": args.augment,
             "accumulate": args.accumulate, "communicator": args.communicator}
    changes = {k: v for k, v in flags.items() if v is not None}
    if args.epochs is not None and args.iterations is None:
        changes["iterations"] = None      # --epochs alone: the profile's iteration count yields
    if args.pretrained is not None:
        changes["pretrained"] = None if args.pretrained.lower() == "none" else args.pretrained
    return config.replace(**changes) if changes else config


def _train_command(args) -> int:
    config = config_from_args(args)
    # checked here first so that the messages name the flags the user typed
    prepare_run(config, args.resume, names={
        "out": "--out" if args.out is not None else "out", "resume": "--resume",
        "pretrained": "--pretrained" if args.pretrained is not None else "pretrained"})
    train(config, resume=args.resume, progress=not args.no_progress)
    return 0
