"""TrainConfig's precision: float32 or tf32 (a GPU's tensor cores; float32 on the CPU)."""
import os

import chainer
import pytest

from medaidet.errors import ConfigError
from medaidet.ssd.precision import use_tf32
from medaidet.training.config import TrainConfig
from medaidet.training.train import train


@pytest.mark.parametrize("precision", ["float16", "mixed16"])
def test_a_precision_the_recipe_does_not_train_in_is_named(precision):
    with pytest.raises(ConfigError, match=f"^precision: '{precision}'"):
        TrainConfig(precision=precision)


def test_use_tf32_sets_cupys_variable(monkeypatch):
    monkeypatch.delenv("CUPY_TF32", raising=False)
    active = use_tf32()
    assert os.environ["CUPY_TF32"] == "1"
    if not chainer.backends.cuda.available:
        assert active is False                  # nothing to switch: no CuPy, no GPU
    assert use_tf32(False) is False
    assert os.environ["CUPY_TF32"] == "0"


@pytest.mark.slow(seconds=2)
def test_tf32_on_the_cpu_multiplies_in_float32_and_says_so(tmp_path, bccd_root, monkeypatch):
    monkeypatch.delenv("CUPY_TF32", raising=False)
    lines = []
    train(TrainConfig.profile("smoke", model="ssd_small", batch_size=2, iterations=1, subset=2,
                              eval_subset=1, eval_batch_size=1, n_processes=0, seed=0,
                              snapshot_interval=None, eval_interval=None, precision="tf32",
                              root=str(bccd_root), out=str(tmp_path)),
          progress=False, log=lines.append)
    assert "train: precision tf32: float32 products (TF32 needs an NVIDIA GPU of compute " \
           "capability 8.0+)" in lines
