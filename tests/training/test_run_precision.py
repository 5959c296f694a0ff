"""TrainConfig's precision through train(): mixed16, tf32 on the CPU, loss-scaling skips."""
import json

import chainer
import numpy as np
import pytest

from medaidet.errors import ConfigError, DivergedError
from medaidet.ssd.precision import HalfConvolution2D
from medaidet.training.config import TrainConfig
from medaidet.training.train import StopOnNonFinite
from medaidet.training.train import Recipe
from medaidet.training.train import train

TINY = dict(model="ssd_small", batch_size=2, iterations=2, subset=2, eval_subset=1,
            eval_batch_size=1, n_processes=0, seed=0, snapshot_interval=None,
            eval_interval=None, log_interval=1)


def test_an_unknown_precision_is_named():
    with pytest.raises(ConfigError, match="^precision: 'float16'"):
        TrainConfig(precision="float16")


def test_the_recipe_builds_the_model_and_optimizer_in_its_precision(bccd_root):
    recipe = Recipe(TrainConfig.profile("smoke", precision="mixed16", root=str(bccd_root),
                                        **TINY))
    model = recipe.model()
    assert any(isinstance(link, HalfConvolution2D) for link in model.links())
    assert all(p.dtype == np.float32 for p in model.params())
    optimizer = recipe.optimizer(recipe.train_chain(model))
    assert optimizer._loss_scaling_is_dynamic and optimizer._loss_scale == 1.0
    plain = Recipe(TrainConfig.profile("smoke", root=str(bccd_root), **TINY))
    assert plain.optimizer(plain.train_chain(plain.model()))._loss_scale is None


@pytest.mark.slow(seconds=35)
def test_mixed16_trains_float32_weights_and_says_so(tmp_path, bccd_root):
    lines = []
    result = train(TrainConfig.profile("smoke", precision="mixed16", root=str(bccd_root),
                                       out=str(tmp_path), **dict(TINY, iterations=1)),
                   progress=False, log=lines.append)
    assert any(line.startswith("train: precision mixed16: float16 convolutions")
               for line in lines), lines
    assert json.loads((tmp_path / "config.json").read_text())["precision"] == "mixed16"
    with np.load(result.weights) as npz:
        floats = {npz[k].dtype for k in npz.files if npz[k].dtype.kind == "f"}
    assert floats == {np.dtype(np.float32)}
    losses = [e["main/loss"] for e in result.metrics["log"] if "main/loss" in e]
    assert losses and all(np.isfinite(losses))


@pytest.mark.slow(seconds=2)
def test_tf32_on_the_cpu_multiplies_in_float32_and_says_so(tmp_path, bccd_root):
    lines = []
    train(TrainConfig.profile("smoke", precision="tf32", root=str(bccd_root),
                              out=str(tmp_path), **dict(TINY, iterations=1)),
          progress=False, log=lines.append)
    assert "train: precision tf32: float32 products (TF32 needs an NVIDIA GPU of compute " \
           "capability 8.0+)" in lines


def test_a_step_the_loss_scaling_skips_is_not_a_divergence():
    link = chainer.links.Linear(2, 1)
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(link)
    optimizer.loss_scaling()
    link.W.grad = np.full_like(link.W.array, np.inf)
    link.b.grad = np.zeros_like(link.b.array)
    optimizer.check_nan_in_grads()                     # what update() does before the hooks
    StopOnNonFinite("pre", skip_overflow=True)(optimizer)     # skipped: no DivergedError
    with pytest.raises(DivergedError) as caught:       # a run without loss scaling stops
        StopOnNonFinite("pre")(optimizer)
    assert caught.value.kind == "training"
    optimizer._loss_scaling_isnan = False              # a step without overflow
    with pytest.raises(DivergedError) as caught:
        StopOnNonFinite("pre", skip_overflow=True)(optimizer)
    assert caught.value.kind == "training"
