"""The recipe's batch fitted to the device's memory, before training (notebook 03, section 4;
notebook 07 teaches the tools by hand).

The recipe's batch is 32 SSD300 images: more memory than many GPUs have (a T4 gives about
15 GiB). :func:`fit_batch` measures a training step (forward + backward on real training
images, random initial weights: memory does not depend on their values) at 2 and 4 images,
so it knows the step's fixed memory and its memory per image; adds the optimizer's state;
and keeps the largest micro-batch (a divisor of the batch) that fits in the memory the device
has free. Where that is less than the batch, the run trains the same batch in ``accumulate``
micro-batches (:class:`~medaidet.training.accumulation.AccumulatingUpdater`): the gradient of
the whole batch, except that batch normalisation (the small SSD's) sees micro-batches.

On a GPU this always runs; on the CPU only when ``config.memory_limit`` says how much the run
may hold (host memory is not a pool to read). The measurement runs before the run is seeded,
on a model of its own, so the run's random streams are not touched.
"""
from __future__ import annotations

import gc
import warnings
from dataclasses import asdict, dataclass

import numpy as np

from medaidet.errors import DeviceError
from medaidet.training.config import TrainConfig
from medaidet.training.memory import (PeakMemory, format_bytes, free_memory, is_out_of_memory,
                                      synchronize)

__all__ = ["MemoryFit", "available_bytes", "plan_accumulate", "fit_batch"]

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
    from chainer.dataset import concat_examples
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
    import chainer
    from chainer.datasets import TransformDataset
    from medaidet.data.bccd import AnnotationWarning, BCCDDataset
    from medaidet.training.recipe import Recipe

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
