"""Capped SSD prediction: identical to ChainerCV's when no cap binds, the caps' guarantees
when one does, and the array contracts. No wall-clock assertions (see benchmarks/)."""
import chainer
import numpy as np
import pytest
from chainer.backends import cuda
from chainercv.extensions import DetectionVOCEvaluator
from chainercv.links import SSD300
from chainercv.links.model.ssd import MultiboxCoder
from chainercv.transforms import resize_bbox
from chainercv.utils import read_image
from PIL import Image

from medaidet.errors import ConfigError, DataError
from medaidet.ssd import predict as predict_mod
from medaidet.ssd.predict import (DEFAULT_KEEP_TOP_K, DEFAULT_TOP_K, CappedPredictor,
                              decode_capped, predict)

N_FG = 3


def small_outputs(seed):
    """A coder of 6x6x4 + 3x3x6 = 198 default boxes, heavily overlapping (NMS has work to do),
    and network outputs (mb_loc, mb_conf) for it."""
    coder = MultiboxCoder(grids=(6, 3), aspect_ratios=((2,), (2, 3)), steps=(8, 16),
                          sizes=(10, 20, 40), variance=(0.1, 0.2))
    return (coder,) + network_outputs(coder, seed)


def ssd300_coder():
    # The real SSD300 layout (8732 default boxes), without building the network.
    return MultiboxCoder(grids=(38, 19, 10, 5, 3, 1),
                         aspect_ratios=((2,), (2, 3), (2, 3), (2, 3), (2,), (2,)),
                         steps=(8, 16, 32, 64, 100, 300),
                         sizes=(30, 60, 111, 162, 213, 264, 315), variance=(0.1, 0.2))


def network_outputs(coder, seed, spread=2.0):
    """(mb_loc, mb_conf) as an SSD would output for one image; distinct class scores."""
    rng, k = np.random.RandomState(seed), len(coder._default_bbox)
    return (rng.normal(0, 0.5, (k, 4)).astype(np.float32),
            rng.normal(0, spread, (k, N_FG + 1)).astype(np.float32))


def scores_of(mb_conf):
    e = np.exp(mb_conf)
    return e / e.sum(axis=1, keepdims=True)


def assert_same(actual, expected):
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape
        np.testing.assert_array_equal(a, e)


def assert_contract(bbox, label, score, n_fg=N_FG):
    r = len(label)
    assert bbox.dtype == np.float32 and bbox.shape == (r, 4)
    assert label.dtype == np.int32 and label.shape == (r,)
    assert score.dtype == np.float32 and score.shape == (r,)
    assert ((label >= 0) & (label < n_fg)).all()
    # ChainerCV's order: grouped by label, each group by descending score
    assert (np.diff(label) >= 0).all()
    for fg in range(n_fg):
        assert (np.diff(score[label == fg]) <= 0).all()
    # (y_min, x_min, y_max, x_max)
    assert (bbox[:, 2] >= bbox[:, 0]).all() and (bbox[:, 3] >= bbox[:, 1]).all()


@pytest.fixture
def nms_inputs(monkeypatch):
    """Record how many boxes each NMS call receives."""
    sizes, real = [], predict_mod.non_maximum_suppression
    monkeypatch.setattr(predict_mod, "non_maximum_suppression",
                        lambda bbox, *a, **kw: sizes.append(len(bbox)) or real(bbox, *a, **kw))
    return sizes


@pytest.mark.parametrize("seed, score_thresh, nms_thresh", [
    *((seed, score, nms) for nms in (0.45, 0.7, None) for score in (0.01, 0.2, 0.5)
      for seed in range(4)),
    # at the edges, and NumPy scalars; 1: no softmax score reaches it
    (3, 0, 0.45), (3, 1, 0.45), (0, 1.0, 0.45), (3, np.float32(0.3), None), (3, 0.3, 1),
    (3, np.float64(0.3), 0.45)])
def test_identical_to_chainercv_without_caps(seed, score_thresh, nms_thresh):
    coder, mb_loc, mb_conf = small_outputs(seed)
    got = decode_capped(coder, mb_loc, mb_conf, nms_thresh, score_thresh, None, None)
    assert_same(got, coder.decode(mb_loc, mb_conf, nms_thresh, score_thresh))
    if score_thresh == 1:       # empty, with the default caps too
        assert_contract(*got)
        assert len(got[0]) == 0
        assert_same(decode_capped(coder, mb_loc, mb_conf, nms_thresh, score_thresh), got)


@pytest.mark.parametrize("seed", range(4))
def test_identical_to_chainercv_when_caps_are_exactly_reached(seed):
    coder, mb_loc, mb_conf = small_outputs(seed)
    expected = coder.decode(mb_loc, mb_conf, 0.45, 0.01)
    # the largest class's candidate count and the total after NMS: caps at the limit
    top_k = int((scores_of(mb_conf)[:, 1:] >= 0.01).sum(axis=0).max())
    keep_top_k = len(expected[2])
    assert_same(decode_capped(coder, mb_loc, mb_conf, 0.45, 0.01, top_k, keep_top_k),
                expected)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("top_k", [1, 5, 20])
def test_top_k_keeps_a_prefix_of_each_class(seed, top_k, nms_inputs):
    coder, mb_loc, mb_conf = small_outputs(seed)
    score = scores_of(mb_conf)[:, 1:]
    for fg in range(N_FG):
        assert len(np.unique(score[:, fg])) == len(score)  # distinct: no tie at the cap
    uncapped = coder.decode(mb_loc, mb_conf, 0.45, 0.01)
    nms_inputs.clear()
    bbox, label, score_out = decode_capped(coder, mb_loc, mb_conf, 0.45, 0.01,
                                           top_k=top_k, keep_top_k=None)
    assert_contract(bbox, label, score_out)
    assert len(nms_inputs) == N_FG and max(nms_inputs) == top_k
    for fg in range(N_FG):
        cutoff = np.sort(score[:, fg][score[:, fg] >= 0.01])[-top_k]
        ub, us = uncapped[0][uncapped[1] == fg], uncapped[2][uncapped[1] == fg]
        cb, cs = bbox[label == fg], score_out[label == fg]
        n = len(cs)
        assert 1 <= n <= top_k
        np.testing.assert_array_equal(cs, us[:n])
        np.testing.assert_array_equal(cb, ub[:n])
        assert n == (us >= cutoff).sum()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("keep_top_k", [1, 7, 30])
def test_keep_top_k_keeps_the_best_in_chainercv_order(seed, keep_top_k):
    coder, mb_loc, mb_conf = small_outputs(seed)
    ub, ul, us = coder.decode(mb_loc, mb_conf, 0.45, 0.01)
    assert len(us) > keep_top_k and len(np.unique(us)) == len(us)
    bbox, label, score = decode_capped(coder, mb_loc, mb_conf, 0.45, 0.01,
                                       top_k=None, keep_top_k=keep_top_k)
    assert_contract(bbox, label, score)
    best = np.sort(np.argsort(-us)[:keep_top_k])  # the best, in their original order
    assert_same((bbox, label, score), (ub[best], ul[best], us[best]))


def test_both_caps_on_the_real_layout(nms_inputs):
    coder = ssd300_coder()
    mb_loc, mb_conf = network_outputs(coder, seed=1, spread=1.0)
    counts = (scores_of(mb_conf)[:, 1:] >= 0.3).sum(axis=0)
    assert counts.min() > DEFAULT_TOP_K  # the cap binds for every class
    uncapped = coder.decode(mb_loc, mb_conf, 0.45, 0.3)
    assert len(uncapped[2]) > DEFAULT_KEEP_TOP_K
    bbox, label, score = decode_capped(coder, mb_loc, mb_conf, 0.45, 0.3)
    assert_contract(bbox, label, score)
    assert max(nms_inputs) == DEFAULT_TOP_K
    assert len(score) == DEFAULT_KEEP_TOP_K
    ref = {(tuple(b), l, s) for b, l, s in zip(*uncapped)}
    assert all((tuple(b), l, s) in ref for b, l, s in zip(bbox, label, score))


@pytest.fixture(scope="module")
def model_and_image():
    np.random.seed(0)
    model = SSD300(n_fg_class=N_FG)
    img = np.random.RandomState(1).uniform(0, 255, (3, 240, 320)).astype(np.float32)
    x = model.xp.stack([model._prepare(img)])
    with chainer.using_config("train", False), chainer.no_backprop_mode():
        mb_locs, mb_confs = model(x)
    return model, img, mb_locs.array[0], mb_confs.array[0]


def test_predict_equals_chainercv_when_no_cap_binds_and_of_no_images(model_and_image):
    model, img, _, mb_conf = model_and_image
    # random weights put every prior above 0.01; this threshold leaves <= 100 per class
    thresh = float(np.sort(scores_of(mb_conf)[:, 1:], axis=0)[-100].max())
    model.score_thresh, model.nms_thresh = thresh, 0.45
    try:
        expected = model.predict([img])
        got = predict(model, [img])
    finally:
        model.use_preset("visualize")
    assert 0 < len(expected[2][0]) <= DEFAULT_KEEP_TOP_K
    for g, e in zip(got, expected):
        assert len(g) == 1
        assert_same(g, e)
    assert predict(model, []) == ([], [], [])


@pytest.mark.slow(seconds=5)
def test_evaluate_preset_respects_the_caps(model_and_image, nms_inputs):
    model, img, mb_loc, mb_conf = model_and_image
    assert (scores_of(mb_conf)[:, 1:] >= 0.01).sum(axis=0).min() > DEFAULT_TOP_K
    model.use_preset("evaluate")
    try:
        bboxes, labels, scores = predict(model, [img])
        batch = predict(model, [img, img[:, :200, :150]])
    finally:
        model.use_preset("visualize")
    assert max(nms_inputs) == DEFAULT_TOP_K
    assert len(batch[0]) == 2
    for bbox, label, score in zip(*batch):
        assert_contract(bbox, label, score)
        assert 0 < len(score) <= DEFAULT_KEEP_TOP_K
        assert (score >= 0.01).all()
    # decoded directly, with boxes taken from the 300x300 input frame to the image's pixels
    bbox, label, score = decode_capped(model.coder, mb_loc, mb_conf, 0.45, 0.01)
    assert_same((resize_bbox(bbox, (300, 300), (240, 320)), label, score),
                (bboxes[0], labels[0], scores[0]))


@pytest.mark.slow(seconds=8)
def test_capped_predictor_delegates_and_evaluates(model_and_image):
    model, img, _, _ = model_and_image
    predictor = CappedPredictor(model, top_k=50, keep_top_k=20)
    predictor.use_preset("evaluate")
    try:
        assert (model.score_thresh, model.nms_thresh) == (0.01, 0.45)
        predictor.score_thresh = 0.02
        assert model.score_thresh == 0.02 and predictor.score_thresh == 0.02
        bboxes, labels, scores = predictor.predict([img])
        assert len(scores[0]) == 20
        assert_same((bboxes[0], labels[0], scores[0]),
                    [a[0] for a in predict(model, [img], top_k=50, keep_top_k=20)])
        gt_bbox = np.array([[10, 10, 60, 80]], dtype=np.float32)
        gt_label = np.array([1], dtype=np.int32)
        it = chainer.iterators.SerialIterator([(img, gt_bbox, gt_label)], 1,
                                              repeat=False, shuffle=False)
        result = DetectionVOCEvaluator(it, predictor)()
        assert "main/map" in result
    finally:
        model.use_preset("visualize")


@pytest.mark.gpu
@pytest.mark.skipif(not cuda.available, reason="needs CuPy and a GPU")
def test_cupy_gives_the_numpy_result():
    import cupy
    coder = ssd300_coder()
    mb_loc, mb_conf = network_outputs(coder, seed=1, spread=1.0)
    expected = decode_capped(coder, mb_loc, mb_conf, 0.45, 0.3)
    coder.to_gpu()
    got = decode_capped(coder, cupy.asarray(mb_loc), cupy.asarray(mb_conf), 0.45, 0.3)
    assert all(isinstance(a, cupy.ndarray) for a in got)
    got = [cupy.asnumpy(a) for a in got]
    # GPU NMS rounds IoUs in float32 (rare flips); its softmax may differ in the last bit
    assert abs(len(got[2]) - len(expected[2])) <= 2
    np.testing.assert_allclose(got[2][:20], expected[2][:20], rtol=1e-6, atol=0)
    np.testing.assert_array_equal(got[1][:20], expected[1][:20])
    np.testing.assert_allclose(got[0][:20], expected[0][:20], atol=1e-3)


@pytest.fixture(scope="module")
def blood_image(bccd_root):
    """A real BCCD image as the model takes it: float32 (3, 480, 640), RGB, 0-255."""
    img = read_image(str(bccd_root / "JPEGImages" / "BloodImage_00000.jpg"))
    assert img.shape == (3, 480, 640) and img.dtype == np.float32
    return img


def set_to(where, value):
    def make(img):
        img = img.copy()
        img[where] = value
        return img
    return make


BAD_IMAGES = {
    # id: (the image made wrong from a good one, third in a batch of good ones; DataError.value)
    "hwc": (lambda img: img.transpose(1, 2, 0), (480, 640, 3)),   # PIL, OpenCV
    "one-channel": (lambda img: img[:1], (1, 480, 640)),
    "2-d": (lambda img: img[0], (480, 640)),
    "rgba": (lambda img: np.concatenate([img, img[:1]]), (4, 480, 640)),
    "hwc-gray": (lambda img: img[:1].transpose(1, 2, 0), (480, 640, 1)),
    "hwc-rgba": (lambda img: np.concatenate([img, img[:1]]).transpose(1, 2, 0), (480, 640, 4)),
    "empty": (lambda img: img[:, :0], (3, 0, 640)),
    "1-d": (lambda img: img[0, 0], (640,)),
    "strings": (lambda img: img.astype(str), np.dtype("<U32")),
    "list": (lambda img: img.tolist(), list),
    "pil": (lambda img: Image.fromarray(img.transpose(1, 2, 0).astype(np.uint8)), Image.Image),
    "inf-pixel": (set_to((1, 200, 300), np.inf), np.inf),
    "nan-channel": (set_to(2, np.nan), np.nan),
    "all-nan": (set_to(slice(None), np.nan), np.nan),
    # the batch itself
    "one-image-as-the-batch": (lambda img: img, (3, 480, 640)),
    "none": (lambda img: None, None),
}
BATCHES = ("one-image-as-the-batch", "none")


@pytest.mark.parametrize("case", BAD_IMAGES)
def test_images_of_the_wrong_form_are_named(model_and_image, blood_image, case):
    model, (make, value) = model_and_image[0], BAD_IMAGES[case]
    batch = make(blood_image) if case in BATCHES else [blood_image, blood_image,
                                                       make(blood_image)]
    for call in (lambda imgs: predict(model, imgs), CappedPredictor(model).predict):
        with pytest.raises(DataError) as info:
            call(batch)
        got = info.value.value
        assert info.value.kind == "image"
        assert got == value if value == value else np.isnan(got)


def test_other_forms_of_an_image_give_its_detections(model_and_image, blood_image):
    """uint8 (ChainerCV's _prepare casts to float32), a non-contiguous view, and a
    (B, 3, H, W) array as the batch."""
    model = model_and_image[0]
    as_uint8 = blood_image.astype(np.uint8)     # BCCD pixels are whole numbers already
    np.testing.assert_array_equal(as_uint8, blood_image)
    view = np.ascontiguousarray(blood_image.transpose(1, 2, 0)).transpose(2, 0, 1)
    expected = predict(model, np.stack([blood_image] * 3))
    got = predict(model, [blood_image, as_uint8, view])
    assert len(expected[2][0]) > 0
    for per_image, want in zip(expected + got, expected * 2):
        assert len(per_image) == 3
        for array in per_image:
            np.testing.assert_array_equal(array, want[0])


BAD_SETTINGS = {
    "score_thresh": (np.nan, np.float32(np.nan), -0.1, 1.5, np.inf, "0.5", None, True),
    "nms_thresh": (-1, 0, np.nan, 1.5, np.inf, "0.45", True),
    "top_k": (0, -1, 2.5, "400", True),
    "keep_top_k": (0, -1, 2.5, "400", True),
}


@pytest.mark.parametrize("name, bad", [(name, bad) for name, bads in BAD_SETTINGS.items()
                                       for bad in bads])
def test_settings_outside_their_range_are_named(model_and_image, blood_image, name, bad):
    """A ConfigError's message begins with the setting, as the Python API names it."""
    model = model_and_image[0]
    coder, mb_loc, mb_conf = small_outputs(seed=0)
    calls = [(name, lambda: decode_capped(coder, mb_loc, mb_conf, **{name: bad}))]
    if name.endswith("top_k"):
        calls += [(name, lambda: CappedPredictor(model, **{name: bad})),
                  (name, lambda: predict(model, [blood_image], **{name: bad}))]
    else:
        calls += [(name, lambda: setattr(CappedPredictor(model), name, bad)),
                  (f"model.{name}", lambda: (setattr(model, name, bad),
                                             predict(model, [blood_image])))]
    try:
        for field, call in calls:
            with pytest.raises(ConfigError) as info:
                call()
            assert str(info.value).startswith(f"{field}: ")
            if field == name:       # the model's settings unchanged ('visualize')
                assert (model.score_thresh, model.nms_thresh) == (0.6, 0.45)
    finally:
        model.use_preset("visualize")


@pytest.mark.gpu
@pytest.mark.skipif(not cuda.available, reason="needs CuPy and a GPU")
def test_cupy_images_are_taken_to_the_host():
    import cupy
    img = np.random.RandomState(0).uniform(0, 255, (3, 20, 30)).astype(np.float32)
    checked = predict_mod._check_image(0, cupy.asarray(img))
    assert isinstance(checked, np.ndarray)
    np.testing.assert_array_equal(checked, img)
