"""The papermill course runner on small made-up notebooks (CI's smoke course runs the real ones)."""
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

from medaidet.errors import ConfigError, MedaidetError
from medaidet.training.config import TrainConfig
from medaidet import cli
from medaidet.env import resolve_profile
from medaidet_tools.course import (OUT_MARKER, CourseError, list_notebooks, run_course,
                                   select_notebooks)

ROOT = Path(__file__).resolve().parents[2]
ENV_KEYS = ("MEDAIDET_COURSE_RUN", "MEDAIDET_PROFILE", "PYTHONPATH")


def make_notebook(directory: Path, name: str, *sources: str, parameters="") -> Path:
    """A notebook with a `parameters` cell (profile = "auto", ``parameters``), then ``sources``."""
    cells = [v4.new_code_cell('profile = "auto"\n' + parameters,
                              metadata={"tags": ["parameters"]})]
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


@pytest.fixture
def notebooks(tmp_path):
    """A course of one notebook, 00_ok, that prints ok."""
    make_notebook(tmp_path / "notebooks", "00_ok", "print('ok')")
    return tmp_path / "notebooks"


def _quiet(*args):
    pass


def _cli_env(notebooks: Path) -> dict:
    """The environment of a `python -m medaidet` subprocess on the made-up ``notebooks``."""
    env = dict(os.environ, MEDAIDET_NOTEBOOKS=str(notebooks))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "")
                                                       .split(os.pathsep) if p])
    return env


def _course_run(notebooks: Path, cwd: Path, *args: str):
    """`python -m medaidet course run --profile smoke ARGS` in ``cwd`` on ``notebooks``."""
    return subprocess.run([sys.executable, "-m", "medaidet", "course", "run", "--profile",
                           "smoke", *args], cwd=cwd, env=_cli_env(notebooks),
                          capture_output=True, text=True, timeout=300)


def _code_outputs(nb):
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


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
    injected = [c for c in nbformat.read(str(out / "00_ok.ipynb"), as_version=4).cells
                if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and 'profile = "smoke"' in injected[0].source

    data = json.loads((out / "summary.json").read_text())
    assert data["ok"] is False and data["profile"] == "smoke"
    assert data["python"] and data["date"] and data["profile_reason"]
    assert {"numpy", "chainer", "chainercv"} <= set(data)     # versions; None if not installed
    assert [r["status"] for r in data["results"]] == ["ok", "failed", "not run"]
    ok = data["results"][0]
    assert ok["seconds"] > 0 and ok["output"] == str(out / "00_ok.ipynb") and ok["error"] is None
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
    workdir = tmp_path / "work"
    workdir.mkdir()
    done = _course_run(failing_course, workdir, "--out", "out")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "01_fail: FAILED" in done.stdout and "ValueError: boom" in done.stdout
    # --out is relative to the current directory
    data = json.loads((workdir / "out" / "summary.json").read_text())
    assert [r["status"] for r in data["results"]] == ["ok", "failed", "not run"]


def test_only_selects_by_file_name_stem_or_number(failing_course):
    notebooks = list_notebooks(failing_course)
    for name in ("01", "01_fail", "01_fail.ipynb"):
        assert [p.stem for p in select_notebooks(notebooks, [name])] == ["01_fail"]
    assert [p.stem for p in select_notebooks(notebooks, ["02", "00"])] == ["00_ok", "02_after"]
    assert select_notebooks(notebooks, None) == notebooks


def test_only_unknown_name_lists_available(failing_course, tmp_path, monkeypatch, capsys):
    with pytest.raises(CourseError) as info:
        run_course(profile="smoke", only=["99_nope"], out=tmp_path / "out",
                   notebooks_dir=failing_course, log=_quiet)
    assert all(name in str(info.value) for name in ("99_nope", "00_ok", "01_fail", "02_after"))
    monkeypatch.setenv("MEDAIDET_NOTEBOOKS", str(failing_course))     # the CLI: exit 2
    assert cli.main(["course", "run", "--only", "7", "--out", str(tmp_path / "out")]) == 2
    assert "no notebook named '7'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cell_timeout_must_be_positive(failing_course, tmp_path):
    with pytest.raises(ConfigError, match="--cell-timeout: 0 is out of range"):
        run_course(profile="smoke", notebooks_dir=failing_course, out=tmp_path / "out",
                   cell_timeout=0, log=_quiet)


@pytest.mark.parametrize("where, kind", [("notebooks", "input"), ("notebooks/runs", "input"),
                                         ("results.txt", "not_a_folder")])
def test_out_in_the_notebooks_folder_or_a_file_is_refused_and_changes_nothing(
        failing_course, tmp_path, where, kind):
    out = tmp_path / where
    if kind == "not_a_folder":
        out.write_text("mine")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError) as info:
        run_course(profile="smoke", out=out, notebooks_dir=failing_course, log=_quiet)
    assert (info.value.kind, info.value.path) == (kind, out.resolve())
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


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


@pytest.mark.slow(seconds=2)
def test_a_seed_reaches_the_notebooks_with_a_detector_seed_parameter(tmp_path):
    """Not notebook 06's ``seed``: set to the detector's, its 'another seed' run repeated."""
    notebooks = tmp_path / "notebooks"
    make_notebook(notebooks, "03_train", "print(f'seed {detector_seed}')",
                  parameters="detector_seed = None")
    make_notebook(notebooks, "04_no_seed", "assert seed == 0 and 'detector_seed' not in globals()",
                  parameters="seed = 0")
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
    for profile in ("smoke", "cpu", "full"):
        assert resolve_profile(profile) == (profile, "as requested")
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


# what `medaidet train` writes first
CPU_CONFIG = json.dumps(TrainConfig.profile("cpu").to_dict())


@pytest.mark.parametrize("files, named", [
    ({"evaluation.json": '{"map": 0.9}', "summary.md": "my notes", "summary.json": "{}",
      "figure.png": "png"}, "(evaluation.json, figure.png, summary.json and 1 more)"),
    ({"runs/": "", "notes.txt": "mine"}, "(notes.txt)"),          # runs/ beside a user's file
    ({"ja/thesis/draft.txt": "the user's"}, "(ja)"),
    ({"runs/thesis/draft.txt": "the user's"}, "(runs)"),
    ({"runs/report.docx": "the user's"}, "(runs)"),
    pytest.param({"runs/cpu/model.npz": "weights", "runs/cpu/config.json": CPU_CONFIG}, None,
                 marks=pytest.mark.slow(seconds=2)),          # Jupyter's ../outputs/runs
    ({"ja/" + OUT_MARKER: "made by the Japanese edition's run"}, None),
], ids=["users-files", "runs-beside-notes", "ja-thesis", "runs-thesis", "runs-file",
        "jupyters-runs", "japanese-run"])
def test_only_a_folder_of_the_courses_own_work_is_adopted(notebooks, tmp_path, files, named):
    """A refused folder's files survive, even with `--only 00` (evaluation.json, summary.*);
    if adopted, a later ``make clean OUT=`` that folder would delete them."""
    out = tmp_path / "outputs"
    for rel, text in files.items():
        if rel.endswith("/"):
            (out / rel).mkdir(parents=True)
        else:
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_text(text)
    before = {rel: (out / rel).read_text() for rel in files if not rel.endswith("/")}
    if named is None:
        assert run_course(profile="smoke", only=["00"], out=out, notebooks_dir=notebooks,
                          log=_quiet).ok
        assert (out / OUT_MARKER).is_file()
    else:
        with pytest.raises(ConfigError) as info:
            run_course(profile="smoke", only=["00"], out=out, notebooks_dir=notebooks,
                       log=_quiet)
        assert (info.value.kind, info.value.path) == ("not_ours", out)
        assert named in str(info.value) and not (out / OUT_MARKER).exists()
    assert {rel: (out / rel).read_text() for rel in before} == before


@pytest.mark.slow(seconds=5)
def test_in_its_own_folder_a_run_replaces_only_what_it_rewrites(notebooks, tmp_path):
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
def test_the_default_outputs_folder_is_marked_as_the_runners(notebooks, tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    done = _course_run(notebooks, workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (workdir / "outputs" / OUT_MARKER).is_file()
    assert (workdir / "outputs" / "summary.json").is_file()


@pytest.mark.slow(seconds=2)
def test_the_kernel_talks_over_unix_sockets_and_prints_no_encryption_warning(tmp_path):
    """Over TCP without encryption ipykernel warned once per notebook on the terminal."""
    notebooks = tmp_path / "notebooks"
    make_notebook(notebooks, "00_connection", "import json, ipykernel.connect\n"
                  "print(json.loads(ipykernel.connect.get_connection_info())['transport'])")
    done = _course_run(notebooks, tmp_path, "--out", str(tmp_path / "out"))
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
def test_no_room_for_the_summary_leaves_no_truncated_summary(notebooks, tmp_path):
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
def test_no_room_for_an_executed_notebook_stops_and_names_it(notebooks, tmp_path):
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
def test_a_full_disk_names_the_summary_and_what_to_do(notebooks, tmp_path, monkeypatch, capsys):
    """A real ENOSPC: the summary's temporary files write to /dev/full."""
    import medaidet.files

    def full_part_file(path):
        fd, name = create_part_file(path)
        if path.parent == out:
            full = os.open("/dev/full", os.O_WRONLY)
            os.dup2(full, fd)
            os.close(full)
        return fd, name

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
