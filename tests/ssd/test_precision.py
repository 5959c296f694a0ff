"""Half precision for SSD. NumPy's float16 matrix product is ~100x slower than float32's BLAS,
so training tests use SSDSmall at a fraction of its widths (:data:`TINY`)."""
import os
import random
import warnings

import chainer
import chainer.links as L
import numpy as np
import pytest
from chainer.dataset import concat_examples
from chainercv.links.model.ssd import Normalize

import medaidet.ssd.loss as loss_module
from medaidet.data.bccd import BCCDDataset
from medaidet.ssd.model import build_ssd
from medaidet.ssd.precision import (Float32Multibox, Float32Normalize, HalfConvolution2D,
                                    HalfDilatedConvolution2D, precision_of, set_precision,
                                    skipped_update, use_loss_scaling, use_tf32)
from medaidet.ssd.weights import shipped_weights
from medaidet.ssd.small import SSDSmall
from medaidet.ssd.loss import MultiboxTrainChain
from medaidet.ssd.transforms import TrainTransform

IDS = ("BloodImage_00046", "BloodImage_00408")
TINY = (4, 4, 8, 8, 8, 8, 8, 8)      # SSDSmall's widths are (16, 32, 64, 128, ...)


@pytest.fixture(scope="module")
def batches(bccd_root):
    """Three seeded batches of the two images through the training transform, concatenated."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = BCCDDataset(bccd_root, "train")
    samples = [full[full.ids.index(image_id)] for image_id in IDS]
    transform = TrainTransform.for_model(SSDSmall(3, widths=TINY))
    random.seed(0)
    np.random.seed(0)
    return [concat_examples([transform(s) for s in samples]) for _ in range(3)]


def tiny_chain(precision):
    """The train chain on a tiny SSDSmall (same initial weights each call) and its optimizer."""
    np.random.seed(0)
    model = set_precision(SSDSmall(3, widths=TINY), precision)
    chain = MultiboxTrainChain(model)
    optimizer = chainer.optimizers.MomentumSGD(lr=1e-3, momentum=0.9)
    optimizer.setup(chain)
    use_loss_scaling(optimizer, precision)
    return chain, optimizer


def test_chainercv_normalize_outputs_zeros_above_256_in_float16_ours_does_not():
    x = np.full((1, 4, 2, 2), 1.0, np.float32)
    x[0, 0] = 300.0                                  # 300 ** 2 > 65504: float16's largest
    expected = 20 * x / np.sqrt((x ** 2).sum(axis=1, keepdims=True))
    # chainer's mixed16 gives Normalize a float16 scale, as SSD300's norm4 (initial 20)
    with chainer.using_config("dtype", chainer.mixed16):
        theirs, ours = Normalize(4, initial=20), Float32Normalize(4, initial=20)
    assert theirs.scale.dtype == np.float16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)            # overflow in square
        zeros = theirs(x.astype(np.float16)).array
    assert zeros.dtype == np.float16 and not zeros.any()
    y = ours(chainer.Variable(x.astype(np.float16)))
    assert y.dtype == np.float16
    np.testing.assert_allclose(y.array.astype(np.float32), expected, rtol=2e-3)
    ours = Float32Normalize(4, initial=20)
    ours.cleargrads()                                 # (a new parameter's grad is nan)
    xv = chainer.Variable(x.astype(np.float16))
    y = ours(xv)
    np.testing.assert_allclose(y.array.astype(np.float32), expected, rtol=2e-3)
    y.grad = np.ones_like(y.array)
    y.backward()
    assert xv.grad.dtype == np.float16 and ours.scale.grad.dtype == np.float32
    assert np.isfinite(xv.grad).all() and np.abs(ours.scale.grad).min() > 0
    np.testing.assert_allclose(ours(x).array, Normalize(4, initial=20)(x).array, rtol=1e-6)


@pytest.mark.parametrize("name", ["ssd300", "ssd_small"])
def test_set_precision_changes_the_links_classes_not_the_weights(name):
    np.random.seed(0)
    model = set_precision(build_ssd(name, None), "mixed16")
    weights = {n: p.array.copy() for n, p in model.namedparams()}
    kinds = {type(link) for link in model.links()}
    assert {HalfConvolution2D, Float32Multibox} <= kinds and L.Convolution2D not in kinds
    if name == "ssd300":
        assert {HalfDilatedConvolution2D, Float32Normalize} <= kinds
        assert Normalize not in kinds and L.DilatedConvolution2D not in kinds
    assert precision_of(model) == "mixed16"
    assert {p.dtype for p in model.params()} == {np.dtype(np.float32)}
    set_precision(model, "tf32")                                # = float32 for the model
    assert precision_of(model) == "float32"
    assert {type(link) for link in model.links()}.isdisjoint(
        {HalfConvolution2D, HalfDilatedConvolution2D, Float32Normalize, Float32Multibox})
    after = {n: p.array for n, p in model.namedparams()}
    assert after.keys() == weights.keys()
    for n, w in weights.items():
        np.testing.assert_array_equal(after[n], w)


def test_mixed16_detections_of_the_shipped_small_ssd_match_float32(bccd_root):
    model = build_ssd("ssd_small", shipped_weights("ssd_small"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        img = BCCDDataset(bccd_root, "test")[0][0]
    x = model._prepare(img)[None]
    out = {}
    for precision in ("float32", "mixed16"):
        set_precision(model, precision)
        with chainer.using_config("train", False), chainer.no_backprop_mode():
            locs, confs = model(x)
        assert locs.dtype == confs.dtype == np.float32
        out[precision] = model.coder.decode(locs.array[0], confs.array[0], model.nms_thresh,
                                            model.score_thresh)
    (boxes, labels, scores), (boxes16, labels16, scores16) = out["float32"], out["mixed16"]
    assert len(labels) > 3
    np.testing.assert_array_equal(labels16, labels)
    np.testing.assert_allclose(boxes16, boxes, atol=0.5)                   # pixels
    np.testing.assert_allclose(scores16, scores, atol=5e-3)


def test_train_chain_in_mixed16_follows_float32_with_float32_weights_and_loss(
        batches, monkeypatch):
    losses, seen = {}, []
    real_loss = loss_module.multibox_loss

    def recording_loss(mb_locs, mb_confs, *args, **kwargs):
        seen.append((mb_locs.dtype, mb_confs.dtype))
        loc_loss, conf_loss = real_loss(mb_locs, mb_confs, *args, **kwargs)
        seen.append((loc_loss.dtype, conf_loss.dtype))
        return loc_loss, conf_loss

    monkeypatch.setattr(loss_module, "multibox_loss", recording_loss)
    for precision in ("float32", "mixed16"):
        chain, optimizer = tiny_chain(precision)
        steps = []

        def loss_of(*batch):
            steps.append(chain(*batch))
            return steps[-1]

        for batch in batches * 2:
            optimizer.update(loss_of, *batch)
            assert not skipped_update(optimizer)
        losses[precision] = np.array([float(loss.array) for loss in steps])
        assert {loss.dtype for loss in steps} == {np.dtype(np.float32)}
        assert {p.dtype for p in chain.params()} == {np.dtype(np.float32)}
        assert {p.grad.dtype for p in chain.params()} == {np.dtype(np.float32)}
    assert set(seen) == {(np.dtype(np.float32),) * 2}        # outputs and losses float32
    assert np.isfinite(losses["mixed16"]).all()
    np.testing.assert_allclose(losses["mixed16"], losses["float32"], rtol=0.02)


def test_dynamic_loss_scaling_skips_a_step_whose_gradients_overflow(batches):
    chain, optimizer = tiny_chain("mixed16")
    before = {n: p.array.copy() for n, p in chain.namedparams()}
    # 1e8 x the loss: gradients far above float16's 65504, as a too large loss scale gives
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        optimizer.update(lambda *a: chain(*a) * 1e8, *batches[0])
    # chainer warns once per parameter whose gradient holds inf or nan
    assert sum(issubclass(w.category, UserWarning) for w in caught) > 1
    assert skipped_update(optimizer)
    for n, p in chain.namedparams():
        np.testing.assert_array_equal(p.array, before[n])
    optimizer.update(chain, *batches[0])
    assert not skipped_update(optimizer)
    assert all(np.isfinite(p.array).all() for p in chain.params())
    assert any((p.array != before[n]).any() for n, p in chain.namedparams())


def test_unknown_precision_is_a_value_error():
    model = SSDSmall(3, widths=TINY)
    with pytest.raises(ValueError):
        set_precision(model, "float16")
    with pytest.raises(ValueError):
        use_loss_scaling(chainer.optimizers.SGD(), "bfloat16")


def test_a_model_built_with_float16_weights_is_refused():
    with chainer.using_config("dtype", chainer.mixed16):     # chainer's own mixed16
        model = SSDSmall(3, widths=TINY)
    with pytest.raises(ValueError):
        set_precision(model, "mixed16")


def test_a_link_it_cannot_run_in_float16_is_a_type_error():
    chain = chainer.Chain()
    with chain.init_scope():
        chain.conv = L.Convolution2D(3, 4, 3)
        chain.fc = L.Linear(4, 2)
    with pytest.raises(TypeError):
        set_precision(chain, "mixed16")
    assert set_precision(chain, "float32") is chain


def test_use_tf32_sets_cupys_variable(monkeypatch):
    monkeypatch.delenv("CUPY_TF32", raising=False)
    active = use_tf32()
    assert os.environ["CUPY_TF32"] == "1"
    if not chainer.backends.cuda.available:
        assert active is False                  # nothing to switch: no CuPy, no GPU
    assert use_tf32(False) is False
    assert os.environ["CUPY_TF32"] == "0"
