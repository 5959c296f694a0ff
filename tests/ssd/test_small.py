"""medaidet.ssd.small: SSD300's grids with default boxes sized for BCCD (more positives per
platelet), a small extractor, and weights that save and load with batch-norm statistics."""
from pathlib import Path

import chainer
import numpy as np
import pytest

from medaidet.ssd.model import build_ssd, model_of_weights
from medaidet.ssd.weights import load_weights, materialize, save_weights
from medaidet.errors import WeightsError
from medaidet.ssd.small import SSD300_SIZES, SmallExtractor, SSDSmall


def test_ssd300_grids_and_shapes_with_smaller_boxes_from_a_small_extractor():
    small, ssd300 = build_ssd("ssd_small"), build_ssd("ssd300")
    ours, theirs = small.coder._default_bbox, ssd300.coder._default_bbox   # (cy, cx, h, w)
    np.testing.assert_array_equal(ours[:, :2], theirs[:, :2])
    assert ours[:, 2:].min() < theirs[:, 2:].min()
    np.testing.assert_allclose(SSDSmall(3, sizes=SSD300_SIZES).coder._default_bbox, theirs,
                               rtol=1e-6)
    x = np.zeros((1, 3, 300, 300), np.float32)
    with chainer.using_config("train", False), chainer.no_backprop_mode():
        maps = small.extractor(x)
        locs, confs = small(x)
    assert [m.shape[2] for m in maps] == list(SmallExtractor.grids)
    assert locs.shape == (1, 8732, 4) and confs.shape == (1, 8732, 4)
    n_small = sum(p.size for p in small.params())
    assert n_small < 2_000_000
    materialize(ssd300)
    assert n_small * 10 < sum(p.size for p in ssd300.extractor.params())


def test_widths_must_name_the_stem_and_six_maps():
    with pytest.raises(ValueError, match="2 stem widths and 6 map widths"):
        SSDSmall(3, widths=(16, 32, 64))


def test_weights_round_trip_with_batch_norm_statistics_in_full_or_half_precision(tmp_path):
    model = build_ssd("ssd_small")
    x = np.random.default_rng(0).uniform(0, 255, (2, 3, 300, 300)).astype(np.float32)
    with chainer.using_config("train", True):
        model(x)                                   # moves the running mean and variance
    bn = model.extractor[0][0].bn
    assert np.abs(bn.avg_mean).sum() > 0
    save_weights(model, tmp_path / "full.npz")
    save_weights(model, tmp_path / "half.npz", compression=True, half=True)
    assert (tmp_path / "half.npz").stat().st_size < 0.6 * (tmp_path / "full.npz").stat().st_size
    with np.load(tmp_path / "half.npz") as npz:
        assert "extractor/0/0/bn/avg_mean" in npz.files
        floats = {npz[k].dtype for k in npz.files if npz[k].dtype.kind == "f"}
    assert floats == {np.dtype(np.float16)}
    full, half = build_ssd("ssd_small"), build_ssd("ssd_small")
    load_weights(full, tmp_path / "full.npz")
    load_weights(half, tmp_path / "half.npz")
    np.testing.assert_array_equal(full.extractor[0][0].bn.avg_mean, bn.avg_mean)
    assert half.extractor[0][0].conv.W.dtype == np.float32
    with chainer.using_config("train", False), chainer.no_backprop_mode():
        expected = model(x)[1].array
        np.testing.assert_array_equal(full(x)[1].array, expected)
        np.testing.assert_allclose(half(x)[1].array, expected, rtol=0.02, atol=0.05)


@pytest.mark.parametrize("pretrained", ["imagenet", "voc0712"])
def test_no_pretrained_weights_for_the_small_ssd(pretrained):
    with pytest.raises(WeightsError) as info:
        build_ssd("ssd_small", pretrained)
    assert (info.value.kind, info.value.path) == ("missing", Path(pretrained))


def test_the_model_is_told_from_the_weights_parameter_names(tmp_path):
    save_weights(build_ssd("ssd_small"), tmp_path / "small.npz")
    assert model_of_weights(tmp_path / "small.npz") == "ssd_small"
    np.savez(tmp_path / "ssd512.npz", **{"extractor/conv1_1/W": np.zeros(1),
                                          "multibox/loc/6/W": np.zeros(1)})
    assert model_of_weights(tmp_path / "ssd512.npz") == "ssd512"
    np.savez(tmp_path / "ssd300.npz", **{"extractor/conv1_1/W": np.zeros(1),
                                          "multibox/loc/5/W": np.zeros(1)})
    assert model_of_weights(tmp_path / "ssd300.npz") == "ssd300"
    (tmp_path / "notes.txt").write_text("not weights")       # load_weights will say what it is
    assert model_of_weights(tmp_path / "notes.txt") == "ssd300"
