"""The training iterator: worker processes for the augmentation, and their errors.

Augmenting an image costs a large share of a training step on the CPU, so the training
iterator runs the transform in worker processes (chainer's ``MultiprocessIterator``) where
the platform allows it, and falls back to the ``SerialIterator`` (saying why) where it does
not. An example that fails to load in a worker (a truncated JPEG) ends the run with the
same error as without workers (an ``"image"`` DataError), not a hang.
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import traceback

import chainer

from medaidet import compat
from medaidet.errors import DataError
from medaidet.training.config import TrainConfig

__all__ = ["make_train_iterator", "n_processes_for", "multiprocessing_problem"]


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
        return WorkerErrorIterator(
            _CarryErrors(dataset), batch_size, n_processes=n, shared_mem=4 << 20), n
    except Exception as exc:        # noqa: BLE001 (any failure: fall back, say why)
        log(f"train: using SerialIterator: MultiprocessIterator failed "
            f"({type(exc).__name__}: {exc})")
        return chainer.iterators.SerialIterator(dataset, batch_size), 0


# Chainer's MultiprocessIterator loads examples in worker processes driven by a thread in
# the main process; an example that raises kills that thread, and the main process then
# waits forever for its batch. So the workers never raise: they return the error as a
# value (_FailedExample), and the iterator raises it in the main process.

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
        """The worker's error (or a ``"worker"`` DataError describing it), its cause
        the worker's traceback."""
        exc = None
        if self.pickled is not None:
            try:
                exc = pickle.loads(self.pickled)
            except Exception:                     # noqa: BLE001 (described instead)
                exc = None
        if exc is None:
            exc = DataError(f"a data-loading worker process failed on training example "
                            f"{self.index}: {self.description}", "worker")
        exc.__cause__ = RuntimeError(f"in the worker process:\n{self.traceback}")
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


class WorkerErrorIterator(chainer.iterators.MultiprocessIterator):
    """MultiprocessIterator over :class:`_CarryErrors`: raises the first error a worker
    met, in the main process."""

    def __next__(self):
        batch = super().__next__()
        for example in batch:
            if isinstance(example, _FailedExample):
                raise example.error()
        return batch

    next = __next__

