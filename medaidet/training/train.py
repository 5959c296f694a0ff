"""Training (notebooks 03 and 06): :func:`train` reads top to bottom like ChainerCV's
``examples/ssd/train.py``: seed, build the recipe, run, save.

* **Seeding** (notebook 06): :func:`seed_everything` seeds Python's ``random`` (ChainerCV's
  augmentations), NumPy's global RNG (shuffle order, initial weights) and CuPy's on each GPU,
  and sets ``chainer.config.cudnn_deterministic`` (nothing where CuPy has no cuDNN: CuPy 14).
  Forked data-loading workers inherit the parent's state: :class:`ReseedingTransform`
  reseeds each from ``(seed, worker)``. What stays non-deterministic: which worker augments
  which image, and GPU kernels that sum in a varying order.
* **The recipe** (notebook 03): :class:`Recipe` builds each piece with one method, in
  ChainerCV's order: model, train chain, datasets and transform, iterators, optimizer (with
  its hooks), updater, trainer, extensions. For one rank of a ChainerMN run
  (:func:`medaidet.extras.mpi.train`) it takes the rank's share of the images and batch,
  and rank 0 alone logs and writes, as ChainerCV's ``train_multi.py``.
* **The non-finite stop**: :class:`StopOnNonFinite`, an optimizer hook, checks the loss and
  gradients before every update and the weights after it; a nan or inf stops training with
  a :class:`~medaidet.errors.DivergedError` naming the iteration, before a snapshot of that
  state is written.
* **Snapshots**: ``snapshot_latest.npz`` holds the whole trainer and, through
  :class:`RandomStateExtension`, Python's and NumPy's random states, which chainer's own
  snapshot leaves out: a resumed run sees the same batches as an uninterrupted one. The
  files a run starts from are checked before anything is built.

:func:`train` writes to ``config.out``: ``model.npz`` + ``.sha256`` (model-only weights,
:func:`medaidet.ssd.weights.save_weights`), ``snapshot_latest.npz``, ``metrics.json`` (the
log and the final numbers), ``loss.png`` and ``map.png``, and ``config.json``. Validation
uses the 'evaluate' preset (score threshold 0.01; the original course measured at 0.6) and
VOC area AP at IoU 0.5, with the capped predictor of :mod:`medaidet.ssd.predict`.
"""
from __future__ import annotations

import contextlib
import gc
import json
import math
import multiprocessing
import os
import random
import time
import warnings
import zipfile
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import chainer
import numpy as np
from chainer import backend, training
from chainer.dataset import concat_examples
from chainer.datasets import ConcatenatedDataset, TransformDataset
from chainer.optimizer_hooks import WeightDecay
from chainer.training import extensions
from chainercv.links.model.ssd import GradientScaling

from medaidet import compat
from medaidet.arguments import prepare_output_dir
from medaidet.data import BCCD_LABEL_NAMES
from medaidet.data.bccd import (AnnotationWarning, BCCDDataset, annotation_path, parse_annotation,
                                split_path)
from medaidet.data.download import TXL_PBC, resolve_root
from medaidet.data.txl_pbc import TXLPBCDataset
from medaidet.device import gpu_ids, resolve_device
from medaidet.errors import ConfigError, DeviceError, DivergedError, WeightsError
from medaidet.files import write_files
from medaidet.numbers import finite_or_none
from medaidet.ssd import PRETRAINED
from medaidet.ssd.model import build_ssd
from medaidet.ssd.precision import set_precision, skipped_update, use_loss_scaling, use_tf32
from medaidet.ssd.predict import CappedPredictor
from medaidet.ssd.loss import MultiboxTrainChain
from medaidet.ssd.transforms import EncodeTransform, TrainTransform
from medaidet.ssd.weights import check_sizes, materialize, save_weights, what_file_is
from medaidet.tables import Table
from medaidet.training.accumulation import AccumulatingUpdater
from medaidet.training.config import WEIGHTS_NAME, TrainConfig
from medaidet.training.extensions import EveryOrEnd, Monitor, Plotter, PresetEvaluator, write_plots
from medaidet.training.iterators import make_train_iterator
from medaidet.training.memory import (PeakMemory, format_bytes, free_memory, is_out_of_memory,
                                      synchronize)

__all__ = ["train", "prepare_run", "initial_weights", "TrainResult", "Recipe", "Built",
           "TrainingData", "Iterators", "Extensions", "Length", "lr_name", "check_objects",
           "seed_everything", "ReseedingTransform", "StopOnNonFinite", "stop_on_divergence",
           "RandomStateExtension", "SNAPSHOT_NAME", "check_snapshot_file", "check_weights_file",
           "load_snapshot", "snapshot_iteration", "run_metrics", "MemoryFit", "available_bytes",
           "plan_accumulate", "fit_batch"]


# --------------------------------------------------------------------------- seeding

def seed_everything(seed: int, devices=None, deterministic: bool = False) -> None:
    """Seed Python's ``random``, NumPy's global RNG and CuPy's RNG on every GPU in
    ``devices`` (chainer devices or GPU ids) with ``seed``, an integer in ``[0, 2**32)``;
    set ``chainer.config.cudnn_deterministic`` to ``deterministic``. Call it before building
    the model (its initial weights come from NumPy's RNG)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) \
            or not 0 <= seed < 2 ** 32:
        raise ConfigError(f"seed must be an integer in [0, 2**32) (NumPy's RandomState "
                          f"limit), got {seed!r}", "seed")
    random.seed(int(seed))
    np.random.seed(int(seed))
    for gpu in gpu_ids(devices):
        import cupy
        with cupy.cuda.Device(gpu):
            cupy.random.seed(int(seed))
    chainer.config.cudnn_deterministic = bool(deterministic)


class ReseedingTransform:
    """Wraps a transform so that every worker process draws its own random numbers.

    ``MultiprocessIterator`` forks workers that inherit the parent's Python and NumPy random
    states: without reseeding, every worker draws the *same* augmentation sequence. On the
    first call in a new process this seeds ``random`` and NumPy from ``(seed, worker name)``
    (``ForkPoolWorker-1``, ...: the same names in every run, unlike process ids), or from
    the OS when ``seed`` is None. In the process that made it, it changes nothing.
    """

    def __init__(self, transform, seed: int | None = None):
        self.transform = transform
        self.seed = seed
        self._pid = os.getpid()

    @staticmethod
    def _worker_key() -> list:
        name = multiprocessing.current_process().name
        digits = "".join(c for c in name if c.isdigit())
        return [int(digits)] if digits else [os.getpid()]

    def __call__(self, in_data):
        pid = os.getpid()
        if pid != self._pid:
            self._pid = pid
            entropy = None if self.seed is None else [self.seed, *self._worker_key()]
            words = np.random.SeedSequence(entropy).generate_state(2)
            random.seed(int(words[0]))
            np.random.seed(int(words[1]))
        return self.transform(in_data)


# --------------------------------------------------------------------------- snapshot

SNAPSHOT_NAME = "snapshot_latest.npz"
SNAPSHOT_EXPECTED = "the snapshot_latest.npz of a medaidet train run (in its output folder)"
WEIGHTS_EXPECTED = ("imagenet, voc0712, none or a model-only .npz (the model.npz of a "
                    "medaidet train run)")


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


def _npz_entries(path: Path, name: str, expected: str, kind: str) -> list:
    """The array names in the ``.npz`` at ``path`` (its zip directory only: no array is
    read). Raises a :class:`~medaidet.errors.WeightsError` of ``kind`` naming ``name`` when
    it is missing, a folder, not a zip (what it is instead:
    :func:`medaidet.ssd.weights.what_file_is`) or truncated."""
    def fail(problem):
        return WeightsError(f"{name}: {path} {problem}; expected {expected}", kind, path=path)

    if not path.exists():
        raise fail("does not exist")
    if path.is_dir():
        raise fail("is a folder")
    try:
        what = what_file_is(path)
        if what is not None:
            raise fail(f"is {what}")
        with zipfile.ZipFile(path) as archive:
            return [entry[:-4] if entry.endswith(".npy") else entry
                    for entry in archive.namelist()]
    except zipfile.BadZipFile as exc:
        raise fail(f"is truncated or corrupt ({exc})") from None
    except OSError as exc:
        raise fail(f"cannot be read ({exc.strerror or exc})") from None


def check_snapshot_file(path, name: str = "resume") -> Path:
    """``path`` if it looks like a trainer snapshot (an ``.npz`` with ``updater/``
    entries), else a ``"snapshot"`` WeightsError naming ``name`` (the argument as the user wrote
    it: ``--resume`` on the command line). Reads only the zip directory; whether the
    snapshot fits the config is checked once the data are built."""
    path = Path(path)
    entries = _npz_entries(path, name, SNAPSHOT_EXPECTED, "snapshot")
    if not any(entry.startswith("updater/") for entry in entries):
        raise WeightsError(f"{name}: {path} is not a trainer snapshot (no 'updater/' entries); "
                           f"expected {SNAPSHOT_EXPECTED}; to start from model weights use "
                           "pretrained=PATH (--pretrained PATH) instead", "snapshot")
    return path


def check_weights_file(path, name: str = "pretrained") -> Path:
    """``path`` if it looks like a model-only weight file (an ``.npz``), else
    a ``"missing"`` WeightsError or
    a ``"file"`` WeightsError naming ``name``. Reads only the zip
    directory; :func:`medaidet.ssd.weights.load_weights` checks every array when it loads."""
    path = Path(path)
    if not path.exists():
        raise WeightsError(f"{name}: {path} does not exist; expected "
                           f"{WEIGHTS_EXPECTED}", "missing", path=path)
    entries = _npz_entries(path, name, WEIGHTS_EXPECTED, "file")
    if any(entry.startswith("updater/") for entry in entries):
        raise WeightsError(f"{name}: {path} is a trainer snapshot, not model weights; "
                           f"expected {WEIGHTS_EXPECTED}; to continue that run use "
                           "resume=PATH (--resume PATH)", "file")
    return path


def load_snapshot(trainer, path, train_size: int, batch_size: int) -> None:
    """Restore ``trainer`` (and the random states) from the snapshot at ``path``, after
    checking that it was taken on ``train_size`` images with ``batch_size``:
    a ``"snapshot"`` WeightsError otherwise, or when it does not fit this trainer's model."""
    path = Path(path)
    _check_fits(path, train_size, batch_size)
    try:
        chainer.serializers.load_npz(str(path), trainer)
    except (KeyError, ValueError, TypeError) as exc:
        raise WeightsError(f"{path} does not fit this trainer ({type(exc).__name__}: "
                           f"{exc}): was it taken with another model or config?",
                           "snapshot") from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise WeightsError(f"{path} is truncated or corrupt ({type(exc).__name__}: "
                           f"{exc}); expected {SNAPSHOT_EXPECTED}", "snapshot") from None


def _check_fits(path: Path, train_size: int, batch_size: int) -> None:
    try:
        with np.load(path, allow_pickle=False) as npz:
            check_sizes(path, npz.zip)          # before chainer reads every array of it
            keys = set(npz.files)
            prefix = f"extensions/{RandomStateExtension.name}/"
            if not any(k.startswith("updater/") for k in keys):
                raise WeightsError(f"{path} is not a trainer snapshot (no 'updater/' entries); "
                                   "to start from model weights use pretrained=PATH instead",
                                   "snapshot")
            if prefix + "train_size" not in keys:
                raise WeightsError(f"{path} was not written by medaidet train (it lacks the "
                                   "random states); it cannot be resumed here", "snapshot")
            size, batch = int(npz[prefix + "train_size"]), int(npz[prefix + "batch_size"])
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise WeightsError(f"{path} is not a readable trainer snapshot ({type(exc).__name__}: "
                           f"{exc}); expected {SNAPSHOT_EXPECTED}", "snapshot") from None
    if (size, batch) != (train_size, batch_size):
        raise WeightsError(
            f"{path} was taken training on {size} images with batch size {batch}; this "
            f"config has {train_size} images and batch size {batch_size}. A trainer snapshot "
            "holds the iterator's position in that dataset: resume with the same subset and "
            "batch size, or start a new run from its model weights "
            "(pretrained='.../model.npz').", "snapshot")


def snapshot_iteration(path: Path):
    """The iteration the snapshot at ``path`` was taken at, or None (no readable one)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            return int(npz["updater/iteration"])
    except (OSError, KeyError, ValueError):
        return None


# --------------------------------------------------------------------------- divergence

class StopOnNonFinite:
    """Optimizer hook that stops training at the first nan or inf.

    ``timing='pre'`` (after backward, before the update rule): this iteration's loss
    (``main/loss`` as the train chain reported it) and every gradient. ``timing='post'``
    (after the update): every parameter, so a step that overflows the weights is caught in
    the iteration that made it, before the trainer writes a snapshot of it. One host
    synchronisation each: the per-array checks travel together. In ``mixed16`` a step whose
    scaled gradients overflowed is skipped by the optimizer (dynamic loss scaling), not
    stopped here.
    """

    call_for_each_param = False

    def __init__(self, timing: str = "pre", loss_key: str = "main/loss"):
        if timing not in ("pre", "post"):
            raise ValueError(f"timing must be 'pre' or 'post', got {timing!r}")
        self.timing = timing
        self.name = f"StopOnNonFinite_{timing}"
        self.loss_key = loss_key

    def __call__(self, optimizer):
        if self.timing == "pre" and skipped_update(optimizer):
            return      # mixed16: scaled gradients overflowed; the step is skipped, not diverged
        if self.timing == "pre":
            try:
                observation = chainer.reporter.get_current_reporter().observation
            except IndexError:                      # no reporter: outside a trainer
                observation = {}
            loss = observation.get(self.loss_key)
            if loss is not None:
                value = float(getattr(loss, "array", loss))
                if not math.isfinite(value):
                    raise DivergedError(f"the loss is {value}", "training")
            arrays = [(name, p.grad) for name, p in optimizer.target.namedparams()]
            what = "gradient"
        else:
            arrays = [(name, p.array) for name, p in optimizer.target.namedparams()]
            what = "weight array"
        bad = _non_finite([(n, a) for n, a in arrays if a is not None])
        if bad:
            after = " after this iteration's update" if self.timing == "post" else ""
            raise DivergedError(f"{len(bad)} {what}(s) hold nan or inf{after}, first {bad[0]}",
                                "training")


def _non_finite(named_arrays) -> list:
    """Names of the arrays holding a nan or inf (one transfer to the host)."""
    if not named_arrays:
        return []
    xp = backend.get_array_module(named_arrays[0][1])
    finite = backend.CpuDevice().send(xp.stack([xp.isfinite(a).all() for _, a in named_arrays]))
    return [name for (name, _), ok in zip(named_arrays, finite) if not ok]


@contextlib.contextmanager
def stop_on_divergence(updater, snapshot: Path):
    """Around ``trainer.run()``: a nan or inf met by :class:`StopOnNonFinite` or by the
    safe loss (a :class:`~medaidet.errors.DivergedError` without an iteration) becomes one
    naming the iteration and the snapshot kept."""
    try:
        yield
    except DivergedError as exc:
        if exc.iteration is not None:
            raise
        cause = (str(exc) if exc.kind == "training" else
                 f"the network's outputs hold nan or inf ({exc})")
        raise _diverged_error(cause, updater.iteration + 1, snapshot) from exc


def _diverged_error(cause, iteration: int, snapshot: Path) -> DivergedError:
    snap_iteration = snapshot_iteration(snapshot) if snapshot.is_file() else None
    if snap_iteration is None:
        kept = (f"no trainer snapshot had been written yet ({snapshot} does not exist): "
                "set snapshot_interval to keep one")
        snapshot_arg = None
    else:
        kept = (f"the last trainer snapshot, {snapshot} (iteration {snap_iteration}), is "
                "intact")
        snapshot_arg = snapshot
    return DivergedError(
        f"training diverged at iteration {iteration}: {cause}. Training stopped there: "
        f"model.npz was not written and no snapshot of this state was taken; {kept}. "
        "Common causes: a learning rate too high for this batch size (lower lr, or warm "
        "up), or a bad sample (medaidet data validate). Start again with a lower lr, or "
        "resume from the snapshot once the cause is fixed.", "training",
        iteration=iteration, snapshot=snapshot_arg, snapshot_iteration=snap_iteration)


# --------------------------------------------------------------------------- recipe

def _first(dataset, n):
    return dataset if n is None or n >= len(dataset) else dataset.slice[:n]


def _n_boxes(dataset) -> int:
    """Boxes in ``dataset``, read from the annotations (no image is decoded)."""
    return sum(len(label) for label in dataset.slice[:, "label"])


def check_objects(dataset, images, config: TrainConfig):
    """Raise :class:`ConfigError` when ``images`` (the first ``subset`` images of
    the training split ``dataset``) hold no box the loader keeps. Images without boxes
    are fine (background only) as long as some image has one."""
    if _n_boxes(images):
        return
    split, root = config.train_split, dataset.root
    listed = split_path(root, split)
    if len(images) < len(dataset) and _n_boxes(dataset):
        raise ConfigError(
            f"the first {len(images)} images of split {split} ({listed}) have no objects: "
            f"nothing to learn (subset={config.subset}). Train on more of the split's "
            f"{len(dataset)} images (a larger subset, or none)", "nothing_to_learn")
    raw = sum(len(parse_annotation(annotation_path(root, i)).objects) for i in dataset.ids)
    why = ("their annotations hold no <object>" if not raw else
           f"the {raw} <object> element(s) of their annotations are all dropped as invalid "
           "or marked difficult")
    raise ConfigError(
        f"split {split} has no objects: nothing to learn. None of the {len(dataset)} images "
        f"listed in {listed} has a box the loader keeps ({why}). Check Annotations/<id>.xml "
        f"of the ids in that list, or run `medaidet data validate {root}`", "nothing_to_learn")


@dataclass
class TrainingData:
    """``images``: the training images (all ranks'); ``train``: this process's share,
    augmented and encoded for the loss; ``val``: the validation images, as they are;
    ``transform``: the training transform (its ``stats`` count the boxes it drops)."""

    images: object
    train: object
    val: object
    transform: object


@dataclass
class Iterators:
    train: object
    val: object
    n_processes: int     # worker processes of the training iterator (0: none)


@dataclass
class Length:
    """How long training runs: ``stop`` (the trainer's stop trigger), ``total`` iterations
    of ``batch_size`` images over ``n_images`` (one process's images and batch)."""

    config: TrainConfig
    n_images: int
    batch_size: int | None = None      # None: the config's

    @property
    def stop(self) -> tuple:
        if self.config.iterations is not None:
            return self.config.iterations, "iteration"
        return self.config.epochs, "epoch"

    @property
    def total(self) -> int:
        if self.config.iterations is not None:
            return self.config.iterations
        batch_size = self.batch_size or self.config.batch_size
        return math.ceil(self.config.epochs * self.n_images / batch_size)

    @property
    def lr_step_iterations(self) -> list:
        """The iteration after which each learning-rate step applies (the first whose epoch
        reaches the step's)."""
        batch_size = self.batch_size or self.config.batch_size
        return [math.ceil(epoch * self.n_images / batch_size) for epoch in self.config.lr_steps]

    def is_end(self, trainer) -> bool:
        if self.config.iterations is not None:
            return trainer.updater.iteration >= self.config.iterations
        return trainer.updater.epoch_detail >= self.config.epochs


@dataclass
class Extensions:
    """The extensions the run reads back: the evaluator (its seconds), the log, the
    progress monitor (the last loss), and where the learning-rate steps apply."""

    evaluator: object
    log_report: object
    monitor: object
    lr_step_iterations: list


@dataclass
class Built:
    """Every piece of a built recipe (:meth:`Recipe.build`), by name."""

    model: object
    train_chain: object
    data: TrainingData
    iterators: Iterators
    optimizer: object
    updater: object
    trainer: object
    extensions: Extensions


def lr_name(config: TrainConfig) -> str:
    """The optimizer's hyperparameter that the learning-rate steps scale (Adam's is alpha)."""
    return "alpha" if config.optimizer == "adam" else "lr"


def _images_and_batch(updater) -> tuple:
    """``(images, batch size)`` of this process's training iterator."""
    iterator = updater.get_iterator("main")
    return len(iterator.dataset), iterator.batch_size


@dataclass
class Recipe:
    """The course's training recipe for ``config``, one method per piece.

    ``root``: the dataset root, resolved (:func:`~medaidet.training.train.train` resolves
    ``config.root`` once, before anything is built); None (the default): resolved from
    ``config.root`` when the data is built. ``device``: the chainer device (default:
    ``config.device`` resolved). ``comm``: the ChainerMN communicator when this process is
    one rank of a multi-process run (:func:`medaidet.extras.mpi.train`); the methods then
    take this rank's share of the images and of the batch, average the gradients over the
    ranks, and let rank 0 alone log and write (as ChainerCV's ``train_multi.py``).
    """

    config: TrainConfig
    root: Path | None = None
    comm: object = None
    device: object = None

    def __post_init__(self):
        if self.device is None:
            self.device = resolve_device(self.config.device)
        size = 1 if self.comm is None else self.comm.size
        self.batch_size = self.config.batch_size // size     # this process's images a step
        self.main = self.comm is None or self.comm.rank == 0  # the one that logs and writes

    def model(self):
        """The SSD of ``config.model`` for BCCD's three classes, from ``config.pretrained``
        weights, with every parameter initialised now (random values are drawn here, from
        the seeded RNG, before the iterator draws its first order), computing in
        ``config.precision`` (:func:`~medaidet.ssd.precision.set_precision`)."""
        config = self.config
        model = materialize(build_ssd(config.model, config.pretrained,
                                      n_fg_class=len(BCCD_LABEL_NAMES)))
        return set_precision(model, config.precision)

    def train_chain(self, model):
        """The model and the safe multibox loss (hard negatives ``k``, weight ``alpha``), on
        this process's device."""
        train_chain = MultiboxTrainChain(model, alpha=self.config.alpha, k=self.config.k,
                                         comm=self.comm)
        train_chain.to_device(self.device)
        self.device.use()
        return train_chain

    def transform(self, model):
        """The training transform: ChainerCV's augmentation then the multibox encoding
        (:class:`~medaidet.ssd.transforms.TrainTransform`), or the encoding alone with
        ``augment=False``."""
        if self.config.augment:
            return TrainTransform.for_model(model, max_expand_ratio=self.config.max_expand_ratio,
                                            color_distortion=self.config.color_distortion)
        return EncodeTransform.for_model(model)

    def datasets(self, model) -> TrainingData:
        """BCCD's training and validation splits (the first ``subset`` / ``eval_subset``
        images), the training images through :meth:`transform`, reseeded per worker
        process when ``config.seed`` is set. Raises :class:`ConfigError` when the
        training images hold no box (:func:`check_objects`)."""
        config = self.config
        if self.root is None:
            self.root = resolve_root(config.root)
        dataset = BCCDDataset(self.root, config.train_split, labels=config.labels)
        images = _first(dataset, config.subset)
        check_objects(dataset, images, config)
        if config.other_sources:     # TXL-PBC's train images of other laboratories
            images = ConcatenatedDataset(
                images, TXLPBCDataset(None, "train", config.other_sources))
        val = _first(BCCDDataset(self.root, config.val_split, labels=config.labels),
                     config.eval_subset)
        transform = self.transform(model)
        # each rank's share of the plain images, wrapped here: a ReseedingTransform made on
        # rank 0 and sent to another rank would take that rank for a worker process and
        # reseed it from its process id (seeded runs would differ from run to run)
        mine = images
        if self.comm is not None:   # rank 0's images, shuffled with the seed, split, sent
            import chainermn
            mine = chainermn.scatter_dataset(images if self.comm.rank == 0 else None,
                                             self.comm, shuffle=True, seed=config.seed or 0)
        train = TransformDataset(mine, ReseedingTransform(transform, config.seed))
        return TrainingData(images, train, val, transform)

    def iterators(self, data: TrainingData, log=print) -> Iterators:
        """The shuffled, repeating training iterator (worker processes where possible:
        :func:`~medaidet.training.iterators.make_train_iterator`), and the validation
        iterator (one pass, in order)."""
        train_iter, n_processes = make_train_iterator(data.train, self.config, log,
                                                      self.batch_size)
        val_iter = chainer.iterators.SerialIterator(data.val, self.config.eval_batch_size,
                                                    repeat=False, shuffle=False)
        return Iterators(train_iter, val_iter, n_processes)

    def optimizer(self, train_chain):
        """MomentumSGD (the recipe; or Adam, ``optimizer='adam'``) with the recipe's hooks:
        bias gradients x ``bias_grad_scale``, weight decay on every other parameter (as
        ChainerCV's example), and :class:`StopOnNonFinite` before and after every update.
        Shared over the ranks of a ChainerMN run."""
        config = self.config
        if config.optimizer == "adam":
            optimizer = chainer.optimizers.Adam(alpha=config.lr)
        else:
            optimizer = chainer.optimizers.MomentumSGD(lr=config.lr, momentum=config.momentum)
        if self.comm is not None:   # gradients averaged over the ranks before every update
            import chainermn
            optimizer = chainermn.create_multi_node_optimizer(optimizer, self.comm)
        optimizer.setup(train_chain)
        use_loss_scaling(optimizer, config.precision)       # mixed16 only
        if self.comm is not None:
            # every rank takes rank 0's weights now: ChainerMN's first update() would do it
            # and skip that update, one step behind a one-process run
            optimizer.update()
        for param in train_chain.params():
            if param.name == "b":
                param.update_rule.add_hook(GradientScaling(config.bias_grad_scale))
            else:
                param.update_rule.add_hook(WeightDecay(config.weight_decay))
        optimizer.add_hook(StopOnNonFinite("pre"))
        optimizer.add_hook(StopOnNonFinite("post"))
        return optimizer

    def updater(self, train_iter, optimizer):
        """``StandardUpdater``, or with ``accumulate > 1`` the
        :class:`~medaidet.training.accumulation.AccumulatingUpdater` (the batch in
        ``accumulate`` micro-batches, the loss normalised by the whole batch's positives)."""
        if self.config.accumulate == 1:
            return training.updaters.StandardUpdater(train_iter, optimizer, device=self.device)
        return AccumulatingUpdater(train_iter, optimizer, device=self.device,
                                   accumulate=self.config.accumulate, comm=self.comm)

    def trainer(self, updater):
        """The trainer: ``iterations`` (or ``epochs`` of the training images), writing to
        ``config.out``."""
        length = Length(self.config, *_images_and_batch(updater))
        return training.Trainer(updater, length.stop, out=str(self.config.out))

    def extensions(self, trainer, model, val_iter, progress: bool = True) -> Extensions:
        """The recipe's learning-rate steps and validation, then what the course adds: the
        log (every ``log_interval`` iterations and at the end), the progress bar, the
        plots, and (one process only) a trainer snapshot with the random states every
        ``snapshot_interval`` epochs and at the end. Only rank 0 logs and writes."""
        config = self.config
        length = Length(config, *_images_and_batch(trainer.updater))
        lr_steps = training.triggers.ManualScheduleTrigger(list(config.lr_steps), "epoch")
        trainer.extend(extensions.ExponentialShift(lr_name(config), config.lr_gamma,
                                                   init=config.lr), trigger=lr_steps)
        evaluator = PresetEvaluator(val_iter, CappedPredictor(model), use_07_metric=False,
                                    label_names=BCCD_LABEL_NAMES, comm=self.comm)
        trainer.extend(evaluator, name="validation",
                       trigger=EveryOrEnd(config.eval_interval, "epoch", length.is_end))
        log_report = extensions.LogReport(trigger=EveryOrEnd(config.log_interval, "iteration",
                                                             length.is_end))
        monitor = Monitor(length.total, progress and self.main)
        if self.main:
            trainer.extend(log_report)
            trainer.extend(extensions.observe_lr(), trigger=(1, "iteration"))
            trainer.extend(monitor, name="monitor")
            trainer.extend(Plotter(Path(config.out), log_report, monitor, length.is_end,
                                   val_split=config.val_split,
                                   lr_steps=length.lr_step_iterations),
                           name="plots",
                           trigger=EveryOrEnd(config.log_interval, "iteration", length.is_end))
        if self.comm is None:       # each rank's data order and random state: not saved
            trainer.extend(RandomStateExtension(length.n_images, length.batch_size))
            trainer.extend(extensions.snapshot(filename=SNAPSHOT_NAME),
                           trigger=EveryOrEnd(config.snapshot_interval, "epoch", length.is_end),
                           priority=-100)
        return Extensions(evaluator, log_report, monitor, length.lr_step_iterations)

    def build(self, log=print, progress: bool = True) -> Built:
        """Every piece, in the recipe's order: model -> train chain -> data -> iterators
        -> optimizer -> updater -> trainer -> extensions."""
        model = self.model()
        train_chain = self.train_chain(model)
        data = self.datasets(model)
        iterators = self.iterators(data, log)
        optimizer = self.optimizer(train_chain)
        updater = self.updater(iterators.train, optimizer)
        trainer = self.trainer(updater)
        ext = self.extensions(trainer, model, iterators.val, progress)
        return Built(model, train_chain, data, iterators, optimizer, updater, trainer, ext)


# --------------------------------------------------------------------------- result

@dataclass
class TrainResult:
    """What :func:`medaidet.training.train.train` produced. ``metrics`` is what
    ``metrics.json`` holds (:func:`run_metrics`)."""

    out: Path
    weights: Path
    sha256: str
    snapshot: Path | None          # None: a multi-process run (no trainer snapshot)
    metrics: dict
    model: object = field(repr=False, default=None)

    def to_dict(self) -> dict:
        return dict(self.metrics)

    def validation_table(self) -> Table:
        """Every validation of the run: iteration, epoch, val mAP and AP per class (the
        split is the config's ``val_split``)."""
        m = self.metrics
        names = list(m["val_ap"])
        table = Table(["iteration", "epoch", f"{m['config']['val_split']} mAP", *names])
        for entry in m["log"]:
            if "validation/main/map" in entry:
                table.append([entry["iteration"], entry["epoch"], entry["validation/main/map"],
                              *(entry.get(f"validation/main/ap/{n}") for n in names)])
        return table

    def summary(self) -> str:
        m = self.metrics
        best = m.get("best_val_map")
        best = "n/a" if best is None else f"{best:.3f} (iteration {m['best_val_iteration']})"
        loss = "n/a" if m.get("last_loss") is None else f"{m['last_loss']:.3f}"
        return (f"trained {m['iterations']} iterations ({m['iterations_this_run']} in this run, "
                f"{m['seconds']:.0f} s, {m['images_per_second']:.2f} images/s); last loss "
                f"{loss}; best val mAP {best}\nweights: {self.weights} "
                f"(sha256 {self.sha256[:12]}...)" +
                (f"\nsnapshot: {self.snapshot}" if self.snapshot is not None else ""))


def _clean_log(log):
    """LogReport's entries with nan/inf as None (JSON has no nan)."""
    return [{k: (finite_or_none(v) if isinstance(v, (float, np.floating)) else v)
             for k, v in entry.items()} for entry in log]


def run_metrics(config, recipe, data, iterators, updater, extensions, *, start_iteration,
                seconds, resume, weights, sha256, snapshot, plots) -> dict:
    """The numbers of a finished run (what ``metrics.json`` holds): how long, how fast,
    the last loss, the best and the last validation AP, what the data and the processes
    were, where the files are, the config and the versions."""
    iterations_run = updater.iteration - start_iteration
    eval_seconds = extensions.evaluator.seconds
    train_seconds = max(seconds - eval_seconds, 1e-9)
    entries = _clean_log(extensions.log_report.log)
    evals = [e for e in entries if e.get("validation/main/map") is not None]
    best = max(evals, key=lambda e: e["validation/main/map"], default=None)
    last_eval = [e for e in entries if "validation/main/map" in e]
    last_eval = last_eval[-1] if last_eval else {}
    counted = iterators.n_processes == 0      # worker processes keep their own counts
    return {
        "iterations": int(updater.iteration),
        "iterations_this_run": int(iterations_run),
        "epochs": float(updater.epoch_detail),
        "resumed_from": None if resume is None else str(resume),
        "seconds": seconds,
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "images_per_second": iterations_run * config.batch_size / train_seconds,
        "seconds_per_epoch": (train_seconds / (iterations_run * config.batch_size)
                              * len(data.images)) if iterations_run else None,
        "last_loss": finite_or_none(extensions.monitor.last_loss),
        "best_val_map": None if best is None else best["validation/main/map"],
        "best_val_iteration": None if best is None else best["iteration"],
        "val_map": last_eval.get("validation/main/map"),
        "val_ap": {c: last_eval.get(f"validation/main/ap/{c}") for c in BCCD_LABEL_NAMES},
        "val_images": len(data.val),
        "train_images": len(data.images),
        "transform_stats": data.transform.stats.to_dict() if counted else None,
        **({} if counted else {"transform_stats_note": (
            "not counted: the transform ran in worker processes; use n_processes=0 to "
            "count drops")}),
        "n_processes": iterators.n_processes,
        "accumulate": config.accumulate,
        "communicator": config.communicator,
        "ranks": 1 if recipe.comm is None else recipe.comm.size,
        "batch_per_rank": recipe.batch_size,
        "rank_digests": None,      # a multi-process run: medaidet.extras.mpi.train's check
        "device": str(recipe.device),
        "weights": str(weights),
        "sha256": sha256,
        "snapshot": None if snapshot is None else str(snapshot),
        "plots": plots,
        "config": config.to_dict(),
        "versions": {"chainer": chainer.__version__, "numpy": np.__version__},
        "log": entries,
    }


# --------------------------------------------------------------------------- memory fit

# The recipe's batch fitted to the device's memory, before training (notebook 03, section 4;
# notebook 07 teaches the tools by hand).
#
# The recipe's batch is 32 SSD300 images: more memory than many GPUs have (a T4 gives about
# 15 GiB). :func:`fit_batch` measures a training step (forward + backward on real training
# images, random initial weights: memory does not depend on their values) at 2 and 4 images,
# so it knows the step's fixed memory and its memory per image; adds the optimizer's state;
# and keeps the largest micro-batch (a divisor of the batch) that fits in the memory the device
# has free. Where that is less than the batch, the run trains the same batch in ``accumulate``
# micro-batches (:class:`~medaidet.training.accumulation.AccumulatingUpdater`): the gradient of
# the whole batch, except that batch normalisation (the small SSD's) sees micro-batches.
#
# On a GPU this always runs; on the CPU only when ``config.memory_limit`` says how much the run
# may hold (host memory is not a pool to read). The measurement runs before the run is seeded,
# on a model of its own, so the run's random streams are not touched.

GIB = 2 ** 30
#: The part of the free memory a step may plan to use (fragmentation, the pool's rounding).
MARGIN = 0.9


@dataclass
class MemoryFit:
    """What the check measured and chose. Bytes: ``fixed`` (a step's memory whatever its
    batch), ``per_image``, ``state`` (the optimizer's state, allocated at its first update),
    ``available`` (what the run may hold on the device). ``measure``: how peaks were read."""
    device: str
    batch_size: int
    accumulate: int
    fixed: int
    per_image: int
    state: int
    available: int
    measure: str

    @property
    def micro_batch(self) -> int:
        return self.batch_size // self.accumulate

    def needs(self, micro_batch: int) -> int:
        """Bytes a step of ``micro_batch`` images is planned to take."""
        return self.fixed + self.per_image * micro_batch + self.state

    def summary(self) -> str:
        """One line: what fits and what the run does."""
        room = (f"{format_bytes(self.available)} available on {self.device}; a step takes "
                f"{format_bytes(self.fixed + self.state)} + {format_bytes(self.per_image)} "
                f"per image, measured")
        if self.accumulate == 1:
            return f"memory: batch {self.batch_size} fits ({room})"
        return (f"memory: batch {self.batch_size} does not fit ({room}): training it as "
                f"{self.accumulate} micro-batches of {self.micro_batch} (accumulate "
                f"{self.accumulate}), the gradient of the whole batch per update")

    def to_dict(self) -> dict:
        return {**asdict(self), "micro_batch": self.micro_batch}


def available_bytes(device, limit_gib: float | None = None) -> int | None:
    """Bytes a run may hold on ``device`` (a chainer device): on a GPU what the driver has
    free plus the blocks CuPy's pool caches, capped by ``limit_gib`` (which also becomes the
    pool's limit, so the run really cannot take more); on the CPU ``limit_gib``, or None."""
    limit = None if limit_gib is None else int(limit_gib * GIB)
    if device.xp is np:
        return limit
    pool = device.xp.get_default_memory_pool()
    with device:
        if limit is not None:
            pool.set_limit(size=limit)
        free = device.xp.cuda.runtime.memGetInfo()[0] + pool.free_bytes()
        if pool.get_limit():
            free = min(free, pool.get_limit() - pool.used_bytes())
    return free


def plan_accumulate(fit: MemoryFit, at_least: int = 1) -> int:
    """The smallest ``accumulate`` (a divisor of the batch, ``at_least`` or more) whose
    micro-batch fits in ``MARGIN`` of the available memory; a ``"memory"``
    :class:`~medaidet.errors.DeviceError` when not even one image does."""
    for accumulate in range(at_least, fit.batch_size + 1):
        if fit.batch_size % accumulate == 0 and \
                fit.needs(fit.batch_size // accumulate) <= MARGIN * fit.available:
            return accumulate
    raise DeviceError(
        f"memory: not even one image fits on {fit.device}: a step of one image takes "
        f"{format_bytes(fit.needs(1))} (measured), {format_bytes(fit.available)} are "
        "available. Free the device's memory (other notebooks' kernels, nvidia-smi lists "
        "them), raise memory_limit, or train the small SSD (model='ssd_small')", "memory",
        needed=fit.needs(1), available=fit.available)


def _peak(chain, examples, device):
    """Peak bytes of one step (forward + backward) on ``examples``; None when the device ran
    out of memory. The step's arrays and gradients are given back afterwards."""
    try:
        with PeakMemory(device) as peak:
            chain.cleargrads()
            chain(*concat_examples(examples, device)).backward()
            synchronize(device)
        return peak.bytes
    except Exception as exc:               # noqa: BLE001 (re-raised unless out of memory)
        if not is_out_of_memory(exc):
            raise
        return None
    finally:
        chain.cleargrads()
        free_memory(device)


def _measure(config: TrainConfig, root, device):
    """Peak bytes of a step at 2 and 4 images, the optimizer state's bytes, the memory
    available while the measured model's parameters are held, and how peaks were read."""
    recipe = Recipe(config.replace(pretrained=None, augment=False), root=root)
    model = recipe.model()
    chain = recipe.train_chain(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnnotationWarning)
        images = BCCDDataset(root, config.train_split, labels=config.labels).slice[:4]
    dataset = TransformDataset(images, recipe.transform(model))
    examples = [dataset[i % len(dataset)] for i in range(4)]
    with chainer.using_config("train", True):
        peaks = [_peak(chain, examples[:n], device) for n in (2, 4)]
    state = sum(p.array.nbytes for p in chain.params()) * (2 if config.optimizer == "adam"
                                                            else 1)
    return peaks, state, available_bytes(device, config.memory_limit), PeakMemory(device).measure


def fit_batch(config: TrainConfig, root, device, log=print):
    """``(config, fit)``: ``config`` with the ``accumulate`` whose micro-batch fits on
    ``device`` (a chainer device) and the :class:`MemoryFit` that chose it, logged in one
    line; ``(config, None)`` on the CPU without ``memory_limit``. A ``"memory"``
    :class:`~medaidet.errors.DeviceError` when not even one image fits."""
    if device.xp is np and config.memory_limit is None:
        return config, None
    peaks, state, available, measure = _measure(config, root, device)
    gc.collect()
    if None in peaks:        # out of memory already at 2 or 4 images
        peaks = [p if p is not None else available for p in peaks]
    per_image = max((peaks[1] - peaks[0]) // 2, peaks[1] // 8)
    fit = MemoryFit(device=str(device), batch_size=config.batch_size,
                    accumulate=config.accumulate, fixed=max(peaks[0] - 2 * per_image, 0),
                    per_image=per_image, state=state, available=available, measure=measure)
    fit.accumulate = plan_accumulate(fit, at_least=config.accumulate)
    if log:
        log(f"train: {fit.summary()}")
    return config.replace(accumulate=fit.accumulate), fit


# --------------------------------------------------------------------------- run

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
    (:func:`medaidet.training.train.seed_everything`)."""
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

    Returns a :class:`~medaidet.training.train.TrainResult`. Raises
    :class:`~medaidet.errors.DeviceError`, a ``"snapshot"`` WeightsError,
    :class:`~medaidet.errors.DivergedError` (a nan/inf loss or
    gradient: which iteration, and the snapshot left intact),
    a ``"missing"`` WeightsError (``pretrained='imagenet'`` offline: the
    message says where to put the file),
    :class:`~medaidet.training.train.ConfigError` (no box in the training images,
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
    :class:`~medaidet.training.train.MemoryFit` that chose ``config.accumulate``."""
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
