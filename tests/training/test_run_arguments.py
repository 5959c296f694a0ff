"""Every bad training input is one named error, naming the argument as the user wrote it,
before any model or data is built."""
import json
import math
import re

import numpy as np
import pytest

from medaidet.errors import ConfigError, WeightsError
from medaidet.cli import main
from medaidet.training.config import TrainConfig
from medaidet.training.train import train


@pytest.fixture
def no_model(monkeypatch):
    """Every check must come before the model or the data is built."""
    def refuse(*args, **kwargs):
        raise AssertionError("the model was built before the arguments were checked")
    monkeypatch.setattr("medaidet.training.train.Recipe.model", refuse)
    monkeypatch.setattr("medaidet.training.train.Recipe.datasets", refuse)


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("flag, value, expected", [
    ("--epochs", "inf", "inf is out of range; expected a number > 0"),
    ("--epochs", "nan", "nan is out of range; expected a number > 0"),
    ("--epochs", "0", "0 is out of range; expected a number > 0"),
    ("--subset", "0", "0 is out of range; expected a whole number > 0"),
    ("--batch-size", "0", "0 is out of range; expected a whole number > 0"),
    ("--iterations", "0", "0 is out of range; expected a whole number > 0"),
    ("--iterations", "1.5", "1.5 is not a whole number; expected a whole number > 0"),
    ("--accumulate", "0", "0 is out of range; expected a whole number > 0"),
    ("--n-processes", "-1", "-1 is out of range; expected a whole number ≥ 0"),
    ("--seed", "-1", "-1 is out of range; expected a whole number from 0 to 2**32 - 1"),
    ("--seed", "4294967296", "4294967296 is out of range; expected a whole number from 0 to"),
    ("--seed", "x", "'x' is not a number; expected a whole number from 0 to 2**32 - 1"),
])
def test_numeric_flags_are_checked_by_argparse(flag, value, expected, capsys, no_model):
    with pytest.raises(SystemExit) as info:
        main(["train", "--profile", "smoke", flag, value])
    assert info.value.code == 2
    # a hint (such as where --help is) may follow the message
    assert _error_line(capsys).startswith(f"medaidet train: error: argument {flag}: {expected}")


@pytest.mark.parametrize("field, value, expected", [
    ("model", "ssd1024", "model: 'ssd1024' is not a model medaidet builds; expected one of "
                         "ssd300, ssd512, ssd_small"),
    ("pretrained", 5, "pretrained: 5 is not a weights name or file; expected null, "
                      "'imagenet', 'voc0712' or the path of a model-only .npz"),
    ("out", 5, "out: 5 is not a folder path; expected a folder to write the results in"),
    ("out", "", "out: '' is not a folder path; expected a folder to write the results in"),
    ("root", 123, "root: 123 is not a folder path; expected null ($MEDAIDET_DATA or the "
                  "cache) or the BCCD root"),
    ("epochs", math.inf, "epochs: inf is out of range; expected a number > 0"),
    ("lr", math.nan, "lr: nan is out of range; expected a number > 0"),
    ("momentum", -0.5, "momentum: -0.5 is out of range; expected a number ≥ 0"),
    ("lr_steps", [10, math.inf], "lr_steps[1]: inf is out of range; expected a number ≥ 0"),
    ("lr_steps", "200", "lr_steps: '200' is not a list; expected a list of epochs"),
    ("subset", 0, "subset: 0 is out of range; expected a whole number > 0 or null"),
    ("n_processes", 1.5, "n_processes: 1.5 is not a whole number; expected a whole "
                         "number ≥ 0 or null"),
    ("train_split", 3, "train_split: 3 is not a split name; expected a split such as "
                       "'train'"),
    ("augment", "yes", "augment: 'yes' is not true or false; expected true or false"),
    ("device", "tpu", "device: 'tpu' is not a device; expected auto, cpu, gpu or a GPU "
                      "number"),
])
def test_config_fields_are_named(field, value, expected):
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({field: value})
    assert str(info.value) == expected
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)


def test_config_file_fields_are_named_with_the_file(tmp_path, capsys, no_model):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"model": "ssd1024"}))
    assert main(["train", "--profile", "smoke", "--config", str(path)]) == 2
    assert _error_line(capsys) == (f"medaidet: error: {path}: model: 'ssd1024' is not a "
                                   "model medaidet builds; expected one of ssd300, ssd512, "
                                   "ssd_small")
    path.write_text('{"epochs": Infinity, "iterations": null}')
    assert main(["train", "--profile", "smoke", "--config", str(path)]) == 2
    assert _error_line(capsys) == (f"medaidet: error: {path}: epochs: inf is out of range; "
                                   "expected a number > 0")


def test_numbers_written_as_text_are_read_as_numbers():
    # YAML 1.1 reads 1e-3 as a string: accept it as the number it says
    config = TrainConfig.from_dict({"lr": "1e-3", "batch_size": "4", "epochs": 2})
    assert config.lr == 1e-3 and config.batch_size == 4 and config.epochs == 2
    assert isinstance(config.batch_size, int) and isinstance(config.epochs, int)


def test_paths_are_kept_as_text(tmp_path):
    config = TrainConfig(out=tmp_path / "o", root=tmp_path, pretrained=tmp_path / "w.npz")
    assert config.out == str(tmp_path / "o") and config.root == str(tmp_path)
    assert config.pretrained == str(tmp_path / "w.npz")
    json.dumps(config.to_dict())
    assert TrainConfig(pretrained="None").pretrained is None


def test_out_that_is_a_file(tmp_path, capsys, no_model):
    file = tmp_path / "results"
    file.write_text("mine")
    assert main(["train", "--profile", "smoke", "--out", str(file)]) == 2
    assert _error_line(capsys) == (f"medaidet: error: --out: {file} is a file, not a folder; "
                                   "give a folder path (it is created if missing)")
    assert file.read_text() == "mine"
    with pytest.raises(ConfigError) as info:
        train(TrainConfig.profile("smoke", out=str(file)), progress=False)
    assert (info.value.kind, info.value.path) == ("not_a_folder", file)
    assert str(info.value).startswith("out: ")


def test_out_that_cannot_be_created(tmp_path, capsys, no_model):
    file = tmp_path / "results"
    file.write_text("mine")
    assert main(["train", "--profile", "smoke", "--out", str(file / "run")]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"medaidet: error: --out: cannot create the folder {file / 'run'} ")
    assert line.endswith("choose a folder you can write to")


def test_out_inside_the_dataset_is_refused(bccd_root, tmp_path, capsys, no_model):
    data = tmp_path / "bccd"
    (data / "Annotations").mkdir(parents=True)
    out = data / "outputs"
    assert main(["train", "--profile", "smoke", "--root", str(data), "--out", str(out)]) == 2
    assert _error_line(capsys) == (
        f"medaidet: error: --out: {out} is inside {data}, which this run reads; choose a "
        "folder outside it (for example outputs/) so nothing of yours is overwritten")
    assert not out.exists()
    with pytest.raises(ConfigError) as info:
        train(TrainConfig.profile("smoke", root=str(data), out=str(data)), progress=False)
    assert (info.value.kind, info.value.path) == ("input", data.resolve())


def _snapshot_like(path):
    """A small .npz with a trainer snapshot's first keys."""
    np.savez(path, **{"updater/iteration": np.int64(2),
                      "updater/model:main/W": np.zeros((64, 64), np.float32)})
    return path


@pytest.mark.parametrize("kind", ["empty", "truncated", "npy", "text", "weights", "folder"])
def test_unusable_resume_file(kind, tmp_path, capsys, no_model):
    path = tmp_path / ("snapshot.npy" if kind == "npy" else "snapshot_latest.npz")
    if kind == "empty":
        path.write_bytes(b"")
        problem = "is empty (0 bytes)"
    elif kind == "truncated":
        data = _snapshot_like(path).read_bytes()
        path.write_bytes(data[:len(data) // 2])
        problem = "is truncated or corrupt"
    elif kind == "npy":
        np.save(path, np.zeros(3))
        problem = "is a single NumPy array (.npy)"
    elif kind == "text":
        path.write_text("not a snapshot")
        problem = "is a text file (it begins 'not a snapshot')"
    elif kind == "weights":
        np.savez(path, **{"extractor/conv1_1/W": np.zeros(3)})
        problem = "is not a trainer snapshot (no 'updater/' entries)"
    else:
        path.mkdir()
        problem = "is a folder"
    out = tmp_path / "out"
    assert main(["train", "--profile", "smoke", "--out", str(out), "--resume", str(path)]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"medaidet: error: --resume: {path} {problem}"), line
    assert "expected the snapshot_latest.npz" in line
    with pytest.raises(WeightsError, match=rf"^resume: .* {re.escape(problem)}"):
        train(TrainConfig.profile("smoke", out=str(out)), resume=path, progress=False)


def test_missing_resume_file(tmp_path, capsys, no_model):
    path = tmp_path / "nothing.npz"
    assert main(["train", "--profile", "smoke", "--out", str(tmp_path / "o"),
                 "--resume", str(path)]) == 2
    assert _error_line(capsys).startswith(f"medaidet: error: --resume: {path} does not exist")


def test_a_good_looking_resume_file_passes_the_first_check(tmp_path):
    from medaidet.training.train import check_snapshot_file
    path = _snapshot_like(tmp_path / "snapshot_latest.npz")
    assert check_snapshot_file(path, "--resume") == path


@pytest.mark.parametrize("kind", ["npy", "missing", "truncated"])
def test_unusable_pretrained_file(kind, tmp_path, capsys, no_model):
    from medaidet.errors import WeightsError

    path = tmp_path / ("weights.npy" if kind == "npy" else "model.npz")
    if kind == "npy":
        np.save(path, np.zeros(3))
        problem = "is a single NumPy array (.npy)"
    elif kind == "truncated":
        np.savez(path, **{"extractor/conv1_1/W": np.zeros((64, 64))})
        data = path.read_bytes()
        path.write_bytes(data[:len(data) // 2])
        problem = "is truncated or corrupt"
    else:
        problem = "does not exist"
    assert main(["train", "--profile", "smoke", "--out", str(tmp_path / "o"),
                 "--pretrained", str(path)]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"medaidet: error: --pretrained: {path} {problem}"), line
    assert "expected imagenet, voc0712, none or a model-only .npz" in line
    with pytest.raises(WeightsError, match=rf"^pretrained: .* {re.escape(problem)}"):
        train(TrainConfig.profile("smoke", out=str(tmp_path / "o"), pretrained=str(path)),
              progress=False)



@pytest.mark.slow(seconds=23)
def test_the_command_checks_its_run_once(monkeypatch, tmp_path, bccd_root):
    """Its messages get the flags' names from the command line (test_out_that_is_a_file)."""
    from medaidet.training import train as run_module
    calls = []
    real = run_module.prepare_run

    def counted(config, resume=None):
        calls.append(config.out)
        return real(config, resume)
    monkeypatch.setattr(run_module, "prepare_run", counted)
    assert main(["train", "--profile", "smoke", "--root", str(bccd_root), "--iterations", "1",
                 "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    assert calls == [str(tmp_path / "run")]


@pytest.mark.slow(seconds=23)
def test_train_resolves_the_data_root_once(monkeypatch, tmp_path, bccd_root):
    """root=None is resolved once ($MEDAIDET_DATA here); both splits are read from it."""
    from medaidet.training import train as run_module
    monkeypatch.setenv("MEDAIDET_DATA", str(bccd_root))
    calls, real = [], run_module.resolve_root

    def counted(root=None):
        calls.append(root)
        return real(root)
    monkeypatch.setattr(run_module, "resolve_root", counted)
    read = []
    real_dataset = run_module.BCCDDataset

    def dataset(root, split, **kwargs):
        read.append((root, split))
        return real_dataset(root, split, **kwargs)
    monkeypatch.setattr(run_module, "BCCDDataset", dataset)
    config = TrainConfig.profile("smoke", root=None, out=str(tmp_path / "run"), iterations=1)
    train(config, progress=False, log=lambda *a: None)
    assert calls == [None]
    assert read == [(real(None), "train"), (real(None), "val")]


@pytest.mark.slow(seconds=23)
def test_out_under_home_is_where_every_file_goes(monkeypatch, tmp_path, bccd_root):
    """Every file of the run goes to ~/run, not to a folder named '~' in the working one."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    config = TrainConfig.profile("smoke", root=str(bccd_root), out="~/run", iterations=1)
    assert config.out == str(tmp_path / "home" / "run")
    result = train(config, progress=False, log=lambda *a: None)
    assert result.out == tmp_path / "home" / "run"
    assert {"config.json", "metrics.json", "model.npz", "snapshot_latest.npz"} <= {
        p.name for p in result.out.iterdir()}
    assert not (tmp_path / "~").exists()
