"""Two annotations of the same images compared box by box (BCCD's own and TXL-PBC's)."""
import numpy as np
import pytest
from medaidet.errors import ConfigError

from medaidet.data.compare import compare_annotations, draw_both, match_boxes
from medaidet.evaluation.evaluate import paired_bootstrap


def test_match_boxes_pairs_the_closest_boxes_of_one_class_once():
    a = [[0, 0, 10, 10], [0, 0, 10, 12], [50, 50, 60, 60], [80, 80, 90, 90]]
    b = [[0, 0, 10, 12], [50, 50, 60, 60], [80, 80, 90, 90], [200, 200, 210, 210]]
    pairs, only_a, only_b = match_boxes(a, [0, 0, 1, 1], b, [0, 1, 2, 1])
    # a[1] == b[0] (IoU 1) wins over a[0] (IoU 0.83); a[3] and b[2] overlap but differ in class
    assert pairs.tolist() == [[1, 0], [2, 1]]
    assert only_a.tolist() == [0, 3] and only_b.tolist() == [2, 3]
    pairs, only_a, only_b = match_boxes(np.zeros((0, 4)), [], b, [0, 1, 2, 1])
    assert pairs.shape == (0, 2) and only_a.size == 0 and only_b.tolist() == [0, 1, 2, 3]


@pytest.mark.slow(seconds=2)
@pytest.mark.filterwarnings("ignore::medaidet.data.bccd.AnnotationWarning")   # BCCD's defects
def test_the_re_annotation_keeps_bccds_boxes_and_adds_the_cells_it_left_out(bccd_root, txl_root):
    from medaidet.data.bccd import BCCDDataset
    bccd = BCCDDataset(split="test", reannotated_only=True)
    txl = BCCDDataset(split="test", labels="txl-pbc")
    comparison = compare_annotations(bccd, txl, names=("BCCD", "TXL-PBC"))
    table = {row[0]: row[1:] for row in comparison.table().rows}
    # boxes BCCD, boxes TXL-PBC, matched, only BCCD, only TXL-PBC
    assert table == {"rbc": [433, 926, 428, 5, 498], "wbc": [38, 43, 38, 0, 5],
                     "platelets": [31, 37, 30, 1, 7]}
    border = {(row[0], row[1]): row[2:] for row in comparison.by("border").rows}
    assert border["0-2 px", "rbc"] == [1, 333]         # two thirds: cells the border cuts
    assert sum(comparison.per_image("rbc")[i][1] for i in txl.ids) == 926
    img, bbox, label = txl[0]
    _, bbox_b, label_b = bccd[0]
    _, only_txl, only_bccd = match_boxes(bbox, label, bbox_b, label_b)
    fig = draw_both(img, [(bbox_b, label_b, only_bccd), (bbox, label, only_txl)],
                    ("BCCD", "TXL-PBC"))
    assert len(fig.axes) == 2 and len(fig.axes[1].patches) == len(bbox)
    with pytest.raises(ValueError, match="different images"):
        compare_annotations(BCCDDataset(split="val", reannotated_only=True), txl)


class Figures:
    """One number per image, resampled like Predictions (``ids``, ``take``)."""

    def __init__(self, values, ids=None):
        self.values = np.asarray(values, dtype=float)
        self.ids = list(ids if ids is not None else range(len(self.values)))

    def __len__(self):
        return len(self.values)

    def take(self, indices):
        return Figures(self.values[indices], [self.ids[i] for i in indices])


def mean(figures):
    return figures.values.mean()


def test_paired_bootstrap_of_a_detector_with_itself_is_exactly_zero():
    a = Figures(np.random.default_rng(1).normal(size=40))
    assert paired_bootstrap(a, a, mean, n=200) == (0.0, 0.0, 0.0)
    both = paired_bootstrap(a, Figures(a.values.copy()), lambda f: {"mean": mean(f),
                                                                    "max": f.values.max()}, n=50)
    assert both == {"mean": (0.0, 0.0, 0.0), "max": (0.0, 0.0, 0.0)}


def test_paired_bootstrap_gives_a_known_shift_and_sees_what_separate_intervals_miss():
    rng = np.random.default_rng(0)
    hard = rng.normal(0, 1, 40)               # how hard each image is: shared by both detectors
    a, b = Figures(hard), Figures(hard + 0.25)
    assert paired_bootstrap(b, a, mean, n=200) == pytest.approx((0.25, 0.25, 0.25))
    b = Figures(hard + 0.1 + rng.normal(0, 0.05, 40))
    value, low, high = paired_bootstrap(b, a, mean, n=1000)
    assert 0 < low < value < high < 0.2
    # the two separate intervals overlap: they cannot tell the detectors apart
    takes = [rng.integers(0, 40, 40) for _ in range(1000)]
    sep_a = np.percentile([hard[t].mean() for t in takes], (2.5, 97.5))
    sep_b = np.percentile([b.values[t].mean() for t in takes], (2.5, 97.5))
    assert sep_b[0] < sep_a[1]


def test_paired_bootstrap_leaves_nans_out_and_uses_statistic_b():
    a = Figures([1.0, 2.0, 3.0, 4.0])
    nan_when_first_missing = lambda f: f.values.mean() if 0 in f.ids else np.nan
    value, low, high = paired_bootstrap(a, a, nan_when_first_missing, n=100,
                                        statistic_b=lambda f: f.values.mean() - 1)
    assert (value, low, high) == (1.0, 1.0, 1.0)


@pytest.mark.slow(seconds=3)
@pytest.mark.filterwarnings("ignore::medaidet.data.bccd.AnnotationWarning")   # BCCD's defects
def test_paired_bootstrap_on_the_two_annotations_as_detectors(bccd_root, txl_root):
    """Each annotation's boxes as a 'detector' scored against TXL-PBC's."""
    from medaidet.data.bccd import BCCDDataset
    from medaidet.evaluation.count import count_errors
    from medaidet.evaluation.evaluate import Predictions
    bccd = BCCDDataset(split="test", reannotated_only=True)
    txl = BCCDDataset(split="test", labels="txl-pbc")
    boxes_b = txl.slice[:, ("bbox", "label")]
    truth = [boxes_b[i] for i in range(len(txl))]

    def as_detector(dataset):
        boxes = dataset.slice[:, ("bbox", "label")]
        preds = [boxes[i] for i in range(len(dataset))]
        return Predictions(list(dataset.ids), [p[0] for p in preds], [p[1] for p in preds],
                           [np.ones(len(p[1]), np.float32) for p in preds],
                           [t[0] for t in truth], [t[1] for t in truth], None,
                           txl.label_names)

    thresholds = {name: 0.5 for name in txl.label_names}
    result = paired_bootstrap(as_detector(bccd), as_detector(txl),
                              lambda p: count_errors(p, thresholds), n=100)
    per_image = compare_annotations(bccd, txl).per_image("rbc").values()
    expected = sum(abs(a - b) for a, b in per_image) / sum(b for _, b in per_image)
    value, low, high = result["rbc"]
    assert value == pytest.approx(expected) and value > 0.4
    assert 0.2 < low <= value <= high
    assert result["wbc"][0] == pytest.approx(5 / 43)


@pytest.mark.parametrize("iou", [-0.5, 0, 1.5, float("nan"), "x"])
def test_a_meaningless_iou_is_a_named_error(iou):
    with pytest.raises(ConfigError) as info:
        match_boxes([[0, 0, 10, 10]], [0], [[0, 0, 10, 10]], [0], iou_thresh=iou)
    assert str(info.value).startswith("iou_thresh:")


@pytest.mark.parametrize("values, n, field", [([], 10, "predictions"), ([1.0, 2.0], 0, "n")])
def test_no_images_to_compare_or_resample_is_a_named_error(values, n, field):
    with pytest.raises(ConfigError) as info:
        paired_bootstrap(Figures(values), Figures(values), mean, n=n)
    assert str(info.value).startswith(f"{field}:")
