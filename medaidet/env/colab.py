"""Google Colab: what a notebook's first cell does there (:func:`setup`).

Every course notebook starts with a setup cell (tagged ``colab-setup``; written by
``tools/set_colab.py``, :mod:`medaidet_tools.colab`). On Colab (``"google.colab" in
sys.modules``) it does only what must happen before medaidet exists: when
:data:`COLAB_DIR_ENV` (default ``/content/medaidet``) is not there yet, it ``git clone``\\ s
the repository named by ``$MEDAIDET_REPO`` (a URL or a local path; default: the project's
repository). Then it calls :func:`setup`, which installs medaidet with the extras that
notebook needs (only notebook 08 needs one: ``mpi``), keeping the runtime's NumPy, installs
the chainer stack when it is missing and changes into ``notebooks/``. Everywhere else (local
Jupyter, papermill, Azure ML) the cell imports ``os``, ``subprocess`` and ``sys`` and does
nothing: it never installs anything behind the user's back.

This module imports nothing beyond the standard library at import time: the cell
imports it from the fresh clone, before anything is installed.
"""
import importlib
import importlib.metadata
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from medaidet.compat import numpy_newer_than_supported, numpy_too_new_message
from medaidet.errors import ConfigError

REPO_ENV = "MEDAIDET_REPO"
COLAB_DIR_ENV = "MEDAIDET_COLAB_DIR"
DEFAULT_COLAB_DIR = "/content/medaidet"


def _run(*cmd) -> None:
    """Run ``cmd``, its output streamed into the notebook (a kernel does not show what
    a child process writes to its own stdout)."""
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    for line in proc.stdout:
        print(line, end="", flush=True)
    if proc.wait() != 0:
        raise RuntimeError(f"Colab setup: `{' '.join(cmd)}` failed (exit {proc.returncode}); "
                           f"see the output above")


def _version(name: str):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _installed(name: str) -> bool:
    return _version(name) is not None


def _missing(extras) -> list:
    """What ``pip install -e home[extras]`` would add: ``["medaidet"]`` when medaidet is not
    installed, else the distributions ``extras`` require that are not installed."""
    if not _installed("medaidet"):
        return ["medaidet"]
    from packaging.requirements import Requirement   # a dependency of medaidet: installed now

    missing = []
    for line in importlib.metadata.requires("medaidet") or []:
        requirement = Requirement(line)
        needed = any(requirement.marker and requirement.marker.evaluate({"extra": extra})
                     for extra in extras)
        if needed and not _installed(requirement.name):
            missing.append(requirement.name)
    return missing


def setup(home=None, extras=(), cuda: str = "auto") -> None:
    """What a notebook's setup cell does once medaidet's clone ``home`` is on ``sys.path``.

    Stops with :class:`ConfigError` when the runtime's NumPy is newer than the
    stack supports (saying how to get one it supports) instead of replacing it. Installs
    the clone with the notebook's ``extras`` (``pip install -e home[extras]``, the NumPy
    there held where it is) when medaidet or something an extra needs is missing, runs
    ``python -m medaidet stack install --cuda <cuda>`` when the stack is not complete (it
    keeps the NumPy too: no runtime restart) and applies :mod:`medaidet.compat` again for
    the new CuPy, then changes into ``home/notebooks``. The cell calls it on Colab only; it
    installs wherever it runs.
    """
    home = os.path.abspath(home or os.environ.get(COLAB_DIR_ENV, DEFAULT_COLAB_DIR))
    numpy = _version("numpy")
    if numpy_newer_than_supported(numpy):
        raise ConfigError(numpy_too_new_message(numpy), "numpy")
    missing = _missing(extras)
    if missing:
        print("installing medaidet" + (f" with {', '.join(extras)}" if extras else "")
              + f" (missing: {', '.join(missing)})", flush=True)
        target = home + (f"[{','.join(extras)}]" if extras else "")
        with tempfile.TemporaryDirectory() as tmp:
            constraints = Path(tmp) / "constraints.txt"   # the runtime's NumPy stays
            constraints.write_text(f"numpy=={numpy}\n" if numpy else "")
            _run(sys.executable, "-m", "pip", "install", "-q", "-e", target,
                 "-c", str(constraints))
    importlib.invalidate_caches()
    # A running kernel does not read the .pth file of the install it just made: as the cell
    # put the clone on sys.path for medaidet, its tools/ goes there for medaidet_tools.
    tools = os.path.join(home, "tools")
    if tools not in sys.path:
        sys.path.insert(1, tools)

    import medaidet
    import medaidet.compat
    from medaidet_tools import stack

    if not stack.status().ok:
        _run(sys.executable, "-m", "medaidet", "stack", "install", "--cuda", cuda)
        medaidet.compat.reapply()           # runtime settings again, for the new CuPy
    notebooks = os.path.join(home, "notebooks")
    if os.path.isdir(notebooks) and os.path.abspath(os.getcwd()) != notebooks:
        os.chdir(notebooks)
        print("working directory:", notebooks)
