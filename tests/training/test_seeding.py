"""medaidet.training.train: what seed_everything seeds and sets, and worker reseeding."""
import multiprocessing
import random

import numpy as np
import pytest

from medaidet.training.train import ReseedingTransform, seed_everything
from medaidet.errors import ConfigError


def _draw(_=None):
    return random.random(), float(np.random.rand())


def test_same_seed_same_draws_other_seed_other_draws():
    seed_everything(5)
    first = _draw()
    seed_everything(5)
    assert _draw() == first
    seed_everything(6)
    assert _draw() != first


def test_deterministic_sets_chainers_cudnn_switch():
    import chainer

    old = chainer.config.cudnn_deterministic
    try:
        seed_everything(2, deterministic=True)
        assert chainer.config.cudnn_deterministic is True
        seed_everything(2, deterministic=False)
        assert chainer.config.cudnn_deterministic is False
    finally:
        chainer.config.cudnn_deterministic = old


@pytest.mark.parametrize("seed", [-1, 1.5, True, "3", 2 ** 32])
def test_bad_seeds_are_named(seed):
    with pytest.raises(ConfigError) as info:
        seed_everything(seed)
    assert info.value.kind == "seed" and repr(seed) in str(info.value)   # the value named


@pytest.mark.parametrize("device", [0, "gpu", None])
def test_devices_are_chainer_devices(device):
    with pytest.raises(ConfigError):
        seed_everything(0, devices=[device])


def _draw_in_worker(transform):
    return multiprocessing.current_process().name, transform(None)


def test_each_worker_draws_its_own_stream():
    """Forked workers inherit NumPy's state: without reseeding they all repeat it."""
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("needs fork")
    ctx = multiprocessing.get_context("fork")

    def run(transform):
        """Each worker's first draw."""
        random.seed(0)
        np.random.seed(0)
        with ctx.Pool(2) as pool:
            results = pool.map(_draw_in_worker, [transform] * 8, chunksize=1)
        first = {}
        for name, value in results:
            first.setdefault(name, value)
        return first

    random.seed(0)
    np.random.seed(0)
    parent = _draw(None)
    plain = run(_draw)
    reseeded = run(ReseedingTransform(_draw, seed=7))
    # NumPy: every forked worker repeats the parent's stream (the bug)
    assert {value[1] for value in plain.values()} == {parent[1]}
    # Python's random reseeds itself from the OS in a forked child (differs every run)
    assert all(value[0] != parent[0] for value in plain.values())
    assert all(value[0] != parent[0] and value[1] != parent[1] for value in reseeded.values())
    if len(reseeded) == 2:
        assert len({value[1] for value in reseeded.values()}) == 2
    # in the process that made it, nothing changes
    random.seed(0)
    np.random.seed(0)
    assert ReseedingTransform(_draw, seed=7)(None) == parent
