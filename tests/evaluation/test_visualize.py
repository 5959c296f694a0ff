"""VOC matching vs ChainerCV, detections drawn on BCCD test images, box sizes found/missed."""
import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from medaidet.errors import ConfigError  # noqa: E402
from medaidet.evaluation.analysis import (STYLES, draw_detections, gt_box_sizes,  # noqa: E402
                                          match_detections, plot_box_sizes, plot_detections)
from medaidet.evaluation.count import count_cells  # noqa: E402
from medaidet.evaluation.evaluate import Predictions  # noqa: E402

NAMES = ("rbc", "wbc", "platelets")
RBC, WBC, PLT = 0, 1, 2


def boxes(*rows):
    return np.array(rows, dtype=np.float32).reshape(-1, 4)


def match(pred, gt, **kwargs):
    """pred: [(box, label, score)], gt: [(box, label)]."""
    return match_detections(boxes(*[p[0] for p in pred]), np.int32([p[1] for p in pred]),
                            np.float32([p[2] for p in pred]), boxes(*[g[0] for g in gt]),
                            np.int32([g[1] for g in gt]), **kwargs)


# VOC matching at IoU 0.5: preds [(box, label, score)], gt [(box, label)], then the expected
# tp and fp (per prediction) and matched_by (per box: the prediction that found it, or -1)
MATCHES = {
    "perfect": ([((10, 10, 50, 50), RBC, 0.9)], [((10, 10, 50, 50), RBC)],
                [True], [False], [0]),
    # 21x21 pixel boxes (VOC's +1) shifted by 10: IoU 11*21 / (2*441 - 231) = 0.35
    "shifted_below_iou": ([((0, 10, 20, 30), RBC, 0.9)], [((0, 0, 20, 20), RBC)],
                          [False], [True], [-1]),
    # shifted by 5: IoU 16*21 / (2*441 - 336) = 0.62: a match
    "shifted_above_iou": ([((0, 5, 20, 25), RBC, 0.9)], [((0, 0, 20, 20), RBC)],
                          [True], [False], [0]),
    # two on one box, the lower-scoring one listed first: the higher score wins
    "higher_score_wins": ([((11, 10, 50, 50), WBC, 0.6), ((10, 10, 50, 50), WBC, 0.8)],
                          [((10, 10, 50, 50), WBC)], [False, True], [True, False], [1]),
    "class_mismatch": ([((10, 10, 50, 50), WBC, 0.9)], [((10, 10, 50, 50), RBC)],
                       [False], [True], [-1]),
    # VOC's greedy rule: a detection whose best box is taken is an FP, though B is free
    "best_box_taken": ([((0, 0, 40, 40), RBC, 0.9), ((0, 4, 40, 44), RBC, 0.8)],
                       [((0, 0, 40, 40), RBC), ((0, 12, 40, 52), RBC)],
                       [True, False], [False, True], [0, -1]),
}


@pytest.mark.parametrize("case", MATCHES)
def test_matching_outcomes(case):
    pred, gt, tp, fp, matched_by = MATCHES[case]
    m = match(pred, gt)
    assert (m.tp.tolist(), m.fp.tolist(), m.matched_by.tolist()) == (tp, fp, matched_by)
    assert m.missed.tolist() == [i < 0 for i in matched_by]


def test_score_threshold_is_inclusive_and_drops_low_scores_from_matching():
    pred, gt = [((10, 10, 50, 50), PLT, 0.4)], [((10, 10, 50, 50), PLT)]
    low = match(pred, gt, score_thresh=0.5)
    assert low.kept.tolist() == [False]
    assert not low.tp.any() and not low.fp.any() and low.missed.tolist() == [True]
    at = match(pred, gt, score_thresh=np.float32(0.4))
    assert at.tp.tolist() == [True] and at.missed.tolist() == [False]
    m = match([((10, 10, 50, 50), PLT, 0.3), ((10, 10, 50, 50), PLT, 0.7)], gt)
    assert m.tp.tolist() == [False, True] and m.fp.tolist() == [False, False]


def test_difficult_boxes_are_ignored_not_missed():
    m = match([((10, 10, 50, 50), RBC, 0.9), ((100, 100, 140, 140), RBC, 0.8)],
              [((10, 10, 50, 50), RBC), ((200, 200, 240, 240), RBC)],
              gt_difficult=np.array([True, True]))
    assert m.ignored.tolist() == [True, False] and m.fp.tolist() == [False, True]
    assert not m.tp.any() and not m.missed.any()


def test_no_predictions_or_no_boxes():
    m = match_detections(np.zeros((0, 4), np.float32), [], [], boxes((0, 0, 9, 9)), [RBC])
    assert m.missed.tolist() == [True] and m.tp.shape == (0,)
    m = match_detections(boxes((0, 0, 9, 9)), [WBC], [0.9], [], [])
    assert m.fp.tolist() == [True] and m.missed.shape == (0,)
    with pytest.raises(ConfigError) as info:           # 2 boxes, 1 label
        match_detections(boxes((0, 0, 9, 9), (1, 1, 9, 9)), [0], [0.9, 0.8], [], [])
    assert str(info.value).startswith("match_detections: ")


@pytest.fixture(scope="module")
def test_split(bccd_root):
    from medaidet.data.bccd import AnnotationWarning, BCCDDataset
    with pytest.warns(AnnotationWarning, match="BloodImage_00284"):   # a box drawn twice
        return BCCDDataset(bccd_root, "test", use_difficult=True)


def known_predictions(dataset, n_images=4):
    """Per image: rbc/wbc exact (TP), platelets missed, one FP rbc, one rbc scoring 0.2."""
    pb, pl, ps, gb, gl = [], [], [], [], []
    for i in range(n_images):
        bbox, label = dataset.slice[:, ("bbox", "label")][i]
        cells = label != PLT
        pb.append(np.concatenate([bbox[cells], boxes((0, 0, 5, 5), (100, 100, 160, 160))]))
        pl.append(np.concatenate([label[cells], [RBC, RBC]]).astype(np.int32))
        ps.append(np.concatenate([np.linspace(0.99, 0.6, cells.sum()), [0.9, 0.2]])
                  .astype(np.float32))
        gb.append(bbox)
        gl.append(label)
    return Predictions(list(dataset.ids[:n_images]), pb, pl, ps, gb, gl, None, NAMES, 0.01,
                       "test")


def styled(ax):
    """kind -> number of rectangles drawn in that kind's colour and line style."""
    out = {}
    for kind, style in STYLES.items():
        out[kind] = sum(1 for p in ax.patches if isinstance(p, Rectangle)
                        and to_hex(p.get_edgecolor()) == to_hex(style["edgecolor"])
                        and p.get_linestyle() == style["linestyle"] and not p.get_fill())
    return out


def test_draw_detections_on_a_real_test_image(test_split):
    preds = known_predictions(test_split, 1)
    img = test_split.slice[:, "img"][0]
    label = preds.gt_labels[0]
    n_cells, n_plt = int((label != PLT).sum()), int((label == PLT).sum())
    fig = Figure()
    ax = fig.subplots()
    m = draw_detections(ax, img, preds.pred_bboxes[0], preds.pred_labels[0],
                        preds.pred_scores[0], preds.gt_bboxes[0], label, NAMES,
                        score_thresh=0.5, title=preds.ids[0])
    assert styled(ax) == {"tp": n_cells, "fp": 1, "missed": n_plt}
    assert len(ax.patches) == n_cells + 1 + n_plt
    assert (m.n_tp, m.n_fp, m.n_missed) == (n_cells, 1, n_plt)
    assert ax.images[0].get_array().shape == (*img.shape[1:], 3)
    counts = count_cells(preds, 0.5)
    expected = " · ".join(f"{n} {counts.predicted[0, l]}/{counts.annotated[0, l]}"
                          for l, n in enumerate(NAMES))
    assert ax.get_title() == f"{preds.ids[0]}\n{expected}"
    tags = [t.get_text() for t in ax.texts]
    assert tags.count("P") == n_plt and tags.count("R") == int((label == RBC).sum()) + 1
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [f"true positive ({n_cells})", "false positive (1)",
                      f"missed (annotated) ({n_plt})"]
    fig.savefig(__import__("io").BytesIO(), format="png")


def test_plot_detections_grid_and_class_filter(test_split):
    preds = known_predictions(test_split, 4)
    fig = plot_detections(preds, n=4, label_names=NAMES, dataset=test_split, ncols=2)
    assert isinstance(fig, Figure)
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 4
    for ax, image_id, gt in zip(panels, preds.ids, preds.gt_labels):
        assert ax.get_title().startswith(image_id + "\n")
        assert styled(ax) == {"tp": int((gt != PLT).sum()), "fp": 1,
                              "missed": int((gt == PLT).sum())}
    n_plt = sum(int((g == PLT).sum()) for g in preds.gt_labels)
    assert n_plt > 0
    assert [t.get_text() for t in fig.legends[0].get_texts()][2] == \
        f"missed (annotated) ({n_plt})"

    only = plot_detections(preds, indices=list(preds.ids[:4]), dataset=test_split,
                           class_filter="platelets")
    panels = [ax for ax in only.axes if ax.images]
    assert sum(styled(ax)["missed"] for ax in panels) == n_plt
    assert all(styled(ax)["tp"] == styled(ax)["fp"] == 0 for ax in panels)
    for ax, gt in zip(panels, preds.gt_labels):
        assert ax.get_title().split("\n")[1] == f"platelets 0/{int((gt == PLT).sum())}"
    assert "platelets only" in only.get_suptitle()

    worst = plot_detections(preds, n=2, dataset=test_split, class_filter=PLT, sort_by="missed")
    shown = [ax.get_title().split("\n")[0] for ax in worst.axes if ax.images]
    n_missed = {i: int((g == PLT).sum()) for i, g in zip(preds.ids, preds.gt_labels)}
    assert [n_missed[i] for i in shown] == sorted(n_missed.values(), reverse=True)[:2]


def test_plot_detections_takes_a_threshold_per_class(test_split):
    preds = known_predictions(test_split, 2)
    low = plot_detections(preds, n=2, dataset=test_split, score_thresh=0.1)
    per_class = plot_detections(preds, n=2, dataset=test_split,
                                score_thresh={"rbc": 0.1, "wbc": 1.0, "platelets": 0.5})
    assert "scores >= rbc 0.1, wbc 1, platelets 0.5" in per_class.get_suptitle()
    for ax_low, ax, gt in zip([a for a in low.axes if a.images],
                              [a for a in per_class.axes if a.images], preds.gt_labels):
        n_wbc, n_plt = int((gt == WBC).sum()), int((gt == PLT).sum())
        # no white cell reaches 1.0
        assert styled(ax) == {"tp": styled(ax_low)["tp"] - n_wbc, "fp": styled(ax_low)["fp"],
                              "missed": n_plt + n_wbc}


def test_plot_detections_refuses_bad_arguments(test_split):
    preds = known_predictions(test_split, 2)
    for field, bad in (("class_filter", "neutrophil"), ("indices", [5]), ("sort_by", "worst")):
        with pytest.raises(ConfigError) as info:
            plot_detections(preds, dataset=test_split, **{field: bad})
        assert str(info.value).startswith(f"{field}: ")


def test_gt_box_sizes_found_vs_missed_on_real_boxes(test_split, bccd_root):
    from medaidet.data.bccd import image_path
    from medaidet.data.image import read_image_size

    preds = known_predictions(test_split, len(test_split))
    sizes = gt_box_sizes(preds, root=bccd_root)
    n_plt = sum(int((g == PLT).sum()) for g in preds.gt_labels)
    n_rbc = sum(int((g == RBC).sum()) for g in preds.gt_labels)
    assert len(sizes.found["platelets"]) == 0 and len(sizes.missed["platelets"]) == n_plt
    assert len(sizes.found["rbc"]) == n_rbc and len(sizes.missed["rbc"]) == 0
    # at 300x300: platelets ~21 px, under SSD300's smallest default box (30 px); rbc ~55 px
    assert 15 < np.median(sizes.missed["platelets"]) < 30
    assert 45 < np.median(sizes.found["rbc"]) < 65
    assert sizes.missed_fraction_below(30)["platelets"] == 1.0
    h_img, w_img = read_image_size(image_path(bccd_root, preds.ids[0]))
    y0, x0, y1, x1 = preds.gt_bboxes[0][0]
    first = np.sqrt((y1 - y0) * 300 / h_img * (x1 - x0) * 300 / w_img)
    name = NAMES[preds.gt_labels[0][0]]
    assert np.isclose((sizes.found[name] if name != "platelets" else sizes.missed[name])[0],
                      first)
    given = gt_box_sizes(preds, image_sizes=[(h_img, w_img)] * len(preds))
    np.testing.assert_allclose(given.missed["platelets"], sizes.missed["platelets"])
    text = str(sizes)
    assert "platelets" in text and "nan" not in text     # no found platelet: no median shown
    assert f"missed {n_plt:4d} (median" in text
    fig = plot_box_sizes(sizes, default_box_sizes=(20, 30), classes=["platelets"])
    (ax,) = fig.axes
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == [
        "default box 20 px", "default box 30 px", "found (0)", f"missed ({n_plt})"]
    assert sum(p.get_height() for p in ax.patches) == n_plt
