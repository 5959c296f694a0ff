"""The training iterator: worker processes for the augmentation where the platform allows,
else ``SerialIterator`` (saying why). An example that fails in a worker ends the run with the
same error as without workers, not a hang."""
from __future__ import annotations

import multiprocessing
import os
import pickle
import traceback

import chainer

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
    """``config.n_processes``, or when None ``min(4, cpu count)`` (0 if deterministic)."""
    if config.n_processes is not None:
        return config.n_processes
    return 0 if config.deterministic else min(4, os.cpu_count() or 1)


def make_train_iterator(dataset, config: TrainConfig, log=print, batch_size=None):
    """``(iterator, n_processes)``: ``MultiprocessIterator``, or ``SerialIterator`` (0, or
    workers impossible: logged), shuffled by NumPy's global RNG. ``batch_size``: this process's."""
    batch_size, n = config.batch_size if batch_size is None else batch_size, n_processes_for(config)
    if n > 0 and (problem := multiprocessing_problem()):
        log(f"train: using SerialIterator (no worker processes): {problem}")
    elif n > 0:
        try:
            return WorkerErrorIterator(
                _CarryErrors(dataset), batch_size, n_processes=n, shared_mem=4 << 20), n
        except Exception as exc:        # noqa: BLE001 (any failure: fall back, say why)
            log(f"train: using SerialIterator: MultiprocessIterator failed "
                f"({type(exc).__name__}: {exc})")
    return chainer.iterators.SerialIterator(dataset, batch_size), 0


class _FailedExample:
    """A worker's error for an example, pickled (or described), with the worker's traceback:
    raised in a worker, it would kill MultiprocessIterator's thread and hang the main process."""

    def __init__(self, index, exc: Exception):
        self.index = index
        self.description = f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
        self.traceback = "".join(traceback.format_exception(exc))
        try:
            self.pickled = pickle.dumps(exc)
            pickle.loads(self.pickled)            # and back: its __init__ may not accept it
        except Exception:                         # noqa: BLE001 (described instead)
            self.pickled = None

    def error(self) -> Exception:
        """The worker's error (or a ``"worker"`` DataError), caused by its traceback."""
        try:
            exc = pickle.loads(self.pickled)      # None: it could not be pickled
        except Exception:                         # noqa: BLE001 (described instead)
            exc = DataError(f"a data-loading worker process failed on training example "
                            f"{self.index}: {self.description}", "worker")
        exc.__cause__ = RuntimeError(f"in the worker process:\n{self.traceback}")
        return exc


class _CarryErrors:
    """``dataset`` for workers: an example that raises becomes a :class:`_FailedExample`."""

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
    """MultiprocessIterator that raises a worker's first error in the main process."""

    def __next__(self):
        batch = super().__next__()
        if failed := next((e for e in batch if isinstance(e, _FailedExample)), None):
            raise failed.error()
        return batch

    next = __next__

