"""The counting frame: which boxes count, on synthetic edge/corner boxes and BCCD's."""
import numpy as np
import pytest

from medaidet.errors import ConfigError
from medaidet.evaluation.count import (densities, frame_area, frame_margins, frame_predictions,
                                       in_frame)
from medaidet.evaluation.evaluate import Predictions

NAMES = ("rbc", "wbc", "platelets")
SIZE = (480, 640)
MARGINS = {"rbc": 40, "wbc": 70, "platelets": 15}


def box(cy, cx, half=10):
    return [cy - half, cx - half, cy + half, cx + half]


@pytest.mark.parametrize("centre, counted", [
    ((240, 320), True),                       # the middle
    ((40, 320), True), ((39.9, 320), False),  # top line: on it counts, above it does not
    ((440, 320), False), ((439.9, 320), True),  # bottom line: on it does not count
    ((240, 40), True), ((240, 39.9), False),
    ((240, 600), False), ((240, 599.9), True),
    ((40, 40), True),
    ((40, 600), False), ((440, 40), False), ((440, 600), False),
    ((0, 0), False), ((480, 640), False),     # the image's own corners
])
def test_a_red_cell_counts_by_its_centre_top_left_in_bottom_right_out(centre, counted):
    assert in_frame([box(*centre)], [0], SIZE, MARGINS, NAMES).tolist() == [counted]


def test_each_class_has_its_own_margin():
    boxes = [box(50, 320), box(50, 320), box(50, 320)]      # 50 px from the top
    assert in_frame(boxes, [0, 1, 2], SIZE, MARGINS, NAMES).tolist() == [True, False, True]


def test_a_sliver_cut_by_the_edge_does_not_count_though_its_box_lies_in_the_image():
    sliver = [0, 300, 12, 340]                # the bottom 12 px of a red cell above the image
    whole = [20, 300, 80, 360]                # a whole cell, centre 50 px from the top
    assert in_frame([sliver, whole], [0, 0], SIZE, MARGINS, NAMES).tolist() == [False, True]


def test_frames_side_by_side_count_every_centre_exactly_once():
    """Two images tiling a field, no margin: a centre on the shared line counts once."""
    rng = np.random.default_rng(0)
    centres = np.column_stack([rng.uniform(0, 480, 300), rng.uniform(0, 1280, 300)])
    centres[:20, 1] = 640
    counted = 0
    for offset in (0, 640):
        boxes = [box(cy, cx - offset, 1) for cy, cx in centres]
        counted += in_frame(boxes, [0] * 300, SIZE, {n: 0 for n in NAMES}, NAMES).sum()
    assert counted == 300


def test_an_empty_image_counts_nothing_and_has_its_frame_area():
    assert in_frame(np.zeros((0, 4)), [], SIZE, MARGINS, NAMES).shape == (0,)
    density = densities([[0, 0, 0]], SIZE, MARGINS, NAMES)
    assert density.tolist() == [[0.0, 0.0, 0.0]]
    assert frame_area(SIZE, 40) == 400 * 560


def test_densities_per_area_and_per_mm2():
    counts = [[56, 1, 2]]
    per_area = densities(counts, SIZE, MARGINS, NAMES)
    assert per_area[0, 0] == pytest.approx(56 / (400 * 560) * 10_000)
    assert per_area[0, 1] == pytest.approx(1 / (340 * 500) * 10_000)
    per_mm2 = densities(counts, SIZE, MARGINS, NAMES, pixel_um=0.5)
    # a pixel of 0.5 um: 4e6 px in a mm^2
    assert per_mm2[0, 0] == pytest.approx(56 / (400 * 560) * 4e6)


def test_a_margin_that_leaves_no_frame_gives_no_density_not_a_division_by_zero():
    density = densities([[3, 0, 0]], SIZE, {"rbc": 240, "wbc": 0, "platelets": 0}, NAMES)
    assert np.isnan(density[0, 0]) and density[0, 1] == 0


@pytest.mark.parametrize("margins, argument", [
    ({"rbc": 40, "wbc": 70}, "margins"),                       # a class without a margin
    ({"rbc": -1, "wbc": 70, "platelets": 15}, "margins['rbc']"),
    ({"rbc": float("nan"), "wbc": 70, "platelets": 15}, "margins['rbc']"),
])
def test_a_wrong_margin_is_a_named_error(margins, argument):
    with pytest.raises(ConfigError) as info:
        in_frame([box(240, 320)], [0], SIZE, margins, NAMES)
    assert str(info.value).startswith(f"{argument}:")


def test_framed_predictions_keep_the_same_boxes_on_both_sides_and_count_the_frame():
    gt = np.array([box(240, 320), box(5, 320), box(240, 630)], np.float32)
    pred = np.array([box(241, 321), box(6, 321)], np.float32)
    preds = Predictions(["a"], [pred], [np.array([0, 0], np.int32)],
                        [np.array([0.9, 0.8], np.float32)], [gt],
                        [np.array([0, 0, 0], np.int32)], None, NAMES)
    framed = frame_predictions(preds, SIZE, MARGINS)
    assert len(framed.pred_bboxes[0]) == 1 and len(framed.gt_bboxes[0]) == 1
    assert framed.pred_scores[0].tolist() == pytest.approx([0.9])
    assert framed.gt_difficults[0].tolist() == [False]
    with pytest.raises(ConfigError):
        frame_predictions(preds, [SIZE, SIZE], MARGINS)


@pytest.mark.filterwarnings("ignore::medaidet.data.bccd.AnnotationWarning")
def test_margins_from_bccd_train_boxes_keep_a_counted_cell_whole(bccd_root):
    """Margins from train boxes: >= 95 % of the boxes whose centre counts lie wholly inside."""
    from medaidet.data.bccd import BCCDDataset

    train = BCCDDataset(bccd_root, "train")
    boxes = train.slice[:, ("bbox", "label")]
    margins = frame_margins([b for b, _ in boxes], [lb for _, lb in boxes], NAMES)
    assert margins["platelets"] < margins["rbc"] < margins["wbc"]
    inside = total = 0
    for bbox, label in boxes:
        keep = in_frame(bbox, label, SIZE, margins, NAMES)
        whole = ((bbox[:, 0] > 0) & (bbox[:, 1] > 0) & (bbox[:, 2] < SIZE[0] - 1)
                 & (bbox[:, 3] < SIZE[1] - 1))
        inside += (keep & whole).sum()
        total += keep.sum()
    assert total > 0 and inside / total >= 0.95


def test_the_frame_figure_marks_each_box_counted_or_not_in_its_class_panel():
    from matplotlib.patches import Rectangle

    from medaidet.colors import CLASS_COLORS
    from medaidet.evaluation.count import plot_frame

    img = np.full((3, *SIZE), 200, np.float32)
    bbox = np.array([box(240, 320), box(5, 320), box(240, 320, 30), box(240, 630)], np.float32)
    label = np.array([0, 0, 1, 2])
    fig = plot_frame(img, bbox, label, MARGINS, NAMES)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["rbc: 1 counted, 1 not (margin 40 px)",
                      "wbc: 1 counted, 0 not (margin 70 px)",
                      "platelets: 0 counted, 1 not (margin 15 px)"]
    rbc = [p for p in fig.axes[0].patches if isinstance(p, Rectangle)]
    frame, counted, left_out = rbc
    assert frame.get_linestyle() == "--" and (frame.get_x(), frame.get_y()) == (40, 40)
    assert counted.get_edgecolor()[:3] == pytest.approx(
        tuple(int(CLASS_COLORS["rbc"][i:i + 2], 16) / 255 for i in (1, 3, 5)))
    assert left_out.get_linestyle() == "-."
    assert left_out.get_edgecolor()[:3] != counted.get_edgecolor()[:3]


def test_frame_errors_say_which_detection_or_box_each_count_error_is():
    from medaidet.evaluation.count import frame_errors

    gt = np.array([box(240, 320), box(45, 320), box(240, 100), box(300, 300)], np.float32)
    pred = np.array([box(241, 321), box(38, 320), box(100, 500), box(302, 302)], np.float32)
    # pred 1 matches gt 1 across the top line (centre 38 < 40, gt's 45); pred 2 is false;
    # gt 2 is found by nothing; pred 3 (0.3, under the threshold) leaves gt 3 missed
    preds = Predictions(["a"], [pred], [np.zeros(4, np.int32)],
                        [np.array([0.9, 0.8, 0.7, 0.3], np.float32)], [gt],
                        [np.zeros(4, np.int32)], None, NAMES)
    errors = frame_errors(preds, {n: 0.5 for n in NAMES}, SIZE, MARGINS)
    kinds = sorted((e.kind, round(e.score, 2)) for e in errors)
    assert kinds == [("false", 0.7), ("line -", 0.8), ("missed", 0.0), ("missed", 0.3)]
    assert all(e.index == 0 and e.label == 0 for e in errors)


def test_frame_errors_add_up_to_the_framed_count_error():
    """Per image and class, (line +) - (line -) + false - missed is the framed count error."""
    from medaidet.evaluation.count import per_image_counts
    from medaidet.evaluation.count import frame_errors

    rng = np.random.default_rng(1)
    ids, pb, pl, ps, gb, gl = [], [], [], [], [], []
    for i in range(30):          # half the cells within 10 px of a class's top or left line
        centres = np.column_stack([rng.uniform(0, 480, 12), rng.uniform(0, 640, 12)])
        near = rng.random(12) < 0.5
        centres[near, rng.integers(0, 2)] = (rng.choice([15, 40, 70], near.sum())
                                             + rng.normal(0, 5, near.sum()))
        labels = rng.integers(0, 3, 12)
        gt = np.array([box(cy, cx, 20) for cy, cx in centres], np.float32)
        found = rng.random(12) < 0.8
        jitter = rng.normal(0, 8, (12, 2))
        det = np.array([box(cy + dy, cx + dx, 20) for (cy, cx), (dy, dx)
                        in zip(centres[found], jitter[found])] + [box(240, 320, 20)], np.float32)
        ids.append(str(i)); gb.append(gt); gl.append(labels.astype(np.int32))
        pb.append(det); pl.append(np.append(labels[found], 2).astype(np.int32))
        ps.append(rng.uniform(0.2, 1, len(det)).astype(np.float32))
    preds = Predictions(ids, pb, pl, ps, gb, gl, None, NAMES)
    thresholds = {"rbc": 0.5, "wbc": 0.4, "platelets": 0.6}
    framed = frame_predictions(preds, SIZE, MARGINS).filter(thresholds)
    error = (per_image_counts(framed.pred_labels, 3) - per_image_counts(framed.gt_labels, 3))
    signed = np.zeros_like(error)
    sign = {"line +": 1, "line -": -1, "false": 1, "missed": -1}
    errors = frame_errors(preds, thresholds, SIZE, MARGINS)
    for e in errors:
        signed[e.index, e.label] += sign[e.kind]
    assert np.abs(error).sum() > 0 and {e.kind for e in errors} == set(sign)
    np.testing.assert_array_equal(signed, error)
