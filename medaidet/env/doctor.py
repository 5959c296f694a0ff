"""The doctor: does this environment run the course, and if not, what fixes it.

Two halves, so every check can be tested without the environment it describes:
:func:`gather_facts` reads the environment into a plain :class:`Facts` and
never raises (a broken import becomes an error string); the ``check_*``
functions turn facts into :class:`Check` lines with the exact fix.

Platform detection (the ``platform`` line) uses only these signals:
Colab: ``google.colab`` imported or ``COLAB_RELEASE_TAG`` set; Azure ML:
``AZUREML_RUN_ID`` / ``AZUREML_ENTRY_SCRIPT`` (jobs) or ``CI_NAME`` with
``CI_WORKSPACE`` (compute instances); a course run: ``MEDAIDET_COURSE_RUN``
(set by ``medaidet course run`` for its kernels); otherwise local.
"""
import ctypes
import html
import importlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.specifiers import SpecifierSet

from medaidet import compat
from medaidet.scaling import distributed  # imports neither chainer nor mpi4py.MPI
from medaidet_tools.stack import sources
from medaidet_tools.stack.install import installed_version

STATUSES = ("ok", "warn", "fail", "skip")
INSTALL = "python -m medaidet stack install"
GIB = 1 << 30


@dataclass
class Check:
    """One line of the report: what was found and, unless ok, the fix."""

    name: str
    status: str
    found: str
    fix: str = ""


@dataclass
class Facts:
    """What :func:`gather_facts` read; tests build these by hand."""

    python: str = ""
    numpy: object = None                 # installed version or None
    chainer: object = None
    chainer_error: str = ""              # import error text, "" when it imports
    chainercv: object = None
    chainercv_error: str = ""
    cupy: list = field(default_factory=list)   # [(distribution, version)]
    nvidia_driver: bool = False          # nvidia-smi or /proc/driver/nvidia present
    cuda_available: object = None        # chainer.backends.cuda.available; None: not read
    resolution_error: str = ""           # chainer.backends.cuda._resolution_error
    cudnn_enabled: object = None
    cudnn_version: object = None
    libcudnn8: object = None             # libcudnn.so.8 loads (CuPy 13 only)
    chainer_cudnn_env: object = None     # $CHAINER_CUDNN
    gpu: object = None                   # dict, or None with gpu_error saying why
    gpu_error: str = ""
    nccl: object = None
    nccl_version: object = None
    nccl_error: str = ""
    mpi: object = None                   # asdict(distributed.MpiInfo); None: not read
    cv2: object = None
    cv2_threads: object = None
    cv2_error: str = ""
    shm_bytes: object = None
    caches: list = field(default_factory=list)  # [(label, path, error or "")]
    papermill: object = None
    papermill_error: str = ""
    kernels: list = field(default_factory=list)
    kernels_error: str = ""
    platform: str = "local"
    platform_why: str = ""
    compat_actions: list = field(default_factory=list)  # [(name, detail)]
    imagenet: list = field(default_factory=list)  # [(source, its URL, state)]
    imagenet_error: str = ""             # why the sources could not be looked at
    smoke: object = None                 # gpu smoke result dict; None: not run
    gather_errors: list = field(default_factory=list)


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _major(version) -> int:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return 0


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def _import_error(name: str) -> str:
    try:
        importlib.import_module(name)
    except Exception as exc:  # any import-time failure is the finding
        return _err(exc)
    return ""


# ---------------------------------------------------------------- gathering

def _gather_stack(f: Facts) -> None:
    f.python = platform.python_version()
    f.numpy = installed_version("numpy")
    f.cupy = compat.installed_cupy()
    f.nvidia_driver = bool(shutil.which("nvidia-smi")) or os.path.exists("/proc/driver/nvidia")
    f.chainer_cudnn_env = os.environ.get("CHAINER_CUDNN")
    f.chainer, f.chainercv = installed_version("chainer"), installed_version("chainercv")
    f.chainer_error = _import_error("chainer")
    f.chainercv_error = _import_error("chainercv")


def _gather_cuda(f: Facts) -> None:
    if f.chainer_error:
        f.gpu_error = "chainer does not import"
        return
    from chainer.backends import cuda
    f.cuda_available = bool(cuda.available)
    err = getattr(cuda, "_resolution_error", None)
    f.resolution_error = _err(err) if err is not None else ""
    f.cudnn_enabled = bool(cuda.cudnn_enabled)
    if not f.cuda_available:
        f.gpu_error = ("no CuPy installed: chainer runs on the CPU" if not f.cupy
                       else "CuPy does not import: chainer runs on the CPU")
        return
    import cupy
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError: no driver or no device
        f.gpu_error = f"no usable CUDA device ({_err(exc)})"
        return
    if count == 0:
        f.gpu_error = "no CUDA device"
        return
    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"]
    free, total = cupy.cuda.Device(0).mem_info
    f.gpu = {"name": name.decode() if isinstance(name, bytes) else str(name), "count": count,
             "cc": f"{props['major']}.{props['minor']}",
             "driver": _cuda_version(cupy.cuda.runtime.driverGetVersion()),
             "runtime": _cuda_version(cupy.cuda.runtime.runtimeGetVersion()),
             "free": int(free), "total": int(total)}
    if f.cudnn_enabled:
        f.cudnn_version = getattr(cuda, "_cudnn_version", None)
    elif max((_major(v) for _, v in f.cupy), default=0) < 14:
        try:
            ctypes.CDLL("libcudnn.so.8")
            f.libcudnn8 = True
        except OSError:
            f.libcudnn8 = False
    try:
        from cupy.cuda import nccl
        f.nccl = bool(getattr(nccl, "available", True))
        f.nccl_version = nccl.get_version() if f.nccl else None
    except Exception as exc:
        f.nccl, f.nccl_error = False, _err(exc)


def _gather_mpi(f: Facts) -> None:
    f.mpi = asdict(distributed.mpi_info())


def _gather_opencv(f: Facts) -> None:
    if importlib.util.find_spec("cv2") is None:
        return
    try:
        import cv2
        f.cv2, f.cv2_threads = cv2.__version__, cv2.getNumThreads()
    except Exception as exc:
        f.cv2, f.cv2_error = installed_version("opencv-python-headless") or "?", _err(exc)


def _gather_shm(f: Facts) -> None:
    if os.path.isdir("/dev/shm"):
        st = os.statvfs("/dev/shm")
        f.shm_bytes = st.f_frsize * st.f_blocks


def _writable_error(path: Path) -> str:
    """'' when a file can be created in ``path`` (or, if it does not exist
    yet, in the nearest existing parent where it would be created)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".medaidet-doctor-"):
            pass
    except OSError as exc:
        return _err(exc)
    return ""


def cache_dirs() -> list:
    """(env var, directory) for the data/weights cache and chainercv's dataset root."""
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    data = os.environ.get("MEDAIDET_DATA") or Path(xdg) / "medaidet"
    root = os.environ.get("CHAINER_DATASET_ROOT") or Path.home() / ".chainer" / "dataset"
    return [("MEDAIDET_DATA", Path(data).expanduser()),
            ("CHAINER_DATASET_ROOT", Path(root).expanduser())]


def _gather_cache(f: Facts) -> None:
    f.caches = [(label, str(path), _writable_error(path)) for label, path in cache_dirs()]


def _gather_imagenet(f: Facts) -> None:
    try:
        from medaidet.ssd.pretrained import imagenet_status
    except ImportError as exc:     # no chainer stack yet
        f.imagenet_error = _err(exc)
        return
    f.imagenet = [(s.describe(), s.url, state) for s, state in imagenet_status()]


def _gather_notebook(f: Facts) -> None:
    try:
        import papermill
        f.papermill = papermill.__version__
    except Exception as exc:
        f.papermill_error = _err(exc)
    try:
        from jupyter_client.kernelspec import KernelSpecManager
        f.kernels = sorted(KernelSpecManager().find_kernel_specs())
    except Exception as exc:
        f.kernels_error = _err(exc)


def _gather_platform(f: Facts) -> None:
    env = os.environ
    if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in env:
        f.platform, f.platform_why = "colab", "google.colab / COLAB_RELEASE_TAG"
    elif "AZUREML_RUN_ID" in env or "AZUREML_ENTRY_SCRIPT" in env:
        f.platform, f.platform_why = "azureml (job)", "AZUREML_RUN_ID / AZUREML_ENTRY_SCRIPT"
    elif "CI_NAME" in env and "CI_WORKSPACE" in env:
        f.platform, f.platform_why = "azureml (compute instance)", "CI_NAME, CI_WORKSPACE"
    elif env.get("MEDAIDET_COURSE_RUN"):
        profile = env.get("MEDAIDET_PROFILE", "?")
        f.platform = f"papermill (medaidet course run, profile {profile})"
        f.platform_why = "MEDAIDET_COURSE_RUN"
    else:
        f.platform, f.platform_why = "local", ""
    if "ipykernel" in sys.modules:
        f.platform += ", in a Jupyter kernel"


def _gather_compat(f: Facts) -> None:
    f.compat_actions = [(a.name, a.detail) for a in compat.apply()]


def gather_facts(gpu_smoke: bool = False) -> Facts:
    """Read the environment. Never raises: a part that fails is recorded in
    ``gather_errors`` and the doctor reports it as a failed line."""
    f = Facts()
    parts = {"compat": _gather_compat, "stack": _gather_stack, "cuda": _gather_cuda,
             "mpi": _gather_mpi, "opencv": _gather_opencv, "shm": _gather_shm,
             "cache": _gather_cache, "imagenet": _gather_imagenet,
             "notebook": _gather_notebook, "platform": _gather_platform}
    for name, part in parts.items():
        try:
            part(f)
        except Exception as exc:
            f.gather_errors.append(f"{name}: {_err(exc)}")
    if gpu_smoke and f.gpu is not None:
        f.smoke = run_gpu_smoke()
    return f


# ---------------------------------------------------------------- GPU smoke

def run_gpu_smoke(device: str = "gpu", timeout: int = 600) -> dict:
    """Run :mod:`medaidet.env.gpu_smoke` in a subprocess (a CUDA fault cannot kill the
    caller) with CUDA_LAUNCH_BLOCKING=1; returns ``{"ok": bool, ...timings or error}``."""
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "medaidet.env.gpu_smoke", device], env=env,
                              timeout=timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout} s"}
    lines = done.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (done.stdout + done.stderr)[-1500:]
        result = {"ok": False, "error": f"exit code {done.returncode}: {tail}"}
    result["wall_s"] = time.perf_counter() - start
    return result


# ---------------------------------------------------------------- checks

def check_python(f: Facts) -> Check:
    v = tuple(int(p) for p in f.python.split(".")[:2])
    if (3, 10) <= v <= (3, 13):
        return Check("python", "ok", f.python)
    return Check("python", "fail", f"{f.python} (supported: 3.10-3.13)",
                 "use Python 3.10-3.13 (e.g. python3.12 -m venv .venv), then " + INSTALL)


def check_numpy(f: Facts) -> Check:
    spec_fix = (f'pip install "numpy{compat.NUMPY_RANGE}" (or {INSTALL}); '
                "then restart the runtime")
    if f.numpy is None:
        return Check("numpy", "fail", "not installed", spec_fix)
    if not SpecifierSet(compat.NUMPY_RANGE).contains(f.numpy):
        return Check("numpy", "fail", f"{f.numpy}, outside the supported {compat.NUMPY_RANGE}",
                     spec_fix)
    cupy14 = [f"{n}=={v}" for n, v in f.cupy if _major(v) >= 14]
    if cupy14 and _major(f.numpy) < 2:
        names = " ".join(n for n, v in f.cupy)
        return Check("numpy", "fail", f"{f.numpy} with {', '.join(cupy14)}: CuPy 14 needs NumPy 2",
                     f"pip uninstall -y {names} && {INSTALL} --cuda auto  (installs CuPy 13.6)")
    return Check("numpy", "ok", f"{f.numpy} (supported: {compat.NUMPY_RANGE})")


def _check_ours(name: str, version, error: str, wanted: str) -> Check:
    if version is None and error:
        return Check(name, "fail", f"not installed ({error})", INSTALL)
    if error:
        return Check(name, "fail", f"{version or '?'} does not import: {error}",
                     f"{INSTALL} --force")
    if version == wanted:
        return Check(name, "ok", f"{version} (medaidet build)")
    return Check(name, "warn", f"{version or 'no metadata'}: upstream/other build, not {wanted}",
                 INSTALL)


def check_chainer(f: Facts) -> Check:
    return _check_ours("chainer", f.chainer, f.chainer_error, sources.CHAINER.wheel_version)


def check_chainercv(f: Facts) -> Check:
    return _check_ours("chainercv", f.chainercv, f.chainercv_error,
                       sources.CHAINERCV.wheel_version)


def check_cupy(f: Facts) -> Check:
    if not f.cupy:
        if f.nvidia_driver:
            return Check("cupy", "warn", "none, but an NVIDIA driver is present: training "
                         "runs on the CPU", f"{INSTALL} --cuda auto")
        return Check("cupy", "skip", "no CuPy: CPU only")
    listed = ", ".join(f"{n}=={v}" for n, v in f.cupy)
    if len(f.cupy) == 1:
        return Check("cupy", "ok", listed)
    return Check("cupy", "fail", f"{len(f.cupy)} CuPy packages overwrite each other: {listed}",
                 f"pip uninstall -y {' '.join(n for n, _ in f.cupy)} && {INSTALL}")


def check_cuda_available(f: Facts) -> Check:
    name = "cuda_available"
    if not f.cupy:
        return Check(name, "skip", "no CuPy installed: chainer runs on the CPU")
    if f.cuda_available is None:
        return Check(name, "skip", "chainer does not import (see the chainer line)")
    uninstall = "pip uninstall -y " + " ".join(n for n, _ in f.cupy)
    if not f.cuda_available:
        return Check(name, "fail", "False: chainer silently falls back to the CPU: "
                     + (f.resolution_error or "unknown reason"),
                     f"{INSTALL} --cuda auto (reinstalls the CuPy matching the driver and "
                     f"NumPy); check the driver with nvidia-smi; CPU only: {uninstall}")
    if f.gpu is None:
        return Check(name, "warn", f"True, but {f.gpu_error}: to_gpu() will fail",
                     f"use a GPU runtime (Colab: Runtime > Change runtime type) and check "
                     f"nvidia-smi; CPU only: {uninstall}")
    return Check(name, "ok", "True")


def _no_gpu(name: str, f: Facts):
    if f.gpu is None:
        return Check(name, "skip", f"no GPU: {f.gpu_error or 'not checked'}")
    return None


def check_cudnn(f: Facts) -> Check:
    skip = _no_gpu("cudnn", f)
    if skip:
        return skip
    cuda_major = max(_major(v) for _, v in f.cupy)
    if cuda_major >= 14:
        found = "no cuDNN in CuPy 14: chainer uses im2col+cuBLAS"
        if f.chainer_cudnn_env == "0":
            return Check("cudnn", "ok", found + "; CHAINER_CUDNN=0 set by medaidet")
        return Check("cudnn", "warn", f"{found}; CHAINER_CUDNN={f.chainer_cudnn_env}: chainer "
                     "warns 'cuDNN is not enabled'",
                     "import medaidet before chainer, or export CHAINER_CUDNN=0")
    if f.cudnn_enabled:
        return Check("cudnn", "ok", f"cuDNN {f.cudnn_version} enabled")
    if f.chainer_cudnn_env == "0":
        return Check("cudnn", "ok", "disabled by CHAINER_CUDNN=0: chainer uses im2col+cuBLAS")
    loads = "loads" if f.libcudnn8 else "does not load"
    cuda = str(f.gpu.get("runtime", "12")).split(".")[0]
    return Check("cudnn", "warn", f"not enabled ({f.resolution_error or 'unknown'}); "
                 f"libcudnn.so.8 {loads}: chainer uses im2col+cuBLAS (slower)",
                 f"python -m cupyx.tools.install_library --library cudnn --cuda {cuda}.x; "
                 "then restart the runtime")


def check_gpu(f: Facts) -> Check:
    skip = _no_gpu("gpu", f)
    if skip:
        return skip
    g = f.gpu
    found = (f"{g['name']} x{g['count']}, compute {g['cc']}, driver CUDA {g['driver']}, "
             f"runtime CUDA {g['runtime']}, {g['free'] / GIB:.1f}/{g['total'] / GIB:.1f} GiB free")
    if _major(g["cc"]) < 5:
        return Check("gpu", "fail", found + ": CUDA 12 cannot target this (Kepler) GPU",
                     "use a newer GPU (compute capability >= 5.0, e.g. T4, V100, A100)")
    if g["free"] < GIB:
        return Check("gpu", "warn", found + ": under 1 GiB free",
                     "free the GPU: restart other kernels (nvidia-smi lists who holds it)")
    return Check("gpu", "ok", found)


def check_nccl(f: Facts) -> Check:
    skip = _no_gpu("nccl", f)
    if skip:
        return skip
    if f.nccl:
        v = f.nccl_version
        shown = f"{v // 10000}.{v // 100 % 100}.{v % 100}" if isinstance(v, int) and v else "?"
        return Check("nccl", "ok", f"NCCL {shown}: ChainerMN pure_nccl can run")
    name, version = f.cupy[0]
    cu = name.replace("cupy-cuda", "").rstrip("x") or "12"
    fix = (f"pip install nvidia-nccl-cu{cu}" if _major(version) >= 14 else
           f"python -m cupyx.tools.install_library --library nccl --cuda {cu}.x")
    return Check("nccl", "warn", f"not available ({f.nccl_error or 'library not found'}): only "
                 "multi-GPU ChainerMN (pure_nccl) needs it", fix)


def check_mpi(f: Facts) -> Check:
    """Multi-process training (ChainerMN) needs mpi4py, an MPI library and its mpiexec;
    only `mpiexec -n N medaidet train --communicator ...` uses them, so a gap is a warning."""
    m = f.mpi
    if m is None:
        return Check("mpi", "skip", "not checked")
    if m.get("problem"):
        return Check("mpi", "warn", f"{m['problem']}: multi-process training "
                     "(mpiexec, ChainerMN) cannot run", m.get("fix") or "")
    return Check("mpi", "ok", f"{m['library_name']} via mpi4py {m['mpi4py']}, mpiexec at "
                 f"{m['mpiexec']}: ChainerMN naive can run")


def check_opencv(f: Facts) -> Check:
    if f.cv2 is None:
        return Check("opencv", "skip", "not installed: PIL is used for image I/O")
    if f.cv2_error:
        return Check("opencv", "fail", f"{f.cv2} does not import: {f.cv2_error}",
                     "pip install --force-reinstall opencv-python-headless")
    found = f"{f.cv2}, cv2.getNumThreads() = {f.cv2_threads}"
    if f.cv2_threads in (0, 1):
        return Check("opencv", "ok", found)
    return Check("opencv", "warn", found + ": forked MultiprocessIterator workers may deadlock",
                 "import medaidet (it calls cv2.setNumThreads(0)), or call cv2.setNumThreads(0)")


def check_shm(f: Facts) -> Check:
    if f.shm_bytes is None:
        return Check("shm", "skip", "no /dev/shm (not Linux)")
    found = f"/dev/shm {f.shm_bytes / GIB:.2f} GiB"
    if f.shm_bytes >= GIB:
        return Check("shm", "ok", found)
    return Check("shm", "warn", found + ": MultiprocessIterator workers may run out of "
                 "shared memory", "docker run --shm-size=2g ..., or use n_processes=0")


def check_cache(f: Facts) -> Check:
    found = "; ".join(f"{path}" + (f" NOT writable ({err})" if err else "")
                      for _, path, err in f.caches)
    bad = [label for label, _, err in f.caches if err]
    if not bad:
        return Check("cache", "ok", found or "none")
    return Check("cache", "fail", found, " ; ".join(f"export {label}=/a/writable/dir"
                                                    for label in bad))


def check_imagenet(f: Facts) -> Check:
    """Where SSD300's ImageNet VGG-16 would come from (the full profile's start)."""
    if f.imagenet_error:
        return Check("imagenet", "skip", f"chainer does not import ({f.imagenet_error})")
    usable = [(name, state) for name, _, state in f.imagenet
              if state.startswith(("cached", "reachable"))]
    listed = "; ".join(f"{name}: {state}" for name, _, state in f.imagenet)
    if usable:
        return Check("imagenet", "ok", f"SSD300 would start from {usable[0][0]} "
                     f"({usable[0][1].split(' (')[0]}). {listed}")
    return Check("imagenet", "warn", f"no source cached or reachable: {listed}",
                 "the full profile (SSD300 from ImageNet) needs one: place one of these files "
                 "in ChainerCV's model cache ($CHAINER_DATASET_ROOT/pfnet/chainercv/models): "
                 + ", ".join(url for _, url, _ in f.imagenet)
                 + "; the cpu and smoke profiles need none")


def check_notebook(f: Facts) -> Check:
    pm = f"papermill {f.papermill}" if f.papermill else f"no papermill ({f.papermill_error})"
    kernel = ("python3 kernel" if "python3" in f.kernels else
              f"no python3 kernel ({f.kernels_error or 'found: ' + (', '.join(f.kernels) or 'none')})")
    if f.papermill and "python3" in f.kernels:
        return Check("notebook", "ok", f"{pm}, {kernel}")
    return Check("notebook", "fail", f"{pm}, {kernel}", "pip install papermill ipykernel")


def check_platform(f: Facts) -> Check:
    return Check("platform", "ok", f.platform + (f" ({f.platform_why})" if f.platform_why else ""))


def check_compat(f: Facts) -> Check:
    done = "; ".join(f"{name}: {detail}" for name, detail in f.compat_actions)
    return Check("compat", "ok", done or "nothing needed")


def check_gpu_smoke(f: Facts) -> Check:
    skip = _no_gpu("gpu_smoke", f)
    if skip:
        return skip
    s = f.smoke
    if s is None:
        return Check("gpu_smoke", "skip", "not run")
    if s.get("ok"):
        return Check("gpu_smoke", "ok", f"alloc {s['alloc_ms']:.1f} ms, argsort (32, 8732) "
                     f"{s['argsort_ms']:.1f} ms matches numpy, SSD300 forward "
                     f"{s['ssd_first_ms']:.0f} ms first / {s['ssd_ms']:.1f} ms")
    return Check("gpu_smoke", "fail", s.get("error", "unknown error").strip(),
                 "restart the runtime (a CUDA fault kills the context); check the cupy and "
                 "cuda_available lines of `medaidet doctor`; rerun with CUDA_LAUNCH_BLOCKING=1 "
                 "to see the failing op")


CHECKS = (check_python, check_numpy, check_chainer, check_chainercv, check_cupy,
          check_cuda_available, check_cudnn, check_gpu, check_nccl, check_mpi, check_opencv,
          check_shm, check_cache, check_imagenet, check_notebook, check_platform,
          check_compat)


# ---------------------------------------------------------------- report

@dataclass(repr=False)
class DoctorReport:
    """The checks in order; text, JSON and HTML views of them."""

    checks: list

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks)

    def by_name(self, name: str) -> Check:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(name)

    def counts(self) -> dict:
        """``{status: number of checks}``."""
        return {s: sum(c.status == s for c in self.checks) for s in STATUSES}

    def summary(self) -> str:
        """One line: the number of checks of each status."""
        return ", ".join(f"{n} {s}" for s, n in self.counts().items())

    def to_dict(self) -> dict:
        return {"checks": [asdict(c) for c in self.checks], "counts": self.counts()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def __str__(self) -> str:
        width = max((len(c.name) for c in self.checks), default=0)
        lines = []
        for c in self.checks:
            lines.append(f"{c.name:<{width}}  {c.status.upper():<4}  {c.found}")
            if c.fix:
                lines.append(f"{'':<{width}}        fix: {c.fix}")
        lines.append(self.summary())
        return "\n".join(lines)

    def __repr__(self):      # the text view, also what a notebook stores beside the HTML
        return str(self)

    def _repr_html_(self) -> str:
        colours = {"ok": "#c8e6c9", "warn": "#ffe0b2", "fail": "#ffcdd2", "skip": "#eeeeee"}
        rows = "".join(
            f"<tr><td>{html.escape(c.name)}</td>"
            f"<td style='background:{colours.get(c.status, '#fff')}'>{c.status}</td>"
            f"<td>{html.escape(c.found)}</td><td><code>{html.escape(c.fix)}</code></td></tr>"
            for c in self.checks)
        return ("<table><tr><th>check</th><th>status</th><th>found</th><th>fix</th></tr>"
                f"{rows}</table>")


def run_doctor(gpu_smoke: bool = False, facts: Facts = None) -> DoctorReport:
    """Gather facts (unless given) and run every check; a check that raises
    becomes a ``fail`` line naming the exception."""
    if facts is None:
        facts = gather_facts(gpu_smoke=gpu_smoke)
    checks = []
    for fn in CHECKS + ((check_gpu_smoke,) if gpu_smoke else ()):
        name = fn.__name__[len("check_"):]
        try:
            checks.append(fn(facts))
        except Exception as exc:
            checks.append(Check(name, "fail", f"the check itself failed: {_err(exc)}",
                                "report this with the output of `medaidet doctor --json`"))
    if facts.gather_errors:
        checks.append(Check("doctor", "fail", "reading the environment failed: "
                            + "; ".join(facts.gather_errors),
                            "report this with the output of `medaidet doctor --json`"))
    return DoctorReport(checks)
