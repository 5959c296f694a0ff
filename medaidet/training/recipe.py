"""The training recipe, in the order ChainerCV's ``examples/ssd/train.py`` reads it.

model -> train chain -> datasets and transform -> iterators -> optimizer (with its hooks)
-> updater -> trainer -> extensions. A :class:`Recipe` holds a
:class:`~medaidet.training.config.TrainConfig` (and, for one rank of a ChainerMN run, its
communicator), and builds each piece with one method; :meth:`Recipe.build` builds all.
:func:`medaidet.training.run.train` is ``build()`` plus what the course adds around it
(checks before any work, seeding, a divergence stop, snapshots with the random states,
metrics and plots). Notebook 03 writes the same recipe out in plain ChainerCV.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import chainer
from chainer import training
from chainer.datasets import ConcatenatedDataset, TransformDataset
from chainer.optimizer_hooks import WeightDecay
from chainer.training import extensions
from chainercv.links.model.ssd import GradientScaling

from medaidet.data import BCCD_LABEL_NAMES
from medaidet.data.annotation import parse_annotation
from medaidet.data.bccd import BCCDDataset
from medaidet.data.pinned import resolve_root
from medaidet.data.txl_pbc import TXLPBCDataset
from medaidet.data.voc import annotation_path, split_path
from medaidet.device import resolve_device
from medaidet.errors import ConfigError
from medaidet.ssd.model import build_ssd
from medaidet.ssd.precision import set_precision, use_loss_scaling
from medaidet.ssd.predict import CappedPredictor
from medaidet.ssd.train_chain import MultiboxTrainChain
from medaidet.ssd.transforms import EncodeTransform, TrainTransform
from medaidet.ssd.weights import materialize
from medaidet.training.accumulation import AccumulatingUpdater
from medaidet.training.config import TrainConfig
from medaidet.training.divergence import StopOnNonFinite
from medaidet.training.extensions import EveryOrEnd, Monitor, Plotter, PresetEvaluator
from medaidet.training.iterators import make_train_iterator
from medaidet.training.seeding import ReseedingTransform
from medaidet.training.snapshot import SNAPSHOT_NAME, RandomStateExtension

__all__ = ["Recipe", "Built", "TrainingData", "Iterators", "Extensions", "Length", "lr_name",
           "check_objects"]


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

    ``root``: the dataset root, resolved (:func:`~medaidet.training.run.train` resolves
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
