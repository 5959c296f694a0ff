"""Every bad training input is one named error, naming the argument as the user wrote it,
before any model or data is built."""
import json
import math

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


@pytest.mark.parametrize("flag, value, named", [
    ("--epochs", "inf", "inf"), ("--epochs", "nan", "nan"), ("--epochs", "0", "0"),
    ("--subset", "0", "0"), ("--batch-size", "0", "0"), ("--iterations", "0", "0"),
    ("--iterations", "1.5", "1.5"), ("--accumulate", "0", "0"), ("--n-processes", "-1", "-1"),
    ("--seed", "-1", "-1"), ("--seed", "4294967296", "4294967296"), ("--seed", "x", "'x'"),
])
def test_numeric_flags_are_checked_by_argparse(flag, value, named, capsys, no_model):
    with pytest.raises(SystemExit) as info:
        main(["train", "--profile", "smoke", flag, value])
    assert info.value.code == 2
    # a hint (such as where --help is) may follow the message
    assert _error_line(capsys).startswith(f"medaidet train: error: argument {flag}: {named} is ")


@pytest.mark.parametrize("field, value, named", [
    ("model", "ssd1024", "model: 'ssd1024'"), ("pretrained", 5, "pretrained: 5"),
    ("out", 5, "out: 5"), ("out", "", "out: ''"), ("root", 123, "root: 123"),
    ("epochs", math.inf, "epochs: inf"), ("lr", math.nan, "lr: nan"),
    ("momentum", -0.5, "momentum: -0.5"), ("lr_steps", [10, math.inf], "lr_steps[1]: inf"),
    ("lr_steps", "200", "lr_steps: '200'"), ("subset", 0, "subset: 0"),
    ("n_processes", 1.5, "n_processes: 1.5"), ("train_split", 3, "train_split: 3"),
    ("augment", "yes", "augment: 'yes'"), ("device", "tpu", "device: 'tpu'"),
    ("batch_size", 0, "batch_size: 0"), ("batchsize", 4, "unknown training option(s) batchsize;"),
])
def test_config_fields_are_named(field, value, named):
    """The message begins with the field (an item of a list by its index) and the value."""
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({field: value})
    assert str(info.value).startswith(f"{named} ")


def test_config_file_fields_are_named_with_the_file(tmp_path, capsys, no_model):
    path = tmp_path / "cfg.json"
    for text, named in ((json.dumps({"model": "ssd1024"}), "model: 'ssd1024'"),
                        ('{"epochs": Infinity, "iterations": null}', "epochs: inf")):
        path.write_text(text)
        assert main(["train", "--profile", "smoke", "--config", str(path)]) == 2
        assert _error_line(capsys).startswith(f"medaidet: error: {path}: {named} ")


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


@pytest.mark.parametrize("case, kind", [("file", "not_a_folder"), ("under_a_file", "unwritable"),
                                        ("inside_the_data", "input")])
def test_an_out_that_cannot_be_used_is_refused(case, kind, tmp_path, capsys, no_model):
    """Never written into: a file of the user's, or the dataset this run reads."""
    file, data = tmp_path / "results", tmp_path / "bccd"
    file.write_text("mine")
    (data / "Annotations").mkdir(parents=True)
    out = {"file": file, "under_a_file": file / "run", "inside_the_data": data / "outputs"}[case]
    assert main(["train", "--profile", "smoke", "--root", str(data), "--out", str(out)]) == 2
    line = _error_line(capsys)
    assert line.startswith("medaidet: error: --out: ") and f" {out} " in line
    with pytest.raises(ConfigError) as info:
        train(TrainConfig.profile("smoke", root=str(data), out=str(out)), progress=False)
    path = data.resolve() / "outputs" if case == "inside_the_data" else out
    assert (info.value.kind, info.value.path) == (kind, path)
    assert str(info.value).startswith("out: ")
    assert file.read_text() == "mine" and not (data / "outputs").exists()


def _snapshot_like(path):
    """A small .npz with a trainer snapshot's first keys."""
    np.savez(path, **{"updater/iteration": np.int64(2),
                      "updater/model:main/W": np.zeros((64, 64), np.float32)})
    return path


def _truncated(path):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


@pytest.mark.parametrize("kind, problem", [
    ("empty", "is empty (0 bytes)"), ("truncated", "is truncated or corrupt"),
    ("npy", "is a single NumPy array (.npy)"),
    ("text", "is a text file (it begins 'not a snapshot')"),
    ("weights", "is not a trainer snapshot (no 'updater/' entries)"),
    ("folder", "is a folder"), ("missing", "does not exist")])
def test_unusable_resume_file(kind, problem, tmp_path, capsys, no_model):
    path = tmp_path / ("snapshot.npy" if kind == "npy" else "snapshot_latest.npz")
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        _truncated(_snapshot_like(path))
    elif kind == "npy":
        np.save(path, np.zeros(3))
    elif kind == "text":
        path.write_text("not a snapshot")
    elif kind == "weights":
        np.savez(path, **{"extractor/conv1_1/W": np.zeros(3)})
    elif kind == "folder":
        path.mkdir()
    out = tmp_path / "out"
    assert main(["train", "--profile", "smoke", "--out", str(out), "--resume", str(path)]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"medaidet: error: --resume: {path} {problem}"), line
    with pytest.raises(WeightsError) as info:
        train(TrainConfig.profile("smoke", out=str(out)), resume=path, progress=False)
    assert info.value.kind == "snapshot" and str(info.value).startswith(f"resume: {path} ")


def test_a_good_looking_resume_file_passes_the_first_check(tmp_path):
    from medaidet.training.train import check_run_file
    path = _snapshot_like(tmp_path / "snapshot_latest.npz")
    assert check_run_file(path, "--resume") == path


@pytest.mark.parametrize("kind, problem", [("npy", "is a single NumPy array (.npy)"),
                                           ("missing", "does not exist"),
                                           ("truncated", "is truncated or corrupt")])
def test_unusable_pretrained_file(kind, problem, tmp_path, capsys, no_model):
    path = tmp_path / ("weights.npy" if kind == "npy" else "model.npz")
    if kind == "npy":
        np.save(path, np.zeros(3))
    elif kind == "truncated":
        np.savez(path, **{"extractor/conv1_1/W": np.zeros((64, 64))})
        _truncated(path)
    assert main(["train", "--profile", "smoke", "--out", str(tmp_path / "o"),
                 "--pretrained", str(path)]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"medaidet: error: --pretrained: {path} {problem}"), line
    with pytest.raises(WeightsError) as info:
        train(TrainConfig.profile("smoke", out=str(tmp_path / "o"), pretrained=str(path)),
              progress=False)
    assert (info.value.kind, info.value.path) == (kind if kind == "missing" else "file", path)

@pytest.mark.slow(seconds=25)
def test_one_run_checks_once_reads_one_root_and_writes_under_home(monkeypatch, tmp_path,
                                                                  bccd_root):
    """The command checks its run once (its messages name the flags: see
    test_an_out_that_cannot_be_used_is_refused); root=None is resolved once ($MEDAIDET_DATA)
    and both splits are read from it; every file goes to ~/run, not to a folder named '~'."""
    from medaidet.training import train as run_module
    monkeypatch.setenv("MEDAIDET_DATA", str(bccd_root))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    calls = {"prepare_run": [], "resolve_root": [], "BCCDDataset": []}
    real = {name: getattr(run_module, name) for name in calls}

    def counted(name, record):
        def call(*args, **kwargs):
            calls[name].append(record(*args))
            return real[name](*args, **kwargs)
        return call
    monkeypatch.setattr(run_module, "prepare_run", counted("prepare_run", lambda c, r=None: c.out))
    monkeypatch.setattr(run_module, "resolve_root", counted("resolve_root", lambda *a: a))
    monkeypatch.setattr(run_module, "BCCDDataset", counted("BCCDDataset", lambda *a: a))
    assert main(["train", "--profile", "smoke", "--iterations", "1", "--out", "~/run",
                 "--no-progress"]) == 0
    run, root = tmp_path / "home" / "run", real["resolve_root"](None)
    assert calls == {"prepare_run": [str(run)], "resolve_root": [(None,)],
                     "BCCDDataset": [(root, "train"), (root, "val")]}
    assert {"config.json", "metrics.json", "model.npz", "snapshot_latest.npz"} <= {
        p.name for p in run.iterdir()}
    assert not (tmp_path / "~").exists()
