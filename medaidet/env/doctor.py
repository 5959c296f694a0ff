"""The doctor: does this environment run the course, and if not, what fixes it (notebook 00).
The ``check_*`` functions turn :class:`~medaidet.env.facts.Facts` into :class:`Check` lines
with the exact fix; :func:`run_doctor` puts them in a :class:`DoctorReport`."""
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet

from medaidet import compat
from medaidet.env.facts import Facts, error_text, gather_facts, major_version
from medaidet_tools.stack import sources

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


def check_python(f: Facts) -> Check:
    if (3, 10) <= tuple(int(p) for p in f.python.split(".")[:2]) <= (3, 13):
        return Check("python", "ok", f.python)
    return Check("python", "fail", f"{f.python} (supported: 3.10-3.13)",
                 "use Python 3.10-3.13 (e.g. python3.12 -m venv .venv), then " + INSTALL)


def check_numpy(f: Facts) -> Check:
    if f.numpy is None or not SpecifierSet(compat.NUMPY_RANGE).contains(f.numpy):
        return Check("numpy", "fail", "not installed" if f.numpy is None else
                     f"{f.numpy}, outside the supported {compat.NUMPY_RANGE}",
                     f'pip install "numpy{compat.NUMPY_RANGE}" (or {INSTALL}); '
                     "then restart the runtime")
    cupy14 = [f"{n}=={v}" for n, v in f.cupy if major_version(v) >= 14]
    if cupy14 and major_version(f.numpy) < 2:
        return Check("numpy", "fail", f"{f.numpy} with {', '.join(cupy14)}: CuPy 14 needs NumPy 2",
                     f"pip uninstall -y {' '.join(n for n, _ in f.cupy)} && {INSTALL} --cuda auto"
                     "  (installs CuPy 13.6)")
    return Check("numpy", "ok", f"{f.numpy} (supported: {compat.NUMPY_RANGE})")


def _check_ours(f: Facts, name: str) -> Check:
    version, error = getattr(f, name), getattr(f, name + "_error")
    wanted = getattr(sources, name.upper()).wheel_version
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
    return _check_ours(f, "chainer")


def check_chainercv(f: Facts) -> Check:
    return _check_ours(f, "chainercv")


def check_cupy(f: Facts) -> Check:
    listed = ", ".join(f"{n}=={v}" for n, v in f.cupy)
    if len(f.cupy) > 1:
        return Check("cupy", "fail", f"{len(f.cupy)} CuPy packages overwrite each other: {listed}",
                     f"pip uninstall -y {' '.join(n for n, _ in f.cupy)} && {INSTALL}")
    if f.cupy:
        return Check("cupy", "ok", listed)
    if f.nvidia_driver:
        return Check("cupy", "warn", "none, but an NVIDIA driver is present: training runs on "
                     "the CPU", f"{INSTALL} --cuda auto")
    return Check("cupy", "skip", "no CuPy: CPU only")


def check_cuda_available(f: Facts) -> Check:
    name, uninstall = "cuda_available", "pip uninstall -y " + " ".join(n for n, _ in f.cupy)
    if not f.cupy:
        return Check(name, "skip", "no CuPy installed: chainer runs on the CPU")
    if f.cuda_available is None:
        return Check(name, "skip", "chainer does not import (see the chainer line)")
    if not f.cuda_available:
        return Check(name, "fail", "False: chainer silently falls back to the CPU: "
                     + (f.resolution_error or "unknown reason"), f"{INSTALL} --cuda auto "
                     f"(the CuPy for the driver); check nvidia-smi; CPU only: {uninstall}")
    if f.gpu is None:
        return Check(name, "warn", f"True, but {f.gpu_error}: to_gpu() will fail",
                     f"use a GPU runtime (Colab: Runtime > Change runtime type) and check "
                     f"nvidia-smi; CPU only: {uninstall}")
    return Check(name, "ok", "True")


def _no_gpu(name: str, f: Facts) -> Check:
    return Check(name, "skip", f"no GPU: {f.gpu_error or 'not checked'}")


def check_cudnn(f: Facts) -> Check:
    if f.gpu is None:
        return _no_gpu("cudnn", f)
    if max(major_version(v) for _, v in f.cupy) >= 14:
        found = "no cuDNN in CuPy 14: chainer uses im2col+cuBLAS"
        if f.chainer_cudnn_env == "0":
            return Check("cudnn", "ok", found + "; CHAINER_CUDNN=0 set by medaidet")
        return Check("cudnn", "warn", f"{found}; CHAINER_CUDNN={f.chainer_cudnn_env}: it warns",
                     "import medaidet before chainer, or export CHAINER_CUDNN=0")
    if f.cudnn_enabled:
        return Check("cudnn", "ok", f"cuDNN {f.cudnn_version} enabled")
    if f.chainer_cudnn_env == "0":
        return Check("cudnn", "ok", "disabled by CHAINER_CUDNN=0: chainer uses im2col+cuBLAS")
    return Check("cudnn", "warn", f"not enabled ({f.resolution_error or 'unknown'}); libcudnn.so.8 "
                 f"{'loads' if f.libcudnn8 else 'does not load'}: chainer uses im2col+cuBLAS "
                 "(slower)", "python -m cupyx.tools.install_library --library cudnn --cuda "
                 f"{str(f.gpu.get('runtime', '12')).split('.')[0]}.x; then restart the runtime")


def check_gpu(f: Facts) -> Check:
    if (g := f.gpu) is None:
        return _no_gpu("gpu", f)
    found = (f"{g['name']} x{g['count']}, compute {g['cc']}, driver CUDA {g['driver']}, "
             f"runtime CUDA {g['runtime']}, {g['free'] / GIB:.1f}/{g['total'] / GIB:.1f} GiB free")
    if major_version(g["cc"]) < 5:
        return Check("gpu", "fail", found + ": CUDA 12 cannot target this (Kepler) GPU",
                     "use a newer GPU (compute capability >= 5.0, e.g. T4, V100, A100)")
    if g["free"] < GIB:
        return Check("gpu", "warn", found + ": under 1 GiB free",
                     "free the GPU: restart other kernels (nvidia-smi lists who holds it)")
    return Check("gpu", "ok", found)


def check_opencv(f: Facts) -> Check:
    if f.cv2 is None:
        return Check("opencv", "fail", "not installed: training's augmentation (ChainerCV's) "
                     "needs it", f"{INSTALL} (it picks the OpenCV that fits your NumPy)")
    if f.cv2_error:
        return Check("opencv", "fail", f"{f.cv2} does not import: {f.cv2_error}",
                     "pip install --force-reinstall opencv-python-headless")
    found = f"{f.cv2}, cv2.getNumThreads() = {f.cv2_threads}"
    if f.cv2_threads in (0, 1):
        return Check("opencv", "ok", found)
    return Check("opencv", "warn", found + ": forked MultiprocessIterator workers may deadlock",
                 "import medaidet (it calls cv2.setNumThreads(0)), or call cv2.setNumThreads(0)")


def check_compat(f: Facts) -> Check:
    return Check("compat", "ok", "; ".join(f"{name}: {detail}" for name, detail
                                           in f.compat_actions) or "nothing needed")


def check_gpu_smoke(f: Facts) -> Check:
    if f.gpu is None:
        return _no_gpu("gpu_smoke", f)
    if (s := f.smoke) is None:
        return Check("gpu_smoke", "skip", "not run")
    if s.get("ok"):
        return Check("gpu_smoke", "ok", f"alloc {s['alloc_ms']:.1f} ms, argsort (32, 8732) "
                     f"{s['argsort_ms']:.1f} ms matches numpy, SSD300 forward "
                     f"{s['ssd_first_ms']:.0f} ms first / {s['ssd_ms']:.1f} ms")
    return Check("gpu_smoke", "fail", s.get("error", "unknown error").strip(),
                 "restart the runtime (a CUDA fault kills the context); rerun with "
                 "CUDA_LAUNCH_BLOCKING=1 to see the failing op")


CHECKS = (check_python, check_numpy, check_chainer, check_chainercv, check_cupy,
          check_cuda_available, check_cudnn, check_gpu, check_opencv, check_compat)


@dataclass(repr=False)
class DoctorReport:
    """The checks in order, shown as text."""

    checks: list

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks)

    def by_name(self, name: str) -> Check:
        return {c.name: c for c in self.checks}[name]

    def summary(self) -> str:
        """One line: the number of checks of each status."""
        return ", ".join(f"{sum(c.status == s for c in self.checks)} {s}" for s in STATUSES)

    def __str__(self) -> str:
        width = max((len(c.name) for c in self.checks), default=0)
        return "\n".join([f"{c.name:<{width}}  {c.status.upper():<4}  {c.found}"
                          + (f"\n{'':<{width}}        fix: {c.fix}" if c.fix else "")
                          for c in self.checks] + [self.summary()])

    __repr__ = __str__       # a notebook shows the text view


def run_doctor(gpu_smoke: bool = False, facts: Facts = None) -> DoctorReport:
    """Gather facts (unless given) and run every check; one that raises is a ``fail`` line."""
    facts = gather_facts(gpu_smoke=gpu_smoke) if facts is None else facts
    report = "report this with the output of `medaidet doctor`"
    checks = []
    for fn in CHECKS + ((check_gpu_smoke,) if gpu_smoke else ()):
        try:
            checks.append(fn(facts))
        except Exception as exc:
            checks.append(Check(fn.__name__[len("check_"):], "fail",
                                f"the check itself failed: {error_text(exc)}", report))
    if facts.gather_errors:
        checks.append(Check("doctor", "fail", "reading the environment failed: "
                            + "; ".join(facts.gather_errors), report))
    return DoctorReport(checks)
