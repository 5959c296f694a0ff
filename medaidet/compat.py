"""Runtime settings that make the chainer stack behave on today's platforms, applied once by
``import medaidet`` and recorded for the doctor and notebooks. Never imports chainer."""
import importlib.metadata
import importlib.util
import os
import re
import sys
import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class Action:
    """One thing :func:`apply` did (or could not do), and why."""

    name: str
    detail: str


ACTIONS: list = []
_applied = False

# The NumPy range of the patched chainer 7.8.1 / chainercv 0.13.1; here (stdlib only) because
# Colab's setup cell checks NumPy before anything of medaidet's is installed.
NUMPY_OLDEST = (1, 26)
NUMPY_BELOW = (2, 6)
NUMPY_RANGE = ">={}.{},<{}.{}".format(*NUMPY_OLDEST, *NUMPY_BELOW)


def numpy_newer_than_supported(version) -> bool:
    """Whether NumPy ``version`` (e.g. ``"2.6.0"``) is at or past :data:`NUMPY_BELOW`."""
    found = re.match(r"(\d+)\.(\d+)", str(version or ""))
    return bool(found) and (int(found[1]), int(found[2])) >= NUMPY_BELOW


def numpy_too_new_message(version) -> str:
    """What to say when the interpreter's NumPy is newer than the stack supports."""
    return (f"This Python has NumPy {version}; the chainer stack supports numpy{NUMPY_RANGE}. "
            "medaidet never replaces an installed NumPy by an older one: install one yourself "
            f'(pip install "numpy{NUMPY_RANGE}"), restart the kernel (Colab: Runtime > Restart '
            "session) and run the setup again.")


def installed_cupy() -> list:
    """(distribution name, version) of every installed CuPy package."""
    found = {(dist.metadata["Name"] or "").lower(): dist.version
             for dist in importlib.metadata.distributions()}
    return sorted((name, version) for name, version in found.items()
                  if name == "cupy" or name.startswith(("cupy-cuda", "cupy-rocm")))


def major_version(version) -> int:
    """The major number of a version string (0 when it has none)."""
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return 0


def _disable_cudnn_on_cupy14(actions: list) -> None:
    # CuPy 14 has no cuDNN: tell chainer before its import, or it warns on every convolution
    if max((major_version(v) for _, v in installed_cupy()), default=0) < 14:
        return
    if "chainer" in sys.modules:
        if os.environ.get("CHAINER_CUDNN") == "0":
            return
        warnings.warn("chainer was imported before medaidet with CuPy >= 14 (no cuDNN): import "
                      "medaidet first, or set CHAINER_CUDNN=0 before importing chainer, to "
                      "silence its 'cuDNN is not enabled' warnings.", RuntimeWarning, stacklevel=3)
        detail = "not set: chainer was already imported"
    elif "CHAINER_CUDNN" in os.environ:
        detail = "left as the user set it: " + os.environ["CHAINER_CUDNN"]
    else:
        os.environ["CHAINER_CUDNN"] = "0"
        detail = "set to 0: CuPy >= 14 has no cuDNN"
    actions.append(Action("CHAINER_CUDNN", detail))


def _single_thread_opencv(actions: list) -> None:
    # OpenCV's thread pool deadlocks in forked MultiprocessIterator workers.
    if importlib.util.find_spec("cv2") is None:
        return
    try:
        import cv2
        cv2.setNumThreads(0)
        detail = "set to 0: avoids deadlocks in forked MultiprocessIterator workers"
    except ImportError as exc:  # a broken OpenCV install: the doctor reports it
        detail = f"skipped: cv2 does not import ({exc})"
    actions.append(Action("cv2.setNumThreads", detail))


def apply() -> list:
    """Apply the settings once; return the list of :class:`Action` taken."""
    global _applied
    if not _applied:
        _applied = True
        _disable_cudnn_on_cupy14(ACTIONS)
        _single_thread_opencv(ACTIONS)
    return list(ACTIONS)


def reapply() -> list:
    """Apply the settings again for a stack changed in this process (``medaidet stack install``
    added CuPy); also sets ``medaidet.compat_actions``. Call it before ``import chainer``."""
    global _applied
    importlib.invalidate_caches()
    ACTIONS.clear()
    _applied = False
    actions = apply()
    if (medaidet := sys.modules.get("medaidet")) is not None:
        medaidet.compat_actions = actions
    return actions
