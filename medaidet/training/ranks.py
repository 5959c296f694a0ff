"""One process or many: what a training run needs to know about the processes training it.

A run is either one process (the usual case) or one rank of a ChainerMN run started by
``mpiexec`` (notebook 08). The run asks a :class:`Ranks` object, never the communicator,
everything that differs between the two: which device this process trains on, its share
of the batch and of the images, its random seed, whether it writes the files, how the
optimizer shares gradients, what happens when one rank fails, and whether every rank ended
with the same weights. The communicator is :mod:`medaidet.training.communicator`'s; starting the ranks
(``mpiexec``) is :mod:`medaidet.scaling.distributed`'s.
"""
from __future__ import annotations

import contextlib
import hashlib
import sys
import traceback
from dataclasses import dataclass

import numpy as np
from chainer.backends import cuda

from medaidet.device import device_kind, gpu_status, rank_device, resolve_device
from medaidet.errors import ConfigError, DistributedError, MedaidetError
from medaidet.training.communicator import communicator_spec, create_communicator
from medaidet.training.config import TrainConfig

__all__ = ["Ranks", "per_rank_batchsize", "param_digest"]


def per_rank_batchsize(batchsize: int, n_ranks: int) -> int:
    """The per-rank batch size for a total ``batchsize`` (as ChainerCV's
    ``train_multi.py``: the recipe's batch size and learning rate stay the same whatever
    the number of ranks). a ``"ranks"`` :class:`~medaidet.errors.DistributedError` unless it divides evenly."""
    if n_ranks < 1 or batchsize < n_ranks or batchsize % n_ranks:
        lower = max(n_ranks, batchsize // n_ranks * n_ranks)
        raise DistributedError(
            f"batch size {batchsize} (the total over all ranks) cannot be split evenly over "
            f"{n_ranks} ranks: use a multiple of {n_ranks}, e.g. {lower} or {lower + n_ranks}",
            "ranks")
    return batchsize // n_ranks


def param_digest(link) -> str:
    """sha256 of a link's parameters (names, dtypes, shapes and values, in name order),
    moved to the host first: equal digests mean bit-identical weights."""
    h = hashlib.sha256()
    for name, param in sorted(link.namedparams()):
        h.update(name.encode())
        if param.array is None:
            h.update(b"uninitialized")
            continue
        array = np.ascontiguousarray(cuda.to_cpu(param.array))
        h.update(f"{array.dtype.str}{array.shape}".encode())
        h.update(array.tobytes())
    return h.hexdigest()


@dataclass
class Ranks:
    """The processes of a run, seen from this one.

    ``comm``: the ChainerMN communicator, or None for a one-process run. ``device``: the
    chainer device this process trains on. ``batch_size``: the images this process takes
    per iteration (the config's batch size, or a rank's share of it).
    """

    comm: object
    device: object
    batch_size: int

    @classmethod
    def one_process(cls, config: TrainConfig) -> "Ranks":
        """One process on ``config.device`` (resolved: ``auto`` is the GPU when one is
        usable), with the config's whole batch."""
        return cls(None, resolve_device(config.device), config.batch_size)

    @classmethod
    def for_config(cls, config: TrainConfig) -> "Ranks":
        """One process, or (``config.communicator`` set) this rank of a ChainerMN run: the
        communicator is created now (its errors name MPI or NCCL problems), each rank
        takes its own GPU, and the batch is split evenly over the ranks."""
        if config.communicator is None:
            return cls.one_process(config)
        spec = communicator_spec(config.communicator)
        wanted = device_kind(config.device)
        if wanted == "auto":
            wanted = "gpu" if gpu_status()[0] else "cpu"
        comm = create_communicator(spec.name, wanted)
        ranks = cls(comm, None, config.batch_size)
        with ranks.abort_on_error():
            batch_size = per_rank_batchsize(config.batch_size, comm.size)
            if batch_size % config.accumulate:
                raise ConfigError(
                    f"each of the {comm.size} ranks gets {batch_size} images per batch "
                    f"(batch_size {config.batch_size} / {comm.size}), not divisible by "
                    f"accumulate {config.accumulate}")
            device = resolve_device(rank_device(comm, config.device))
        return cls(comm, device, batch_size)

    # ---- who is who

    @property
    def size(self) -> int:
        return 1 if self.comm is None else self.comm.size

    @property
    def rank(self) -> int:
        return 0 if self.comm is None else self.comm.rank

    @property
    def is_root(self) -> bool:
        """Rank 0 (or the only process): the one that logs, shows progress and writes the
        files (every rank writing the same files would corrupt them)."""
        return self.rank == 0

    @property
    def keeps_snapshots(self) -> bool:
        """Trainer snapshots (and so resuming) only in a one-process run: each rank's data
        order and random state would have to be saved and restored too."""
        return self.comm is None

    def log(self, log):
        """``log`` on rank 0, a function that says nothing on the other ranks."""
        return log if self.is_root else (lambda *_, **__: None)

    def describe(self, total_batch_size: int) -> str | None:
        """One line on how the work is shared, or None for one process."""
        if self.comm is None:
            return None
        return (f"ChainerMN, {self.size} ranks, {self.batch_size} "
                f"image{'' if self.batch_size == 1 else 's'} per rank per iteration "
                f"(batch {total_batch_size} in all)")

    # ---- what each rank does differently

    def seed(self, seed):
        """This process's seed: ``seed + rank`` (``None`` stays ``None``): each rank draws
        its own shuffling and augmentation stream. The initial weights need not match:
        :meth:`broadcast_weights` gives every rank rank 0's."""
        return seed if seed is None else int(seed) + self.rank

    def share(self, dataset, seed):
        """This process's images: all of them, or this rank's equal share
        (``chainermn.scatter_dataset``: rank 0's copy is shuffled with ``seed``, split into
        equal parts and sent; other ranks may pass ``None``). Scatter the plain dataset
        before wrapping it in transforms: the object is pickled to every rank.
        a ``"ranks"`` :class:`~medaidet.errors.DistributedError` when there are fewer images than ranks."""
        if self.comm is None:
            return dataset
        import chainermn     # an optional dependency (the mpi extra)
        comm = self.comm
        size = comm.bcast_obj(len(dataset) if comm.rank == 0 else None)
        if size < comm.size:
            raise DistributedError(
                f"the dataset has {size} samples for {comm.size} ranks: every rank needs at "
                f"least one; use more images or fewer ranks", "ranks")
        return chainermn.scatter_dataset(dataset if comm.rank == 0 else None, comm,
                                         shuffle=True, seed=seed or 0)

    def wrap_optimizer(self, optimizer):
        """``optimizer``, or ChainerMN's multi-node optimizer around it (gradients are
        averaged over the ranks before every update, so the hooks see the same gradients
        on every rank)."""
        if self.comm is None:
            return optimizer
        import chainermn     # an optional dependency (the mpi extra)
        return chainermn.create_multi_node_optimizer(optimizer, self.comm)

    def broadcast_weights(self, optimizer) -> None:
        """Give every rank rank 0's weights now. ChainerMN would do it in the first
        ``update()`` and skip that update: the first batch would be thrown away and the run
        one step behind a one-process one. (The parameters must have their shapes.)"""
        if self.comm is not None:
            optimizer.update()

    def agreed_digests(self, model, what="parameters"):
        """None for one process; else every rank's sha256 of ``model``'s parameters, by
        rank, after checking that they are identical (a :class:`~medaidet.errors.DistributedError`
        of kind ``"diverged"`` on every rank if not). A collective call: every rank must reach it (at the end of
        training)."""
        if self.comm is None:
            return None
        comm = self.comm      # gathered to rank 0, then broadcast: all ranks act together
        digests = comm.bcast_obj(comm.gather_obj(param_digest(model)))
        odd = [rank for rank, d in enumerate(digests) if d != digests[0]]
        if odd:
            listed = ", ".join(f"rank {r}: {d[:12]}" for r, d in enumerate(digests))
            raise DistributedError(
                f"the {what} differ across ranks after training (ranks {odd} differ from "
                f"rank 0; sha256 {listed}): every rank must train with the optimizer from "
                f"chainermn.create_multi_node_optimizer and take the same number of updates "
                f"(equal shares from scatter_dataset, the same iteration count)", "diverged",
                digests=digests)
        return digests

    @contextlib.contextmanager
    def abort_on_error(self, exit_code=1):
        """Stop every rank when this one fails. An exception (or ``sys.exit`` with a
        non-zero code) on one rank otherwise leaves the others waiting in the next
        allreduce, and the failing rank itself hangs in MPI_Finalize at exit: the job never
        ends. Inside this block, the error is printed (with the rank) and
        ``MPI_Abort(exit_code)`` ends the whole job. With one process (or one rank) the
        error propagates as usual."""
        try:
            yield
        except BaseException as exc:
            comm = self.comm
            if comm is None or comm.size <= 1:
                raise
            if isinstance(exc, SystemExit) and exc.code in (None, 0):
                raise
            if isinstance(exc, MedaidetError):
                text = f"medaidet: error: {exc}\n"
            else:
                text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            sys.stdout.flush()
            sys.stderr.write(f"[rank {comm.rank}/{comm.size}] {text}"
                             f"[rank {comm.rank}/{comm.size}] aborting all ranks\n")
            sys.stderr.flush()
            comm.mpi_comm.Abort(exit_code)
            raise  # not reached: MPI_Abort ends the process
