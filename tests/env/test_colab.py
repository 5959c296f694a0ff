"""The Colab setup cell: installs on Colab only, a no-op elsewhere; inserting it; badges."""
import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import nbformat
import pytest

import medaidet
import medaidet.stack
from medaidet.env import colab

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "00_environment.ipynb"


class FakePopen:
    """Records commands instead of running them; every command succeeds."""

    calls = []

    def __init__(self, cmd, **kwargs):
        FakePopen.calls.append(list(cmd))
        self.stdout = iter(["fake output\n"])
        self.returncode = 0

    def wait(self):
        return self.returncode


def _forbid(*args, **kwargs):
    raise AssertionError(f"the setup cell started a process: {args}")


@pytest.fixture
def no_processes(monkeypatch):
    for name in ("Popen", "run", "call", "check_call", "check_output"):
        monkeypatch.setattr(subprocess, name, _forbid)
    monkeypatch.setattr(os, "system", _forbid)


@pytest.fixture
def fake_colab(monkeypatch):
    google = types.ModuleType("google")
    google_colab = types.ModuleType("google.colab")
    google.colab = google_colab
    monkeypatch.setitem(sys.modules, "google", sys.modules.get("google", google))
    monkeypatch.setitem(sys.modules, "google.colab", google_colab)
    monkeypatch.setattr(sys, "path", list(sys.path))
    chdirs = []
    monkeypatch.setattr(os, "chdir", chdirs.append)
    return chdirs


@pytest.fixture
def stack_ok(monkeypatch):
    monkeypatch.setattr(medaidet.stack, "status", lambda: types.SimpleNamespace(ok=True))


@pytest.fixture
def fake_popen(monkeypatch):
    FakePopen.calls = []
    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    return FakePopen.calls


def _exec(source):
    namespace = {"__name__": "__main__"}
    exec(compile(source, "<colab-setup>", "exec"), namespace)
    return namespace


def test_source_is_plain_python_with_repo_url_first():
    tree = ast.parse(colab.SETUP_CELL_SOURCE)  # no IPython magics: papermill and exec run it
    first = next(node for node in tree.body if not isinstance(node, ast.Expr))
    assert isinstance(first, ast.Assign) and first.targets[0].id == "REPO_URL"
    assert first.value.value == colab.REPO_URL_PLACEHOLDER
    assert not any(line.lstrip().startswith(("!", "%"))
                   for line in colab.SETUP_CELL_SOURCE.splitlines())


def test_noop_outside_colab(monkeypatch, no_processes):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    path_before, cwd_before = list(sys.path), os.getcwd()
    start = time.perf_counter()
    namespace = _exec(colab.SETUP_CELL_SOURCE)
    elapsed = time.perf_counter() - start
    assert elapsed < 0.05, f"the setup cell took {elapsed:.3f} s outside Colab"
    assert namespace["REPO_URL"] == colab.REPO_URL_PLACEHOLDER
    assert "_medaidet_colab_setup" not in namespace
    assert sys.path == path_before and os.getcwd() == cwd_before


def test_colab_with_medaidet_and_stack_installed_does_nothing(fake_colab, stack_ok, no_processes):
    namespace = _exec(colab.SETUP_CELL_SOURCE)
    assert "_medaidet_colab_setup" not in namespace
    assert fake_colab == [str(REPO / "notebooks")]  # only: into the course's notebooks folder


def test_colab_installs_the_stack_when_missing(monkeypatch, fake_colab, fake_popen):
    monkeypatch.setattr(medaidet.stack, "status", lambda: types.SimpleNamespace(ok=False))
    monkeypatch.setattr(medaidet, "compat_actions", medaidet.compat_actions)
    monkeypatch.setattr(importlib, "reload", lambda module: module)
    _exec(colab.SETUP_CELL_SOURCE)
    assert fake_popen == [[sys.executable, "-m", "medaidet", "stack", "install", "--cuda", "auto"]]


def test_colab_placeholder_repo_url_and_no_medaidet_raises(monkeypatch, fake_colab, no_processes):
    if Path("/content/medaidet/pyproject.toml").exists():
        pytest.skip("a clone exists at /content/medaidet")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "medaidet" else real_find_spec(name, *a))
    with pytest.raises(RuntimeError, match="REPO_URL") as excinfo:
        _exec(colab.SETUP_CELL_SOURCE)
    assert "placeholder" in str(excinfo.value) and "top of this cell" in str(excinfo.value)


def test_colab_clones_and_installs_with_repo_url(monkeypatch, fake_colab, fake_popen, stack_ok):
    if Path("/content/medaidet/pyproject.toml").exists():
        pytest.skip("a clone exists at /content/medaidet")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "medaidet" else real_find_spec(name, *a))
    url = "https://github.com/someone/medaidet"
    _exec(colab.setup_cell_source(url))
    assert fake_popen == [
        ["git", "clone", "-q", "--depth", "1", url, "/content/medaidet"],
        [sys.executable, "-m", "pip", "install", "-q", "-e", "/content/medaidet[mpi]"],
    ]
    assert sys.path[0] == "/content/medaidet"


def test_failed_command_raises(monkeypatch, fake_colab):
    monkeypatch.setattr(medaidet.stack, "status", lambda: types.SimpleNamespace(ok=False))

    class Failing(FakePopen):
        def wait(self):
            self.returncode = 3
            return 3

    monkeypatch.setattr(subprocess, "Popen", Failing)
    with pytest.raises(RuntimeError, match=r"stack install --cuda auto` failed \(exit 3\)"):
        _exec(colab.SETUP_CELL_SOURCE)


def test_setup_cell_source_repo_url():
    source = colab.setup_cell_source("https://github.com/someone/medaidet")
    assert 'REPO_URL = "https://github.com/someone/medaidet"' in source
    assert colab.REPO_URL_PLACEHOLDER not in source.split("\n")[2]
    assert colab.setup_cell_source() == colab.SETUP_CELL_SOURCE
    with pytest.raises(ValueError):
        colab.setup_cell_source('x"; import os')


def _setup_cells(nb):
    return [c for c in nb.cells if colab.SETUP_CELL_TAG in c.metadata.get("tags", [])]


def test_insert_setup_cell_is_first_idempotent_and_clean(tmp_path):
    path = tmp_path / NOTEBOOK.name
    original = nbformat.read(str(NOTEBOOK), as_version=nbformat.NO_CONVERT)
    original.cells = [c for c in original.cells  # the committed notebook has the cell already
                      if colab.SETUP_CELL_TAG not in c.metadata.get("tags", [])]
    nbformat.write(original, str(path))

    assert colab.insert_setup_cell(path) is True
    first_bytes = path.read_bytes()
    assert colab.insert_setup_cell(path) is False
    assert path.read_bytes() == first_bytes

    nb = nbformat.read(str(path), as_version=nbformat.NO_CONVERT)
    nbformat.validate(nb)
    cell = nb.cells[0]
    assert cell.cell_type == "code"
    assert cell.metadata["tags"] == [colab.SETUP_CELL_TAG]
    assert cell.source == colab.SETUP_CELL_SOURCE
    assert cell.outputs == [] and cell.execution_count is None
    assert len(_setup_cells(nb)) == 1
    assert [c.source for c in nb.cells[1:]] == [c.source for c in original.cells]
    assert nb.metadata == original.metadata
    assert first_bytes.endswith(b"\n")


def test_insert_setup_cell_updates_and_moves_an_old_cell(tmp_path):
    path = tmp_path / NOTEBOOK.name
    nb = nbformat.read(str(NOTEBOOK), as_version=nbformat.NO_CONVERT)
    old = nbformat.v4.new_code_cell("print('old setup')", id="old-setup")
    old.metadata["tags"] = [colab.SETUP_CELL_TAG]
    old.outputs = [nbformat.v4.new_output("stream", text="x")]
    old.execution_count = 4
    nb.cells.insert(2, old)
    nbformat.write(nb, str(path))

    assert colab.insert_setup_cell(path, repo_url="https://github.com/someone/medaidet") is True
    nb = nbformat.read(str(path), as_version=nbformat.NO_CONVERT)
    assert len(_setup_cells(nb)) == 1
    assert nb.cells[0].source == colab.setup_cell_source("https://github.com/someone/medaidet")
    assert nb.cells[0].outputs == [] and nb.cells[0].execution_count is None
    assert "old setup" not in "".join(c.source for c in nb.cells)


def test_notebook_with_setup_cell_still_has_its_parameters_cell(tmp_path):
    path = tmp_path / NOTEBOOK.name
    shutil.copy(NOTEBOOK, path)
    colab.insert_setup_cell(path)
    nb = nbformat.read(str(path), as_version=nbformat.NO_CONVERT)
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and tagged[0] > 0


def test_colab_badge():
    badge = colab.colab_badge("someone/medaidet", "notebooks/03_training.ipynb")
    assert badge == (
        "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        "(https://colab.research.google.com/github/someone/medaidet/blob/main/notebooks/"
        "03_training.ipynb)")
    assert colab.colab_badge("someone/medaidet", Path("00_environment.ipynb")).endswith(
        "/github/someone/medaidet/blob/main/notebooks/00_environment.ipynb)")
    assert "/blob/dev/notebooks/" in colab.colab_badge("a/b", "x.ipynb", branch="dev")
    for bad in ("medaidet", "a/b/c", "/medaidet", ""):
        with pytest.raises(ValueError):
            colab.colab_badge(bad, "00_environment.ipynb")
