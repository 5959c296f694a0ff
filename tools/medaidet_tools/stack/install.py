"""Installing the stack into the running interpreter, and reporting on it.

Never imports chainer, chainercv or CuPy: everything is read from the
installed distributions' metadata, so it works before (and after a broken)
install.
"""
import importlib.metadata
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.specifiers import SpecifierSet

from medaidet.compat import installed_cupy, numpy_newer_than_supported, numpy_too_new_message
from medaidet_tools.stack import cuda as cuda_choice
from medaidet_tools.stack import sources
from medaidet_tools.stack.build import NUMPY_RANGE, build_wheels
from medaidet_tools.stack.errors import StackError


def installed_version(name: str):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def numpy_supported(version) -> bool:
    return version is not None and SpecifierSet(NUMPY_RANGE).contains(version)


@dataclass
class StackStatus:
    """What the stack consists of in this interpreter."""

    python: str
    numpy: object
    numpy_supported: bool
    chainer: object
    chainer_ours: bool
    chainercv: object
    chainercv_ours: bool
    cupy: list = field(default_factory=list)
    opencv: object = None        # "name version" of the first OPENCV_DISTRIBUTIONS installed

    @property
    def ok(self) -> bool:
        return (self.chainer_ours and self.chainercv_ours and self.numpy_supported
                and len(self.cupy) <= 1 and self.opencv is not None)

    def to_dict(self) -> dict:
        return {**asdict(self), "cupy": [f"{n}=={v}" for n, v in self.cupy], "ok": self.ok}

    def __str__(self) -> str:
        def ours(flag):
            return "medaidet build" if flag else "NOT medaidet's build"
        lines = [
            f"python     {self.python}",
            f"numpy      {self.numpy or 'missing'}"
            + ("" if self.numpy_supported else f"  (supported: {NUMPY_RANGE})"),
            f"chainer    {self.chainer or 'missing'}"
            + (f"  ({ours(self.chainer_ours)})" if self.chainer else ""),
            f"chainercv  {self.chainercv or 'missing'}"
            + (f"  ({ours(self.chainercv_ours)})" if self.chainercv else ""),
            "cupy       " + (", ".join(f"{n}=={v}" for n, v in self.cupy) or "none"),
            f"opencv     {self.opencv or 'missing'}",
        ]
        if not self.ok:
            lines.append("-> run: python -m medaidet stack install")
        return "\n".join(lines)


def status() -> StackStatus:
    """Read what is installed, without importing any of it."""
    numpy = installed_version("numpy")
    chainer = installed_version("chainer")
    chainercv = installed_version("chainercv")
    return StackStatus(
        python=sys.version.split()[0],
        numpy=numpy,
        numpy_supported=numpy_supported(numpy),
        chainer=chainer,
        chainer_ours=chainer == sources.CHAINER.wheel_version,
        chainercv=chainercv,
        chainercv_ours=chainercv == sources.CHAINERCV.wheel_version,
        cupy=installed_cupy(),
        opencv=next((f"{n} {installed_version(n)}" for n in OPENCV_DISTRIBUTIONS
                     if installed_version(n)), None),
    )


def _pip(args, log) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *args]
    log("$ " + " ".join(cmd))
    done = subprocess.run(cmd)
    if done.returncode != 0:
        raise StackError(f"pip install failed (exit {done.returncode}); its output is above. "
                         f"Run `python -m medaidet doctor` for what is installed now.")


def _numpy_constraint(log) -> str:
    """Keep the platform's NumPy when it is supported (no Colab restart); never replace a
    newer one by an older one (:class:`StackError` says what to do); install or upgrade
    one that is missing or too old."""
    current = installed_version("numpy")
    if numpy_supported(current):
        log(f"keeping NumPy {current}")
        return f"numpy=={current}\n"
    if numpy_newer_than_supported(current):
        raise StackError(numpy_too_new_message(current))
    if current:
        log(f"NumPy {current} is outside {NUMPY_RANGE}: pip will change it "
            "(on Colab/Jupyter, restart the runtime afterwards)")
    return f"numpy{NUMPY_RANGE}\n"


OPENCV_DISTRIBUTIONS = ("opencv-python-headless", "opencv-python", "opencv-contrib-python",
                        "opencv-contrib-python-headless")


def _install_opencv(constraints: Path, log) -> None:
    # ChainerCV's training augmentations need OpenCV (Colab has it).
    # Installed under the NumPy constraint: opencv >= 4.12 needs NumPy 2, and
    # unconstrained pip would silently upgrade NumPy 1.26 to get it.
    present = status().opencv
    if present:
        log(f"OpenCV: keeping {present}")
        return
    numpy_major = int((installed_version("numpy") or "2").split(".")[0])
    requirement = "opencv-python-headless" + ("<4.12" if numpy_major < 2 else "")
    log(f"OpenCV: installing {requirement} (for NumPy {installed_version('numpy')})")
    _pip([requirement, "-c", str(constraints)], log)


def _install_cupy(choice, constraints: Path, log) -> None:
    present = installed_cupy()
    if choice.requirement is None:
        log(f"CuPy: none installed ({choice.reason})")
        return
    wanted = choice.requirement.split(">")[0].split("=")[0]
    spec = SpecifierSet(choice.requirement[len(wanted):])
    names = [n for n, _ in present]
    if names == [wanted] and spec.contains(present[0][1]):
        log(f"CuPy: keeping {wanted} {present[0][1]} ({choice.reason})")
        return
    if present and names != [wanted]:
        raise StackError(
            f"CuPy already installed as {', '.join(f'{n}=={v}' for n, v in present)}, but this "
            f"machine needs {choice.requirement} ({choice.reason}). Two CuPy packages break "
            f"each other: pip uninstall -y {' '.join(names)}, then run this again.")
    # the same package at another version is upgraded in place: still one CuPy
    log(f"CuPy: installing {choice.requirement} ({choice.reason})")
    _pip([choice.requirement, "-c", str(constraints)], log)


def install(cuda="auto", cache_dir=None, force=False, log=print) -> StackStatus:
    """Build (cached) and install chainer/chainercv, and CuPy when wanted.

    Idempotent: when our wheels are already installed nothing is reinstalled
    unless ``force``.
    """
    numpy_constraint = _numpy_constraint(log)   # first: a NumPy that is too new stops here
    wheels = build_wheels(cache_dir=cache_dir, force=force, log=log)
    before = status()
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(numpy_constraint)
        if before.chainer_ours and before.chainercv_ours and before.numpy_supported \
                and not force:
            log(f"chainer {before.chainer} and chainercv {before.chainercv} already installed")
        else:
            _pip([*map(str, wheels), "-c", str(constraints)], log)
            if force:
                _pip(["--force-reinstall", "--no-deps", *map(str, wheels)], log)
        _install_opencv(constraints, log)
        numpy_version = installed_version("numpy")
        choice = cuda_choice.choose_cupy(cuda, numpy_version, cuda_choice.query_nvidia_smi())
        _install_cupy(choice, constraints, log)
    after = status()
    log(str(after))
    if not after.ok:
        raise StackError("the stack is not complete after installing:\n" + str(after))
    return after
