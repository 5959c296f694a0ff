"""Google Colab support: the first cell of every notebook, and "Open in Colab" links.

:data:`SETUP_CELL_SOURCE` is the source of the first code cell of every course
notebook (tagged ``colab-setup``). On Colab (``"google.colab" in sys.modules``)
it clones the repository named by ``REPO_URL`` when medaidet is not importable,
``pip install -e`` it with the ``mpi`` extra (Open MPI and mpi4py from PyPI), runs ``python -m medaidet stack install --cuda auto``
when the chainer stack is not installed, and changes into the repository's
``notebooks/`` folder. Everywhere else (local Jupyter, papermill, Azure ML) it
only assigns ``REPO_URL`` and imports ``sys``: it never installs anything
behind the user's back.

:func:`insert_setup_cell` puts that cell first in a notebook (idempotently,
without outputs); :func:`colab_badge` gives the README's markdown link.

This module imports nothing beyond the standard library at import time.
"""
from pathlib import Path

SETUP_CELL_TAG = "colab-setup"
SETUP_CELL_ID = "colab-setup"
REPO_URL_PLACEHOLDER = "https://github.com/<your-github-user>/medaidet"
COLAB_URL = "https://colab.research.google.com/github/{slug}/blob/{branch}/notebooks/{name}"
COLAB_BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"

SETUP_CELL_SOURCE = '''\
# Colab setup. On Google Colab this cell installs medaidet and the chainer stack
# (Runtime > Change runtime type > GPU first); anywhere else it does nothing.
REPO_URL = "https://github.com/<your-github-user>/medaidet"  # on Colab: your copy of this repository
import sys

if "google.colab" in sys.modules:
    def _medaidet_colab_setup(repo_url, target="/content/medaidet"):
        import importlib
        import importlib.util
        import os
        import subprocess

        def run(*cmd):  # streams the output into the notebook
            print("$", " ".join(cmd), flush=True)
            proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            for line in proc.stdout:
                print(line, end="", flush=True)
            if proc.wait() != 0:
                raise RuntimeError(f"Colab setup: `{' '.join(cmd)}` failed "
                                   f"(exit {proc.returncode}); see the output above")

        if importlib.util.find_spec("medaidet") is None:
            if not os.path.isfile(os.path.join(target, "pyproject.toml")):
                if "<your-github-user>" in repo_url:
                    raise RuntimeError(
                        "Colab setup: medaidet is not installed and REPO_URL is still the "
                        f"placeholder {repo_url!r}. Set REPO_URL at the top of this cell to "
                        "your copy of the medaidet repository (e.g. "
                        "https://github.com/<user>/medaidet) and run the cell again, or "
                        f"upload the repository to {target}.")
                run("git", "clone", "-q", "--depth", "1", repo_url, target)
            # [mpi]: Open MPI and mpi4py from PyPI, for notebook 08's multi-process training
            run(sys.executable, "-m", "pip", "install", "-q", "-e", target + "[mpi]")
            if target not in sys.path:  # this kernel started before the editable install
                sys.path.insert(0, target)
            importlib.invalidate_caches()

        import medaidet
        import medaidet.stack

        if not medaidet.stack.status().ok:
            run(sys.executable, "-m", "medaidet", "stack", "install", "--cuda", "auto")
            importlib.invalidate_caches()
            importlib.reload(medaidet.compat)  # runtime settings again, for the new CuPy
            medaidet.compat_actions = medaidet.compat.apply()
        notebooks = os.path.join(os.path.dirname(os.path.dirname(
            os.path.abspath(medaidet.__file__))), "notebooks")
        if os.path.isdir(notebooks) and os.path.abspath(os.getcwd()) != notebooks:
            os.chdir(notebooks)
            print("working directory:", notebooks)

    _medaidet_colab_setup(REPO_URL)
    del _medaidet_colab_setup
'''


def setup_cell_source(repo_url=None) -> str:
    """:data:`SETUP_CELL_SOURCE`, with ``REPO_URL`` set to ``repo_url`` when given."""
    if repo_url is None:
        return SETUP_CELL_SOURCE
    if '"' in repo_url or "\\" in repo_url or "\n" in repo_url:
        raise ValueError(f"not a plain repository URL: {repo_url!r}")
    old = f'REPO_URL = "{REPO_URL_PLACEHOLDER}"'
    return SETUP_CELL_SOURCE.replace(old, f'REPO_URL = "{repo_url}"', 1)


def colab_url(repo_slug: str, notebook_path, branch: str = "main") -> str:
    """Colab's address of ``notebooks/<name>.ipynb`` in the GitHub repository ``repo_slug``."""
    slug = repo_slug.strip("/")
    if slug.count("/") != 1 or not all(slug.split("/")):
        raise ValueError(f"repo_slug must be 'owner/name', got {repo_slug!r}")
    return COLAB_URL.format(slug=slug, branch=branch, name=Path(notebook_path).name)


def colab_badge(repo_slug: str, notebook_path, branch: str = "main") -> str:
    """Markdown "Open in Colab" badge linking to ``notebook_path`` (its file name under
    ``notebooks/``) of the GitHub repository ``repo_slug`` ("owner/name")."""
    return f"[![Open In Colab]({COLAB_BADGE_IMAGE})]({colab_url(repo_slug, notebook_path, branch)})"


def insert_setup_cell(notebook_path, repo_url=None) -> bool:
    """Make the Colab setup cell (tagged ``colab-setup``) the first cell of the notebook.

    Replaces any existing ``colab-setup`` cell wherever it is; the cell has no
    outputs and no execution count. Writes the file only when something
    changed; returns True when it did.
    """
    import nbformat

    path = Path(notebook_path)
    nb = nbformat.read(str(path), as_version=nbformat.NO_CONVERT)
    before = nbformat.writes(nb)
    cell = nbformat.v4.new_code_cell(source=setup_cell_source(repo_url))
    cell.metadata["tags"] = [SETUP_CELL_TAG]
    if (nb.nbformat, nb.nbformat_minor) >= (4, 5):
        cell["id"] = SETUP_CELL_ID
    else:
        cell.pop("id", None)
    rest = [c for c in nb.cells if SETUP_CELL_TAG not in c.get("metadata", {}).get("tags", [])]
    nb.cells = [cell] + rest
    nbformat.validate(nb)
    after = nbformat.writes(nb)
    if after == before:
        return False
    path.write_text(after + ("" if after.endswith("\n") else "\n"), encoding="utf-8")
    return True
