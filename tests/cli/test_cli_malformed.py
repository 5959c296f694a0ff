"""Malformed input for ``medaidet``: exit 2, one last error line naming argument and value."""
import errno
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from medaidet import cli
from medaidet_tools import cli as tools_cli

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory, bccd_root, txl_root):
    """Every bad (and one good) input file, made once for all rows."""
    d = tmp_path_factory.mktemp("inputs")
    made = {"dir": d, "bccd": bccd_root, "txl": txl_root}
    made["a_file"] = d / "results.txt"
    made["a_file"].write_text("a user's file\n")
    made["npy"] = d / "weights.npy"
    np.save(made["npy"], np.zeros(3, np.float32))
    made["text"] = d / "weights.txt"
    made["text"].write_text("not weights\n")
    made["tar"] = d / "weights.tar"
    with tarfile.open(made["tar"], "w") as tar:
        tar.add(made["text"], arcname="weights.txt")
    made["empty"] = d / "empty.npz"
    made["empty"].write_bytes(b"")
    from medaidet.ssd.model import build_ssd
    from medaidet.ssd.weights import save_weights
    model = build_ssd("ssd300", pretrained=None)
    made["weights"] = d / "model.npz"
    save_weights(model, made["weights"])
    made["truncated"] = d / "truncated.npz"
    made["truncated"].write_bytes(made["weights"].read_bytes()[:4096])
    with np.load(made["weights"]) as arrays:
        poisoned = {k: arrays[k] for k in arrays.files}
    first = sorted(poisoned)[0]
    poisoned[first] = np.full_like(poisoned[first], np.nan)
    made["nan"] = d / "nan.npz"
    np.savez(made["nan"], **poisoned)
    made["zip"] = d / "BCCD.zip"
    with zipfile.ZipFile(made["zip"], "w") as archive:
        archive.writestr("BCCD/README.md", "not the tar.gz")
    for name, value in {"model": "ssd1024", "pretrained": 5, "out": 5, "root": 123}.items():
        made[f"config_{name}"] = d / f"config_{name}.json"
        made[f"config_{name}"].write_text(json.dumps({name: value}))
    return made


# (id, argv from the inputs, substrings the one error line must hold[, environment])
ROWS = [
    ("train --epochs inf", lambda f: ["train", "--epochs", "inf"], ["--epochs", "inf"]),
    ("train --subset 0", lambda f: ["train", "--subset", "0"], ["--subset", "0"]),
    ("train --batch-size 0", lambda f: ["train", "--batch-size", "0"], ["--batch-size", "0"]),
    ("train --iterations -1", lambda f: ["train", "--iterations", "-1"], ["--iterations", "-1"]),
    ("evaluate --subset 0", lambda f: ["evaluate", str(f["weights"]), "--subset", "0"],
     ["--subset", "0"]),
    ("evaluate --batch-size 0", lambda f: ["evaluate", str(f["weights"]), "--batch-size", "0"],
     ["--batch-size", "0"]),
    ("count --score-thresh -1", lambda f: ["count", str(f["weights"]), "--score-thresh", "-1"],
     ["--score-thresh", "-1"]),
    ("count --score-thresh nan", lambda f: ["count", str(f["weights"]), "--score-thresh", "nan"],
     ["--score-thresh", "nan"]),
    ("count --score-thresh 2", lambda f: ["count", str(f["weights"]), "--score-thresh", "2"],
     ["--score-thresh", "2"]),
    ("course run --cell-timeout 0", lambda f: ["course", "run", "--cell-timeout", "0"],
     ["--cell-timeout", "0"]),
    ("course run --seed 2**32", lambda f: ["course", "run", "--seed", "4294967296"],
     ["--seed", "4294967296"]),
    ("train --seed 2**32", lambda f: ["train", "--seed", "4294967296"], ["--seed", "4294967296"]),
    ("course run --out ''", lambda f: ["course", "run", "--profile", "smoke", "--out", ""],
     ["--out", "''"]),
    ("train --labels txl-pbc --out inside TXL-PBC",
     lambda f: ["train", "--labels", "txl-pbc", "--out", str(f["txl"] / "runs"), "--root",
                str(f["bccd"])], ["--out", "which this run reads"],
     lambda f: {"MEDAIDET_TXL_PBC": str(f["txl"])}),
    ("train --out FILE", lambda f: ["train", "--out", str(f["a_file"]), "--root", str(f["bccd"])],
     ["--out", "results.txt", "is a file"]),
    ("train --out under a file",
     lambda f: ["train", "--out", str(f["a_file"] / "run"), "--root", str(f["bccd"])],
     ["--out", "results.txt", "cannot create"]),
    ("train --out inside the data",
     lambda f: ["train", "--out", str(f["bccd"] / "runs"), "--root", str(f["bccd"])],
     ["--out", "which this run reads"]),
    ("evaluate --out FILE", lambda f: ["evaluate", str(f["weights"]), "--out", str(f["a_file"])],
     ["--out", "results.txt", "is a file"]),
    ("count --out FILE", lambda f: ["count", str(f["weights"]), "--out", str(f["a_file"])],
     ["--out", "results.txt", "is a file"]),
    ("course run --out FILE", lambda f: ["course", "run", "--out", str(f["a_file"])],
     ["--out", "results.txt", "is a file"]),
    ("course run --out notebooks", lambda f: ["course", "run", "--out", str(REPO / "notebooks")],
     ["--out", "notebooks", "which this run reads"]),
    ("course run --out a folder of the user's files",
     lambda f: ["course", "run", "--only", "00", "--out", str(f["dir"])],
     ["--out: the folder ", "inputs", "already holds files (BCCD.zip, ",
      "no .medaidet-course file", "Choose a new or empty folder for --out"]),
    ("stack build --out FILE", lambda f: ["stack", "build", "--out", str(f["a_file"])],
     ["--out", "results.txt", "is a file"]),
    ("train --resume truncated", lambda f: ["train", "--resume", str(f["truncated"]),
                                            "--root", str(f["bccd"]), "--out", str(f["dir"] / "r1")],
     ["truncated.npz"]),
    ("train --resume empty", lambda f: ["train", "--resume", str(f["empty"]),
                                        "--root", str(f["bccd"]), "--out", str(f["dir"] / "r2")],
     ["empty.npz"]),
    ("train --resume .npy", lambda f: ["train", "--resume", str(f["npy"]),
                                       "--root", str(f["bccd"]), "--out", str(f["dir"] / "r3")],
     ["weights.npy"]),
    ("train --pretrained .npy", lambda f: ["train", "--pretrained", str(f["npy"]),
                                           "--root", str(f["bccd"]), "--out", str(f["dir"] / "r4")],
     ["weights.npy"]),
    ("evaluate .npy", lambda f: ["evaluate", str(f["npy"])], ["weights.npy"]),
    ("evaluate text file", lambda f: ["evaluate", str(f["text"])], ["weights.txt"]),
    ("evaluate tar file", lambda f: ["evaluate", str(f["tar"])], ["weights.tar"]),
    ("evaluate truncated", lambda f: ["evaluate", str(f["truncated"])], ["truncated.npz"]),
    ("evaluate NaN weights", lambda f: ["evaluate", str(f["nan"])], ["nan.npz"]),
    ("data download from a plain path",
     lambda f: ["data", "download", "--root", str(f["dir"] / "dl1")], ["https://", "file://"],
     lambda f: {"MEDAIDET_BCCD_URL": str(f["zip"])}),
    ("data download of a zip",
     lambda f: ["data", "download", "--root", str(f["dir"] / "dl2")], ["ZIP archive"],
     lambda f: {"MEDAIDET_BCCD_URL": f["zip"].as_uri()}),
    ("config model: ssd1024", lambda f: ["train", "--config", str(f["config_model"])],
     ["model", "ssd1024"]),
    ("config pretrained: 5", lambda f: ["train", "--config", str(f["config_pretrained"])],
     ["pretrained", "5"]),
    ("config out: 5", lambda f: ["train", "--config", str(f["config_out"])], ["out", "5"]),
    ("config root: 123", lambda f: ["train", "--config", str(f["config_root"])], ["root", "123"]),
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


def test_data_validate_exits_1_when_it_reports_errors(files, capsys):
    # real BCCD has objects of severity error (zero-area and duplicate boxes)
    assert cli.main(["data", "validate", str(files["bccd"])]) == 1
    assert "zero_area" in capsys.readouterr().out


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
