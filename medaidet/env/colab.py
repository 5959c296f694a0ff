"""Google Colab: what a notebook's first cell does there (:func:`setup`).

On Colab, every notebook's ``colab-setup`` cell (:mod:`medaidet_tools.colab`) clones
``$MEDAIDET_REPO`` into :data:`COLAB_DIR_ENV` when missing and calls :func:`setup`; elsewhere it
does nothing. Standard library only at import time: the cell imports this from the fresh clone.
"""
import importlib.metadata
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from medaidet.compat import numpy_newer_than_supported, numpy_too_new_message, reapply
from medaidet.errors import ConfigError

REPO_ENV = "MEDAIDET_REPO"
COLAB_DIR_ENV = "MEDAIDET_COLAB_DIR"
DEFAULT_COLAB_DIR = "/content/medaidet"


def _run(*cmd) -> None:
    """Run ``cmd``, its output streamed into the notebook (a kernel hides a child's stdout)."""
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


def _missing(extras) -> list:
    """What ``pip install -e home[extras]`` would add: ``["medaidet"]`` when medaidet is not
    installed, else the distributions ``extras`` require that are not installed."""
    if _version("medaidet") is None:
        return ["medaidet"]
    from packaging.requirements import Requirement   # a dependency of medaidet: installed now

    missing = []
    for line in importlib.metadata.requires("medaidet") or []:
        requirement = Requirement(line)
        needed = any(requirement.marker and requirement.marker.evaluate({"extra": extra})
                     for extra in extras)
        if needed and _version(requirement.name) is None:
            missing.append(requirement.name)
    return missing


def setup(home=None, extras=(), cuda: str = "auto") -> None:
    """What a notebook's setup cell does once medaidet's clone ``home`` is on ``sys.path``.

    Installs the clone with ``extras`` when anything is missing and the chainer stack when
    incomplete, both keeping the runtime's NumPy (no restart), then changes into
    ``home/notebooks``. Raises ConfigError when that NumPy is newer than the stack supports.
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
    # a running kernel does not read the new install's .pth file: put tools/ on sys.path
    tools = os.path.join(home, "tools")
    if tools not in sys.path:
        sys.path.insert(1, tools)

    from medaidet_tools import stack

    if not stack.status().ok:
        _run(sys.executable, "-m", "medaidet", "stack", "install", "--cuda", cuda)
        reapply()           # runtime settings again, for the new CuPy
    notebooks = os.path.join(home, "notebooks")
    if os.path.isdir(notebooks) and os.path.abspath(os.getcwd()) != notebooks:
        os.chdir(notebooks)
        print("working directory:", notebooks)
