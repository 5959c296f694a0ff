"""Google Colab: what a notebook's ``colab-setup`` cell (:mod:`medaidet_tools.colab`) does there
once it has cloned ``$MEDAIDET_REPO`` into :data:`COLAB_DIR_ENV` (:func:`setup`). Standard library
only at import time: the cell imports this from the fresh clone."""
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
    """What ``pip install -e home[extras]`` would add (``["medaidet"]`` when it is missing)."""
    if _version("medaidet") is None:
        return ["medaidet"]
    from packaging.requirements import Requirement   # a dependency of medaidet: installed now
    requirements = map(Requirement, importlib.metadata.requires("medaidet") or [])
    return [r.name for r in requirements if _version(r.name) is None
            and any(r.marker and r.marker.evaluate({"extra": extra}) for extra in extras)]


def setup(home=None, extras=(), cuda: str = "auto") -> None:
    """Install the clone ``home`` with ``extras`` when anything is missing and the chainer stack
    when incomplete, both keeping the runtime's NumPy (no restart); change into ``home/notebooks``.
    Raises ConfigError when that NumPy is newer than the stack supports."""
    home = os.path.abspath(home or os.environ.get(COLAB_DIR_ENV, DEFAULT_COLAB_DIR))
    numpy = _version("numpy")
    if numpy_newer_than_supported(numpy):
        raise ConfigError(numpy_too_new_message(numpy), "numpy")
    if missing := _missing(extras):
        print("installing medaidet" + (f" with {', '.join(extras)}" if extras else "")
              + f" (missing: {', '.join(missing)})", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            constraints = Path(tmp) / "constraints.txt"   # the runtime's NumPy stays
            constraints.write_text(f"numpy=={numpy}\n" if numpy else "")
            _run(sys.executable, "-m", "pip", "install", "-q", "-e",
                 home + (f"[{','.join(extras)}]" if extras else ""), "-c", str(constraints))
    importlib.invalidate_caches()
    # a running kernel does not read the new install's .pth file: put tools/ on sys.path
    if (tools := os.path.join(home, "tools")) not in sys.path:
        sys.path.insert(1, tools)

    from medaidet_tools import stack
    if not stack.status().ok:
        _run(sys.executable, "-m", "medaidet", "stack", "install", "--cuda", cuda)
        reapply()           # runtime settings again, for the new CuPy
    notebooks = os.path.join(home, "notebooks")
    if os.path.isdir(notebooks) and os.path.abspath(os.getcwd()) != notebooks:
        os.chdir(notebooks)
        print("working directory:", notebooks)
