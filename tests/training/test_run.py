"""Training: config, smoke runs on real BCCD, seeds, kill + resume, divergence, the command."""
import json
import os
import signal
import stat
import subprocess
import sys
import time

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

from conftest import REPO
from medaidet.device import resolve_device
from medaidet.errors import ConfigError, DeviceError, DivergedError, WeightsError
from medaidet import cli
from medaidet.cli import config_from_args
from medaidet.ssd.model import build_ssd
from medaidet.ssd.weights import load_weights
from medaidet.training.config import TrainConfig
from medaidet.training.iterators import n_processes_for
from medaidet.training.train import StopOnNonFinite, train

# Tiny runs: SSD300 on a 2-core CPU is several seconds per image per iteration.
TINY = dict(subset=2, batch_size=1, eval_subset=1, eval_batch_size=1, seed=0,
            n_processes=0, pretrained=None, device="cpu")


def _parse(argv):
    return cli.build_parser().parse_args(["train", *argv])


def _assert_same_weights(path_a, path_b):
    with np.load(path_a) as a, np.load(path_b) as b:
        assert sorted(b.files) == sorted(a.files)
        different = [k for k in a.files if not np.array_equal(a[k], b[k])]
    assert not different, f"{len(different)} parameters differ, e.g. {different[:3]}"


def test_recipe_defaults():
    c = TrainConfig()
    assert (c.model, c.pretrained, c.batch_size, c.lr, c.momentum, c.weight_decay) == \
        ("ssd300", "imagenet", 32, 1e-3, 0.9, 5e-4)
    assert (c.bias_grad_scale, c.epochs, c.lr_steps, c.lr_gamma, c.k, c.alpha) == \
        (2.0, 300, (200.0, 250.0), 0.1, 3, 1.0)
    assert TrainConfig.profile("full") == c
    smoke = TrainConfig.profile("smoke")
    assert smoke.pretrained is None and smoke.n_processes == 0 and smoke.iterations


def test_the_labels_and_the_other_sources_from_the_command_line():
    """The shipped trusted-label detector's record names `--labels txl-pbc`."""
    config = config_from_args(_parse(["--profile", "cpu", "--labels", "txl-pbc",
                                      "--other-sources", "PBC", "Raabin-WBC"]))
    assert config.labels == "txl-pbc" and config.other_sources == ("PBC", "Raabin-WBC")
    assert config_from_args(_parse(["--profile", "cpu"])) == TrainConfig.profile("cpu")
    for bad in (["--labels", "voc"], ["--other-sources", "BCCD"]):
        with pytest.raises(SystemExit):
            _parse(["--profile", "cpu", *bad])


def test_config_file_json_and_flags(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"batch_size": 8, "lr_steps": [10, 20], "seed": 3,
                                "eval_interval": 5}))
    config = config_from_args(_parse(["--profile", "smoke", "--config", str(path),
                                      "--seed", "7", "--iterations", "2", "--subset", "2",
                                      "--device", "cpu", "--out", str(tmp_path / "o")]))
    assert config.batch_size == 8 and config.lr_steps == (10.0, 20.0)
    assert config.eval_interval == 5 and config.seed == 7          # the flag wins
    assert config.iterations == 2 and config.subset == 2 and config.pretrained is None
    yaml = pytest.importorskip("yaml")
    y = tmp_path / "cfg.yaml"
    y.write_text(yaml.safe_dump({"batch_size": 4, "device": 1}))
    assert TrainConfig.from_file(y).batch_size == 4


def test_gpu_without_cuda_is_a_named_error(tmp_path):
    if chainer.backends.cuda.available:
        pytest.skip("CUDA is available here")
    with pytest.raises(DeviceError) as info:
        resolve_device("gpu")
    assert (info.value.kind, info.value.spec) == ("no_cuda", "gpu")
    args = _parse(["--profile", "smoke", "--device", "gpu", "--out", str(tmp_path)])
    with pytest.raises(DeviceError) as info:
        args.func(args)
    assert info.value.kind == "no_cuda"
    assert str(resolve_device("auto")) == "@numpy"


@pytest.fixture(scope="module")
def run_a(tmp_path_factory, bccd_root):
    """Uninterrupted: 4 iterations, batch 1, 2 images, seed 0."""
    out = tmp_path_factory.mktemp("run_a")
    return train(TrainConfig.profile("smoke", iterations=4, root=str(bccd_root),
                                     out=str(out), **TINY), progress=False)


@pytest.mark.slow(seconds=17)
def test_smoke_training_writes_everything(run_a):
    out = run_a.out
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("iterations", "seconds", "images_per_second", "last_loss", "best_val_map",
                "val_map", "val_ap", "log", "sha256", "transform_stats"):
        assert key in metrics, key
    assert metrics["iterations"] == 4
    assert np.isfinite(metrics["last_loss"])
    assert set(metrics["val_ap"]) == {"rbc", "wbc", "platelets"}
    assert metrics["val_map"] is None or 0 <= metrics["val_map"] <= 1
    assert any("validation/main/map" in entry for entry in metrics["log"])
    assert metrics["transform_stats"]["samples"] == 4
    for name in ("loss.png", "map.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "model.npz.sha256").read_text().split()[0] == run_a.sha256
    assert (out / "snapshot_latest.npz").is_file()
    fresh = build_ssd("ssd300", None)
    report = load_weights(fresh, out / "model.npz")
    assert report.loaded
    for name, param in fresh.namedparams():
        np.testing.assert_array_equal(
            param.array, dict(run_a.model.namedparams())[name].array)


@pytest.mark.slow(seconds=2)
def test_every_file_of_the_run_gets_the_usual_file_mode(run_a):
    """0666 less the umask, readable by the course's other accounts, not 0600."""
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in run_a.out.iterdir()
             if p.is_file()}
    assert set(modes) >= {"snapshot_latest.npz", "metrics.json", "config.json", "loss.png",
                          "model.npz", "model.npz.sha256"}
    assert modes == {name: oct(0o666 & ~umask) for name in modes}


def _train_process(config: dict, cfg_path, resume=None) -> subprocess.Popen:
    """``medaidet train`` in a new process, config from a file."""
    cfg_path.write_text(json.dumps(config))
    argv = [sys.executable, "-m", "medaidet", "train", "--profile", "smoke", "--config",
            str(cfg_path), "--no-progress"]
    if resume is not None:
        argv += ["--resume", str(resume)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow(seconds=19)
def test_same_seed_in_another_process_gives_bitwise_identical_weights(run_a, tmp_path,
                                                                      bccd_root):
    out = tmp_path / "run_b"
    proc = _train_process(dict(TINY, iterations=4, root=str(bccd_root), out=str(out)),
                          tmp_path / "cfg.json")
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    _assert_same_weights(run_a.weights, out / "model.npz")
    assert (out / "model.npz.sha256").read_text().split()[0] == run_a.sha256


@pytest.mark.slow(seconds=27)
def test_killed_run_resumed_from_its_snapshot_ends_with_the_same_weights(run_a, tmp_path,
                                                                        bccd_root):
    """A real SIGKILL after the first snapshot (each epoch = 2 iterations), then resume."""
    out = tmp_path / "run_k"
    config = dict(TINY, iterations=4, snapshot_interval=1, root=str(bccd_root), out=str(out))
    snapshot = out / "snapshot_latest.npz"
    proc = _train_process(config, tmp_path / "cfg.json")
    deadline = time.monotonic() + 600
    while not snapshot.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.kill()
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, \
        f"the run ended before it could be killed (rc {proc.returncode}):\n{output}"
    assert not (out / "model.npz").exists() and not (out / "metrics.json").exists()
    with np.load(snapshot) as npz:
        assert int(npz["updater/iteration"]) == 2

    proc = _train_process(config, tmp_path / "cfg.json", resume=snapshot)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    assert "resumed from" in output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["iterations"] == 4 and metrics["iterations_this_run"] == 2
    _assert_same_weights(run_a.weights, out / "model.npz")


@pytest.mark.parametrize("timing, poison", [("pre", "input"), ("post", "lr")])
def test_stop_on_non_finite_before_and_after_the_update(timing, poison):
    """Before: nan gradients stop it, the step not applied; after: the step made the weights
    non-finite."""
    link = L.Linear(3, 2, initialW=np.ones((2, 3), np.float32))
    optimizer = chainer.optimizers.SGD(lr=1e38 if poison == "lr" else 0.1)
    optimizer.setup(link)
    optimizer.add_hook(StopOnNonFinite(timing))
    x = np.full((1, 3), np.nan if poison == "input" else 1e3, np.float32)
    before = link.W.array.copy()
    with pytest.raises(DivergedError) as info:
        optimizer.update(lambda: F.sum(link(x) ** 2))
    assert info.value.kind == "training"
    assert not np.isfinite(link.W.grad if timing == "pre" else link.W.array).all()
    if timing == "pre":
        np.testing.assert_array_equal(link.W.array, before)


def test_deterministic_needs_a_seed_and_means_no_workers():
    with pytest.raises(ConfigError, match="^deterministic=True"):
        TrainConfig(deterministic=True)
    assert n_processes_for(TrainConfig(deterministic=True, seed=0)) == 0
    assert n_processes_for(TrainConfig(deterministic=True, seed=0, n_processes=2)) == 2
    assert n_processes_for(TrainConfig(seed=0)) >= 1
    config = config_from_args(_parse(["--profile", "smoke", "--seed", "3", "--deterministic",
                                      "--no-augment"]))
    assert (config.seed, config.deterministic, config.augment) == (3, True, False)


@pytest.mark.slow(seconds=2)
def test_resume_with_another_subset_is_refused(run_a, bccd_root, tmp_path):
    config = TrainConfig.profile("smoke", iterations=5, root=str(bccd_root),
                                 out=str(tmp_path), **dict(TINY, subset=3))
    with pytest.raises(WeightsError) as info:
        train(config, resume=run_a.snapshot, progress=False)
    assert info.value.kind == "snapshot" and "3 images" in str(info.value)
    with pytest.raises(WeightsError) as info:                 # model weights, not a snapshot
        train(config, resume=run_a.weights, progress=False)
    assert info.value.kind == "snapshot"


@pytest.mark.slow(seconds=5)
def test_a_damaged_snapshot_is_a_named_error(run_a, bccd_root, tmp_path):
    """Its zip directory is intact (the first check passes); an array in the middle is not."""
    data = bytearray(run_a.snapshot.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 256] = bytes(b ^ 0xFF for b in data[middle:middle + 256])
    damaged = tmp_path / "snapshot_latest.npz"
    damaged.write_bytes(bytes(data))
    config = TrainConfig.profile("smoke", iterations=5, root=str(bccd_root),
                                 out=str(tmp_path / "out"), **TINY)
    with pytest.raises(WeightsError) as info:
        train(config, resume=damaged, progress=False, log=lambda *_: None)
    assert info.value.kind == "snapshot" and "snapshot_latest.npz" in str(info.value)
