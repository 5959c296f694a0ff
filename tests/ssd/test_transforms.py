"""The SSD training transform: the course's recipe, and that it cannot emit invalid targets.
``MEDAIDET_PROPERTY_RUNS`` (default 1) multiplies the property tests' seeds."""
import os
import pickle
import random
import warnings

import numpy as np
import pytest
from chainercv import transforms as cvt
from chainercv.links import SSD300

import medaidet.ssd.transforms as T
from medaidet.data.bccd import BCCDDataset
from medaidet.errors import DataError
from medaidet.ssd.transforms import (
    EncodeTransform, TrainTransform, check_sample, recheck_boxes)

RUNS = max(1, int(os.environ.get("MEDAIDET_PROPERTY_RUNS", "1")))
SIZE = 300
N_FG = 3
# (split, id): most border boxes (9), smallest box (20 px), loader-dropped zero-area boxes (2)
REAL = [("train", "BloodImage_00046"), ("train", "BloodImage_00408"),
        ("train", "BloodImage_00343"), ("val", "BloodImage_00338")]


@pytest.fixture(scope="module")
def model():
    return SSD300(n_fg_class=N_FG)


@pytest.fixture(scope="module")
def real_samples(bccd_root):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        datasets = {split: BCCDDataset(bccd_root, split) for split in ("train", "val")}
    return [datasets[split][datasets[split].ids.index(image_id)] for split, image_id in REAL]


@pytest.fixture
def transform(model):
    return TrainTransform.for_model(model)


@pytest.fixture
def geometry_only(monkeypatch):
    """Pixel operations that draw the same random numbers (same geometry), without the work."""
    def distort(img):
        return img

    def resize(img, size):
        random.choice(range(5))            # ChainerCV's five interpolations
        return np.zeros((img.shape[0],) + tuple(size), dtype=np.float32)

    monkeypatch.setattr(T, "random_distort", distort)
    monkeypatch.setattr(T, "resize_with_random_interpolation", resize)


def assert_valid_boxes(bbox, label, size=SIZE, min_size=T.DEFAULT_MIN_SIZE):
    assert bbox.dtype == np.float32 and bbox.ndim == 2 and bbox.shape[1] == 4
    assert label.dtype == np.int32 and label.shape == (len(bbox),)
    assert np.isfinite(bbox).all()
    assert (bbox >= 0).all() and (bbox <= size).all()
    assert (bbox[:, 2:] - bbox[:, :2] >= min_size).all()
    assert ((label >= 0) & (label < N_FG)).all()


def assert_valid_targets(mb_loc, mb_label, n_prior):
    assert mb_loc.shape == (n_prior, 4) and mb_loc.dtype == np.float32
    assert mb_label.shape == (n_prior,) and mb_label.dtype == np.int32
    assert ((mb_label >= 0) & (mb_label <= N_FG)).all()
    assert np.isfinite(mb_loc[mb_label > 0]).all()


def assert_stats_add_up(stats):
    assert stats.boxes_in == (stats.degenerate_input + stats.cropped_out + stats.too_small
                              + stats.non_finite + stats.boxes_out)


def test_output_of_one_real_sample(transform, model, real_samples):
    img, bbox, label = real_samples[0]
    random.seed(0)
    out_img, mb_loc, mb_label = transform((img, bbox, label))
    assert out_img.shape == (3, SIZE, SIZE) and out_img.dtype == np.float32
    # the mean is subtracted: pixel values are 0-255 (a little more after Lanczos/cubic)
    restored = out_img + model.mean
    assert -40 < restored.min() and restored.max() < 300 and restored.max() > 100
    n_prior = len(model.coder._default_bbox)
    assert n_prior == 8732
    assert_valid_targets(mb_loc, mb_label, n_prior)
    assert (mb_label > 0).any()
    assert transform.stats.samples == 1 and transform.stats.boxes_in == len(bbox)


def test_for_model_takes_the_models_settings(model):
    transform = TrainTransform.for_model(model, min_size=2)
    assert transform.size == model.insize == SIZE
    assert transform.n_fg_class == N_FG and transform.min_size == 2
    np.testing.assert_array_equal(transform.mean, model.mean)
    assert transform.coder is not model.coder           # a CPU copy
    assert transform.coder._default_bbox is model.coder._default_bbox   # still on CPU


def test_same_seed_same_augmentation_other_seeds_vary(transform, real_samples):
    outputs = []
    for _ in range(2):
        random.seed(123)
        outputs.append([transform(sample) for sample in real_samples[:2]])
    for first, second in zip(*outputs):
        for a, b in zip(first, second):
            np.testing.assert_array_equal(a, b)
    random.seed(5)
    boxes = {tuple(np.round(transform.augment(*real_samples[0])[1][:1].ravel(), 3))
             for _ in range(8)}
    assert len(boxes) > 4


@pytest.fixture
def no_crop(monkeypatch):
    """The random crop keeps the whole image."""
    monkeypatch.setattr(T, "random_crop_with_bbox_constraints", lambda img, bbox, return_param: (
        img, {"y_slice": slice(0, img.shape[1]), "x_slice": slice(0, img.shape[2])}))


def test_without_color_distortion_the_pixels_keep_their_colours(model, monkeypatch, no_crop):
    calls = []
    monkeypatch.setattr(T, "random_distort", lambda img: calls.append(1) or img * 0.5)
    img = np.broadcast_to(np.float32([200, 120, 180])[:, None, None], (3, 120, 160)).copy()
    bbox, label = np.array([[30, 40, 60, 100]], dtype=np.float32), np.array([1])
    for distort, expected in [(False, [200, 120, 180]), (True, [100, 60, 90])]:
        t = TrainTransform.for_model(model, expand_probability=0, color_distortion=distort)
        out, _, _ = t.augment(img, bbox, label)
        np.testing.assert_allclose(out.mean(axis=(1, 2)), expected, atol=0.5)
    assert len(calls) == 1


def test_boxes_follow_the_image_without_expansion_or_crop(transform, monkeypatch, no_crop):
    """A box drawn as a bright rectangle stays on it through resize and flip."""
    img = np.zeros((3, 120, 160), dtype=np.float32)
    img[:, 30:60, 40:100] = 255
    bbox = np.array([[30, 40, 60, 100]], dtype=np.float32)
    monkeypatch.setattr(T, "random_distort", lambda x: x)
    transform.expand_probability = 0
    flipped = set()
    for seed in range(8):
        random.seed(seed)
        out, out_bbox, out_label = transform.augment(img, bbox, np.array([1]))
        y0, x0, y1, x1 = np.round(out_bbox[0]).astype(int)
        assert out[0, y0 + 3:y1 - 3, x0 + 3:x1 - 3].min() > 200
        assert out[0].sum() / 255 == pytest.approx((y1 - y0) * (x1 - x0), rel=0.05)
        assert out_label.tolist() == [1]
        flipped.add((x0 + x1) / 2 > 150)
    assert flipped == {True, False}


@pytest.mark.slow(seconds=13)
def test_property_real_samples(transform, real_samples, geometry_only):
    n_prior = len(transform.coder._default_bbox)
    positives = 0
    runs = 0
    for seed in range(250 * RUNS):
        random.seed(seed)
        for img, bbox, label in real_samples:
            out_img, out_bbox, out_label = transform.augment(img, bbox, label)
            assert out_img.shape == (3, SIZE, SIZE)
            assert_valid_boxes(out_bbox, out_label)
            mb_loc, mb_label = transform.coder.encode(out_bbox, out_label)
            assert_valid_targets(mb_loc, mb_label, n_prior)
            positives += int((mb_label > 0).sum())
            runs += 1
    stats = transform.stats
    assert runs >= 1000 and stats.samples == runs
    assert_stats_add_up(stats)
    assert positives > 10 * runs and stats.boxes_out > 5 * runs
    assert stats.cropped_out > 0             # the crop removed boxes, as SSD's does


def test_property_real_pixels(transform, real_samples):
    n_prior = len(transform.coder._default_bbox)
    for seed in range(12 * RUNS):
        random.seed(10_000 + seed)
        for sample in real_samples:
            out_img, mb_loc, mb_label = transform(sample)
            assert out_img.shape == (3, SIZE, SIZE) and np.isfinite(out_img).all()
            assert_valid_targets(mb_loc, mb_label, n_prior)
    assert_stats_add_up(transform.stats)


def adversarial_boxes(rng, height, width):
    """Boxes an augmentation can turn into slivers, in (y_min, x_min, y_max, x_max)."""
    h, w = height, width
    fixed = [
        [0, 0, h, w],                      # the whole image
        [0, 0, 1, 1], [h - 1, w - 1, h, w], [0, w - 1, 1, w], [h - 1, 0, h, 1],  # 1-px corners
        [0, 0, 0.5, w], [h - 0.5, 0, h, w], [0, 0, h, 0.25], [0, w - 0.3, h, w],  # edge slivers
        [h / 2, w / 2, h / 2 + 1, w / 2 + 1],                                    # 1-px centre
        [h / 3, 10, h / 3 + 1e-3, w - 10],                                        # sub-pixel
        [10, w / 4, h - 10, w / 4 + 0.01],
        [-4, -4, 8, 8], [h - 6, w - 6, h + 3, w + 3],                             # overhanging
        [0, 0, 0, 20], [5, 5, 30, 5],                                             # zero size
    ]
    n = 12
    y = rng.uniform(0, h - 2, n)
    x = rng.uniform(0, w - 2, n)
    size = rng.uniform(0.05, 2, (n, 2))
    random_boxes = np.stack([y, x, y + size[:, 0], x + size[:, 1]], axis=1)
    bbox = np.concatenate([np.array(fixed, dtype=np.float64), random_boxes]).astype(np.float32)
    label = rng.integers(0, N_FG, len(bbox)).astype(np.int32)
    return bbox, label


@pytest.mark.slow(seconds=7)
def test_property_adversarial_boxes(transform, real_samples, geometry_only):
    n_prior = len(transform.coder._default_bbox)
    rng = np.random.default_rng(0)
    for seed in range(250 * RUNS):
        random.seed(20_000 + seed)
        img, real_bbox, real_label = real_samples[seed % len(real_samples)]
        bbox, label = adversarial_boxes(rng, *img.shape[1:])
        if seed % 2:                       # on their own, and among the real boxes
            bbox = np.concatenate([real_bbox, bbox])
            label = np.concatenate([real_label, label])
        out_img, out_bbox, out_label = transform.augment(img, bbox, label)
        assert_valid_boxes(out_bbox, out_label)
        mb_loc, mb_label = transform.coder.encode(out_bbox, out_label)
        assert_valid_targets(mb_loc, mb_label, n_prior)
    stats = transform.stats
    assert_stats_add_up(stats)
    assert stats.degenerate_input == 2 * 250 * RUNS       # the two zero-size boxes
    assert stats.too_small > 250 * RUNS                   # the re-check did drop slivers
    assert stats.dropped == stats.too_small and stats.non_finite == 0


def test_labels_stay_with_their_boxes(transform, geometry_only):
    img = np.zeros((3, 480, 640), dtype=np.float32)
    bbox = np.array([[100, 100, 101, 300],      # class 0: 1 px tall, 200 wide
                     [200, 200, 300, 400],      # class 1: large
                     [50, 400, 60, 405]],       # class 2: 10 tall, 5 wide
                    dtype=np.float32)
    label = np.array([0, 1, 2], dtype=np.int32)
    kept = []
    for seed in range(200):
        random.seed(seed)
        _, out_bbox, out_label = transform.augment(img, bbox, label)
        assert len(out_bbox) == len(out_label)
        for box, cls in zip(out_bbox, out_label):
            h, w = box[2] - box[0], box[3] - box[1]
            assert {0: w > 20 * h, 1: h > 10 and w > 10, 2: h > w / 2 and w < 20}[int(cls)]
            kept.append(int(cls))
    assert set(kept) == {0, 1, 2}
    assert transform.stats.too_small > 0 and kept.count(0) < kept.count(1)


def test_recheck_boxes_clips_drops_and_keeps_labels_aligned():
    bbox = np.array([
        [10, 10, 50, 50],          # fine
        [-3, 5, 20, 305],          # overhangs: clipped to [0, 5, 20, 300]
        [100, 100, 100.5, 200],    # 0.5 px tall: dropped
        [np.nan, 0, 10, 10],       # not finite: dropped
        [290, 299.5, 310, 320],    # clipped to 0.5 px wide: dropped
        [0, 0, 300, 300],          # the whole image
        [7, 7, 8, 8],              # exactly min_size: kept
        [1, 1, np.inf, 5],         # not finite: dropped
    ], dtype=np.float32)
    label = np.array([0, 1, 2, 0, 1, 2, 1, 0], dtype=np.int32)
    checked = recheck_boxes(bbox, label, (300, 300), N_FG, min_size=1)
    np.testing.assert_array_equal(checked.keep, [1, 1, 0, 0, 0, 1, 1, 0])
    np.testing.assert_array_equal(checked.label, [0, 1, 2, 1])
    np.testing.assert_array_equal(checked.bbox, [[10, 10, 50, 50], [0, 5, 20, 300],
                                                 [0, 0, 300, 300], [7, 7, 8, 8]])
    assert checked.bbox.dtype == np.float32 and checked.label.dtype == np.int32
    assert (checked.too_small, checked.non_finite, checked.clipped) == (2, 2, 1)
    assert recheck_boxes(bbox, label, (300, 300), N_FG, min_size=2).keep[6] == 0


def relabelled(sample, bad):
    """``sample``'s boxes with box 4 labelled ``bad``."""
    img, bbox, label = sample
    label = label.copy()
    label[4] = bad
    return bbox, label


def checked(bbox, label, shape=(3, 40, 40)):
    """``check_sample`` of an image of ``shape``."""
    return lambda t, s: check_sample(np.zeros(shape, np.float32), np.array(bbox, np.float32),
                                     np.array(label), N_FG)


WRONG = {
    # id: (call(transform, a real sample), the DataError's kind and fields; {}: a ValueError)
    **{f"label-{bad}{via}": (call, dict(kind="label_range", box_index=4, value=bad))
       for bad in (3, -1, 7) for via, call in [
           ("", lambda t, s, bad=bad: t((s[0], *relabelled(s, bad)))),
           ("-recheck", lambda t, s, bad=bad: recheck_boxes(*relabelled(s, bad), (480, 640),
                                                            N_FG))]},
    "label-float": (checked([[0, 0, 5, 5]], [0.0]), dict(kind="label_dtype", value=np.float64)),
    "label-bool": (checked([[0, 0, 5, 5]], [True]), dict(kind="label_dtype", value=bool)),
    "more-labels": (checked([[0, 0, 5, 5]], [0, 1]), dict(kind="shape")),
    "box-of-3": (checked([[0, 0, 5]], [0]), dict(kind="shape")),
    "inf-box": (checked([[0, 0, 5, np.inf]], [0]),
                dict(kind="non_finite_box", box_index=0, value=[0, 0, 5, np.inf])),
    "reversed-box": (checked([[0, 0, 5, 5], [10, 20, 5, 30]], [0, 1]),
                     dict(kind="reversed_box", box_index=1, value=[10, 20, 5, 30])),
    "hwc-image": (checked(np.zeros((0, 4)), np.zeros(0, int), (40, 40, 3)), dict(kind="image")),
    "min_size-0": (lambda t, s: TrainTransform(t.coder, SIZE, t.mean, min_size=0), {}),
    "n_fg_class-0": (lambda t, s: TrainTransform(t.coder, SIZE, t.mean, n_fg_class=0), {}),
}


@pytest.mark.parametrize("call, fields", WRONG.values(), ids=list(WRONG))
def test_wrong_samples_and_settings_raise(transform, real_samples, call, fields):
    with pytest.raises(DataError if fields else ValueError) as info:
        call(transform, real_samples[0])
    assert {name: getattr(info.value, name) for name in fields} == fields


def test_zero_size_input_box_dropped_before_augmenting_and_no_box_is_fine(transform,
                                                                          real_samples):
    img = np.zeros((3, 40, 40), np.float32)
    bbox = np.array([[0, 0, 10, 10], [5, 5, 5, 20], [1, 1, 30, 1]], np.float32)
    out_bbox, out_label, keep = check_sample(img, bbox, np.array([2, 1, 0]), N_FG)
    assert keep.tolist() == [True, False, False] and out_label.tolist() == [2]
    random.seed(0)
    transform((img, bbox, np.array([2, 1, 0], np.int32)))
    assert transform.stats.degenerate_input == 2
    random.seed(1)
    out_img, mb_loc, mb_label = transform(
        (real_samples[0][0], np.zeros((0, 4), np.float32), np.zeros(0, np.int32)))
    assert out_img.shape == (3, SIZE, SIZE)
    assert (mb_label == 0).all() and np.isfinite(mb_loc).all()


def test_stats_reset_and_pickle(transform, real_samples):
    random.seed(2)
    transform(real_samples[1])
    assert transform.stats.samples == 1
    copy = pickle.loads(pickle.dumps(transform))     # as MultiprocessIterator does
    random.seed(2)
    copy(real_samples[1])
    assert copy.stats.samples == 2
    old = transform.reset_stats()
    assert old.samples == 1 and transform.stats.samples == 0
    assert set(old.to_dict()) >= {"samples", "boxes_in", "boxes_out", "dropped",
                                  "too_small", "non_finite", "cropped_out"}


def test_encode_transform_is_resize_and_encode(model, real_samples):
    transform = EncodeTransform.for_model(model)
    img, bbox, label = real_samples[1]
    out_img, mb_loc, mb_label = transform((img, bbox, label))
    again = transform((img, bbox, label))
    for a, b in zip((out_img, mb_loc, mb_label), again):
        np.testing.assert_array_equal(a, b)
    expected_img = cvt.resize(img, (SIZE, SIZE)) - model.mean
    np.testing.assert_allclose(out_img, expected_img, atol=1e-4)
    expected = model.coder.encode(cvt.resize_bbox(bbox, img.shape[1:], (SIZE, SIZE)), label)
    np.testing.assert_array_equal(mb_loc, expected[0])
    np.testing.assert_array_equal(mb_label, expected[1])
    assert transform.stats.boxes_out == 2 * len(bbox)
