"""Evaluation protocols on synthetic predictions, and a tiny real run on BCCD."""
import json
import math

import numpy as np
import pytest

from conftest import REPO, edit_objects, split_ids

from medaidet import cli
from medaidet.errors import ConfigError, WeightsError
from medaidet.evaluation.evaluate import (Predictions, bootstrap, evaluate, evaluate_weights,
                                          plot_pr_curves)
from medaidet.evaluation.protocol import PROTOCOLS

NAMES = ("rbc", "wbc", "platelets")


def box(y, x, h=20, w=20):
    return [y, x, y + h, x + w]


def make_gt(n_images=3):
    """Per image: two rbc, one wbc, one platelet, at distinct places."""
    bboxes, labels = [], []
    for i in range(n_images):
        o = 10 * i
        bboxes.append(np.array([box(o, 0), box(o, 50), box(o, 100, 60, 60), box(o, 200, 8, 8)],
                               dtype=np.float32))
        labels.append(np.array([0, 0, 1, 2], dtype=np.int32))
    return bboxes, labels


def without_platelets(gb, gl):
    """The boxes and labels of ``make_gt`` less each image's platelet."""
    keep = [lb != 2 for lb in gl]
    return [b[k] for b, k in zip(gb, keep)], [lb[k] for lb, k in zip(gl, keep)]


def preds_from(pred_bboxes, pred_labels, pred_scores, gt_bboxes, gt_labels, split=None):
    """``pred_scores`` None: every prediction at 0.9."""
    pred_scores = [np.full(len(lb), 0.9) for lb in pred_labels] if pred_scores is None \
        else pred_scores
    return Predictions([f"img{i}" for i in range(len(gt_bboxes))],
                       [np.asarray(b, dtype=np.float32).reshape(-1, 4) for b in pred_bboxes],
                       [np.asarray(lb, dtype=np.int32) for lb in pred_labels],
                       [np.asarray(s, dtype=np.float32) for s in pred_scores],
                       gt_bboxes, gt_labels, None, NAMES, 0.01, split)


def test_perfect_predictions_score_one_in_both_metrics_and_protocols():
    gb, gl = make_gt()
    result = evaluate(preds_from(gb, gl, None, gb, gl), NAMES)
    assert set(result.protocols) == set(PROTOCOLS) == {"evaluate", "course"}
    for p in result.protocols.values():
        np.testing.assert_allclose(p.ap_voc, 1.0)
        np.testing.assert_allclose(p.ap_voc07, 1.0)
        assert p.map_voc == pytest.approx(1.0) and p.map_voc07 == pytest.approx(1.0)
        assert list(p.n_gt) == [6, 3, 3]


def test_missing_class_scores_zero_and_others_one():
    gb, gl = make_gt()
    p = evaluate(preds_from(*without_platelets(gb, gl), None, gb, gl))["evaluate"]
    np.testing.assert_allclose(p.ap_voc, [1, 1, 0])
    np.testing.assert_allclose(p.ap_voc07, [1, 1, 0])
    assert p.map_voc == pytest.approx(2 / 3)
    assert p.n_detections[2] == 0


def test_class_without_boxes_is_nan_and_left_out_of_the_mean():
    gb, gl = without_platelets(*make_gt())
    result = evaluate(preds_from(gb, gl, None, gb, gl))
    p = result["evaluate"]
    assert len(p.ap_voc) == 3 and math.isnan(p.ap_voc[2])       # ChainerCV's: 2 classes
    assert p.map_voc == pytest.approx(1.0)
    assert result.to_dict()["protocols"]["evaluate"]["ap_voc"]["platelets"] is None
    json.dumps(result.to_dict(), allow_nan=False)


def test_score_filter_low_scores_count_in_evaluate_not_in_course():
    gb, gl = make_gt()
    scores = [np.where(lb == 1, 0.3, 0.9) for lb in gl]
    result = evaluate(preds_from(gb, gl, scores, gb, gl))
    ev, course = result["evaluate"], result["course"]
    assert ev.score_thresh == 0.01 and course.score_thresh == 0.6
    np.testing.assert_allclose(ev.ap_voc, [1, 1, 1])
    np.testing.assert_allclose(course.ap_voc, [1, 0, 1])
    np.testing.assert_allclose(course.ap_voc07, [1, 0, 1])
    assert ev.n_detections[1] == 3 and course.n_detections[1] == 0


def test_low_scoring_false_positives_lower_ap_only_with_low_threshold_recall_gain():
    # rbc: TPs at 0.9 and 0.3, an FP at 0.5; course (>= 0.6) reaches recall 1/2 only
    gb, gl = make_gt(1)
    fp = box(300, 300)
    pb = [np.array([gb[0][0], fp, gb[0][1], gb[0][2], gb[0][3]])]
    pl = [np.array([0, 0, 0, 1, 2])]
    ps = [np.array([0.9, 0.5, 0.3, 0.9, 0.9])]
    result = evaluate(preds_from(pb, pl, ps, gb, gl))
    # Area AP (VOC2010+): precision envelope 1 up to recall 0.5, 2/3 up to 1.
    assert result["evaluate"].ap_voc[0] == pytest.approx(0.5 + 0.5 * 2 / 3)
    assert result["course"].ap_voc[0] == pytest.approx(0.5)
    ev_rec, co_rec = result["evaluate"].recall[0], result["course"].recall[0]
    np.testing.assert_allclose(co_rec, ev_rec[:len(co_rec)])
    assert co_rec.max() == pytest.approx(0.5) and ev_rec.max() == pytest.approx(1.0)


def test_filter_refuses_below_the_prediction_threshold_and_is_a_filter():
    gb, gl = make_gt(1)
    preds = preds_from(gb, gl, [np.array([0.05, 0.7, 0.6, 0.59])], gb, gl)
    kept = preds.filter(0.6)
    np.testing.assert_array_equal(kept.pred_scores[0], np.float32([0.7, 0.6]))
    np.testing.assert_array_equal(kept.pred_labels[0], [0, 1])
    assert kept.score_thresh == 0.6
    per_class = preds.filter({"rbc": 0.01, "wbc": 0.65, "platelets": 0.6})
    thresholds = {0: 0.01, 1: 0.65, 2: 0.6}
    expected = [s for s, lb in zip([0.05, 0.7, 0.6, 0.59], gl[0]) if s >= thresholds[lb]]
    np.testing.assert_allclose(per_class.pred_scores[0], expected, rtol=1e-6)
    assert per_class.score_thresh == 0.01
    # below the predictions' 0.01, and a class missing or unknown
    for bad in (0.001, {"rbc": 0.001, "wbc": 0.5, "platelets": 0.5},
                {"rbc": 0.5, "wbc": 0.5, "plt": 0.5}):
        with pytest.raises(ConfigError) as info:
            preds.filter(bad)
        assert str(info.value).startswith("score_thresh: ")


def test_table_json_and_figure():
    gb, gl = make_gt()
    result = evaluate(preds_from(gb, gl, None, gb, gl, split="test"))
    table = result.table()
    assert table.columns[:3] == ["class", "boxes", "AP evaluate (score>=0.01)"]
    assert [row[:2] for row in table.rows] == [["rbc", 6], ["wbc", 3], ["platelets", 3],
                                               ["mean", ""]]
    assert all(v == pytest.approx(1.0) for row in table.rows for v in row[2:])
    assert repr(result) == str(result) == str(table)
    assert result._repr_markdown_() == table.to_markdown()
    summary = result.summary_table()
    assert summary.columns == ["", "mAP", *NAMES]
    assert summary.rows[0][1:] == [0.719, 0.760, 0.965, 0.432]     # the course's, published
    assert [row[1:] for row in summary.rows[1:]] == [pytest.approx([1.0] * 4)] * 2
    d = json.loads(result.to_json())
    assert set(d) >= {"split", "n_images", "iou_thresh", "protocols", "label_names"}
    assert set(d["protocols"]) == {"evaluate", "course"}
    assert set(d["protocols"]["course"]) >= {"score_thresh", "map_voc", "map_voc07",
                                            "ap_voc", "ap_voc07"}
    from matplotlib.figure import Figure
    fig = plot_pr_curves(result)
    assert isinstance(fig, Figure) and len(fig.axes) == 3


def test_missing_weights_is_a_named_error(tmp_path, bccd_root):
    missing = tmp_path / "runs" / "model.npz"
    with pytest.raises(WeightsError) as info:
        evaluate_weights(missing, root=bccd_root, subset=1, progress=False)
    assert (info.value.kind, info.value.path) == ("missing", missing)


def test_cli_parser_registers_evaluate():
    args = cli.build_parser().parse_args(["evaluate", "w.npz", "--subset", "2", "--device", "gpu",
                              "--out", "o", "--root", "d"])
    assert (args.weights, args.split, args.model, args.subset, args.device, args.out,
            args.root) == ("w.npz", "test", None, 2, "gpu", "o", "d")
    assert callable(args.func)


@pytest.mark.slow(seconds=3)
def test_evaluate_weights_and_the_cli_on_real_bccd_subset(bccd_root, tmp_path, capsys):
    """The same evaluation by the API and the CLI; the model is read from the weights."""
    from medaidet.ssd.model import build_ssd
    from medaidet.ssd.weights import save_weights
    np.random.seed(0)
    weights, out = tmp_path / "small.npz", tmp_path / "eval"
    save_weights(build_ssd("ssd_small"), weights)
    result = evaluate_weights(weights, split="test", root=bccd_root, subset=2, out=out,
                              progress=False)
    assert result.n_images == 2 and result.split == "test"
    d = json.loads((out / "evaluation.json").read_text())
    assert d["n_images"] == 2 and len(d["image_ids"]) == 2
    assert (d["weights"], d["model"]) == (str(weights), "ssd_small")
    for proto in ("evaluate", "course"):
        p = d["protocols"][proto]
        assert set(p["ap_voc"]) == set(NAMES)
        for value in list(p["ap_voc"].values()) + list(p["ap_voc07"].values()):
            assert value is None or 0.0 <= value <= 1.0
        assert p["n_gt"]["rbc"] > 0
    for name in NAMES:
        assert d["protocols"]["course"]["n_detections"][name] <= \
            d["protocols"]["evaluate"]["n_detections"][name]
    assert (out / "pr_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli.main(["evaluate", str(weights), "--subset", "2", "--root", str(bccd_root),
                     "--device", "cpu", "--json"]) == 0
    by_cli = json.loads(capsys.readouterr().out)
    assert (by_cli["model"], by_cli["image_ids"]) == ("ssd_small", d["image_ids"])
    assert by_cli["protocols"] == d["protocols"]


@pytest.mark.slow(seconds=2)
@pytest.mark.filterwarnings("ignore::medaidet.data.bccd.AnnotationWarning")
def test_seconds_is_the_time_the_prediction_loop_took(bccd_root):
    import time

    from medaidet.data.bccd import BCCDDataset
    from medaidet.evaluation.evaluate import predict_split
    from medaidet.ssd.model import build_ssd

    np.random.seed(0)
    model = build_ssd("ssd_small")
    dataset = BCCDDataset(bccd_root, "val").slice[:5]
    began = time.perf_counter()
    predictions = predict_split(model, dataset, batch_size=2, progress=False)
    took = time.perf_counter() - began
    assert len(predictions) == 5
    assert 0 < predictions.seconds <= took
    assert predictions.filter(0.5).seconds == predictions.seconds


@pytest.fixture
def weights_file(tmp_path):
    path = tmp_path / "model.npz"
    path.write_bytes(b"")   # never read when a check fails first
    return path


@pytest.mark.parametrize("case, kind", [("file", "not_a_folder"), ("under_a_file", "unwritable"),
                                        ("inside_the_data", "input")])
def test_an_out_that_cannot_be_used_fails_before_predicting(case, kind, weights_file, bccd_root,
                                                            tmp_path, no_prediction):
    """Never written into: a file of the user's, or the dataset this run reads."""
    file = tmp_path / "results.txt"
    file.write_text("mine\n")
    out = {"file": file, "under_a_file": file / "eval", "inside_the_data": bccd_root / "eval"}
    with pytest.raises(ConfigError) as info:
        evaluate_weights(weights_file, root=bccd_root, subset=1, out=out[case], progress=False)
    path = bccd_root.resolve() / "eval" if case == "inside_the_data" else out[case]
    assert (info.value.kind, info.value.path) == (kind, path)
    assert str(info.value).startswith("--out: ")
    assert file.read_text() == "mine\n" and not (bccd_root / "eval").exists()


@pytest.mark.parametrize("option", ["--subset", "--batch-size"])
@pytest.mark.parametrize("value", ["0", "-3", "1.5"])
def test_a_subset_or_batch_size_not_a_positive_integer_is_refused(option, value, weights_file,
                                                                  bccd_root, no_prediction,
                                                                  capsys):
    with pytest.raises(SystemExit) as info:
        cli.build_parser().parse_args(["evaluate", "w.npz", option, value])
    assert info.value.code == 2 and f"argument {option}: " in capsys.readouterr().err
    number = float(value) if "." in value else int(value)
    with pytest.raises(ConfigError) as info:
        evaluate_weights(weights_file, root=bccd_root, progress=False,
                         **{option[2:].replace("-", "_"): number})
    assert str(info.value).startswith(f"{option}: ")


def test_predictions_without_any_box_are_a_named_error_not_nan():
    gb, gl = make_gt(2)
    preds = preds_from(gb, gl, None, [np.zeros((0, 4), np.float32)] * 2,
                       [np.zeros(0, np.int32)] * 2, split="test")
    # no box at all; difficult boxes only (ignored by AP)
    difficult = Predictions(preds.ids, preds.pred_bboxes, preds.pred_labels, preds.pred_scores,
                            gb, gl, [np.ones(len(lb), dtype=bool) for lb in gl], NAMES)
    for nothing in (preds, difficult):
        with pytest.raises(ConfigError) as info:
            evaluate(nothing)
        assert info.value.kind == "nothing_to_evaluate"


def test_pr_curves_of_a_class_with_detections_but_no_box():
    gb, gl = make_gt()
    result = evaluate(preds_from(gb, gl, None, *without_platelets(gb, gl)))
    assert result["evaluate"].recall[2] is None and result["evaluate"].n_detections[2] == 3
    fig = plot_pr_curves(result)
    labels = [t.get_text() for t in fig.axes[2].get_legend().get_texts()]
    assert all(label.endswith("(no curve)") for label in labels)


def test_cli_on_a_split_without_objects_fails_before_predicting(weights_file, bccd_copy,
                                                               tmp_path, no_prediction, capsys):
    root = bccd_copy()
    edit_objects(root, split_ids(root, "test"))
    out = tmp_path / "eval"
    assert cli.main(["evaluate", str(weights_file), "--root", str(root), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("medaidet: error: ") and err.count("\n") == 1
    assert f"{root}/ImageSets/Main/test.txt" in err                # the list to check
    assert not (out / "evaluation.json").exists()


def test_a_subset_without_objects_asks_for_more_images(weights_file, bccd_copy, no_prediction):
    root = bccd_copy()
    edit_objects(root, split_ids(root, "train")[:1])
    with pytest.raises(ConfigError) as info:
        evaluate_weights(weights_file, split="train", root=root, subset=1, progress=False)
    assert info.value.kind == "nothing_to_evaluate"
    with pytest.raises(AssertionError, match="model was built"):   # 2 images: one has boxes
        evaluate_weights(weights_file, split="train", root=root, subset=2, progress=False)


def test_cli_without_room_for_the_figure_leaves_neither_result_file(bccd_root, tmp_path):
    """A file-size limit the JSON fits and the PR-curve figure does not (a real EFBIG)."""
    import os
    import resource
    import signal
    import subprocess
    import sys

    from medaidet.ssd.weights import shipped_weights

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past it fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (16_000, resource.RLIM_INFINITY))

    out = tmp_path / "eval"
    done = subprocess.run(
        [sys.executable, "-m", "medaidet", "evaluate", str(shipped_weights()), "--root",
         str(bccd_root), "--subset", "2", "--out", str(out)], capture_output=True, text=True,
        cwd=REPO, timeout=300, preexec_fn=limit_file_size,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "MPLCONFIGDIR": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("medaidet: error:")]
    assert len(error) == 1, done.stderr
    assert error[0].startswith(f"medaidet: error: {out / 'pr_curves.png'}: File too large")
    assert sorted(os.listdir(out)) == []


def _two_images():
    box = np.array([[0, 0, 10, 10]], np.float32)
    return Predictions(["a", "b"], [box, box + 20], [np.array([0], np.int32)] * 2,
                       [np.array([0.9], np.float32)] * 2, [box, box], [np.array([0], np.int32)] * 2,
                       None, ("rbc", "wbc", "platelets"))


def test_take_resamples_images_and_bootstrap_gives_the_spread_of_a_figure():
    preds = _two_images()
    again = preds.take([1, 1, 0])
    assert again.ids == ["b", "b", "a"] and again.pred_bboxes[0][0, 0] == 20
    # one image right (IoU 1), one wrong: a resample holds 0, 1 or 2 right ones
    right = lambda p: float(np.mean([b[0, 0] == 0 for b in p.pred_bboxes]))    # noqa: E731
    low, high = bootstrap(preds, right, n=400, seed=1)
    assert (low, high) == (0.0, 1.0)
    spread = bootstrap(preds, lambda p: {"right": right(p), "n": len(p)}, n=50)
    assert spread["n"] == (2.0, 2.0) and spread["right"] == (0.0, 1.0)


def test_scored_against_swaps_the_ground_truth_of_the_same_images():
    preds = _two_images()

    class Other(list):              # a dataset: ids, len and slice[:, ("bbox", "label")]
        ids = ["a", "b"]
        slice = property(lambda self: self)

        def __getitem__(self, key):
            assert key[1] == ("bbox", "label")
            return list(self)
    other = Other([(np.zeros((0, 4)), np.zeros(0)), (np.array([[20, 20, 30, 30]]), np.array([2]))])
    swapped = preds.scored_against(other)
    assert [len(g) for g in swapped.gt_labels] == [0, 1] and swapped.gt_labels[1][0] == 2
    assert swapped.pred_bboxes is preds.pred_bboxes
    other.ids = ["b", "a"]
    with pytest.raises(ConfigError) as info:
        preds.scored_against(other)
    assert str(info.value).startswith("scored_against: ")


def test_count_errors_counts_each_class_at_its_own_threshold():
    from medaidet.evaluation.count import count_errors
    errors = count_errors(_two_images(), {"rbc": 0.95, "wbc": 0.5, "platelets": 0.5})
    assert errors["rbc"] == 1.0 and np.isnan(errors["wbc"])
