"""The Makefile behind README's two commands: BCCD provisioned first, command-line variables
only, paths with spaces, and `make clean` removing only what `make run` made."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")

# The venvs are never rebuilt by these tests (-o: take them as up to date).
KEEP_VENVS = ["-o", ".venv-py311/.ready", "-o", ".venv-py312/.ready"]
PROVISION = "-m medaidet data download"
MARKER = ".medaidet-course"   # medaidet_tools.course's: the runner's own output folders


def make(*args, cwd=REPO, env=None):
    """Run REPO's Makefile in ``cwd`` (where relative paths resolve), without MEDAIDET_DATA."""
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith("MAKE") and k != "MEDAIDET_DATA"}
    full_env.update(env or {})
    return subprocess.run(["make", "--no-print-directory", "-f", str(REPO / "Makefile"),
                           *KEEP_VENVS, *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=120)


def recipe_lines(*args, env=None):
    result = make("-n", *args, env=env)
    assert result.returncode == 0, result.stderr
    return [line.strip() for line in result.stdout.splitlines()]


def index_of(lines, needle):
    return next(i for i, line in enumerate(lines) if needle in line)


def test_bccd_is_provisioned_before_the_tests_and_before_the_first_notebook():
    test = recipe_lines("test")
    assert index_of(test, PROVISION) < index_of(test, "-m pytest")
    run = recipe_lines("run")
    assert index_of(run, PROVISION) < index_of(run, "-m medaidet course run")


def test_out_profile_and_edition_come_from_the_command_line_only():
    exported = recipe_lines("run", env={"OUT": "/home/someone/thesis", "PROFILE": "x",
                                        "COURSE_LANG": "ja"})
    assert exported[-1].endswith('course run --profile "auto" --lang "en" --out "outputs"'), \
        exported
    given = recipe_lines("run", "PROFILE=cpu", "OUT=my outputs")
    assert given[-1].endswith('course run --profile "cpu" --lang "en" --out "my outputs"'), given
    seeded = recipe_lines("run", "SEED=1")
    assert seeded[-1].endswith('course run --profile "auto" --lang "en" --out "outputs" '
                               '--seed "1"'), seeded
    assert recipe_lines("run", env={"SEED": "5"})[-1].endswith('--out "outputs"')
    japanese = recipe_lines("run", "COURSE_LANG=ja")
    assert japanese[-1].endswith('course run --profile "auto" --lang "ja" --out "outputs/ja"'), \
        japanese


@pytest.mark.parametrize("lang", ["xx", "../..", ""])
def test_an_edition_that_is_not_one_stops_make_with_one_message(lang):
    for target in ("lab", "run"):
        result = make("-n", target, f"COURSE_LANG={lang}")
        assert result.returncode != 0 and result.stdout == ""
        assert f"COURSE_LANG={lang} " in result.stderr and "Traceback" not in result.stderr


def test_without_a_copy_or_a_network_make_stops_with_one_message(tmp_path):
    """A refused local port stands in for the network; `make test` and `run` run `make bccd`."""
    result = make("bccd", f"PY={sys.executable}", cwd=tmp_path, env={
        "MEDAIDET_CACHE": str(tmp_path / "cache"), "no_proxy": "127.0.0.1",
        "MEDAIDET_BCCD_URL": "http://127.0.0.1:9/bccd.tar.gz"})
    assert result.returncode != 0 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 2, result.stderr   # medaidet's message, then make's "Error 2"
    assert str(tmp_path / "cache" / "bccd") in errors[0]     # where to put a copy
    assert not (tmp_path / "cache" / "bccd").exists()


def test_with_a_copy_make_bccd_verifies_it_and_prints_its_root(tmp_path, bccd_root):
    result = make("bccd", f"PY={sys.executable}", cwd=tmp_path, env={
        "MEDAIDET_DATA": str(bccd_root), "MEDAIDET_BCCD_URL": "http://127.0.0.1:9/x"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == str(bccd_root)


def test_clean_removes_only_a_folder_the_course_runner_made(tmp_path):
    def folder(name, marked, files=("notes.txt",)):
        path = tmp_path / name
        path.mkdir()
        for f in files:
            (path / f).write_text("keep me")
        if marked:
            (path / MARKER).write_text("")
        return path

    thesis = folder("thesis", marked=False)
    result = make("clean", "OUT=thesis", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (thesis / "notes.txt").read_text() == "keep me"
    assert "make clean: kept thesis" in result.stderr and MARKER in result.stderr

    exported = folder("outputs-of-someone", marked=True)
    assert make("clean", cwd=tmp_path, env={"OUT": str(exported)}).returncode == 0
    assert exported.is_dir()            # OUT from the environment is not make's OUT

    made = folder("my outputs", marked=True, files=("01_data.ipynb", "summary.md"))
    result = make("clean", "OUT=my outputs", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not made.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs-of-someone", "thesis"]


@pytest.mark.parametrize("uid, allowed", [("0", True), ("1000", False)])
def test_lab_runs_as_root_with_allow_root_only(tmp_path, uid, allowed):
    """JupyterLab refuses root (a container) without --allow-root; a fake `id` sets the uid."""
    (tmp_path / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (tmp_path / "id").chmod(0o755)
    lines = recipe_lines("lab", "-o", ".venv-py312/.lab",
                         env={"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    lab = lines[index_of(lines, "-m jupyterlab")]
    assert ("--allow-root" in lab.split()) == allowed, lab
