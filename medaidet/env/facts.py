"""What the doctor reads: the environment as a plain :class:`Facts` (notebook 00), so each
check of :mod:`medaidet.env.doctor` can be tested with facts built by hand."""
import ctypes
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

from medaidet import compat
from medaidet.compat import major_version
from medaidet_tools.stack.install import installed_version

__all__ = ["Facts", "gather_facts", "run_gpu_smoke"]


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
    cv2: object = None
    cv2_threads: object = None
    cv2_error: str = ""
    compat_actions: list = field(default_factory=list)  # [(name, detail)]
    smoke: object = None                 # gpu smoke result dict; None: not run
    gather_errors: list = field(default_factory=list)


def error_text(exc: BaseException) -> str:
    """An exception as one line of a report: its type and text."""
    return f"{type(exc).__name__}: {exc}"


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def _import_error(name: str) -> str:
    try:
        importlib.import_module(name)
    except Exception as exc:  # any import-time failure is the finding
        return error_text(exc)
    return ""


def _gather_stack(f: Facts) -> None:
    f.python = platform.python_version()
    f.numpy = installed_version("numpy")
    f.cupy = compat.installed_cupy()
    f.nvidia_driver = bool(shutil.which("nvidia-smi")) or os.path.exists("/proc/driver/nvidia")
    f.chainer_cudnn_env = os.environ.get("CHAINER_CUDNN")
    f.chainer, f.chainercv = installed_version("chainer"), installed_version("chainercv")
    f.chainer_error, f.chainercv_error = _import_error("chainer"), _import_error("chainercv")


def _gather_cuda(f: Facts) -> None:
    if f.chainer_error:
        f.gpu_error = "chainer does not import"
        return
    from chainer.backends import cuda
    f.cuda_available = bool(cuda.available)
    err = getattr(cuda, "_resolution_error", None)
    f.resolution_error = "" if err is None else error_text(err)
    f.cudnn_enabled = bool(cuda.cudnn_enabled)
    if not f.cuda_available:
        f.gpu_error = (f"{'CuPy does not import' if f.cupy else 'no CuPy installed'}: "
                       "chainer runs on the CPU")
        return
    import cupy
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError: no driver or no device
        f.gpu_error = f"no usable CUDA device ({error_text(exc)})"
        return
    if not count:
        f.gpu_error = "no CUDA device"
        return
    props, (free, total) = cupy.cuda.runtime.getDeviceProperties(0), cupy.cuda.Device(0).mem_info
    name = props["name"]
    f.gpu = {"name": name.decode() if isinstance(name, bytes) else str(name), "count": count,
             "cc": f"{props['major']}.{props['minor']}",
             "driver": _cuda_version(cupy.cuda.runtime.driverGetVersion()),
             "runtime": _cuda_version(cupy.cuda.runtime.runtimeGetVersion()),
             "free": int(free), "total": int(total)}
    if f.cudnn_enabled:
        f.cudnn_version = getattr(cuda, "_cudnn_version", None)
    elif max((major_version(v) for _, v in f.cupy), default=0) < 14:
        try:
            f.libcudnn8 = ctypes.CDLL("libcudnn.so.8") is not None
        except OSError:
            f.libcudnn8 = False


def _gather_opencv(f: Facts) -> None:
    if importlib.util.find_spec("cv2") is None:
        return
    try:
        import cv2
        f.cv2, f.cv2_threads = cv2.__version__, cv2.getNumThreads()
    except Exception as exc:
        f.cv2, f.cv2_error = installed_version("opencv-python-headless") or "?", error_text(exc)


def _gather_compat(f: Facts) -> None:
    f.compat_actions = [(a.name, a.detail) for a in compat.apply()]


def gather_facts(gpu_smoke: bool = False) -> Facts:
    """Read the environment. Never raises: a part that fails is recorded in ``gather_errors``."""
    f = Facts()
    for name, part in (("compat", _gather_compat), ("stack", _gather_stack),
                       ("cuda", _gather_cuda), ("opencv", _gather_opencv)):
        try:
            part(f)
        except Exception as exc:
            f.gather_errors.append(f"{name}: {error_text(exc)}")
    if gpu_smoke and f.gpu is not None:
        f.smoke = run_gpu_smoke()
    return f


def run_gpu_smoke(device: str = "gpu", timeout: int = 600) -> dict:
    """:mod:`medaidet.env.gpu_smoke`'s ``{"ok": bool, ...timings or error}``, run in a child (a
    CUDA fault cannot kill the caller) with CUDA_LAUNCH_BLOCKING=1."""
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "medaidet.env.gpu_smoke", device],
                              env=dict(os.environ, CUDA_LAUNCH_BLOCKING="1"), timeout=timeout,
                              capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout} s"}
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        result = {"ok": False,
                  "error": f"exit code {done.returncode}: {(done.stdout + done.stderr)[-1500:]}"}
    result["wall_s"] = time.perf_counter() - start
    return result

