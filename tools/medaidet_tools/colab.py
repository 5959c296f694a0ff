"""What a maintainer writes for Colab from pyproject's repository URL: every notebook's setup
cell and README's "Open in Colab" badges (``python tools/set_colab.py``; the tests check
that both agree with pyproject).

Every course notebook starts with a setup cell (tagged ``colab-setup``) written by
:func:`setup_cell`, shown as one line: its ``# @title`` (:data:`SETUP_CELL_METADATA` folds
the code away in Colab and JupyterLab). What it does on Colab is
:mod:`medaidet.env.colab`'s docstring. The repository's URL is written in one place,
pyproject's ``[project.urls] Repository`` (:func:`repository_url`); :func:`insert_setup_cell`
writes it into a notebook, :func:`update_readme_badges` into README's table. A notebook
names the extras it needs in its metadata (``{"medaidet": {"extras": ["mpi"]}}``).
"""
import re
from pathlib import Path

from medaidet.env.colab import COLAB_DIR_ENV, DEFAULT_COLAB_DIR, REPO_ENV

SETUP_CELL_TAG = "colab-setup"
SETUP_CELL_ID = "colab-setup"
COLAB_URL = "https://colab.research.google.com/github/{slug}/blob/{branch}/notebooks/{name}"
COLAB_BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
# README's badge table lies between these two lines (tools/set_colab.py rewrites it)
BADGES_BEGIN = "<!-- colab-badges: written by tools/set_colab.py from pyproject's Repository -->"
BADGES_END = "<!-- /colab-badges -->"

_CELL = '''\
# @title Setup · on Google Colab: install {package} (from ${repo_env}) and the chainer stack; elsewhere nothing
import os, shutil, subprocess, sys; home = os.environ.get("{dir_env}", "{default_dir}")
if "google.colab" in sys.modules and not os.path.isdir(os.path.join(home, "medaidet")):  # clone medaidet
    repo = os.environ.get("{repo_env}", "{repo}")
    if os.path.exists(home) and os.listdir(home): raise RuntimeError(f"{{home}} holds files but no medaidet clone: empty it, or %env {dir_env}=<another folder>")
    if "<" in repo or repo.startswith("-"): raise RuntimeError("Set the repository first: %env {repo_env}=https://github.com/<you>/medaidet")
    if shutil.which("git") is None: raise RuntimeError(f"git is not installed: install it (apt-get install -y git), or put a medaidet clone in {{home}}")
    subprocess.run(["git", "clone", "-q", "--", repo, home], check=True)
if "google.colab" in sys.modules: sys.path.insert(0, home); from medaidet.env.colab import setup; setup({setup_args})
'''


def setup_cell(repo: str, extras=()) -> str:
    """The source of a notebook's setup cell: clone ``repo`` (unless ``$MEDAIDET_REPO``
    names another; a URL with ``<...>`` in it is a placeholder the cell asks to replace)
    and install medaidet with ``extras``."""
    extras = list(extras)
    return _CELL.format(
        package="medaidet" + (f"[{','.join(extras)}]" if extras else ""), repo=repo,
        repo_env=REPO_ENV, dir_env=COLAB_DIR_ENV, default_dir=DEFAULT_COLAB_DIR,
        setup_args="home" + (", extras=[" + ", ".join(f'"{e}"' for e in extras) + "]"
                             if extras else ""))


#: The cell's metadata besides its tag: a reader sees one line, the cell's title. Colab shows
#: a cell with ``cellView: form`` as its ``# @title`` line (the code opens on a click);
#: JupyterLab and Notebook 7 collapse a cell whose ``jupyter.source_hidden`` is true.
SETUP_CELL_METADATA = {"cellView": "form", "jupyter": {"source_hidden": True}}


def repository_url(pyproject) -> str:
    """``[project.urls] Repository`` of the ``pyproject.toml`` at ``pyproject``."""
    text = Path(pyproject).read_text(encoding="utf-8")
    try:
        import tomllib
    except ImportError:   # Python 3.10: the one line, read plainly
        found = re.search(r'(?m)^Repository\s*=\s*"([^"]+)"', text)
        url = found[1] if found else None
    else:
        url = tomllib.loads(text).get("project", {}).get("urls", {}).get("Repository")
    if not url:
        raise ValueError(f"{pyproject}: no [project.urls] Repository")
    return url


def repository_slug(url: str) -> str:
    """``owner/name`` of a GitHub repository URL."""
    found = re.fullmatch(r"https://github\.com/([^/]+/[^/]+?)(?:\.git)?/?", url)
    if not found:
        raise ValueError(f"not a GitHub repository URL: {url!r} (https://github.com/owner/name)")
    return found[1]


def colab_url(repo_slug: str, notebook_path, branch: str = "main") -> str:
    """Colab's address of ``notebooks/<name>.ipynb`` (or ``notebooks/ja/<name>.ipynb``, the
    Japanese edition's) in the GitHub repository ``repo_slug``."""
    slug = repo_slug.strip("/")
    if slug.count("/") != 1 or not all(slug.split("/")):
        raise ValueError(f"repo_slug must be 'owner/name', got {repo_slug!r}")
    path = Path(notebook_path)
    # an edition's notebook (notebooks/ja/NAME) keeps its folder
    name = f"{path.parent.name}/{path.name}" if path.parent.parent.name == "notebooks" \
        else path.name
    return COLAB_URL.format(slug=slug, branch=branch, name=name)


def colab_badge(repo_slug: str, notebook_path, branch: str = "main") -> str:
    """Markdown "Open in Colab" badge linking to ``notebook_path`` (its file name under
    ``notebooks/``) of the GitHub repository ``repo_slug`` ("owner/name")."""
    return f"[![Open In Colab]({COLAB_BADGE_IMAGE})]({colab_url(repo_slug, notebook_path, branch)})"


def site_url(repo_slug: str) -> str:
    """Where GitHub Pages publishes the course's website (``make site``) of ``owner/name``."""
    owner, name = repo_slug.split("/", 1)
    return f"https://{owner}.github.io/{name}/"


def badge_table(repo_url: str, notebook_paths) -> str:
    """README's table: one row per notebook ("00 environment"), its "Open in Colab" badge
    for the repository at ``repo_url`` and its page on the course's website."""
    slug = repository_slug(repo_url)
    rows = ["| notebook | | |", "|---|---|---|"]
    for path in sorted(map(Path, notebook_paths), key=lambda p: p.name):
        page = f"{site_url(slug)}{'ja/' if path.parent.name == 'ja' else ''}{path.stem}.html"
        rows.append(f"| {path.stem.replace('_', ' ')} | {colab_badge(slug, path)} | "
                    f"[{'読む' if path.parent.name == 'ja' else 'read'}]({page}) |")
    return "\n".join(rows)


def update_readme_badges(readme, repo_url: str, notebook_paths, write: bool = True) -> bool:
    """Put :func:`badge_table` between README's :data:`BADGES_BEGIN` and :data:`BADGES_END`
    lines. Returns whether the table there differs (and, with ``write``, rewrites it)."""
    path = Path(readme)
    text = path.read_text(encoding="utf-8")
    begin, end = text.find(BADGES_BEGIN + "\n"), text.find(BADGES_END)
    if begin < 0 or end < begin:
        raise ValueError(f"{path}: no lines {BADGES_BEGIN!r} … {BADGES_END!r} to put the "
                         f"badges between")
    inner = begin + len(BADGES_BEGIN) + 1
    new = text[:inner] + badge_table(repo_url, notebook_paths) + "\n" + text[end:]
    if new == text:
        return False
    if write:
        path.write_text(new, encoding="utf-8")
    return True


def setup_cells(nb) -> list:
    """The cells of ``nb`` tagged ``colab-setup``."""
    return [c for c in nb.cells if SETUP_CELL_TAG in c.get("metadata", {}).get("tags", [])]


def notebook_extras(nb) -> list:
    """The extras of medaidet the notebook ``nb`` needs: its metadata's
    ``medaidet.extras`` (e.g. ``["mpi"]``), else none."""
    return list(nb.metadata.get("medaidet", {}).get("extras", []))


def notebook_setup_cell(nb, repo: str) -> str:
    """The setup cell the notebook ``nb`` should start with, for the repository ``repo``."""
    return setup_cell(repo, notebook_extras(nb))


def insert_setup_cell(notebook_path, repo: str) -> bool:
    """Make :func:`notebook_setup_cell` the first cell of the notebook, tagged ``colab-setup``.

    An existing ``colab-setup`` cell is replaced (wherever it was; its id and metadata
    are kept), without outputs or execution count; nothing else in the notebook
    changes. Writes the file only when something changed; returns True when it did.
    """
    import nbformat

    path = Path(notebook_path)
    nb = nbformat.read(str(path), as_version=nbformat.NO_CONVERT)
    before = nbformat.writes(nb)
    old = setup_cells(nb)
    cell = nbformat.v4.new_code_cell(source=notebook_setup_cell(nb, repo))
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
