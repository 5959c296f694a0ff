"""Seeding: one call for every random number generator a training run uses, and an honest
report of what that does and does not make reproducible.

A Chainer/ChainerCV training run draws random numbers in five places:

* **Python's** ``random``: ChainerCV's augmentations (``random_expand``, ``random_crop``'s
  constraint search, ``random_flip``, ...) and our colour distortion;
* **NumPy's** global ``RandomState``: the iterators' shuffle order (chainer's
  ``ShuffleOrderSampler`` uses it in the main process), weight initialisation on the CPU,
  and some augmentations;
* **CuPy**, once per GPU: ``cupy.random.seed`` seeds only the *current* device's generator;
* **data-loading workers**: ``MultiprocessIterator`` forks workers that inherit the
  parent's NumPy state, so without reseeding every worker repeats the *same* NumPy stream;
  Python's ``random`` reseeds itself from the OS in a forked child, so its draws differ in
  every run (:class:`ReseedingTransform` reseeds both from the seed, in each worker);
* **the kernels themselves**: not random, but not always bitwise reproducible (cuDNN's
  algorithm choice, atomic adds, the thread count of the CPU's BLAS).

:func:`seed_everything` seeds the first four, sets the determinism switch chainer has
(``chainer.config.cudnn_deterministic``), and returns a :class:`SeedReport`: one row per
item, saying what it did and where bitwise reproducibility is *not* possible and why.

What is reproducible, measured by the tests: on the CPU with ``n_processes=0`` two runs with
the same seed give bitwise identical weights, in the same or in separate processes, and a
run killed and resumed from its trainer snapshot ends with the same weights as an
uninterrupted one. With worker processes the shuffle order is still reproducible but the
augmentation is not: ``MultiprocessIterator`` hands each image to whichever worker is free,
so which worker's random stream augments it varies from run to run. ``deterministic=True``
therefore asks for ``n_processes=0``.
"""
from __future__ import annotations

import multiprocessing
import os
import random
from dataclasses import asdict, dataclass, field

import chainer
import numpy as np
from chainer.backends import cuda

from medaidet.device import gpu_ids
from medaidet.errors import ConfigError

__all__ = ["seed_everything", "SeedReport", "SeedRow", "ReseedingTransform"]

SEEDED = "seeded"
SET = "set"
NOT_DETERMINISTIC = "not deterministic"
NOT_APPLICABLE = "n/a"


@dataclass
class SeedRow:
    """One thing :func:`seed_everything` seeded or set, or could not make deterministic."""

    item: str
    status: str            # 'seeded', 'set', 'not deterministic' or 'n/a'
    detail: str


@dataclass(repr=False)
class SeedReport:
    """What :func:`seed_everything` did; print it (a table) or show it in a notebook."""

    seed: int
    deterministic: bool
    rows: list = field(default_factory=list)

    @property
    def not_deterministic(self) -> list:
        """The rows saying what stays non-deterministic."""
        return [r for r in self.rows if r.status == NOT_DETERMINISTIC]

    def row(self, item: str) -> SeedRow:
        for r in self.rows:
            if r.item == item:
                return r
        raise KeyError(item)

    def table(self) -> str:
        width = max(len(r.item) for r in self.rows)
        status = max(len(r.status) for r in self.rows)
        lines = [f"seed {self.seed}, deterministic mode "
                 f"{'on' if self.deterministic else 'off'}"]
        lines += [f"  {r.item:<{width}}  {r.status:<{status}}  {r.detail}" for r in self.rows]
        return "\n".join(lines)

    __str__ = __repr__ = table     # repr: what a notebook stores beside the table

    def _repr_markdown_(self):          # a table in Jupyter
        head = (f"**seed {self.seed}**, deterministic mode "
                f"{'on' if self.deterministic else 'off'}\n\n| item | status | detail |\n"
                "|---|---|---|\n")
        return head + "\n".join(f"| {r.item} | {r.status} | {r.detail} |" for r in self.rows)

    def to_dict(self) -> dict:
        return {"seed": self.seed, "deterministic": self.deterministic,
                "rows": [asdict(r) for r in self.rows]}


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed must be an integer >= 0, got {seed!r}", "seed")
    if seed >= 2 ** 32:
        raise ConfigError(f"seed must be < 2**32 (NumPy's RandomState limit), got {seed}",
                          "seed")
    return int(seed)


def _cudnn_row(deterministic: bool) -> SeedRow:
    chainer.config.cudnn_deterministic = bool(deterministic)
    flag = f"chainer.config.cudnn_deterministic = {bool(deterministic)}"
    if not cuda.available:
        return SeedRow("cuDNN", NOT_APPLICABLE, f"{flag}; no GPU in this run")
    if not cuda.cudnn_enabled:
        return SeedRow("cuDNN", NOT_APPLICABLE,
                       f"{flag}, but this CuPy has no cuDNN (CuPy 14 removed it): the flag "
                       "does nothing; chainer convolves with im2col + cuBLAS instead")
    if deterministic:
        return SeedRow("cuDNN", SET, f"{flag}: deterministic convolution algorithms "
                                     "(slower; max pooling backward still uses cuDNN's)")
    return SeedRow("cuDNN", NOT_DETERMINISTIC,
                   f"{flag}: cuDNN may pick non-deterministic convolution algorithms; "
                   "pass deterministic=True")


def seed_everything(seed: int, devices=None, deterministic: bool = False,
                    n_processes: int = 0) -> SeedReport:
    """Seed Python's ``random``, NumPy's global RNG and CuPy's RNG on every GPU in
    ``devices``; set chainer's determinism switch; report what stays non-deterministic.

    Args:
        seed: an integer in ``[0, 2**32)``.
        devices: chainer devices (or GPU ids) the run uses; CuPy is seeded on each GPU.
        deterministic: set ``chainer.config.cudnn_deterministic`` (cuDNN's deterministic
            algorithms, where cuDNN exists). Off, the report says what may vary.
        n_processes: the data-loading worker processes the run will use (0: none). Workers
            are seeded by :class:`ReseedingTransform`; the report says what that does and
            does not guarantee.

    Returns a :class:`SeedReport`. Call it before building the model (its initial weights
    are drawn from the seeded NumPy RNG) and before the first batch.
    """
    seed = _check_seed(seed)
    rows = []
    random.seed(seed)
    rows.append(SeedRow("Python random", SEEDED,
                        f"random.seed({seed}): ChainerCV's augmentations draw from it"))
    np.random.seed(seed)
    rows.append(SeedRow("NumPy", SEEDED,
                        f"np.random.seed({seed}): initial weights, augmentation"))
    rows.append(SeedRow("shuffle order", SEEDED,
                        "chainer's iterators shuffle with NumPy's global RNG in the main "
                        "process: the same seed gives the same order of images"))

    gpus = gpu_ids(devices)
    rows += [_cupy_row(seed, gpus), _workers_row(n_processes), _cudnn_row(deterministic)]
    if gpus:
        rows.append(SeedRow(
            "GPU kernels", NOT_DETERMINISTIC,
            "kernels that accumulate with atomic adds (e.g. scatter-add in the backward of "
            "indexing) sum in a varying order, and cuBLAS may choose other algorithms on "
            "another GPU or version: nothing guarantees equal bits. Measured: two "
            "deterministic runs of SSD300 (im2col + cuBLAS, no cuDNN) ended bit-identical "
            "on an H100 (docs/gpu.md); check yours with compare_weights"))
    threads = os.environ.get("OMP_NUM_THREADS") or os.environ.get("OPENBLAS_NUM_THREADS")
    rows.append(SeedRow(
        "CPU BLAS", SET if threads else NOT_APPLICABLE,
        ("thread count fixed by the environment (" + threads + "): " if threads else "") +
        "matrix products are reproducible for a fixed thread count; another machine or "
        "thread count can change the last bits"))
    return SeedReport(seed=seed, deterministic=bool(deterministic), rows=rows)


def _cupy_row(seed: int, gpus) -> SeedRow:
    """CuPy's generator seeded on every GPU of the run (each device has its own)."""
    if not gpus:
        return SeedRow("CuPy", NOT_APPLICABLE, "no GPU in this run")
    import cupy
    for gpu in gpus:
        with cupy.cuda.Device(gpu):
            cupy.random.seed(seed)
    return SeedRow("CuPy", SEEDED, f"cupy.random.seed({seed}) on GPU "
                                   f"{', '.join(map(str, gpus))} (each device has "
                                   "its own generator)")


def _workers_row(n_processes: int) -> SeedRow:
    """What seeding does for the data-loading worker processes."""
    if n_processes:
        return SeedRow(
            "iterator workers", NOT_DETERMINISTIC,
            f"{n_processes} worker processes, each reseeded from (seed, worker) so they do "
            "not repeat one another's augmentation; but MultiprocessIterator gives each "
            "image to whichever worker is free, so which stream augments it varies: use "
            "n_processes=0 for bitwise reproducible augmentation")
    return SeedRow("iterator workers", NOT_APPLICABLE,
                   "no worker processes: augmentation is drawn in this process "
                   "from the seeded Python and NumPy RNGs")


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
