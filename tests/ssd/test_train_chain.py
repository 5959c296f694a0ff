"""The training chain on real BCCD batches. SSD300 takes seconds per pass on a CPU, so it runs
once (one shared updater step); everything else uses a stub model."""
import random
import warnings

import chainer
import chainer.functions as F
import numpy as np
import pytest
from chainercv.links import SSD300
from chainercv.links.model.ssd import multibox_loss as chainercv_multibox_loss

import medaidet.ssd.loss as loss_module
from medaidet.data.bccd import BCCDDataset
from medaidet.errors import InvalidTargetsError
from medaidet.ssd.loss import MultiboxTrainChain
from medaidet.ssd.transforms import TrainTransform

KEYS = ("main/loss", "main/loss/loc", "main/loss/conf")
IDS = ("BloodImage_00046", "BloodImage_00408")


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


@pytest.fixture(scope="module")
def dataset(bccd_root):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = BCCDDataset(bccd_root, "train")
    return [full[full.ids.index(image_id)] for image_id in IDS]     # (img, bbox, label)


@pytest.fixture(scope="module")
def update(dataset):
    """One StandardUpdater step of SSD300 on two real samples, recording what reached the loss."""
    np.random.seed(0)            # chainer's initializers draw from NumPy's global RNG
    model = SSD300(n_fg_class=3)
    chain = MultiboxTrainChain(model)
    transform = TrainTransform.for_model(model)
    train = chainer.datasets.TransformDataset(dataset, transform)
    iterator = chainer.iterators.SerialIterator(train, batch_size=2, shuffle=False)
    optimizer = chainer.optimizers.MomentumSGD(lr=1e-3, momentum=0.9)
    optimizer.setup(chain)
    updater = chainer.training.updaters.StandardUpdater(iterator, optimizer)
    seen = {}

    def recording_loss(*args, **kwargs):
        seen["args"] = [a.array.copy() if isinstance(a, chainer.Variable) else a.copy()
                        for a in args[:4]]
        return real_loss(*args, **kwargs)

    real_loss = loss_module.multibox_loss
    reporter = chainer.Reporter()
    reporter.add_observer("main", chain)
    observation = {}
    random.seed(0)
    with pytest.MonkeyPatch.context() as patch, reporter.scope(observation):
        patch.setattr(loss_module, "multibox_loss", recording_loss)
        updater.update()
    return dict(model=model, chain=chain, transform=transform, optimizer=optimizer,
                updater=updater, observation=observation, loss_args=seen["args"],
                grads={name: param.grad for name, param in chain.namedparams()})


def test_one_standard_updater_step_runs(update):
    assert update["updater"].iteration == 1 and update["optimizer"].t == 1
    assert all(np.isfinite(p.array).all() for p in update["chain"].params())
    # v = -lr * grad from v = 0 (layers initialize lazily inside the update: no "before")
    conv = update["model"].extractor.conv1_1.W
    velocity = conv.update_rule.state["v"]
    np.testing.assert_allclose(velocity, -1e-3 * conv.grad, rtol=1e-6)
    assert np.abs(velocity).max() > 0
    stats = update["transform"].stats
    assert stats.samples == 2 and stats.dropped == 0 and stats.boxes_out > 0


def test_the_batch_reached_the_loss(update):
    mb_locs, mb_confs, gt_mb_locs, gt_mb_labels = update["loss_args"]
    assert mb_locs.shape == (2, 8732, 4) and mb_confs.shape == (2, 8732, 4)
    assert gt_mb_locs.shape == (2, 8732, 4) and gt_mb_labels.dtype == np.int32
    assert (gt_mb_labels > 0).sum(axis=1).min() > 0
    assert np.isfinite(gt_mb_locs[gt_mb_labels > 0]).all()


def test_reports_the_three_losses_equal_to_chainercvs_on_the_same_inputs(update):
    observation = update["observation"]
    values = {key: as_float(observation[key]) for key in KEYS}
    assert all(np.isfinite(v) and v > 0 for v in values.values())
    assert values["main/loss"] == pytest.approx(values["main/loss/loc"]
                                                + values["main/loss/conf"], rel=1e-6)
    loc_loss, conf_loss = chainercv_multibox_loss(*update["loss_args"], 3)
    assert values["main/loss/loc"] == pytest.approx(float(loc_loss.array), rel=1e-5)
    assert values["main/loss/conf"] == pytest.approx(float(conf_loss.array), rel=1e-5)


def test_backward_gives_finite_gradients(update):
    grads = update["grads"]
    assert len(grads) > 40 and "/model/multibox/conf/0/W" in grads
    for name, grad in grads.items():
        assert grad is not None, name
        assert np.isfinite(grad).all(), name
    assert any(np.abs(grad).max() > 0 for grad in grads.values())


class StubModel(chainer.Link):
    """``model(imgs)`` -> learnable (B, K, 4) locations and (B, K, n_class) scores."""

    def __init__(self, n_prior=12, n_class=4):
        super().__init__()
        rng = np.random.default_rng(0)
        with self.init_scope():
            self.loc = chainer.Parameter(rng.normal(size=(n_prior, 4)).astype(np.float32))
            self.conf = chainer.Parameter(rng.normal(size=(n_prior, n_class)).astype(np.float32))

    def forward(self, imgs):
        b = len(imgs)
        return (F.broadcast_to(self.loc, (b,) + self.loc.shape),
                F.broadcast_to(self.conf, (b,) + self.conf.shape))


def stub_targets(b=3, n_prior=12):
    rng = np.random.default_rng(1)
    gt_mb_locs = rng.normal(size=(b, n_prior, 4)).astype(np.float32)
    gt_mb_labels = rng.integers(0, 4, size=(b, n_prior)).astype(np.int32)
    gt_mb_labels[:, :2] = 0
    imgs = np.zeros((b, 3, 8, 8), np.float32)
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


def test_n_positive_normalises_micro_batches_like_the_batch():
    stub = StubModel()
    imgs, gt_mb_locs, gt_mb_labels = stub_targets(b=4)
    gt_mb_labels[0, 2:] = 0                     # different positive counts per half
    whole, whole_obs = run_reported(MultiboxTrainChain(stub), imgs, gt_mb_locs, gt_mb_labels)
    n_positive = (gt_mb_labels > 0).sum()
    parts = [run_reported(MultiboxTrainChain(stub), imgs[s], gt_mb_locs[s], gt_mb_labels[s],
                          n_positive) for s in (slice(0, 2), slice(2, 4))]
    assert sum(float(loss.array) for loss, _ in parts) == pytest.approx(
        float(whole.array), rel=1e-6)
    for key in KEYS:
        assert sum(as_float(obs[key]) for _, obs in parts) == pytest.approx(
            as_float(whole_obs[key]), rel=1e-6)


def test_reports_nothing_outside_a_reporter():
    loss = MultiboxTrainChain(StubModel())(*stub_targets())
    assert np.isfinite(float(loss.array))


def test_bad_label_with_stub_model_names_the_prior():
    imgs, gt_mb_locs, gt_mb_labels = stub_targets()
    gt_mb_labels[2, 7] = -1
    with pytest.raises(InvalidTargetsError) as info:
        MultiboxTrainChain(StubModel())(imgs, gt_mb_locs, gt_mb_labels)
    assert (info.value.batch_index, info.value.prior_index, info.value.value) == (2, 7, -1)
