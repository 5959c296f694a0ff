"""Seeding every random number generator a training run uses (notebook 06 teaches what it
does and does not make reproducible).

:func:`seed_everything` seeds Python's ``random`` (ChainerCV's augmentations), NumPy's global
RNG (shuffle order, initial weights), CuPy's on each GPU of the run (each device has its own)
and sets chainer's one determinism switch, ``chainer.config.cudnn_deterministic`` (it does
nothing where CuPy has no cuDNN: CuPy 14). Data-loading workers inherit the parent's state
when forked: :class:`ReseedingTransform` reseeds each from ``(seed, worker)``. What stays
non-deterministic: which worker augments which image, and GPU kernels that sum in a varying
order.
"""
from __future__ import annotations

import multiprocessing
import os
import random

import chainer
import numpy as np

from medaidet.device import gpu_ids
from medaidet.errors import ConfigError

__all__ = ["seed_everything", "ReseedingTransform"]


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
