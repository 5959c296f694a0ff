"""The papermill course runner, on the real notebook 00 and on small made-up notebooks."""
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat import v4

import medaidet.stack
from medaidet.arguments import ArgumentValueError, OutputDirError
from medaidet.env.course import (CourseError, list_notebooks, resolve_profile, run_course,
                             select_notebooks)
from medaidet.errors import MedaidetError

ROOT = Path(__file__).resolve().parents[2]
ENV_KEYS = ("MEDAIDET_COURSE_RUN", "MEDAIDET_PROFILE", "PYTHONPATH")


def make_notebook(directory: Path, name: str, *sources: str) -> Path:
    """A notebook with a `parameters` cell (profile = "auto") followed by ``sources``."""
    cells = [v4.new_code_cell('profile = "auto"', metadata={"tags": ["parameters"]})]
    cells += [v4.new_code_cell(source) for source in sources]
    nb = v4.new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.ipynb"
    nbformat.write(nb, str(path))
    return path


@pytest.fixture
def failing_course(tmp_path):
    """00 ok (and checks what the runner gives its kernels), 01 raises, 02 after it."""
    notebooks = tmp_path / "notebooks"
    make_notebook(notebooks, "00_ok",
                  "import os\n"
                  "assert profile == 'smoke', profile\n"
                  "assert os.environ['MEDAIDET_COURSE_RUN'] == '1'\n"
                  "assert os.environ['MEDAIDET_PROFILE'] == 'smoke'\n"
                  f"assert os.path.samefile(os.getcwd(), {str(notebooks)!r}), os.getcwd()\n"
                  "print('fine')")
    make_notebook(notebooks, "01_fail", 'raise ValueError("boom")', "print('never')")
    make_notebook(notebooks, "02_after", "print('after')")
    return notebooks


def _quiet(*args):
    pass


def _code_outputs(nb):
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


@pytest.mark.slow(seconds=4)
@pytest.mark.skipif(not medaidet.stack.status().ok,
                    reason="the chainer stack is not installed here (python -m medaidet stack "
                           "install); notebook 00 would rightly fail")
def test_notebook_00_runs(tmp_path):
    summary = run_course(profile="smoke", only=["00"], out=tmp_path, log=_quiet)
    assert summary.ok, summary.to_dict()
    assert summary.profile == "smoke"
    [result] = summary.results
    assert result.name == "00_environment" and result.status == "ok"

    executed = tmp_path / "00_environment.ipynb"
    assert Path(result.output) == executed and executed.is_file()
    nb = nbformat.read(str(executed), as_version=4)
    assert _code_outputs(nb), "the executed notebook has no outputs"
    injected = [cell for cell in nb.cells
                if "injected-parameters" in cell.metadata.get("tags", [])]
    assert len(injected) == 1 and 'profile = "smoke"' in injected[0].source
    assert not any(out.output_type == "error" for out in _code_outputs(nb))

    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["ok"] is True and data["profile"] == "smoke"
    for key in ("python", "numpy", "chainer", "chainercv", "date", "profile_reason"):
        assert data[key], key
    [entry] = data["results"]
    assert entry["name"] == "00_environment" and entry["status"] == "ok"
    assert entry["seconds"] > 0 and entry["output"] == str(executed) and entry["error"] is None
    assert "00_environment" in (tmp_path / "summary.md").read_text()


@pytest.mark.slow(seconds=12)
def test_failing_notebook_stops_the_course(failing_course, tmp_path):
    lines = []
    out = tmp_path / "out"
    env_before = {key: os.environ.get(key) for key in ENV_KEYS}
    summary = run_course(profile="smoke", out=out, notebooks_dir=failing_course,
                         log=lines.append)
    assert not summary.ok
    assert [(r.name, r.status) for r in summary.results] == [
        ("00_ok", "ok"), ("01_fail", "failed"), ("02_after", "not run")]
    failed = summary.results[1]
    assert failed.error.startswith("ValueError: boom"), failed.error
    assert summary.results[2].note == "an earlier notebook failed"

    # the failing notebook is kept, with its error; nothing after it ran
    kept = nbformat.read(str(out / "01_fail.ipynb"), as_version=4)
    errors = [o for o in _code_outputs(kept) if o.output_type == "error"]
    assert errors and errors[0].ename == "ValueError" and errors[0].evalue == "boom"
    assert "never" not in json.dumps(_code_outputs(kept))
    assert not (out / "02_after.ipynb").exists()

    data = json.loads((out / "summary.json").read_text())
    assert data["ok"] is False
    assert [r["status"] for r in data["results"]] == ["ok", "failed", "not run"]
    assert data["results"][2]["output"] is None
    assert "not run (an earlier notebook failed)" in (out / "summary.md").read_text()
    assert any("01_fail" in line and "ValueError: boom" in line for line in lines)
    assert any("02_after: not run (an earlier notebook failed)" in line for line in lines)
    assert any(str(out / "summary.json") in line for line in lines)
    # the kernels' environment is not left behind in this process
    assert {key: os.environ.get(key) for key in ENV_KEYS} == env_before

    # a second run removes the copies of the first, so the folder matches the summary
    (failing_course / "01_fail.ipynb").unlink()
    make_notebook(failing_course, "01_fail", "print('fixed')")
    assert run_course(profile="smoke", out=out, notebooks_dir=failing_course,
                      log=_quiet).ok
    make_notebook(failing_course, "00_ok", "raise ValueError('boom again')")
    summary = run_course(profile="smoke", out=out, notebooks_dir=failing_course, log=_quiet)
    assert [r.status for r in summary.results] == ["failed", "not run", "not run"]
    assert not (out / "01_fail.ipynb").exists() and not (out / "02_after.ipynb").exists()


@pytest.mark.slow(seconds=4)
def test_cli_exits_nonzero_when_a_notebook_fails(failing_course, tmp_path):
    env = dict(os.environ, MEDAIDET_NOTEBOOKS=str(failing_course))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "")
                                                       .split(os.pathsep) if p])
    workdir = tmp_path / "work"
    workdir.mkdir()
    done = subprocess.run([sys.executable, "-m", "medaidet", "course", "run", "--profile", "smoke",
                           "--out", "out"], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "01_fail: FAILED" in done.stdout and "ValueError: boom" in done.stdout
    # --out is relative to the current directory
    data = json.loads((workdir / "out" / "summary.json").read_text())
    assert [r["status"] for r in data["results"]] == ["ok", "failed", "not run"]


def test_cli_unknown_name_is_a_usage_error(failing_course, tmp_path):
    env = dict(os.environ, MEDAIDET_NOTEBOOKS=str(failing_course))
    done = subprocess.run([sys.executable, "-m", "medaidet", "course", "run", "--only", "7",
                           "--out", str(tmp_path / "out")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no notebook named '7'" in done.stderr and "01_fail" in done.stderr


def test_only_selects_by_file_name_stem_or_number(failing_course):
    notebooks = list_notebooks(failing_course)
    for name in ("01", "01_fail", "01_fail.ipynb"):
        assert [p.stem for p in select_notebooks(notebooks, [name])] == ["01_fail"]
    assert [p.stem for p in select_notebooks(notebooks, ["02", "00"])] == ["00_ok", "02_after"]
    assert select_notebooks(notebooks, None) == notebooks


def test_only_unknown_name_lists_available(failing_course, tmp_path):
    with pytest.raises(CourseError) as info:
        run_course(profile="smoke", only=["99_nope"], out=tmp_path / "out",
                   notebooks_dir=failing_course, log=_quiet)
    assert isinstance(info.value, MedaidetError)
    message = str(info.value)
    assert "99_nope" in message
    for stem in ("00_ok", "01_fail", "02_after"):
        assert stem in message
    assert not (tmp_path / "out").exists()


def test_cell_timeout_must_be_positive(failing_course, tmp_path):
    with pytest.raises(ArgumentValueError, match="--cell-timeout: 0 is out of range"):
        run_course(profile="smoke", notebooks_dir=failing_course, out=tmp_path / "out",
                   cell_timeout=0, log=_quiet)


@pytest.mark.parametrize("where", ["the notebooks folder", "inside it"])
def test_out_in_the_notebooks_folder_is_refused_and_deletes_nothing(failing_course, where):
    # it used to delete <out>/<name>.ipynb, i.e. every notebook, before running them
    out = failing_course if where == "the notebooks folder" else failing_course / "runs"
    before = {p.name: p.read_bytes() for p in failing_course.iterdir()}
    with pytest.raises(OutputDirError, match=r"--out: .* which this run reads"):
        run_course(profile="smoke", out=out, notebooks_dir=failing_course, log=_quiet)
    assert {p.name: p.read_bytes() for p in failing_course.iterdir()} == before


def test_out_that_is_a_file_is_named_before_any_work(failing_course, tmp_path):
    out = tmp_path / "results.txt"
    out.write_text("mine")
    with pytest.raises(OutputDirError, match="--out: .*results.txt is a file, not a folder"):
        run_course(profile="smoke", out=out, notebooks_dir=failing_course, log=_quiet)
    assert out.read_text() == "mine"


def test_missing_notebooks_dir_says_where(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(CourseError, match="nowhere"):
        run_course(profile="smoke", notebooks_dir=missing, out=tmp_path / "out", log=_quiet)


@pytest.mark.slow(seconds=4)
def test_cell_timeout(tmp_path):
    notebooks = tmp_path / "notebooks"
    make_notebook(notebooks, "00_slow", "import time; time.sleep(30)")
    out = tmp_path / "out"
    summary = run_course(profile="smoke", out=out, notebooks_dir=notebooks,
                         cell_timeout=3, log=_quiet)
    [result] = summary.results
    assert result.status == "failed"
    assert result.seconds < 25
    assert "CellTimeoutError" in result.error and "3 s" in result.error
    data = json.loads((out / "summary.json").read_text())
    assert data["cell_timeout"] == 3
    assert "CellTimeoutError" in data["results"][0]["error"]
    assert (out / "00_slow.ipynb").is_file()


def test_runs_go_under_out_where_a_notebook_has_run_dir(tmp_path):
    notebooks = tmp_path / "notebooks"
    path = make_notebook(notebooks, "03_train",
                         "import pathlib\n"
                         "pathlib.Path(run_dir, profile).mkdir(parents=True)\n"
                         "pathlib.Path(run_dir, profile, 'model.npz').write_text('w')")
    nb = nbformat.read(str(path), as_version=4)
    nb.cells[0].source += '\nrun_dir = "../outputs/runs"'
    nbformat.write(nb, str(path))
    make_notebook(notebooks, "04_no_run_dir", "assert 'run_dir' not in globals()")
    out = tmp_path / "out"
    summary = run_course(profile="smoke", out=out, notebooks_dir=notebooks, log=_quiet)
    assert summary.ok, summary.results
    assert (out / "runs" / "smoke" / "model.npz").read_text() == "w"
    assert not (tmp_path / "outputs").exists()


def test_resolve_profile(monkeypatch):
    assert resolve_profile("smoke") == ("smoke", "as requested")
    assert resolve_profile("cpu") == ("cpu", "as requested")
    assert resolve_profile("full") == ("full", "as requested")
    with pytest.raises(CourseError, match="unknown profile 'fast': use 'auto', 'smoke', 'cpu', "
                                          "'full'"):
        resolve_profile("fast")
    # a chainer that does not import: the CPU course, and the reason says why
    monkeypatch.setitem(sys.modules, "chainer", None)
    monkeypatch.setitem(sys.modules, "chainer.backends", None)
    profile, reason = resolve_profile("auto")
    assert profile == "cpu" and "chainer does not import" in reason


def test_summary_reports_the_evaluation_a_notebook_leaves(tmp_path):
    notebooks = tmp_path / "notebooks"
    evaluation = {"split": "test", "n_images": 4, "protocols": {
        "evaluate": {"score_thresh": 0.01, "map_voc": 0.5,
                     "ap_voc": {"rbc": 0.25, "wbc": 0.75, "platelets": None}}},
        "model": "ssd_small", "weights": "/w/ssd_small_bccd.npz",
        "weights_note": "the small SSD's weights shipped with medaidet"}
    make_notebook(notebooks, "04_eval",
                  "import json, os, pathlib\n"
                  "out = pathlib.Path(os.environ['MEDAIDET_COURSE_OUT'])\n"
                  f"(out / 'evaluation.json').write_text(json.dumps({evaluation!r}))")
    out = tmp_path / "out"
    summary = run_course(profile="smoke", out=out, notebooks_dir=notebooks, log=_quiet)
    assert summary.ok and summary.evaluation == evaluation
    assert json.loads((out / "summary.json").read_text())["evaluation"] == evaluation
    md = (out / "summary.md").read_text()
    assert "test mAP, evaluate protocol (score >= 0.01, 4 images): **0.500**" in md
    assert "rbc 0.250, wbc 0.750, platelets n/a" in md
    # which weights: the smoke run's own model is untrained, the shipped one is not
    assert ("evaluated: ssd_small from /w/ssd_small_bccd.npz (the small SSD's weights "
            "shipped with medaidet)") in md
    # a later run without that notebook does not report the stale file
    make_notebook(notebooks, "04_eval", "print('no evaluation this time')")
    assert run_course(profile="smoke", out=out, notebooks_dir=notebooks,
                      log=_quiet).evaluation is None
