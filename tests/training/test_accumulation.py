"""Gradient accumulation: one SSD300 update on four BCCD images with different positive
counts, as one batch and as 2 and 4 micro-batches (that dividing each micro-batch by its own
positives does not add up is test_loss's)."""
import copy
import warnings

import chainer
import numpy as np
import pytest
from chainer.training.updaters import StandardUpdater
from stubs import FakeComm, StubModel

from medaidet.data.bccd import BCCDDataset
from medaidet.errors import ConfigError
from medaidet.training.accumulation import (AccumulatingUpdater, batch_positives,
                                            gradient_difference)
from medaidet.ssd.model import build_ssd
from medaidet.ssd.weights import materialize
from medaidet.ssd.loss import MultiboxTrainChain
from medaidet.ssd.transforms import EncodeTransform

IDS = ("BloodImage_00001", "BloodImage_00005", "BloodImage_00004", "BloodImage_00022")
KEYS = ("main/loss", "main/loss/loc", "main/loss/conf")
RTOL, ATOL = 1e-4, 1e-6          # for the weights (and the stub model)
# Gradients: float32 sums over ~1e5-1e6 terms that the large batch groups differently (BLAS
# blocking, ReLU/max-pool ties). Measured: worst relative L2 error 5e-4, worst element 1.1e-3
# of its parameter's largest; float64 agrees to 5e-15.
GRAD_RTOL, GRAD_NORM_RTOL, GRAD_ATOL_OF_MAX = 1e-4, 2e-3, 1e-2


def as_float(value):
    return float(value.array if isinstance(value, chainer.Variable) else value)


def one_update(model, samples, make_updater, lr=1e-3):
    """One update of a copy of ``model``: its gradients, weights after, and what was reported."""
    chain = MultiboxTrainChain(copy.deepcopy(model))
    optimizer = chainer.optimizers.MomentumSGD(lr=lr, momentum=0.9)
    observation = update_once(chain, optimizer, samples, make_updater)
    assert optimizer.t == 1
    return dict(grads={n: p.grad.copy() for n, p in chain.namedparams()},
                params={n: p.array.copy() for n, p in chain.namedparams()},
                observation=observation)


def update_once(chain, optimizer, samples, make_updater, raw=False):
    """One update of ``chain`` on all ``samples`` as one batch; what was reported (as floats
    unless ``raw``)."""
    optimizer.setup(chain)
    iterator = chainer.iterators.SerialIterator(samples, len(samples), shuffle=False)
    updater = make_updater(iterator, optimizer)
    reporter = chainer.Reporter()
    reporter.add_observer("main", chain)
    observation = {}
    with reporter.scope(observation):
        updater.update()
    return observation if raw else {k: as_float(v) for k, v in observation.items()}


UPDATERS = {
    "standard": lambda it, opt: StandardUpdater(it, opt),
    "accumulate2": lambda it, opt: AccumulatingUpdater(it, opt, accumulate=2),
}


def assert_gradients_close(ours, theirs, what):
    """Each parameter's relative L2 error and its elements, at that parameter's scale."""
    assert ours.keys() == theirs.keys()
    for name, want in theirs.items():
        scale = np.abs(want).max()
        if scale == 0:
            assert not ours[name].any(), f"{what} {name}: not zero"
            continue
        relative = float(np.linalg.norm(ours[name] - want) / np.linalg.norm(want))
        close = np.allclose(ours[name], want, rtol=GRAD_RTOL, atol=GRAD_ATOL_OF_MAX * scale)
        assert relative <= GRAD_NORM_RTOL and close, \
            f"{what} {name}: relative L2 error {relative:.2e}, elementwise close: {close}"


def encoded(root, model):
    """The images ``IDS`` of BCCD's train split, encoded for ``model``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = BCCDDataset(root, "train")
    transform = EncodeTransform.for_model(model)
    return [transform(dataset[dataset.ids.index(i)]) for i in IDS]


@pytest.fixture(scope="module")
def samples(bccd_root):
    return encoded(bccd_root, build_ssd("ssd300", None, n_fg_class=3))


@pytest.fixture(scope="module")
def initial_model():
    np.random.seed(0)
    return materialize(build_ssd("ssd300", None, n_fg_class=3))


@pytest.fixture(scope="module")
def runs(samples, initial_model):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = one_update(initial_model, samples, UPDATERS[name])
        return cache[name]
    return get


def test_the_samples_have_different_positive_counts(samples):
    counts = [int((label > 0).sum()) for _, _, label in samples]
    assert counts == [242, 249, 134, 153]
    assert counts[0] + counts[1] != counts[2] + counts[3]     # the naive way must differ
    assert batch_positives(samples) == sum(counts)


@pytest.mark.slow(seconds=20)
def test_accumulated_gradients_match_the_large_batch(runs):
    large, accumulated = runs("standard"), runs("accumulate2")
    assert_gradients_close(accumulated["grads"], large["grads"], "gradient of")
    assert sum(np.abs(g).max() > 0 for g in large["grads"].values()) > 30
    for key in KEYS:       # the batch's loss, not the last micro-batch's share
        assert accumulated["observation"][key] == pytest.approx(
            large["observation"][key], rel=1e-5), key
    for name, weight in large["params"].items():
        np.testing.assert_allclose(accumulated["params"][name], weight, rtol=RTOL,
                                   atol=ATOL, err_msg=name)


@pytest.mark.slow(seconds=2)
def test_accumulated_update_moves_the_weights_like_the_large_batch(runs, initial_model):
    before = {"/model" + n: p.array for n, p in initial_model.namedparams()}
    large, accumulated = runs("standard"), runs("accumulate2")
    moved = {name: large["params"][name] - start for name, start in before.items()}
    assert_gradients_close({name: accumulated["params"][name] - start
                            for name, start in before.items()}, moved, "update of")
    assert sum(np.abs(m).max() > 0 for m in moved.values()) > 30


@pytest.mark.slow(seconds=12)
def test_batch_normalisation_makes_the_micro_batches_another_function(bccd_root, samples,
                                                                      initial_model):
    """The small SSD normalises each micro-batch by its own statistics; SSD300 has no BN."""
    assert gradient_difference(initial_model, samples[:2], 2) < 1e-4
    np.random.seed(0)
    small = materialize(build_ssd("ssd_small", None, n_fg_class=3))
    small_samples = encoded(bccd_root, small)
    before = {name: p.array.copy() for name, p in small.namedparams()}
    assert gradient_difference(small, small_samples, 2) > 0.02
    assert gradient_difference(small, small_samples, 1) == 0.0
    for name, p in small.namedparams():                         # copies were trained, not it
        np.testing.assert_array_equal(p.array, before[name], err_msg=name)


def stub_samples(n=6, n_prior=12):
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        labels = rng.integers(0, 4, size=n_prior).astype(np.int32)
        labels[: i + 1] = 0                       # different positive counts
        out.append((np.full((3, 4, 4), 1 + i / 3, np.float32),
                    rng.normal(size=(n_prior, 4)).astype(np.float32), labels))
    return out


def stub_update(samples, make_updater, chain=None, raw=False):
    chain = chain or MultiboxTrainChain(StubModel())
    return chain, update_once(chain, chainer.optimizers.SGD(lr=0.1), samples, make_updater, raw)


@pytest.mark.parametrize("n_micro", [1, 2, 3, 6])
def test_stub_accumulation_matches_the_batch(n_micro):
    """accumulate=1 is the standard updater bit for bit."""
    samples = stub_samples()
    large, large_obs = stub_update(samples, StandardUpdater)
    acc, acc_obs = stub_update(samples, lambda it, opt: AccumulatingUpdater(
        it, opt, accumulate=n_micro))
    tol = dict(rtol=0, atol=0) if n_micro == 1 else dict(rtol=1e-5, atol=1e-7)
    for (name, p), q in zip(large.namedparams(), acc.params()):
        np.testing.assert_allclose(q.grad, p.grad, err_msg=name, **tol)
        np.testing.assert_allclose(q.array, p.array, err_msg=name, **tol)
    assert acc_obs.keys() == large_obs.keys()
    for key in KEYS:
        assert acc_obs[key] == pytest.approx(large_obs[key], rel=tol["rtol"], abs=0)


def test_comm_is_allreduced_once_per_batch_like_the_loss():
    samples = stub_samples()
    count = sum(int((label > 0).sum()) for _, _, label in samples)
    big_comm, acc_comm = FakeComm(4, 50), FakeComm(4, 50)
    chain, _ = stub_update(samples, StandardUpdater, MultiboxTrainChain(StubModel(), comm=big_comm))
    acc_chain, _ = stub_update(samples, lambda it, opt: AccumulatingUpdater(it, opt, accumulate=3),
                               MultiboxTrainChain(StubModel(), comm=acc_comm))
    assert big_comm.received == acc_comm.received == [count]    # once, the whole batch
    for p, q in zip(chain.params(), acc_chain.params()):
        np.testing.assert_allclose(q.array, p.array, rtol=1e-5, atol=1e-7)
    assert batch_positives(samples, FakeComm(4, 50)) == (count + 50) / 4


def test_reports_sum_losses_and_average_other_keys():
    class Chain(MultiboxTrainChain):
        def forward(self, *args, n_positive=None):
            loss = super().forward(*args, n_positive=n_positive)
            chainer.reporter.report({"imgs": len(args[0])}, self)
            return loss

    updaters = []

    def make_updater(iterator, optimizer):
        updaters.append(AccumulatingUpdater(iterator, optimizer, accumulate=3))
        return updaters[0]
    _, observation = stub_update(stub_samples(), make_updater, Chain(StubModel()), raw=True)
    assert as_float(observation["main/imgs"]) == 2                   # a mean, not 6
    assert isinstance(observation["main/loss"], chainer.Variable)
    assert observation["main/loss"].creator is None                  # no graph kept
    updaters[0].update()                                             # no reporter: fine


def test_batch_size_not_divisible_is_named():
    chain = MultiboxTrainChain(StubModel())
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(chain)
    iterator = chainer.iterators.SerialIterator(stub_samples(), 3)
    for bad in (2, 0, -1, 1.5, True):            # 2: the batch of 3 does not split in 2
        with pytest.raises(ConfigError) as info:
            AccumulatingUpdater(iterator, optimizer, accumulate=bad)
        assert info.value.kind == "accumulation"
    # a short last batch of a non-repeating iterator: named at that iteration
    iterator = chainer.iterators.SerialIterator(stub_samples(5), 4, repeat=False,
                                                shuffle=False)
    updater = AccumulatingUpdater(iterator, optimizer, accumulate=2)
    updater.update()
    with pytest.raises(ConfigError) as info:
        updater.update()
    assert info.value.kind == "accumulation"
