"""Google Colab support: the first cell of every notebook, and "Open in Colab" links.

:data:`SETUP_CELL` is the source of the first code cell of every course notebook
(tagged ``colab-setup``), the same in all of them, shown as one line: its ``# @title``
(:data:`SETUP_CELL_METADATA` folds the code away in Colab and JupyterLab). On Colab
(``"google.colab" in sys.modules``) it is a bootstrap that does only what must
happen before medaidet exists: when :data:`COLAB_DIR_ENV` (default
``/content/medaidet``) is not there yet, it ``git clone``\\ s the repository named
by ``$MEDAIDET_REPO`` (a URL or a local path; default :data:`DEFAULT_REPO`, the
project's URL in pyproject's ``[project.urls]``) and ``pip install -e`` s it with
the ``mpi`` extra. Then it calls :func:`setup`, which installs the chainer stack
when it is missing and changes into ``notebooks/``. Everywhere else (local
Jupyter, papermill, Azure ML) the cell imports ``os``, ``subprocess`` and ``sys``
and does nothing: it never installs anything behind the user's back.

The repository is configured in one place: ``MEDAIDET_REPO``, e.g. in a Colab
cell ``%env MEDAIDET_REPO=https://github.com/<you>/medaidet``. Its default is
written once, in :data:`SETUP_CELL` (the cell runs before the package exists);
the tests check that it is pyproject's ``[project.urls] Repository``.

``python tools/set_setup_cell.py`` (:func:`insert_setup_cell`) writes the cell
into the notebooks; :func:`colab_badge` gives the README's markdown link.

This module imports nothing beyond the standard library at import time: the cell
imports it from the fresh clone, before the stack is installed.
"""
import importlib
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

SETUP_CELL_TAG = "colab-setup"
SETUP_CELL_ID = "colab-setup"
REPO_ENV = "MEDAIDET_REPO"
COLAB_DIR_ENV = "MEDAIDET_COLAB_DIR"
DEFAULT_COLAB_DIR = "/content/medaidet"
# pyproject's [project.urls] Repository (tests/env/test_colab.py checks they are equal).
# A URL with "<...>" in it is a placeholder: the cell then asks for MEDAIDET_REPO.
DEFAULT_REPO = "https://github.com/<your-github-user>/medaidet"
COLAB_URL = "https://colab.research.google.com/github/{slug}/blob/{branch}/notebooks/{name}"
COLAB_BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"

SETUP_CELL = f'''\
# @title Setup · on Google Colab: install medaidet (from ${REPO_ENV}) and the chainer stack; elsewhere nothing
import os, subprocess, sys; home = os.environ.get("{COLAB_DIR_ENV}", "{DEFAULT_COLAB_DIR}")
if "google.colab" in sys.modules and not os.path.exists(home):  # clone and install medaidet
    repo = os.environ.get("{REPO_ENV}", "{DEFAULT_REPO}")
    if "<" in repo: raise RuntimeError("Set the repository first: %env {REPO_ENV}=https://github.com/<you>/medaidet")
    subprocess.run(["git", "clone", "-q", repo, home], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", home + "[mpi]"], check=True)
if "google.colab" in sys.modules: sys.path.insert(0, home); from medaidet.env.colab import setup; setup(home)
'''


#: The cell's metadata besides its tag: a reader sees one line, the cell's title. Colab shows
#: a cell with ``cellView: form`` as its ``# @title`` line (the code opens on a click);
#: JupyterLab and Notebook 7 collapse a cell whose ``jupyter.source_hidden`` is true.
SETUP_CELL_METADATA = {"cellView": "form", "jupyter": {"source_hidden": True}}


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


def _installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def setup(home=None, cuda: str = "auto") -> None:
    """What :data:`SETUP_CELL` does once medaidet's clone ``home`` is on ``sys.path``.

    Installs the clone (``pip install -e home[mpi]``) when no medaidet is installed
    (an earlier run of the cell stopped after the clone, or the repository was
    uploaded by hand), runs ``python -m medaidet stack install --cuda <cuda>`` when
    the stack is not complete (it keeps the platform's NumPy: no runtime restart)
    and applies :mod:`medaidet.compat` again for the new CuPy, then changes into
    ``home/notebooks``. The cell calls it on Colab only; it installs wherever it runs.
    """
    home = os.path.abspath(home or os.environ.get(COLAB_DIR_ENV, DEFAULT_COLAB_DIR))
    if not _installed("medaidet"):
        # [mpi]: Open MPI and mpi4py from PyPI, for notebook 08's multi-process training
        _run(sys.executable, "-m", "pip", "install", "-q", "-e", home + "[mpi]")
    importlib.invalidate_caches()

    import medaidet
    import medaidet.compat
    import medaidet.stack

    if not medaidet.stack.status().ok:
        _run(sys.executable, "-m", "medaidet", "stack", "install", "--cuda", cuda)
        medaidet.compat.reapply()           # runtime settings again, for the new CuPy
    notebooks = os.path.join(home, "notebooks")
    if os.path.isdir(notebooks) and os.path.abspath(os.getcwd()) != notebooks:
        os.chdir(notebooks)
        print("working directory:", notebooks)


def colab_url(repo_slug: str, notebook_path, branch: str = "main") -> str:
    """Colab's address of ``notebooks/<name>.ipynb`` in the GitHub repository ``repo_slug``."""
    slug = repo_slug.strip("/")
    if slug.count("/") != 1 or not all(slug.split("/")):
        raise ValueError(f"repo_slug must be 'owner/name', got {repo_slug!r}")
    return COLAB_URL.format(slug=slug, branch=branch, name=Path(notebook_path).name)


def colab_badge(repo_slug: str, notebook_path, branch: str = "main") -> str:
    """Markdown "Open in Colab" badge linking to ``notebook_path`` (its file name under
    ``notebooks/``) of the GitHub repository ``repo_slug`` ("owner/name"). The notebook
    opened from it installs from ``$MEDAIDET_REPO`` (default :data:`DEFAULT_REPO`), so
    set that to the same repository."""
    return f"[![Open In Colab]({COLAB_BADGE_IMAGE})]({colab_url(repo_slug, notebook_path, branch)})"


def setup_cells(nb) -> list:
    """The cells of ``nb`` tagged ``colab-setup``."""
    return [c for c in nb.cells if SETUP_CELL_TAG in c.get("metadata", {}).get("tags", [])]


def insert_setup_cell(notebook_path) -> bool:
    """Make :data:`SETUP_CELL` the first cell of the notebook, tagged ``colab-setup``.

    An existing ``colab-setup`` cell is replaced (wherever it was; its id and metadata
    are kept), without outputs or execution count; nothing else in the notebook
    changes. Writes the file only when something changed; returns True when it did.
    """
    import nbformat

    path = Path(notebook_path)
    nb = nbformat.read(str(path), as_version=nbformat.NO_CONVERT)
    before = nbformat.writes(nb)
    old = setup_cells(nb)
    cell = nbformat.v4.new_code_cell(source=SETUP_CELL)
    if old:
        cell.metadata = old[0].metadata
        if "id" in old[0]:
            cell["id"] = old[0]["id"]
    if SETUP_CELL_TAG not in cell.metadata.get("tags", []):
        cell.metadata["tags"] = [*cell.metadata.get("tags", []), SETUP_CELL_TAG]
    for key, value in SETUP_CELL_METADATA.items():
        cell.metadata[key] = value
    if (nb.nbformat, nb.nbformat_minor) < (4, 5):
        cell.pop("id", None)
    elif not old:
        cell["id"] = SETUP_CELL_ID
    nb.cells = [cell] + [c for c in nb.cells if not any(c is o for o in old)]
    nbformat.validate(nb)
    after = nbformat.writes(nb)
    if after == before:
        return False
    path.write_text(after + ("" if after.endswith("\n") else "\n"), encoding="utf-8")
    return True
