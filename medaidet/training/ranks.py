"""One process or many: what a training run needs to know about the processes training it.

A run is either one process (the usual case) or one rank of a ChainerMN run started by
``mpiexec`` (notebook 08). The run asks a :class:`Ranks` object, never the communicator,
everything that differs between the two: which device this process trains on, its share
of the batch and of the images, its random seed, whether it writes the files, how the
optimizer shares gradients, and whether every rank ended with the same weights.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

from chainer.backends import cuda

from medaidet.device import parse_device, resolve_device
from medaidet.scaling import distributed
from medaidet.training.config import ConfigError, TrainConfig

__all__ = ["Ranks"]


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
        spec = distributed.communicator_spec(config.communicator)
        wanted = parse_device(config.device)
        if wanted == "auto":
            wanted = "gpu" if cuda.available else "cpu"
        comm = distributed.create_communicator(spec.name, "cpu" if wanted == "cpu" else "gpu")
        with distributed.abort_on_error(comm):
            batch_size = distributed.per_rank_batchsize(config.batch_size, comm.size)
            if batch_size % config.accumulate:
                raise ConfigError(
                    f"each of the {comm.size} ranks gets {batch_size} images per batch "
                    f"(batch_size {config.batch_size} / {comm.size}), not divisible by "
                    f"accumulate {config.accumulate}")
            device = resolve_device(distributed.rank_device(comm, config.device))
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
        return distributed.is_root(self.comm)

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
        """This process's seed: ``seed + rank`` (each rank its own shuffling and
        augmentation; the weights are rank 0's, see :meth:`broadcast_weights`)."""
        return distributed.rank_seed(seed, self.comm)

    def share(self, dataset, seed):
        """This process's images: all of them, or this rank's equal share (shuffled with
        ``seed``)."""
        if self.comm is None:
            return dataset
        return distributed.scatter_dataset(dataset, self.comm, seed=seed or 0)

    def wrap_optimizer(self, optimizer):
        """``optimizer``, or ChainerMN's multi-node optimizer around it (gradients are
        averaged over the ranks before every update, so the hooks see the same gradients
        on every rank)."""
        if self.comm is None:
            return optimizer
        import chainermn
        return chainermn.create_multi_node_optimizer(optimizer, self.comm)

    def broadcast_weights(self, optimizer) -> None:
        """Give every rank rank 0's weights now. ChainerMN would do it in the first
        ``update()`` and skip that update: the first batch would be thrown away and the run
        one step behind a one-process one. (The parameters must have their shapes.)"""
        if self.comm is not None:
            optimizer.update()

    def agreed_digests(self, model):
        """None for one process; else every rank's sha256 of the weights, after checking
        that they are identical (:class:`~medaidet.scaling.distributed.RanksDivergedError`
        on every rank if not). Every rank must call it."""
        if self.comm is None:
            return None
        return [distributed.check_ranks_agree(self.comm, model)] * self.size

    @contextlib.contextmanager
    def abort_on_error(self):
        """An error on one rank ends every rank (see
        :func:`~medaidet.scaling.distributed.abort_on_error`); nothing for one process."""
        with distributed.abort_on_error(self.comm):
            yield
