"""Malformed input for ``medaidet``: exit 2, one last error line naming argument and value."""
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from medaidet import cli
from medaidet_tools import cli as tools_cli

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory, bccd_root, txl_root):
    """The bad (and one good) input files, made once for all rows."""
    d = tmp_path_factory.mktemp("inputs")
    made = {"dir": d, "bccd": bccd_root, "txl": txl_root}
    made["a_file"] = d / "results.txt"
    made["a_file"].write_text("a user's file\n")
    made["npy"] = d / "weights.npy"
    np.save(made["npy"], np.zeros(3, np.float32))
    from medaidet.ssd.model import build_ssd
    from medaidet.ssd.weights import save_weights
    made["weights"] = d / "model.npz"
    save_weights(build_ssd("ssd300", pretrained=None), made["weights"])
    with np.load(made["weights"]) as arrays:
        poisoned = {k: arrays[k] for k in arrays.files}
    first = sorted(poisoned)[0]
    poisoned[first] = np.full_like(poisoned[first], np.nan)
    made["nan"] = d / "nan.npz"
    np.savez(made["nan"], **poisoned)
    return made


# (id, argv from the inputs, substrings the one error line must hold[, environment]). Each
# check is tested with its fields where it lives (tests/training, evaluation, ssd, env); these
# rows check the one line each command reports it in.
ROWS = [
    ("course run --cell-timeout 0", lambda f: ["course", "run", "--cell-timeout", "0"],
     ["--cell-timeout", "0"]),
    ("course run --seed 2**32", lambda f: ["course", "run", "--seed", "4294967296"],
     ["--seed", "4294967296"]),
    ("course run --out ''", lambda f: ["course", "run", "--profile", "smoke", "--out", ""],
     ["--out", "''"]),
    ("train --labels txl-pbc --out inside TXL-PBC",
     lambda f: ["train", "--labels", "txl-pbc", "--out", str(f["txl"] / "runs"), "--root",
                str(f["bccd"])], ["--out", "which this run reads"],
     lambda f: {"MEDAIDET_TXL_PBC": str(f["txl"])}),
    ("evaluate --out FILE", lambda f: ["evaluate", str(f["weights"]), "--out", str(f["a_file"])],
     ["--out", "results.txt"]),
    ("course run --out FILE", lambda f: ["course", "run", "--out", str(f["a_file"])],
     ["--out", "results.txt"]),
    ("stack build --out FILE", lambda f: ["stack", "build", "--out", str(f["a_file"])],
     ["--out", "results.txt"]),
    ("evaluate .npy", lambda f: ["evaluate", str(f["npy"])], ["weights.npy"]),
    ("evaluate NaN weights", lambda f: ["evaluate", str(f["nan"])], ["nan.npz"]),
]


@pytest.mark.slow(seconds=2)   # per row: most rows fail in argparse or a first check
@pytest.mark.parametrize("row", ROWS, ids=[row[0] for row in ROWS])
def test_malformed_input_gives_one_named_line(row, files, capsys, monkeypatch):
    name, argv, expected, *environ = row
    for key, value in (environ[0](files) if environ else {}).items():
        monkeypatch.setenv(key, value)
    before = files["a_file"].read_text()
    try:
        status = cli.main(argv(files))
    except SystemExit as exc:  # argparse's own exit
        status = exc.code
    captured = capsys.readouterr()
    # what the command logged before it stopped may precede it; the error is one line, last
    errors = [line for line in captured.err.splitlines() if "error:" in line]
    assert status == 2, (status, captured.err)
    assert len(errors) == 1 and errors[0].startswith("medaidet"), captured.err
    assert captured.err.rstrip("\n").endswith(errors[0]) and "Traceback" not in captured.err
    for text in expected:
        assert text in errors[0], (text, errors[0])
    assert files["a_file"].read_text() == before


def test_debug_shows_the_traceback(files, capsys):
    status = cli.main(["course", "run", "--out", str(files["a_file"]), "--debug"])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1].startswith("medaidet: error: --out:")


def test_an_os_error_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    def unreadable(args):
        raise PermissionError(13, "Permission denied", str(tmp_path / "locked.npz"))
    monkeypatch.setattr(cli, "_doctor", unreadable)
    assert cli.main(["doctor"]) == 2
    err = capsys.readouterr().err
    assert err == f"medaidet: error: {tmp_path / 'locked.npz'}: Permission denied\n"


def test_a_full_disk_names_the_folder_and_what_to_do(tmp_path, capsys, monkeypatch):
    """A plain write()'s OSError names no file: the command's output folder is named instead."""
    def no_room(args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(tools_cli, "_run", no_room)
    assert cli.main(["course", "run", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        "medaidet: error: No space left on device: free space on the disk that holds "
        f"{tmp_path / 'out'}, or choose an --out folder on another disk\n")


def test_a_full_quota_in_the_cache_says_how_to_move_the_cache(tmp_path, capsys, monkeypatch):
    wheel = tmp_path / "cache" / "wheels" / "chainer-7.8.1-py3-none-any.whl"

    def no_room(args):
        raise OSError(errno.EDQUOT, "Disk quota exceeded", str(wheel))
    monkeypatch.setenv("MEDAIDET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cli, "_doctor", no_room)
    assert cli.main(["doctor"]) == 2
    assert capsys.readouterr().err == (
        f"medaidet: error: {wheel}: Disk quota exceeded: free space in your quota on the disk "
        f"that holds {wheel.parent}, or set $MEDAIDET_CACHE (or --cache) to a folder on "
        "another disk\n")


@pytest.mark.slow(seconds=9)
def test_ctrl_c_ends_with_one_line_and_status_130(tmp_path, bccd_root):
    command = [sys.executable, "-m", "medaidet", "train", "--profile", "smoke",
               "--root", str(bccd_root), "--out", str(tmp_path / "run"), "--n-processes", "0",
               "--iterations", "1000"]
    # a background shell's child ignores SIGINT unless it turns it back on
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(8)  # into model building or training
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "medaidet: interrupted"


def test_a_bare_interpreter_is_told_the_one_command_to_run(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")],
                   check=True)
    python = tmp_path / "venv" / "bin" / "python"
    done = subprocess.run([str(python), "-m", "medaidet", "stack", "install", "--cuda", "none"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"python -m pip install -e {REPO}" in line and "is not installed" in line
