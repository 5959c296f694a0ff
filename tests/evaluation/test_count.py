"""Counting: hand-made predictions with known counts, the threshold sweep, plots, CLI hook."""
import json
import math

import numpy as np
from matplotlib.colors import to_rgb
import pytest
from matplotlib.figure import Figure

from medaidet import cli
from medaidet.errors import ConfigError
from medaidet.evaluation.count import (SweepResult, count_cells, count_weights, plot_counts,
                                       plot_sweep, threshold_sweep)
from medaidet.evaluation.evaluate import Predictions

NAMES = ("rbc", "wbc", "platelets")


def make_preds(pred, gt, split=None):
    """pred: per image a list of (label, score); gt: per image a list of labels."""
    pl = [np.array([lb for lb, _ in p], dtype=np.int32) for p in pred]
    ps = [np.array([s for _, s in p], dtype=np.float32) for p in pred]
    pb = [np.zeros((len(p), 4), dtype=np.float32) for p in pred]
    gl = [np.array(g, dtype=np.int32) for g in gt]
    gb = [np.zeros((len(g), 4), dtype=np.float32) for g in gt]
    return Predictions([f"img{i}" for i in range(len(gt))], pb, pl, ps, gb, gl, None,
                       NAMES, 0.01, split)


def known_case():
    # annotated rbc/wbc/platelets: image 0 4/1/2, image 1 2/1/0; predicted >= 0.5: 6/1/1, 1/1/1
    pred = [[(0, 0.9)] * 6 + [(0, 0.2), (1, 0.8), (1, 0.1), (2, 0.7)],
            [(0, 0.55), (1, 0.5), (2, 0.95)]]
    gt = [[0, 0, 0, 0, 1, 2, 2], [0, 0, 1]]
    return make_preds(pred, gt)


def test_counts_errors_and_their_table_are_exact():
    result = count_cells(known_case(), score_thresh=0.5)
    np.testing.assert_array_equal(result.predicted, [[6, 1, 1], [1, 1, 1]])
    np.testing.assert_array_equal(result.annotated, [[4, 1, 2], [2, 1, 0]])
    np.testing.assert_array_equal(result.error, [[2, 0, -1], [-1, 0, 1]])
    np.testing.assert_allclose(result.mae, [1.5, 0.0, 1.0])
    np.testing.assert_allclose(result.bias, [0.5, 0.0, 0.0])
    # sum |error| / sum annotated: rbc 3 / 6; platelets 2 / 2 (img1's extra one counts too)
    np.testing.assert_allclose(result.relative_error, [0.5, 0.0, 1.0])
    assert result.rows()[0] == {"image": "img0", "rbc_pred": 6, "rbc_true": 4, "rbc_error": 2,
                                "wbc_pred": 1, "wbc_true": 1, "wbc_error": 0,
                                "platelets_pred": 1, "platelets_true": 2, "platelets_error": -1}
    assert repr(result) == str(result)  # a notebook stores the table as text, not the arrays
    d = json.loads(result.to_json())
    assert d["per_class"]["rbc"]["mae"] == 1.5 and len(d["per_image"]) == 2


def test_threshold_is_inclusive_and_relative_error_guards_zero():
    result = count_cells(make_preds([[(2, 0.6), (0, 0.6)]], [[0]]), score_thresh=0.6)
    np.testing.assert_array_equal(result.predicted, [[1, 0, 1]])
    assert math.isnan(result.relative_error[2])
    assert result.mae[2] == 1.0 and result.bias[2] == 1.0
    d = result.to_dict()
    json.dumps(d, allow_nan=False)
    assert d["per_class"]["platelets"]["relative_error"] is None
    # at 1: only saturated scores
    preds = make_preds([[(0, 1.0), (0, 0.999)]], [[0]])
    np.testing.assert_array_equal(count_cells(preds, 1.0).predicted, [[1, 0, 0]])


def test_set_aside_images_are_reported_apart_and_named():
    result = count_cells(known_case(), 0.5, set_aside={"img1": "no rbc box", "other": "x"})
    assert result.set_aside == {"img1": "no rbc box"}         # ids not predicted: ignored
    # all images as before; without img1 only image 0: rbc |6 - 4| / 4, platelets 1 / 2
    np.testing.assert_allclose(result.relative_error, [0.5, 0.0, 1.0])
    rest = result.without_set_aside()
    assert rest.ids == ["img0"]
    np.testing.assert_allclose(rest.relative_error, [0.5, 0.0, 0.5])
    np.testing.assert_allclose(rest.mae, [2.0, 0.0, 1.0])
    d = json.loads(result.to_json())
    assert d["set_aside"] == {"img1": "no rbc box"}
    assert d["without_set_aside"]["n_images"] == 1
    assert d["without_set_aside"]["per_class"]["platelets"]["relative_error"] == 0.5
    # how many images lack each class
    both = count_cells(known_case(), 0.5, set_aside={"img0": "no wbc box",
                                                     "img1": "no rbc box; no wbc box"})
    assert both.set_aside_reasons() == {"no wbc box": 2, "no rbc box": 1}


def test_count_weights_sets_aside_the_images_the_validator_flags(bccd_root):
    from medaidet.ssd.weights import SHIPPED_WEIGHTS

    result, _ = count_weights(SHIPPED_WEIGHTS["ssd_small", "bccd"], split="test", progress=False)
    assert sorted(result.set_aside) == ["BloodImage_00135", "BloodImage_00171",
                                        "BloodImage_00178", "BloodImage_00249",
                                        "BloodImage_00303", "BloodImage_00327"]
    assert result.set_aside["BloodImage_00303"] == "no rbc box"
    assert len(result.without_set_aside().ids) == 66


def sweep_case():
    # 3 rbc per image; detections 0.9, 0.8, 0.7 (true) and 0.3, 0.2 (spurious)
    pred = [[(0, s) for s in (0.9, 0.8, 0.7, 0.3, 0.2)]] * 4
    return make_preds(pred, [[0, 0, 0]] * 4)


def test_threshold_sweep_known_curve_and_best_threshold():
    thresholds = [0.1, 0.25, 0.5, 0.75, 0.85, 0.95]
    sweep = threshold_sweep(sweep_case(), thresholds)
    np.testing.assert_allclose(sweep.mae[:, 0], [2, 1, 0, 1, 2, 3])
    np.testing.assert_allclose(sweep.bias[:, 0], [2, 1, 0, -1, -2, -3])
    assert (sweep.best_threshold["rbc"], sweep.best_mae["rbc"]) == (0.5, 0.0)
    assert repr(sweep) == str(sweep)
    assert json.loads(json.dumps(sweep.to_dict(), allow_nan=False))["best_threshold"]["rbc"] == 0.5


def test_best_threshold_is_the_middle_of_the_tied_ones():
    """Val's wbc are often exact over a range of thresholds."""
    t = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    mae = np.array([[1.0, 0.0, 2.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.5],
                    [0.0, 1.0, 1.0], [0.5, 1.0, 0.7], [0.0, 2.0, 3.0]])
    sweep = SweepResult(t, ("rbc", "wbc", "platelets"), mae, mae, mae)
    # rbc: tied at 0.2, 0.3, 0.4 and 0.6 (not contiguous): the middle one of the four, upper
    assert sweep.best_threshold == {"rbc": 0.4, "wbc": 0.2, "platelets": 0.3}
    assert sweep.best_mae == {"rbc": 0.0, "wbc": 0.0, "platelets": 0.5}
    empty = SweepResult(t, ("rbc",), np.full((6, 1), np.nan), mae[:, :1], mae[:, :1])
    assert empty.best_threshold == {"rbc": 0.1}             # no images: no MAE to compare


def test_sweep_on_test_split_warns_about_optimism():
    preds = sweep_case()
    preds.split = "test"
    with pytest.warns(UserWarning):
        threshold_sweep(preds, [0.5])


def test_sweep_is_monotone_on_random_predictions():
    rng = np.random.RandomState(0)
    pred = [[(int(rng.randint(3)), float(rng.uniform(0.01, 1))) for _ in range(30)]
            for _ in range(5)]
    gt = [list(rng.randint(0, 3, size=20)) for _ in range(5)]
    sweep = threshold_sweep(make_preds(pred, gt))
    assert np.all(np.diff(sweep.bias, axis=0) <= 0)


def test_plots_return_figures_in_the_class_colours():
    from medaidet.data.bccd import CLASS_COLORS
    fig = plot_counts(count_cells(known_case(), 0.5))
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    for ax, name in zip(fig.axes, NAMES):
        colour = ax.collections[0].get_facecolor()[0][:3]
        np.testing.assert_allclose(colour, to_rgb(CLASS_COLORS[name]), err_msg=name)
    fig = plot_sweep(threshold_sweep(sweep_case()))
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    for ax, name in zip(fig.axes, NAMES):
        assert ax.get_title() == name
        assert {to_rgb(line.get_color()) for line in ax.lines} == {to_rgb(CLASS_COLORS[name])}


def test_count_scatter_shows_every_image_where_counts_coincide():
    """40 images on one point must not look like one image."""
    from medaidet.evaluation.count import AREA_PER_IMAGE, images_at_points

    gt = [[0, 1, 2]] * 40 + [[0, 0, 2]] * 2 + [[0, 1]] * 3
    pred = [[(0, 0.9), (1, 0.9), (2, 0.9)]] * 40 + [[(0, 0.9), (1, 0.9)]] * 2 \
        + [[(0, 0.9), (0, 0.8), (1, 0.9)]] * 3
    result = count_cells(make_preds(pred, gt), 0.5)
    points, n_images = images_at_points(result.annotated[:, 1], result.predicted[:, 1])
    assert points.tolist() == [[0, 1], [1, 1]] and n_images.tolist() == [2, 43]
    fig = plot_counts(result)
    for l, ax in enumerate(fig.axes):
        dots = ax.collections[0]
        per_dot = dots.get_sizes() / AREA_PER_IMAGE
        assert per_dot.sum() == len(result.ids) == 45, NAMES[l]
        expected = dict(zip(map(tuple, np.stack(images_at_points(
            result.annotated[:, l], result.predicted[:, l])[0])), per_dot))
        drawn = {tuple(xy): k for xy, k in zip(dots.get_offsets().astype(int).tolist(), per_dot)}
        assert drawn == expected
        labels = sorted(int(t.get_text()) for t in ax.texts)
        assert labels == sorted(int(k) for k in per_dot if k > 1), NAMES[l]
    assert "area and number" in fig.get_suptitle()


def test_the_sweep_gives_each_class_its_own_scale():
    """RBC's MAE is ten times the others': one shared axis would flatten their curves."""
    pred = [[(0, s) for s in np.linspace(0.06, 0.99, 40)] + [(1, 0.9), (1, 0.3), (2, 0.7)]] * 5
    gt = [[0] * 30 + [1, 2]] * 5
    sweep = threshold_sweep(make_preds(pred, gt), [0.1, 0.25, 0.5, 0.75, 0.95])
    assert sweep.mae[:, 0].max() > 5 * sweep.mae[:, 1:].max()
    fig = plot_sweep(sweep)
    for l, ax in enumerate(fig.axes):
        low, high = ax.get_ylim()
        most = sweep.mae[:, l].max()
        assert low == 0 and most <= high <= 1.5 * most, NAMES[l]
        star = [line for line in ax.lines if line.get_marker() == "*"]
        assert len(star) == 1 and star[0].get_xdata()[0] == sweep.best_threshold[NAMES[l]]


def test_the_sweep_axis_is_not_flattened_by_the_lowest_thresholds():
    """At score 0.05 a detector counts background by the hundred."""
    pred = [[(0, 0.06)] * 200 + [(0, s) for s in (0.9, 0.8, 0.7, 0.3)]] * 4
    sweep = threshold_sweep(make_preds(pred, [[0, 0, 0]] * 4), [0.05, 0.25, 0.5, 0.75])
    assert sweep.mae[0, 0] == 201
    ax = plot_sweep(sweep).axes[0]
    assert ax.get_ylim()[1] < 10
    assert "off the scale\n(MAE up to 201)" in " ".join(t.get_text() for t in ax.texts)
    ax = plot_sweep(threshold_sweep(sweep_case())).axes[0]
    assert not ax.texts


@pytest.mark.parametrize("value, expected", [("0.01", 0.01), ("1", 1.0), ("0.35", 0.35)])
def test_cli_count_takes_thresholds_from_the_predictions_to_one(value, expected):
    args = cli.build_parser().parse_args(["count", "w.npz", "--score-thresh", value])
    assert (args.weights, args.score_thresh, args.device) == ("w.npz", expected, "auto")


@pytest.mark.slow(seconds=17)
def test_count_command_on_real_bccd_subset(bccd_root, tmp_path, capsys):
    from medaidet.ssd.model import build_ssd
    from medaidet.ssd.weights import save_weights
    np.random.seed(0)
    weights, out = tmp_path / "ssd300_random.npz", tmp_path / "count"
    save_weights(build_ssd("ssd300", n_fg_class=3), weights)
    args = cli.build_parser().parse_args(["count", str(weights), "--root", str(bccd_root),
                                          "--subset", "2", "--split", "val", "--out", str(out),
                                          "--json"])
    assert args.func(args) == 0
    d = json.loads((out / "counts.json").read_text())
    assert d["n_images"] == 2 and d["split"] == "val" and d["score_thresh"] == 0.5
    assert set(d["per_class"]) == set(NAMES) and "best_threshold" in d["sweep"]
    assert d["per_class"]["rbc"]["annotated_total"] > 0
    for name in ("counts.png", "count_sweep.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert json.loads(capsys.readouterr().out)["n_images"] == 2


@pytest.mark.parametrize("option, value", [
    *(("--score-thresh", v) for v in ("-1", "nan", "2", "inf", "0", "0.005", "half")),
    ("--subset", "0"), ("--batch-size", "0"), ("--out", "a file")])
def test_cli_refuses_what_counts_nothing_before_predicting_naming_it(
        option, value, tmp_path, bccd_root, no_prediction, capsys):
    """Exit 2, the option named on the last line; --out: a file where the folder would go."""
    weights = tmp_path / "model.npz"
    weights.write_bytes(b"")
    if value == "a file":
        value = str(tmp_path / "counts")
        (tmp_path / "counts").write_text("")
    try:
        code = cli.main(["count", str(weights), "--root", str(bccd_root), option, value])
    except SystemExit as exc:       # argparse's refusal
        code = exc.code
    err = capsys.readouterr().err
    last = err.splitlines()[-1]
    assert code == 2 and f"{option}: " in last and value in last and "Traceback" not in err


REFUSED = [  # (id, call(an empty weights file), the field its ConfigError names)
    # 0.001: below the lowest score the predictions hold
    *[(f"count_cells-{bad}", lambda w, bad=bad: count_cells(known_case(), bad), "score_thresh")
      for bad in (float("nan"), 2.0, -1.0, float("inf"), 0.001)],
    ("sweep-nan", lambda w: threshold_sweep(sweep_case(), [0.5, float("nan")]), "thresholds"),
    ("sweep-none", lambda w: threshold_sweep(sweep_case(), []), "thresholds"),
    *[(f"count_weights-{bad}", lambda w, bad=bad: count_weights(w, score_thresh=bad,
                                                               progress=False), "--score-thresh")
      for bad in (-1, float("nan"), 2, 0.001)],       # before predicting
]


@pytest.mark.parametrize("call, field", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_a_threshold_outside_the_predictions_to_one_is_refused(call, field, tmp_path,
                                                                no_prediction):
    (tmp_path / "model.npz").write_bytes(b"")
    with pytest.raises(ConfigError) as info:
        call(tmp_path / "model.npz")
    assert str(info.value).startswith(f"{field}: ")


def test_report_count_errors_chooses_on_val_and_reports_test_once_with_its_interval():
    """Val picks rbc >= 0.5; on test that misses 1 of 4 cells in one of two images: 1/7."""
    from medaidet.evaluation.count import report_count_errors

    val = make_preds([[(0, 0.9), (0, 0.6), (0, 0.3)]] * 3, [[0, 0]] * 3, split="val")
    test = make_preds([[(0, 0.9), (0, 0.8), (0, 0.7), (0, 0.4)], [(0, 0.9)] * 3],
                      [[0, 0, 0, 0], [0, 0, 0]], split="test")
    report = report_count_errors(val, test, n=200)
    rbc = report["rbc"]
    assert 0.3 < rbc["threshold"] <= 0.6
    assert rbc["error"] == pytest.approx(1 / 7) and rbc["cells"] == 7
    # resamples hold image 0 twice (1/4), image 1 twice (0) or both (1/7)
    assert rbc["low"] == pytest.approx(0.0) and rbc["high"] == pytest.approx(0.25)
    assert report["wbc"]["cells"] == 0 and math.isnan(report["wbc"]["error"])
