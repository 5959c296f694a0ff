"""The batch fitted to the device's memory, on the CPU with a memory limit standing in for
a small GPU."""
import json

import chainer
import numpy as np
import pytest

from medaidet.errors import DeviceError
from medaidet.training import train as memory_fit
from medaidet.training.config import TrainConfig
from medaidet.training.train import GIB, MARGIN, MemoryFit, fit_batch, plan_accumulate
from medaidet.training.train import train

MIB = 2 ** 20
SMALL = dict(model="ssd_small", batch_size=8, iterations=1, subset=8, eval_subset=1,
             eval_batch_size=1, n_processes=0, seed=0, snapshot_interval=None,
             eval_interval=None)


def _fit(available, fixed=100 * MIB, per_image=50 * MIB, state=20 * MIB, batch_size=32):
    return MemoryFit(device="@cupy:0", batch_size=batch_size, accumulate=1, fixed=fixed,
                     per_image=per_image, state=state, available=available, measure="test")


# 24 images, room for 7: micro-batches of 6 (24 / 7 is no batch)
@pytest.mark.parametrize("room_for, batch_size, accumulate", [
    (32, 32, 1), (31, 32, 2), (16, 32, 2), (9, 32, 4), (8, 32, 4), (1, 32, 32), (7, 24, 4)])
def test_the_largest_micro_batch_dividing_the_batch_that_fits_is_chosen(room_for, batch_size,
                                                                        accumulate):
    fit = _fit(available=(120 * MIB + room_for * 50 * MIB) / MARGIN + 1, batch_size=batch_size)
    assert plan_accumulate(fit) == accumulate


def test_never_fewer_micro_batches_than_asked():
    assert plan_accumulate(_fit(available=64 * GIB), at_least=2) == 2


def test_not_even_one_image_is_a_memory_error_with_the_numbers():
    fit = _fit(available=150 * MIB)
    with pytest.raises(DeviceError) as caught:
        plan_accumulate(fit)
    assert caught.value.kind == "memory"
    assert caught.value.needed == 170 * MIB and caught.value.available == 150 * MIB


def test_on_the_cpu_without_a_limit_nothing_is_measured(monkeypatch, bccd_root):
    monkeypatch.setattr(memory_fit, "_measure", lambda *a: pytest.fail("measured"))
    config = TrainConfig.profile("smoke", **SMALL)
    assert fit_batch(config, bccd_root, chainer.get_device("@numpy")) == (config, None)


@pytest.mark.slow(seconds=27)
def test_a_limit_too_small_for_the_batch_trains_it_in_micro_batches(tmp_path, bccd_root):
    """Room for 3 images: micro-batches of 2 (the largest divisor of 8 that fits)."""
    cpu = chainer.get_device("@numpy")
    _, free = fit_batch(TrainConfig.profile("smoke", memory_limit=64, **SMALL), bccd_root, cpu,
                        log=None)
    assert free.accumulate == 1 and free.per_image > MIB and free.state > 0
    room = (free.fixed + free.state + 3 * free.per_image) / MARGIN / GIB
    lines = []
    result = train(TrainConfig.profile("smoke", memory_limit=room, root=str(bccd_root),
                                       out=str(tmp_path), **SMALL),
                   progress=False, log=lines.append)
    said = [line for line in lines if line.startswith("train: memory:")]
    assert len(said) == 1 and "micro-batches of 2 (accumulate 4)" in said[0], lines
    assert json.loads((tmp_path / "config.json").read_text())["accumulate"] == 4
    fit = json.loads((tmp_path / "metrics.json").read_text())["memory_fit"]
    assert fit["accumulate"] == 4 and fit["micro_batch"] == 2 and fit["batch_size"] == 8
    assert fit["available"] == int(room * GIB)
    assert result.metrics["memory_fit"] == fit


@pytest.mark.slow(seconds=30)
def test_the_measurement_leaves_the_seeded_run_as_it_was(tmp_path, bccd_root):
    weights = []
    for limit in (None, 64):
        out = tmp_path / str(limit)
        result = train(TrainConfig.profile("smoke", memory_limit=limit, root=str(bccd_root),
                                           out=str(out), **SMALL), progress=False,
                       log=lambda line: None)
        assert (result.metrics["memory_fit"] is None) == (limit is None)
        with np.load(result.weights) as npz:
            weights.append({k: npz[k] for k in npz.files})
    assert weights[0].keys() == weights[1].keys()
    for name in weights[0]:
        np.testing.assert_array_equal(weights[0][name], weights[1][name], err_msg=name)
