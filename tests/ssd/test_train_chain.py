"""MultiboxTrainChain on a stub model: the loss it reports and what it passes to the loss. The
real SSD300 update runs in every smoke training (notebook 03) and in test_accumulation."""
import chainer
import numpy as np
import pytest
from chainercv.links.model.ssd import multibox_loss as chainercv_multibox_loss
from stubs import StubModel

import medaidet.ssd.loss as loss_module
from medaidet.errors import InvalidTargetsError
from medaidet.ssd.loss import MultiboxTrainChain


def run_reported(chain, *args):
    """Call ``chain(*args)`` under a reporter; return (loss, observation)."""
    reporter = chainer.Reporter()
    reporter.add_observer("main", chain)
    observation = {}
    with reporter.scope(observation):
        loss = chain(*args)
    return loss, observation


def as_float(value):
    return float(value.array if isinstance(value, chainer.Variable) else value)


def stub_targets(b=3, n_prior=12):
    rng = np.random.default_rng(1)
    gt_mb_locs = rng.normal(size=(b, n_prior, 4)).astype(np.float32)
    gt_mb_labels = rng.integers(0, 4, size=(b, n_prior)).astype(np.int32)
    gt_mb_labels[:, :2] = 0
    imgs = np.ones((b, 3, 8, 8), np.float32)
    return imgs, gt_mb_locs, gt_mb_labels


@pytest.mark.parametrize("alpha", [1, 2.5, 0])
def test_alpha_weights_the_location_loss(alpha):
    stub = StubModel()
    imgs, gt_mb_locs, gt_mb_labels = stub_targets()
    loss, observation = run_reported(MultiboxTrainChain(stub, alpha=alpha), imgs, gt_mb_locs,
                                     gt_mb_labels)
    loc, conf = chainercv_multibox_loss(*stub(imgs), gt_mb_locs, gt_mb_labels, 3)
    assert float(loss.array) == pytest.approx(alpha * float(loc.array) + float(conf.array),
                                              rel=1e-6)
    assert as_float(observation["main/loss/loc"]) == pytest.approx(float(loc.array), rel=1e-6)
    assert as_float(observation["main/loss/conf"]) == pytest.approx(float(conf.array),
                                                                    rel=1e-6)


def test_arguments_reach_the_loss(monkeypatch):
    seen = {}
    real = loss_module.multibox_loss

    def spy(mb_locs, mb_confs, gt_mb_locs, gt_mb_labels, k, comm=None, check=True,
            n_positive=None):
        seen.update(k=k, comm=comm, check=check, n_positive=n_positive)
        return real(mb_locs, mb_confs, gt_mb_locs, gt_mb_labels, k, check=check,
                    n_positive=n_positive)

    monkeypatch.setattr(loss_module, "multibox_loss", spy)
    comm = object()
    chain = MultiboxTrainChain(StubModel(), k=1, comm=comm, check=False)
    chain(*stub_targets())
    assert seen == {"k": 1, "comm": comm, "check": False, "n_positive": None}
    chain(*stub_targets(), n_positive=17)
    assert seen["n_positive"] == 17


def test_reports_nothing_outside_a_reporter():
    loss = MultiboxTrainChain(StubModel())(*stub_targets())
    assert np.isfinite(float(loss.array))


def test_bad_label_with_stub_model_names_the_prior():
    imgs, gt_mb_locs, gt_mb_labels = stub_targets()
    gt_mb_labels[2, 7] = -1
    with pytest.raises(InvalidTargetsError) as info:
        MultiboxTrainChain(StubModel())(imgs, gt_mb_locs, gt_mb_labels)
    assert (info.value.batch_index, info.value.prior_index, info.value.value) == (2, 7, -1)
