"""medaidet.train: config, smoke training on real BCCD, resume to the same weights, CLI."""
import argparse
import json
import textwrap

import numpy as np
import pytest

from conftest import run_python
from medaidet.train import (ConfigError, DeviceError, ResumeError, TrainConfig,
                            add_train_parser, config_from_args, resolve_device, train)

# Tiny runs: SSD300 on a 2-core CPU is several seconds per image per iteration.
TINY = dict(subset=2, batch_size=1, eval_subset=1, eval_batch_size=1, seed=0,
            n_processes=0, pretrained=None, device="cpu")


def _parse(argv):
    parser = argparse.ArgumentParser(prog="medaidet")
    add_train_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["train", *argv])


def _arrays(path):
    with np.load(path) as npz:
        return {k: npz[k] for k in npz.files}


# --------------------------------------------------------------------------- config

def test_recipe_defaults():
    c = TrainConfig()
    assert (c.model, c.pretrained, c.batch_size, c.lr, c.momentum, c.weight_decay) == \
        ("ssd300", "imagenet", 32, 1e-3, 0.9, 5e-4)
    assert (c.bias_grad_scale, c.epochs, c.lr_steps, c.lr_gamma, c.k, c.alpha) == \
        (2.0, 300, (200.0, 250.0), 0.1, 3, 1.0)
    assert TrainConfig.profile("full") == c
    smoke = TrainConfig.profile("smoke")
    assert smoke.pretrained is None and smoke.n_processes == 0 and smoke.iterations
    with pytest.raises(ConfigError, match="unknown profile"):
        TrainConfig.profile("huge")


def test_config_errors():
    with pytest.raises(ConfigError, match="batch_size"):
        TrainConfig(batch_size=0)
    with pytest.raises(ConfigError, match="unknown training option.*batchsize"):
        TrainConfig.from_dict({"batchsize": 4})
    with pytest.raises(ConfigError, match="device"):
        TrainConfig(device="tpu")


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
    bad = tmp_path / "bad.json"
    bad.write_text('{"lr": "fast"}')
    with pytest.raises(ConfigError, match="bad.json.*lr"):
        TrainConfig.from_file(bad)
    yaml = pytest.importorskip("yaml")
    y = tmp_path / "cfg.yaml"
    y.write_text(yaml.safe_dump({"batch_size": 4, "device": 1}))
    assert TrainConfig.from_file(y).batch_size == 4


def test_gpu_without_cuda_is_a_named_error(tmp_path):
    from chainer.backends import cuda
    if cuda.available:
        pytest.skip("CUDA is available here")
    with pytest.raises(DeviceError, match="CUDA cannot be used.*--device cpu"):
        resolve_device("gpu")
    args = _parse(["--profile", "smoke", "--device", "gpu", "--out", str(tmp_path)])
    with pytest.raises(DeviceError, match="GPU 0"):
        args.func(args)
    assert str(resolve_device("auto")) == "@numpy"


# --------------------------------------------------------------------------- training

@pytest.fixture(scope="module")
def run_a(tmp_path_factory, bccd_root):
    """Uninterrupted: 4 iterations, batch 1, 2 images, seed 0, evaluation at the end."""
    out = tmp_path_factory.mktemp("run_a")
    return train(TrainConfig.profile("smoke", iterations=4, data=str(bccd_root),
                                     out=str(out), **TINY), progress=False)


def test_smoke_training_writes_everything(run_a):
    from medaidet.model import build_ssd, load_weights

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


def test_resume_in_a_new_process_gives_the_same_weights(run_a, tmp_path, bccd_root):
    """Run B stops at iteration 2; a new process resumes it (through the train command)
    to iteration 4: the final weights equal the uninterrupted run's exactly."""
    out = tmp_path / "run_b"
    train(TrainConfig.profile("smoke", iterations=2, data=str(bccd_root), out=str(out),
                              **TINY), progress=False)
    first_leg = _arrays(out / "model.npz")
    final_a = _arrays(run_a.weights)
    assert any(not np.array_equal(first_leg[k], final_a[k]) for k in final_a)

    config = dict(TINY, iterations=4, data=str(bccd_root), out=str(out))
    (tmp_path / "cfg.json").write_text(json.dumps(config))
    code = textwrap.dedent(f"""
        import argparse
        from medaidet.train import add_train_parser
        parser = argparse.ArgumentParser()
        add_train_parser(parser.add_subparsers(dest="command"))
        args = parser.parse_args(["train", "--profile", "smoke", "--config",
                                  {str(tmp_path / 'cfg.json')!r}, "--no-progress",
                                  "--resume", {str(out / 'snapshot_latest.npz')!r}])
        raise SystemExit(args.func(args))
    """)
    proc = run_python(code, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resumed from" in proc.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["iterations"] == 4 and metrics["iterations_this_run"] == 2
    final_b = _arrays(out / "model.npz")
    assert final_b.keys() == final_a.keys()
    different = [k for k in final_a if not np.array_equal(final_a[k], final_b[k])]
    assert not different, f"{len(different)} parameters differ, e.g. {different[:3]}"


def test_resume_with_another_subset_is_refused(run_a, bccd_root, tmp_path):
    config = TrainConfig.profile("smoke", iterations=5, data=str(bccd_root),
                                 out=str(tmp_path), **dict(TINY, subset=3))
    with pytest.raises(ResumeError, match="2 images with batch size 1.*3 images"):
        train(config, resume=run_a.snapshot, progress=False)
    with pytest.raises(ResumeError, match="not a trainer snapshot"):
        train(config, resume=run_a.weights, progress=False)
