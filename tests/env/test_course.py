"""The papermill course runner, on the real notebook 00 and on small made-up notebooks."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbformat import v4

import medaidet_tools.stack
from medaidet.errors import ConfigError, MedaidetError
from medaidet.training.config import TrainConfig
from medaidet import cli
from medaidet.env import resolve_profile
from medaidet_tools.course import (OUT_MARKER, CourseError, list_notebooks, run_course,
                                   select_notebooks)

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


def _cli_env(notebooks: Path) -> dict:
    """The environment of a `python -m medaidet` subprocess on the made-up ``notebooks``."""
    env = dict(os.environ, MEDAIDET_NOTEBOOKS=str(notebooks))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "")
                                                       .split(os.pathsep) if p])
    return env


def _contents(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def _code_outputs(nb):
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


@pytest.mark.slow(seconds=8)
@pytest.mark.skipif(not medaidet_tools.stack.status().ok,
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


@pytest.mark.slow(seconds=10)
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


@pytest.mark.slow(seconds=6)
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
    with pytest.raises(ConfigError, match="--cell-timeout: 0 is out of range"):
        run_course(profile="smoke", notebooks_dir=failing_course, out=tmp_path / "out",
                   cell_timeout=0, log=_quiet)


@pytest.mark.parametrize("where", ["the notebooks folder", "inside it"])
def test_out_in_the_notebooks_folder_is_refused_and_deletes_nothing(failing_course, where):
    out = failing_course if where == "the notebooks folder" else failing_course / "runs"
    before = {p.name: p.read_bytes() for p in failing_course.iterdir()}
    with pytest.raises(ConfigError) as info:
        run_course(profile="smoke", out=out, notebooks_dir=failing_course, log=_quiet)
    assert (info.value.kind, info.value.path) == ("input", out.resolve())
    assert {p.name: p.read_bytes() for p in failing_course.iterdir()} == before


def test_out_that_is_a_file_is_named_before_any_work(failing_course, tmp_path):
    out = tmp_path / "results.txt"
    out.write_text("mine")
    with pytest.raises(ConfigError) as info:
        run_course(profile="smoke", out=out, notebooks_dir=failing_course, log=_quiet)
    assert (info.value.kind, info.value.path) == ("not_a_folder", out)
    assert out.read_text() == "mine"


def test_missing_notebooks_dir_says_where(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(CourseError, match="nowhere"):
        run_course(profile="smoke", notebooks_dir=missing, out=tmp_path / "out", log=_quiet)


@pytest.mark.slow(seconds=5)
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


@pytest.mark.slow(seconds=2)
def test_a_seed_reaches_the_notebooks_with_a_detector_seed_parameter(tmp_path):
    """Not notebook 06's ``seed``: set to the detector's, its 'another seed' run repeated."""
    notebooks = tmp_path / "notebooks"
    path = make_notebook(notebooks, "03_train", "print(f'seed {detector_seed}')")
    nb = nbformat.read(str(path), as_version=4)
    nb.cells[0].source += "\ndetector_seed = None"
    nbformat.write(nb, str(path))
    path = make_notebook(notebooks, "04_no_seed", "assert seed == 0 and 'detector_seed' not in globals()")
    nb = nbformat.read(str(path), as_version=4)
    nb.cells[0].source += "\nseed = 0"
    nbformat.write(nb, str(path))
    out = tmp_path / "out"
    summary = run_course(profile="smoke", out=out, notebooks_dir=notebooks, log=_quiet, seed=3)
    assert summary.ok, summary.results
    executed = nbformat.read(str(out / "03_train.ipynb"), as_version=4)
    assert _code_outputs(executed)[-1].text == "seed 3\n"
    assert json.loads((out / "summary.json").read_text())["seed"] == 3
    assert "- seed: 3 (`--seed`)" in (out / "summary.md").read_text()
    with pytest.raises(MedaidetError, match="--seed"):
        run_course(profile="smoke", out=out, notebooks_dir=notebooks, log=_quiet, seed=-1)
    # notebook 03 declares it, in a line papermill can parse, in both editions
    import papermill
    for edition in ("", "ja"):
        path = ROOT / "notebooks" / edition / "03_training.ipynb"
        assert "detector_seed" in papermill.inspect_notebook(str(path)), path


def test_warnings_a_notebook_prints_are_listed(tmp_path, capsys):
    """Stderr warnings are listed but fail nothing; stdout that mentions a warning is not one."""
    notebooks = tmp_path / "notebooks"
    make_notebook(notebooks, "00_warns", "print('a UserWarning explained on stdout')",
                  "import warnings\nwarnings.warn('careful with this', UserWarning)",
                  "import sys\nprint('\\x1b[0;93m2026-11-25 [W:onnxruntime:, graph.cc:1492 Graph] "
                  "Initializer x appears in graph inputs', file=sys.stderr)")
    make_notebook(notebooks, "01_clean", "print('fine')")
    out = tmp_path / "out"
    summary = run_course(profile="smoke", out=out, notebooks_dir=notebooks)
    assert summary.ok
    warned, clean = summary.results
    assert len(warned.warnings) == 2 and warned.warnings[0].startswith("cell ")
    assert warned.warnings[0].endswith(".py:2: UserWarning: careful with this")
    assert "[W:onnxruntime:, graph.cc:1492 Graph] Initializer x" in warned.warnings[1]
    assert clean.warnings == []
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("00_warns: ok (") and line.endswith(
        "; 2 warning line(s) in its outputs, the first: " + warned.warnings[0]) for line in lines)
    data = json.loads((out / "summary.json").read_text())
    assert [r["warnings"] for r in data["results"]] == [warned.warnings, []]
    assert "2 warning line(s)" in (out / "summary.md").read_text()

    # CI's check (tools/check_course_outputs.py) fails on it, and passes a clean run
    tool = [sys.executable, str(ROOT / "tools" / "check_course_outputs.py")]
    done = subprocess.run([*tool, str(out)], capture_output=True, text=True)
    assert done.returncode == 1 and f"00_warns: {warned.warnings[0]}" in done.stderr
    clean_out = tmp_path / "clean"
    assert run_course(profile="smoke", out=clean_out, notebooks_dir=notebooks, only=["01"]).ok
    done = subprocess.run([*tool, str(clean_out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("1 executed notebook, no warning in their outputs")

    make_notebook(notebooks, "02_model_and_loss", "print('ChainerCV : IndexError')")
    shown_out = tmp_path / "shown"
    assert run_course(profile="smoke", out=shown_out, notebooks_dir=notebooks, only=["02"]).ok
    done = subprocess.run([*tool, str(shown_out)], capture_output=True, text=True)
    assert done.returncode == 1
    assert "02_model_and_loss: 0 figure(s), expected at least 2" in done.stderr
    assert "02_model_and_loss: no 'medaidet  : InvalidTargetsError' in its outputs" in done.stderr
    assert "'ChainerCV : IndexError'" not in done.stderr


def test_resolve_profile(monkeypatch):
    assert resolve_profile("smoke") == ("smoke", "as requested")
    assert resolve_profile("cpu") == ("cpu", "as requested")
    assert resolve_profile("full") == ("full", "as requested")
    with pytest.raises(ValueError) as info:
        resolve_profile("fast")
    assert all(p in str(info.value) for p in ("'fast'", "'auto'", "'smoke'", "'cpu'", "'full'"))
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


def test_a_folder_of_someone_elses_files_is_refused_and_left_alone(failing_course, tmp_path):
    """Even with `--only 00`: the user's evaluation.json and summary.* must survive."""
    mine = tmp_path / "thesis"
    mine.mkdir()
    for name, text in {"evaluation.json": '{"map": 0.9}', "summary.md": "my notes",
                       "summary.json": "{}", "figure.png": "png"}.items():
        (mine / name).write_text(text)
    before = _contents(mine)
    with pytest.raises(ConfigError) as info:
        run_course(profile="smoke", only=["00"], out=mine, notebooks_dir=failing_course,
                   log=_quiet)
    message = str(info.value)
    assert message.startswith(f"--out: the folder {mine} already holds files "
                              "(evaluation.json, figure.png, summary.json and 1 more)"), message
    assert f"it has no {OUT_MARKER} file" in message
    assert "Choose a new or empty folder for --out, or move those files out of it" in message
    assert _contents(mine) == before and not (mine / OUT_MARKER).exists()


@pytest.mark.slow(seconds=2)
def test_a_folder_with_only_the_notebooks_training_runs_is_the_courses(tmp_path):
    """Jupyter's ../outputs/runs is adopted by `make run`; runs/ beside a user's file is not."""
    notebooks = tmp_path / "notebooks"
    make_notebook(notebooks, "00_ok", "print('ok')")
    out = tmp_path / "outputs"
    (out / "runs" / "cpu").mkdir(parents=True)
    (out / "runs" / "cpu" / "model.npz").write_bytes(b"weights")
    (out / "runs" / "cpu" / "config.json").write_text(   # what `medaidet train` writes first
        json.dumps(TrainConfig.profile("cpu").to_dict()))
    assert run_course(profile="smoke", out=out, notebooks_dir=notebooks, log=_quiet).ok
    assert (out / OUT_MARKER).is_file()
    assert (out / "runs" / "cpu" / "model.npz").read_bytes() == b"weights"

    theirs = tmp_path / "theirs"
    (theirs / "runs").mkdir(parents=True)
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError) as info:
        run_course(profile="smoke", out=theirs, notebooks_dir=notebooks, log=_quiet)
    assert info.value.kind == "not_ours" and "notes.txt" in str(info.value)
    assert not (theirs / OUT_MARKER).exists()


def test_runs_or_ja_holding_the_users_files_do_not_make_a_folder_the_courses(tmp_path):
    """If adopted, a later ``make clean OUT=`` that folder would delete the user's files."""
    notebooks = tmp_path / "notebooks"
    make_notebook(notebooks, "00_ok", "print('ok')")
    for name, sub in (("only-ja", "ja"), ("only-runs", "runs"), ("runs-file", "runs")):
        folder = tmp_path / name
        (folder / sub / "thesis").mkdir(parents=True)
        target = folder / sub / ("report.docx" if name == "runs-file" else "thesis/draft.txt")
        target.write_text("the user's")
        with pytest.raises(ConfigError) as info:
            run_course(profile="smoke", out=folder, notebooks_dir=notebooks, log=_quiet)
        assert info.value.kind == "not_ours" and f"({sub})" in str(info.value)
        assert target.read_text() == "the user's" and not (folder / OUT_MARKER).exists()
    ours = tmp_path / "ours"
    (ours / "ja").mkdir(parents=True)
    (ours / "ja" / OUT_MARKER).write_text("made by the Japanese edition's run")
    assert run_course(profile="smoke", out=ours, notebooks_dir=notebooks, log=_quiet).ok


@pytest.mark.slow(seconds=5)
def test_in_its_own_folder_a_run_replaces_only_what_it_rewrites(tmp_path):
    notebooks = tmp_path / "notebooks"
    make_notebook(notebooks, "00_ok", "print('ok')")
    make_notebook(notebooks, "04_eval",
                  "import os, pathlib\n"
                  "out = pathlib.Path(os.environ['MEDAIDET_COURSE_OUT'])\n"
                  "(out / 'evaluation.json').write_text('{\"split\": \"test\"}')")
    out = tmp_path / "out"
    out.mkdir()  # an empty folder is adopted
    assert run_course(profile="smoke", out=out, notebooks_dir=notebooks, log=_quiet).ok
    assert (out / OUT_MARKER).is_file()
    assert {"00_ok.ipynb", "04_eval.ipynb", "evaluation.json", "summary.json",
            "summary.md"} <= set(os.listdir(out))
    (out / "notes.txt").write_text("added by the user")
    kept = {name: (out / name).read_bytes()
            for name in ("04_eval.ipynb", "evaluation.json", "notes.txt")}

    lines = []
    summary = run_course(profile="smoke", only=["00"], out=out, notebooks_dir=notebooks,
                         log=lines.append)
    assert summary.ok and [r.name for r in summary.results] == ["00_ok"]
    # notebook 04 did not run: its evaluation is neither deleted nor reported as this run's
    assert {name: (out / name).read_bytes() for name in kept} == kept
    assert summary.evaluation is None
    assert json.loads((out / "summary.json").read_text())["evaluation"] is None
    assert f"course: replacing 00_ok.ipynb, summary.json, summary.md of an earlier run in " \
           f"{out}" in lines


@pytest.mark.slow(seconds=2)
def test_the_default_outputs_folder_is_marked_as_the_runners(tmp_path):
    notebooks = tmp_path / "notebooks"
    make_notebook(notebooks, "00_ok", "print('ok')")
    workdir = tmp_path / "work"
    workdir.mkdir()
    done = subprocess.run([sys.executable, "-m", "medaidet", "course", "run", "--profile",
                           "smoke"], cwd=workdir, env=_cli_env(notebooks), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (workdir / "outputs" / OUT_MARKER).is_file()
    assert (workdir / "outputs" / "summary.json").is_file()


@pytest.mark.slow(seconds=5)
def test_lang_ja_runs_the_japanese_edition_into_outputs_ja(tmp_path):
    notebooks = tmp_path / "notebooks"
    make_notebook(notebooks, "00_ok", "print('english')")
    make_notebook(notebooks / "ja", "00_ok", "print('日本語')")
    workdir = tmp_path / "work"
    workdir.mkdir()
    for lang in ("ja", "en"):
        done = subprocess.run([sys.executable, "-m", "medaidet", "course", "run", "--profile",
                               "smoke", "--lang", lang], cwd=workdir, env=_cli_env(notebooks),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    ja, en = workdir / "outputs" / "ja", workdir / "outputs"
    assert "日本語" in (ja / "00_ok.ipynb").read_text(encoding="utf-8")
    assert "english" in (en / "00_ok.ipynb").read_text(encoding="utf-8")
    assert json.loads((ja / "summary.json").read_text())["lang"] == "ja"
    assert "- edition: Japanese (日本語版) (`--lang ja`)" in (ja / "summary.md").read_text(
        encoding="utf-8")
    assert "- edition: English (`--lang en`)" in (en / "summary.md").read_text()
    with pytest.raises(CourseError, match="unknown edition --lang 'fr'"):
        run_course(profile="smoke", out=tmp_path / "x", lang="fr", log=_quiet)


@pytest.mark.slow(seconds=2)
def test_the_kernel_talks_over_unix_sockets_and_prints_no_encryption_warning(tmp_path):
    """Over TCP without encryption ipykernel warned once per notebook on the terminal."""
    notebooks = tmp_path / "notebooks"
    make_notebook(notebooks, "00_connection", "import json, ipykernel.connect\n"
                  "print(json.loads(ipykernel.connect.get_connection_info())['transport'])")
    done = subprocess.run([sys.executable, "-m", "medaidet", "course", "run", "--profile",
                           "smoke", "--out", str(tmp_path / "out")], cwd=tmp_path,
                          env=_cli_env(notebooks), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "without encryption" not in done.stdout + done.stderr
    nb = nbformat.read(str(tmp_path / "out" / "00_connection.ipynb"), as_version=4)
    assert [out.text.strip() for out in _code_outputs(nb) if "text" in out] == ["ipc"]


@pytest.mark.slow(seconds=2)
def test_ctrl_c_ends_in_one_line_and_keeps_the_summary(tmp_path):
    """Ctrl-C reaches the runner's process group only; the kernel has a session of its own."""
    notebooks = tmp_path / "notebooks"
    started = tmp_path / "started"
    make_notebook(notebooks, "00_sleep", "import pathlib, time\n"
                                         f"pathlib.Path({str(started)!r}).touch()\n"
                                         "time.sleep(120)\n")
    make_notebook(notebooks, "01_after", "print('after')")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "medaidet", "course", "run", "--profile",
                             "smoke", "--out", str(out)], cwd=tmp_path,
                            env=_cli_env(notebooks), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert started.exists(), "the cell never started"
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)   # a hang fails here
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "ZMQError" not in err, err
    assert err.strip().splitlines()[-1] == "medaidet: interrupted"

    data = json.loads((out / "summary.json").read_text())
    assert [(r["name"], r["status"]) for r in data["results"]] == [
        ("00_sleep", "failed"), ("01_after", "not run")]
    assert data["results"][0]["error"] == "KeyboardInterrupt: interrupted by the user"
    assert data["results"][1]["note"] == "interrupted"
    kept = nbformat.read(str(out / "00_sleep.ipynb"), as_version=4)
    assert [o.ename for o in _code_outputs(kept) if o.output_type == "error"] == [
        "KeyboardInterrupt"]
    assert not (out / "01_after.ipynb").exists()


FULL_DISK_RUN = """
import resource, signal, sys
from medaidet import cli
from medaidet_tools import course

where, limit, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
real = getattr(course, where)
def no_room_from_here(*args):
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    return real(*args)
setattr(course, where, no_room_from_here)
sys.exit(cli.main(["course", "run", "--profile", "smoke", "--out", out]))
"""


def _run_out_of_room(where: str, limit: int, notebooks: Path, out: Path):
    """`course run` whose files may grow to ``limit`` bytes once ``course.<where>`` runs."""
    return subprocess.run([sys.executable, "-c", FULL_DISK_RUN, where, str(limit), str(out)],
                          cwd=ROOT, env=_cli_env(notebooks), capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow(seconds=2)
def test_no_room_for_the_summary_leaves_no_truncated_summary(tmp_path):
    notebooks = tmp_path / "notebooks"
    make_notebook(notebooks, "00_ok", "print('ok')")
    out = tmp_path / "out"
    done = _run_out_of_room("_write_summary", 100, notebooks, out)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"medaidet: error: {out / 'summary.json'}: File too large: the file outgrew the "
        "file-size limit (`ulimit -f`) or the file system's; raise it, or choose an --out "
        "folder on another disk")
    assert "Traceback" not in done.stderr
    assert (out / "00_ok.ipynb").is_file()
    assert sorted(os.listdir(out)) == [OUT_MARKER, "00_ok.ipynb"]  # no summary, no .part


@pytest.mark.slow(seconds=2)
def test_no_room_for_an_executed_notebook_stops_and_names_it(tmp_path):
    notebooks = tmp_path / "notebooks"
    make_notebook(notebooks, "00_ok", "print('ok')")
    make_notebook(notebooks, "01_after", "print('after')")
    out = tmp_path / "out"
    done = _run_out_of_room("_execute", 1000, notebooks, out)  # the copy is ~2 kB
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        f"medaidet: error: {out / '00_ok.ipynb'}: File too large: ")
    assert "Traceback" not in done.stderr
    assert os.listdir(out) == [OUT_MARKER]  # the part of a notebook is not left behind


@pytest.mark.slow(seconds=2)
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_a_full_disk_names_the_summary_and_what_to_do(tmp_path, monkeypatch, capsys):
    """A real ENOSPC: the summary's temporary files write to /dev/full."""
    import medaidet.files

    def full_part_file(path):
        fd, name = create_part_file(path)
        if path.parent == out:
            full = os.open("/dev/full", os.O_WRONLY)
            os.dup2(full, fd)
            os.close(full)
        return fd, name

    notebooks = tmp_path / "notebooks"
    make_notebook(notebooks, "00_ok", "print('ok')")
    out = tmp_path / "out"
    run_course(profile="smoke", out=out, notebooks_dir=notebooks, log=_quiet)
    create_part_file = medaidet.files._create_part_file
    monkeypatch.setattr(medaidet.files, "_create_part_file", full_part_file)
    monkeypatch.setenv("MEDAIDET_NOTEBOOKS", str(notebooks))
    assert cli.main(["course", "run", "--profile", "smoke", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        f"medaidet: error: {out / 'summary.json'}: No space left on device: free space on "
        f"the disk that holds {out}, or choose an --out folder on another disk")
    assert sorted(os.listdir(out)) == [OUT_MARKER, "00_ok.ipynb"]


def test_course_profile_opens_a_notebook_in_one_call():
    from medaidet.env import course_profile
    said = []
    assert course_profile("smoke", log=said.append) == "smoke" and said == []
    chosen = course_profile("auto", log=said.append)
    assert chosen == resolve_profile("auto")[0] and said == [
        f"profile: {chosen} ({resolve_profile('auto')[1]})"]
