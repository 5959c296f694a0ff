"""Training (notebooks 03 and 06): :func:`train` is ChainerCV's ``examples/ssd/train.py`` (seed,
build the :class:`Recipe` piece by piece, run, save). Writes to ``config.out``: ``model.npz`` +
``.sha256``, ``snapshot_latest.npz`` (with the random states: a resumed run sees the batches an
uninterrupted one would), ``metrics.json``, ``loss.png``, ``map.png`` and ``config.json``."""
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
from collections import namedtuple
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

from medaidet.arguments import prepare_output_dir
from medaidet.data import BCCD_LABEL_NAMES
from medaidet.data.bccd import (AnnotationWarning, BCCDDataset, annotation_path, parse_annotation,
                                split_path)
from medaidet.data.download import TXL_PBC, resolve_root
from medaidet.data.txl_pbc import TXLPBCDataset
from medaidet.device import resolve_device
from medaidet.errors import ConfigError, DeviceError, DivergedError, WeightsError
from medaidet.files import write_files
from medaidet.numbers import finite_or_none
from medaidet.ssd import PRETRAINED
from medaidet.ssd.model import build_ssd
from medaidet.ssd.precision import use_tf32
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
           "TrainingData", "Iterators", "Extensions", "Length", "check_objects", "seed_everything",
           "ReseedingTransform", "StopOnNonFinite", "stop_on_divergence", "RandomStateExtension",
           "SNAPSHOT_NAME", "check_run_file", "load_snapshot", "run_metrics", "MemoryFit",
           "available_bytes", "plan_accumulate", "fit_batch"]


def seed_everything(seed: int, devices=None, deterministic: bool = False) -> None:
    """Seed Python's, NumPy's and (on each GPU among the chainer ``devices``) CuPy's RNGs with
    ``seed`` in ``[0, 2**32)``; set ``cudnn_deterministic``. Call it before building the model."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
        raise ConfigError(f"seed must be an integer in [0, 2**32) (NumPy's RandomState "
                          f"limit), got {seed!r}", "seed")
    random.seed(int(seed))
    np.random.seed(int(seed))
    for device in devices or ():
        if getattr(device, "xp", None) is None:
            raise ConfigError(f"devices: {device!r} is not a chainer device; pass "
                              "medaidet.device.resolve_device(spec)'s")
        if device.xp is not np:             # CuPy: one generator per GPU
            with device.device:
                device.xp.random.seed(int(seed))
    chainer.config.cudnn_deterministic = bool(deterministic)


class ReseedingTransform:
    """``transform``, reseeding ``random`` and NumPy at its first call in each new (worker)
    process from ``(seed, worker name)``, the same every run (the OS's entropy if no seed)."""

    def __init__(self, transform, seed: int | None = None):
        self.transform, self.seed, self._pid = transform, seed, os.getpid()

    def __call__(self, in_data):
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            digits = "".join(c for c in multiprocessing.current_process().name if c.isdigit())
            entropy = None if self.seed is None else [self.seed, int(digits or self._pid)]
            words = np.random.SeedSequence(entropy).generate_state(2)
            random.seed(int(words[0]))
            np.random.seed(int(words[1]))
        return self.transform(in_data)


SNAPSHOT_NAME = "snapshot_latest.npz"
SNAPSHOT_EXPECTED = "the snapshot_latest.npz of a medaidet train run (in its output folder)"


class RandomStateExtension:
    """Puts Python's and NumPy's random states (chainer's snapshot leaves them out) and the
    training set and batch sizes into the trainer snapshot. Only ``serialize`` matters."""

    name = "train_state"
    trigger = (10 ** 12, "iteration")
    priority = 0

    def __init__(self, train_size: int, batch_size: int):
        self.train_size, self.batch_size = int(train_size), int(batch_size)

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
        gauss = float(serializer("python_gauss", None))
        random.setstate((int(serializer("python_version", None)),
                         tuple(int(v) for v in serializer("python_state", None)),
                         None if math.isnan(gauss) else gauss))
        np.random.set_state(("MT19937", np.asarray(serializer("numpy_keys", None), np.uint32),
                             int(serializer("numpy_pos", None)),
                             int(serializer("numpy_has_gauss", None)),
                             float(serializer("numpy_cached_gaussian", None))))


def check_run_file(path, name: str = "resume", snapshot: bool = True) -> Path:
    """``path`` if it is a trainer snapshot (``updater/`` entries) or, with ``snapshot=False``,
    a model-only ``.npz``; else a WeightsError naming ``name`` (kind ``"snapshot"``; for
    weights ``"missing"`` or ``"file"``). Reads only the zip directory."""
    path, kind = Path(path), "snapshot" if snapshot else "file"

    def fail(problem, kind=kind):
        expected = SNAPSHOT_EXPECTED if snapshot else ("imagenet, voc0712, none or a model-only "
                                                       ".npz (the model.npz of a train run)")
        return WeightsError(f"{name}: {path} {problem}; expected {expected}", kind, path=path)

    if not path.exists():
        raise fail("does not exist", kind if snapshot else "missing")
    try:
        what = what_file_is(path)        # a folder, an empty file, a .npy, a text file, ...
        if what is not None:
            raise fail(f"is {what}")
        with zipfile.ZipFile(path) as archive:
            found = any(entry.startswith("updater/") for entry in archive.namelist())
    except zipfile.BadZipFile as exc:
        raise fail(f"is truncated or corrupt ({exc})") from None
    except OSError as exc:
        raise fail(f"cannot be read ({exc.strerror or exc})") from None
    if found != snapshot:
        raise fail("is a trainer snapshot, not model weights: to continue that run use "
                   "resume=PATH (--resume PATH)" if found else
                   "is not a trainer snapshot (no 'updater/' entries): to start from model "
                   "weights use pretrained=PATH (--pretrained PATH)")
    return path


def load_snapshot(trainer, path, train_size: int, batch_size: int) -> None:
    """Restore ``trainer`` and the random states from ``path``; a ``"snapshot"`` WeightsError
    unless it was taken on ``train_size`` images with ``batch_size`` and fits the model."""
    path, prefix = Path(path), f"extensions/{RandomStateExtension.name}/"
    try:
        with np.load(path, allow_pickle=False) as npz:
            check_sizes(path, npz.zip)          # before chainer reads every array of it
            if prefix + "train_size" not in npz.files:
                raise WeightsError(f"{path} lacks medaidet train's random states: it cannot be "
                                   "resumed; start from its weights (pretrained=PATH)", "snapshot")
            size, batch = int(npz[prefix + "train_size"]), int(npz[prefix + "batch_size"])
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise WeightsError(f"{path} is not a readable trainer snapshot ({type(exc).__name__}: "
                           f"{exc}); expected {SNAPSHOT_EXPECTED}", "snapshot") from None
    if (size, batch) != (train_size, batch_size):
        raise WeightsError(f"{path} was taken on {size} images with batch size {batch}, this "
                           f"config has {train_size} images and batch size {batch_size}: resume "
                           "with the same subset and batch size, or start from its weights "
                           "(pretrained='.../model.npz')", "snapshot")
    try:
        chainer.serializers.load_npz(str(path), trainer)
    except (KeyError, ValueError, TypeError) as exc:
        raise WeightsError(f"{path} does not fit this trainer ({type(exc).__name__}: {exc}): "
                           "was it taken with another model or config?", "snapshot") from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise WeightsError(f"{path} is truncated or corrupt ({type(exc).__name__}: {exc}); "
                           f"expected {SNAPSHOT_EXPECTED}", "snapshot") from None


class StopOnNonFinite:
    """Optimizer hook stopping training at the first nan or inf: ``'pre'`` checks the loss and
    every gradient before the update, ``'post'`` every parameter after it (one host sync each)."""

    call_for_each_param = False

    def __init__(self, timing: str = "pre", loss_key: str = "main/loss"):
        if timing not in ("pre", "post"):
            raise ValueError(f"timing must be 'pre' or 'post', got {timing!r}")
        self.timing, self.loss_key, self.name = timing, loss_key, f"StopOnNonFinite_{timing}"

    def __call__(self, optimizer):
        pre = self.timing == "pre"
        if pre:
            try:
                observation = chainer.reporter.get_current_reporter().observation
            except IndexError:                      # no reporter: outside a trainer
                observation = {}
            loss = observation.get(self.loss_key, 0.0)
            value = float(getattr(loss, "array", loss))
            if not math.isfinite(value):
                raise DivergedError(f"the loss is {value}", "training")
        arrays = [(name, a) for name, p in optimizer.target.namedparams()
                  if (a := p.grad if pre else p.array) is not None]
        if not arrays:
            return
        xp = backend.get_array_module(arrays[0][1])       # one transfer to the host
        finite = backend.CpuDevice().send(xp.stack([xp.isfinite(a).all() for _, a in arrays]))
        bad = [name for (name, _), ok in zip(arrays, finite) if not ok]
        if bad:
            what = ("gradient(s) hold nan or inf" if pre else
                    "weight array(s) hold nan or inf after this iteration's update")
            raise DivergedError(f"{len(bad)} {what}, first {bad[0]}", "training")


@contextlib.contextmanager
def stop_on_divergence(updater, snapshot: Path):
    """Around ``trainer.run()``: a DivergedError without an iteration becomes one naming the
    iteration and the snapshot kept."""
    try:
        yield
    except DivergedError as exc:
        if exc.iteration is not None:
            raise
        cause = (str(exc) if exc.kind == "training" else
                 f"the network's outputs hold nan or inf ({exc})")
        try:
            with np.load(snapshot, allow_pickle=False) as npz:
                snap_iteration = int(npz["updater/iteration"])
        except (OSError, KeyError, ValueError):         # none written yet
            snap_iteration = None
        kept = (f"no trainer snapshot was written ({snapshot}; set snapshot_interval)"
                if snap_iteration is None else
                f"the last trainer snapshot, {snapshot} (iteration {snap_iteration}), is intact")
        iteration = updater.iteration + 1
        raise DivergedError(
            f"training diverged at iteration {iteration}: {cause}; model.npz was not written, "
            f"{kept}. Lower lr (or warm up) or fix the bad sample (medaidet data validate), "
            "then start again or resume", "training", iteration=iteration,
            snapshot=None if snap_iteration is None else snapshot,
            snapshot_iteration=snap_iteration) from exc


def _first(dataset, n):
    return dataset if n is None or n >= len(dataset) else dataset.slice[:n]


def _n_boxes(dataset) -> int:       # read from the annotations: no image is decoded
    return sum(len(label) for label in dataset.slice[:, "label"])


def check_objects(dataset, images, config: TrainConfig):
    """A ConfigError when ``images`` (the first ``subset`` of the training split ``dataset``)
    hold no box the loader keeps."""
    if _n_boxes(images):
        return
    split, root = config.train_split, dataset.root
    listed = split_path(root, split)
    if len(images) < len(dataset) and _n_boxes(dataset):
        raise ConfigError(f"subset={config.subset}: the first {len(images)} images of split "
                          f"{split} ({listed}) have no objects; use a larger subset, or none",
                          "nothing_to_learn")
    raw = sum(len(parse_annotation(annotation_path(root, i)).objects) for i in dataset.ids)
    why = f"all {raw} <object>s dropped as invalid or difficult" if raw else "no <object>"
    raise ConfigError(f"split {split} has nothing to learn: no image in {listed} has a box the "
                      f"loader keeps ({why}); check their Annotations/<id>.xml, or run "
                      f"`medaidet data validate {root}`", "nothing_to_learn")


# ``images``: all ranks' training images; ``train``: this process's share, augmented and
# encoded; ``val``: validation images as they are; ``transform`` (``stats``: drops)
TrainingData = namedtuple("TrainingData", "images train val transform")
# ``n_processes``: worker processes of the training iterator (0: none)
Iterators = namedtuple("Iterators", "train val n_processes")
# the extensions the run reads back, and where the learning-rate steps apply
Extensions = namedtuple("Extensions", "evaluator log_report monitor lr_step_iterations")
# every piece of a built recipe (:meth:`Recipe.build`), by name
Built = namedtuple("Built", "model train_chain data iterators optimizer updater trainer extensions")


@dataclass
class Length:
    """How long training runs (``stop`` trigger, ``total`` iterations), for one process."""

    config: TrainConfig
    n_images: int
    batch_size: int | None = None      # None: the config's

    def __post_init__(self):
        config, batch_size = self.config, self.batch_size or self.config.batch_size
        if config.iterations is not None:
            self.stop, self.total = (config.iterations, "iteration"), config.iterations
        else:
            self.stop = config.epochs, "epoch"
            self.total = math.ceil(config.epochs * self.n_images / batch_size)
        # the iteration after which each learning-rate step applies
        self.lr_step_iterations = [math.ceil(epoch * self.n_images / batch_size)
                                   for epoch in config.lr_steps]

    def is_end(self, trainer) -> bool:
        if self.config.iterations is not None:
            return trainer.updater.iteration >= self.config.iterations
        return trainer.updater.epoch_detail >= self.config.epochs


@dataclass
class Recipe:
    """The course's training recipe for ``config``, one method per piece (notebook 03). ``root``:
    the dataset root (None: ``config.root``'s, resolved when the data is built); ``device``:
    default ``config.device``; ``comm``: this rank's ChainerMN communicator."""

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
        """The SSD of ``config.model`` from ``config.pretrained`` for BCCD, initialised now."""
        return materialize(build_ssd(self.config.model, self.config.pretrained,
                                     n_fg_class=len(BCCD_LABEL_NAMES)))

    def train_chain(self, model):
        """The model and the multibox loss (``k``, ``alpha``) on this process's device."""
        train_chain = MultiboxTrainChain(model, alpha=self.config.alpha, k=self.config.k,
                                         comm=self.comm).to_device(self.device)
        self.device.use()
        return train_chain

    def transform(self, model):
        """Augmentation then multibox encoding; the encoding alone with ``augment=False``."""
        if self.config.augment:
            return TrainTransform.for_model(model, max_expand_ratio=self.config.max_expand_ratio,
                                            color_distortion=self.config.color_distortion)
        return EncodeTransform.for_model(model)

    def datasets(self, model) -> TrainingData:
        """BCCD's training (transformed) and validation splits, cut to ``subset`` /
        ``eval_subset``; :class:`ConfigError` when the training images hold no box."""
        config = self.config
        if self.root is None:
            self.root = resolve_root(config.root)
        dataset = BCCDDataset(self.root, config.train_split, labels=config.labels)
        images = _first(dataset, config.subset)
        check_objects(dataset, images, config)
        if config.other_sources:     # TXL-PBC's train images of other laboratories
            images = ConcatenatedDataset(images, TXLPBCDataset(None, "train", config.other_sources))
        val = _first(BCCDDataset(self.root, config.val_split, labels=config.labels),
                     config.eval_subset)
        transform = self.transform(model)
        # wrapped per rank: one sent from rank 0 would reseed from the pid (irreproducible)
        mine = images
        if self.comm is not None:
            import chainermn
            mine = chainermn.scatter_dataset(images if self.comm.rank == 0 else None,
                                             self.comm, shuffle=True, seed=config.seed or 0)
        train = TransformDataset(mine, ReseedingTransform(transform, config.seed))
        return TrainingData(images, train, val, transform)

    def iterators(self, data: TrainingData, log=print) -> Iterators:
        """The shuffled, repeating training iterator and the one-pass validation iterator."""
        train_iter, n_processes = make_train_iterator(data.train, self.config, log, self.batch_size)
        val_iter = chainer.iterators.SerialIterator(data.val, self.config.eval_batch_size,
                                                    repeat=False, shuffle=False)
        return Iterators(train_iter, val_iter, n_processes)

    def optimizer(self, train_chain):
        """MomentumSGD (or Adam) with the hooks: bias gradients x ``bias_grad_scale``, weight
        decay on the other parameters, :class:`StopOnNonFinite` before and after updates."""
        config = self.config
        optimizer = (chainer.optimizers.Adam(alpha=config.lr) if config.optimizer == "adam" else
                     chainer.optimizers.MomentumSGD(lr=config.lr, momentum=config.momentum))
        if self.comm is not None:   # gradients averaged over the ranks before every update
            import chainermn
            optimizer = chainermn.create_multi_node_optimizer(optimizer, self.comm)
        optimizer.setup(train_chain)
        if self.comm is not None:
            # rank 0's weights to every rank now: ChainerMN's first update() would skip a step
            optimizer.update()
        for param in train_chain.params():
            param.update_rule.add_hook(GradientScaling(config.bias_grad_scale) if param.name == "b"
                                       else WeightDecay(config.weight_decay))
        optimizer.add_hook(StopOnNonFinite("pre"))
        optimizer.add_hook(StopOnNonFinite("post"))
        return optimizer

    def updater(self, train_iter, optimizer):
        """``StandardUpdater``, or with ``accumulate > 1`` an ``AccumulatingUpdater``."""
        if self.config.accumulate == 1:
            return training.updaters.StandardUpdater(train_iter, optimizer, device=self.device)
        return AccumulatingUpdater(train_iter, optimizer, device=self.device,
                                   accumulate=self.config.accumulate, comm=self.comm)

    def _length(self, updater) -> Length:
        iterator = updater.get_iterator("main")          # this process's images and batch
        return Length(self.config, len(iterator.dataset), iterator.batch_size)

    def trainer(self, updater):
        """The trainer, stopping after ``iterations`` or ``epochs``, writing to ``config.out``."""
        return training.Trainer(updater, self._length(updater).stop, out=str(self.config.out))

    def extensions(self, trainer, model, val_iter, progress: bool = True) -> Extensions:
        """Learning-rate steps and validation, then the log, progress bar, plots and (one
        process only) snapshots. Only rank 0 logs and writes."""
        config, length = self.config, self._length(trainer.updater)

        def every(interval, unit):
            return EveryOrEnd(interval, unit, length.is_end)

        trainer.extend(extensions.ExponentialShift(     # Adam's learning rate is its alpha
            "alpha" if config.optimizer == "adam" else "lr", config.lr_gamma, init=config.lr),
            trigger=training.triggers.ManualScheduleTrigger(list(config.lr_steps), "epoch"))
        evaluator = PresetEvaluator(val_iter, CappedPredictor(model), use_07_metric=False,
                                    label_names=BCCD_LABEL_NAMES, comm=self.comm)
        trainer.extend(evaluator, name="validation", trigger=every(config.eval_interval, "epoch"))
        log_report = extensions.LogReport(trigger=every(config.log_interval, "iteration"))
        monitor = Monitor(length.total, progress and self.main)
        if self.main:
            trainer.extend(log_report)
            trainer.extend(extensions.observe_lr(), trigger=(1, "iteration"))
            trainer.extend(monitor, name="monitor")
            trainer.extend(Plotter(Path(config.out), log_report, monitor, length.is_end,
                                   val_split=config.val_split, lr_steps=length.lr_step_iterations),
                           name="plots", trigger=every(config.log_interval, "iteration"))
        if self.comm is None:       # each rank's data order and random state: not saved
            trainer.extend(RandomStateExtension(length.n_images, length.batch_size))
            trainer.extend(extensions.snapshot(filename=SNAPSHOT_NAME),
                           trigger=every(config.snapshot_interval, "epoch"), priority=-100)
        return Extensions(evaluator, log_report, monitor, length.lr_step_iterations)

    def build(self, log=print, progress: bool = True) -> Built:
        """Every piece, in the recipe's order."""
        model = self.model()
        train_chain = self.train_chain(model)
        data = self.datasets(model)
        iterators = self.iterators(data, log)
        optimizer = self.optimizer(train_chain)
        updater = self.updater(iterators.train, optimizer)
        trainer = self.trainer(updater)
        ext = self.extensions(trainer, model, iterators.val, progress)
        return Built(model, train_chain, data, iterators, optimizer, updater, trainer, ext)


@dataclass
class TrainResult:
    """What :func:`train` produced; ``metrics`` is what ``metrics.json`` holds."""

    out: Path
    weights: Path
    sha256: str
    snapshot: Path | None          # None: a multi-process run (no trainer snapshot)
    metrics: dict
    model: object = field(repr=False, default=None)

    def validation_table(self) -> Table:
        """Every validation of the run: iteration, epoch, mAP and AP per class."""
        m = self.metrics
        names = list(m["val_ap"])
        return Table(["iteration", "epoch", f"{m['config']['val_split']} mAP", *names],
                     [[e["iteration"], e["epoch"], e["validation/main/map"],
                       *(e.get(f"validation/main/ap/{n}") for n in names)]
                      for e in m["log"] if "validation/main/map" in e])

    def summary(self) -> str:
        m, best = self.metrics, self.metrics.get("best_val_map")
        best = "n/a" if best is None else f"{best:.3f} (iteration {m['best_val_iteration']})"
        loss = "n/a" if m.get("last_loss") is None else f"{m['last_loss']:.3f}"
        return (f"trained {m['iterations']} iterations ({m['iterations_this_run']} in this run, "
                f"{m['seconds']:.0f} s, {m['images_per_second']:.2f} images/s); last loss "
                f"{loss}; best val mAP {best}\nweights: {self.weights} "
                f"(sha256 {self.sha256[:12]}...)" +
                (f"\nsnapshot: {self.snapshot}" if self.snapshot is not None else ""))


def run_metrics(config, recipe, data, iterators, updater, extensions, *, start_iteration,
                seconds, resume, weights, sha256, snapshot, plots, fit=None) -> dict:
    """The numbers of a finished run, as ``metrics.json`` holds them; ``fit``: the MemoryFit."""
    iterations_run = updater.iteration - start_iteration
    train_seconds = max(seconds - extensions.evaluator.seconds, 1e-9)
    entries = [{k: finite_or_none(v) if isinstance(v, (float, np.floating)) else v
                for k, v in entry.items()} for entry in extensions.log_report.log]  # no nan
    evals = [e for e in entries if "validation/main/map" in e]
    best = max((e for e in evals if e["validation/main/map"] is not None),
               key=lambda e: e["validation/main/map"], default=None)
    last_eval = evals[-1] if evals else {}
    counted = iterators.n_processes == 0      # worker processes keep their own counts
    return {
        "iterations": int(updater.iteration),
        "iterations_this_run": int(iterations_run),
        "epochs": float(updater.epoch_detail),
        "resumed_from": None if resume is None else str(resume),
        "seconds": seconds,
        "train_seconds": train_seconds,
        "eval_seconds": extensions.evaluator.seconds,
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
        **({} if counted else {"transform_stats_note": "not counted: the transform ran in "
                               "worker processes; use n_processes=0 to count drops"}),
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
        "memory_fit": fit.to_dict() if fit is not None else None,
    }


# The recipe's batch fitted to the device's memory before training (notebook 03, section 3;
# notebook 07 by hand): :func:`fit_batch` measures a step at 2 and 4 images (fixed and per-image
# bytes), adds the optimizer state and keeps the largest micro-batch that fits. Always on a GPU;
# on the CPU only with ``config.memory_limit``. Runs before seeding, on a model of its own.

GIB = 2 ** 30
#: The part of the free memory a step may plan to use (fragmentation, the pool's rounding).
MARGIN = 0.9


@dataclass
class MemoryFit:
    """What the check measured and chose, in bytes: ``fixed`` (per step), ``per_image``,
    ``state`` (optimizer), ``available``; ``measure``: how peaks were read."""
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
    """Bytes a run may hold on ``device``: on a GPU the driver's free bytes plus CuPy's cached
    blocks, capped by ``limit_gib`` (also the pool's limit); on the CPU ``limit_gib``."""
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
    """The smallest ``accumulate`` (>= ``at_least``, dividing the batch) whose micro-batch
    fits in ``MARGIN`` of the memory; a ``"memory"`` DeviceError when not even one image does."""
    for accumulate in range(at_least, fit.batch_size + 1):
        if fit.batch_size % accumulate == 0 and \
                fit.needs(fit.batch_size // accumulate) <= MARGIN * fit.available:
            return accumulate
    raise DeviceError(
        f"memory: not even one image fits on {fit.device} ({format_bytes(fit.needs(1))} "
        f"measured, {format_bytes(fit.available)} available): free its memory (nvidia-smi lists "
        "the users), raise memory_limit, or use model='ssd_small'", "memory",
        needed=fit.needs(1), available=fit.available)


def _peak(chain, examples, device):
    """Peak bytes of one forward + backward on ``examples``; None when out of memory."""
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
    """Step peaks at 2 and 4 images, optimizer state bytes, bytes available, how measured."""
    recipe = Recipe(config.replace(pretrained=None, augment=False), root=root)
    chain = recipe.train_chain(model := recipe.model())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnnotationWarning)
        images = BCCDDataset(root, config.train_split, labels=config.labels).slice[:4]
    dataset = TransformDataset(images, recipe.transform(model))
    examples = [dataset[i % len(dataset)] for i in range(4)]
    with chainer.using_config("train", True):
        peaks = [_peak(chain, examples[:n], device) for n in (2, 4)]
    state = sum(p.array.nbytes for p in chain.params()) * (2 if config.optimizer == "adam" else 1)
    return peaks, state, available_bytes(device, config.memory_limit), PeakMemory(device).measure


def fit_batch(config: TrainConfig, root, device, log=print):
    """``(config with the accumulate that fits, MemoryFit)``, logged; ``(config, None)`` on
    the CPU without ``memory_limit``. A ``"memory"`` DeviceError when not one image fits."""
    if device.xp is np and config.memory_limit is None:
        return config, None
    peaks, state, available, measure = _measure(config, root, device)
    gc.collect()
    peaks = [available if p is None else p for p in peaks]     # None: out of memory
    per_image = max((peaks[1] - peaks[0]) // 2, peaks[1] // 8)
    fit = MemoryFit(device=str(device), batch_size=config.batch_size,
                    accumulate=config.accumulate, fixed=max(peaks[0] - 2 * per_image, 0),
                    per_image=per_image, state=state, available=available, measure=measure)
    fit.accumulate = plan_accumulate(fit, at_least=config.accumulate)
    if log:
        log(f"train: {fit.summary()}")
    return config.replace(accumulate=fit.accumulate), fit


def prepare_run(config: TrainConfig, resume=None) -> tuple[Path, Path]:
    """Check before anything is built: OpenCV when augmenting, the dataset root, the output
    folder (made now, not inside its inputs), the ``resume`` and ``pretrained`` files; returns
    ``(out, root)``, resolved. Raises ConfigError, WeightsError or a "not_found" DataError."""
    try:
        if config.augment:
            import cv2  # noqa: F401  (ChainerCV's augmentation imports it in each step)
    except ImportError as exc:
        raise ConfigError(f"augment: OpenCV does not import ({exc}), ChainerCV's augmentation "
                          "needs it: python -m medaidet stack install, or augment=False") from None
    if resume is not None and config.communicator is not None:
        raise WeightsError("resume: a multi-process (ChainerMN) run cannot be resumed; start a "
                           "new run from its weights (pretrained='.../model.npz')", "snapshot")
    root = resolve_root(config.root)
    read = ((root, resolve_root(None, TXL_PBC)) if config.labels == "txl-pbc"
            or config.other_sources else (root,))
    out = prepare_output_dir(config.out, "out", inputs=read)
    if resume is not None:
        check_run_file(resume, "resume")
    if config.pretrained is not None and config.pretrained not in PRETRAINED:
        check_run_file(config.pretrained, "pretrained", snapshot=False)
    return out, root


def initial_weights(config: TrainConfig) -> dict:
    """The weights a seeded run of ``config`` starts from, ``{save_npz name: array}`` (rank
    0's). Needs ``config.seed``; reseeds the global RNGs."""
    if config.seed is None:
        raise ConfigError("initial_weights needs a seeded config (seed=...): without a "
                          "seed the initial weights are not reproducible")
    seed_everything(config.seed, deterministic=config.deterministic)
    serializer = chainer.serializers.DictionarySerializer()
    serializer.save(Recipe(config).model())
    return dict(serializer.target)


def train(config: TrainConfig | None = None, resume=None, progress: bool = True,
          log=print, comm=None, device=None) -> TrainResult:
    """Train as ``config`` says (notebook 03), from a ``resume`` snapshot (06), as one ``comm``
    rank (08). Raises ConfigError, DeviceError, WeightsError, DivergedError or DataError."""
    config = config if config is not None else TrainConfig()
    if config.communicator is not None and comm is None:
        raise ConfigError(f"communicator: {config.communicator!r} needs several processes: "
                          "run `mpiexec -n N python -m medaidet train --communicator "
                          f"{config.communicator}` (notebook 08) or medaidet.extras.mpi.train")
    out, root = prepare_run(config, resume)
    device = resolve_device(config.device) if device is None else device
    rank = 0 if comm is None else comm.rank
    # the batch fitted to the memory, before seeding (it builds a model of its own)
    config, fit = fit_batch(config, root, device, log) if comm is None else (config, None)
    log = log if rank == 0 else (lambda *args, **kwargs: None)      # rank 0 alone logs
    if config.precision == "tf32":
        device.use()
        log("train: precision tf32: " + ("TF32 tensor cores for float32 matrix products"
                                         if use_tf32() else "float32 products (TF32 needs an "
                                         "NVIDIA GPU of compute capability 8.0+)"))
    if config.seed is not None:   # each rank its own stream; the weights are rank 0's
        seed_everything(config.seed + rank, [device], config.deterministic)
        log(f"train: seeded Python, NumPy and CuPy with {config.seed + rank}; "
            f"cudnn_deterministic {config.deterministic}")

    recipe = Recipe(config, root, comm, device)
    model, _, data, iterators, _, updater, trainer, ext = recipe.build(log, progress)
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
        ext.monitor.finalize()
        iterators.train.finalize()
    seconds = time.perf_counter() - start
    weights, snapshot = out / WEIGHTS_NAME, out / SNAPSHOT_NAME if comm is None else None
    if not recipe.main:
        return TrainResult(out, weights, "", snapshot, {"rank": rank}, model)
    sha256 = save_weights(model, weights)
    plots = write_plots(ext.log_report.log, out, config.val_split, ext.lr_step_iterations)
    metrics = run_metrics(config, recipe, data, iterators, updater, ext, resume=resume,
                          start_iteration=start_iteration, seconds=seconds, weights=weights,
                          sha256=sha256, snapshot=snapshot, plots=plots, fit=fit)
    if iterators.n_processes == 0:
        stats = data.transform.stats
        log(f"train: augmentation dropped {stats.dropped} of {stats.boxes_in} boxes "
            f"(too small {stats.too_small}, non-finite {stats.non_finite}); "
            f"{stats.cropped_out} left the random crop (the recipe's own behaviour)")
    write_files({out / "metrics.json": json.dumps(metrics, indent=2) + "\n"})
    result = TrainResult(out, weights, sha256, snapshot, metrics, model)
    log(result.summary())
    return result
