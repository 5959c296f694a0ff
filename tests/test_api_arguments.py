"""The Python API checks its arguments as the CLI does: a ConfigError naming the argument, never
a TypeError from deep inside nor a wrong result (a threshold of 2 that counts nothing)."""
import numpy as np
import pytest

from medaidet.data import agreement, bccd, compare, same_field, txl_pbc
from medaidet.errors import ConfigError
from medaidet.evaluation import analysis, count
from medaidet.evaluation.evaluate import Predictions, bootstrap, paired_bootstrap

NAMES = ("rbc", "wbc", "platelets")
MARGINS = {"rbc": 5, "wbc": 5, "platelets": 5}
PER_CLASS = {"rbc": 0.5, "wbc": 0.5, "platelets": 0.5}
BOX = [[10, 10, 50, 50]]
COMPARISON = compare.Comparison(("BCCD", "TXL-PBC"), NAMES, [], [])


def predictions(n=1):
    box = np.array(BOX, np.float32)
    return Predictions([f"BloodImage_0000{i}" for i in range(n)], [box] * n,
                       [np.array([0], np.int32)] * n, [np.array([0.9], np.float32)] * n,
                       [box] * n, [np.array([0], np.int32)] * n, None, NAMES, 0.05)


def a_label_file(txl_root):
    return next((txl_root / "TXL_PBC" / "labels" / "test").glob("*.txt"))


CASES = {
    "frame_margins: no boxes": (lambda: count.frame_margins(None, [[0]], NAMES), "bboxes"),
    "frame_margins: a label past the classes": (
        lambda: count.frame_margins([BOX], [[7]], NAMES), "bboxes"),
    "frame_margins: no class names": (lambda: count.frame_margins([BOX], [[0]], None),
                                      "label_names"),
    "margin_per_class: not a dict": (lambda: count.margin_per_class(None, NAMES), "margins"),
    "in_frame: boxes of text": (lambda: count.in_frame("x", [0], (100, 100), MARGINS, NAMES),
                                "bbox"),
    "in_frame: three numbers a box": (
        lambda: count.in_frame([[0, 0, 1]], [0], (100, 100), MARGINS, NAMES), "bbox"),
    "in_frame: a label past the classes": (
        lambda: count.in_frame(BOX, [9], (100, 100), MARGINS, NAMES), "bbox"),
    "in_frame: a size of three numbers": (
        lambda: count.in_frame(BOX, [0], (1, 2, 3), MARGINS, NAMES), "size"),
    "frame_area: no size": (lambda: count.frame_area(None, 3), "size"),
    "frame_predictions: not predictions": (
        lambda: count.frame_predictions(None, (100, 100), MARGINS), "predictions"),
    "frame_predictions: no sizes": (
        lambda: count.frame_predictions(predictions(), None, MARGINS), "sizes"),
    "frame_errors: one threshold, not one per class": (
        lambda: count.frame_errors(predictions(), 0.5, (100, 100), MARGINS), "thresholds"),
    "densities: counts of text": (
        lambda: count.densities("x", [(100, 100)], MARGINS, NAMES), "counts"),
    "count_cells: not predictions": (lambda: count.count_cells("x"), "predictions"),
    "count_errors: one threshold": (lambda: count.count_errors(predictions(), 0.5),
                                    "thresholds"),
    "count_errors: a threshold above 1": (
        lambda: count.count_errors(predictions(), {**PER_CLASS, "wbc": 2}),
        "score_thresh['wbc']"),
    "images_at_points: no counts": (lambda: count.images_at_points(None, [1]),
                                    "annotated, predicted"),
    "threshold_sweep: not predictions": (lambda: count.threshold_sweep(None),
                                         "predictions"),
    "report_count_errors: not predictions": (
        lambda: count.report_count_errors(None, predictions()), "predictions"),
    "filter: nan": (lambda: predictions().filter(float("nan")), "score_thresh"),
    "filter: 2": (lambda: predictions().filter(2), "score_thresh"),
    "take: image ids, not positions": (lambda: predictions().take(["a"]), "indices"),
    "take: past the last image": (lambda: predictions().take([1]), "indices"),
    "bootstrap: no statistic": (lambda: bootstrap(predictions(), None), "statistic"),
    "bootstrap: a level of 2": (lambda: bootstrap(predictions(), len, level=2), "level"),
    "bootstrap: a negative seed": (lambda: bootstrap(predictions(), len, seed=-1), "seed"),
    "paired_bootstrap: other images": (
        lambda: paired_bootstrap(predictions(), predictions().take([0, 0]), len), "b"),
    "recall_precision: thresholds of text": (
        lambda: analysis.recall_precision(predictions(), "ab"), "score_thresh"),
    "detection_scores: a threshold above 1": (
        lambda: analysis.detection_scores(predictions(), 2), "score_thresh"),
    "box_outcomes: a threshold above 1": (
        lambda: analysis.box_outcomes(predictions(), score_threshs=(2,),
                                      image_sizes=[(480, 640)]), "score_threshs"),
    "stage_counts: not outcomes": (lambda: analysis.stage_counts(None, 0.5), "outcomes"),
    "missed_by: no bins": (lambda: analysis.missed_by(None, 0.5, "size", []), "bins"),
    "missed_by: bins of text": (lambda: analysis.missed_by(None, 0.5, "size", "ab"), "bins"),
    "gt_box_sizes: a threshold above 1": (
        lambda: analysis.gt_box_sizes(predictions(), 2), "score_thresh"),
    "gt_box_sizes: sizes of another length": (
        lambda: analysis.gt_box_sizes(predictions(), image_sizes=[(1, 2), (3, 4)]),
        "image_sizes"),
    "pair_counts: no pairs": (lambda: agreement.pair_counts(None, None), "pairs"),
    "pair_counts: a margin of text": (lambda: agreement.pair_counts(None, [], "x"), "margin"),
    "count_agreement: rows of numbers": (lambda: agreement.count_agreement([1, 2]),
                                         "rows[0]"),
    "match_boxes: boxes of text": (lambda: compare.match_boxes("a", [0], BOX, [0]), "bbox_a"),
    "compare_annotations: no datasets": (lambda: compare.compare_annotations(None, None),
                                         "a"),
    "Comparison.by: an unknown column": (lambda: COMPARISON.by("colour"), "what"),
    "Comparison.by: bins decreasing": (lambda: COMPARISON.by("size", (100, 40, 0)), "bins"),
    "Comparison.per_image: an unknown class": (lambda: COMPARISON.per_image("RBC"),
                                               "class_name"),
    "same_field_pairs: one thumbnail": (
        lambda: list(same_field.same_field_pairs(np.zeros((60, 80)))), "thumbs"),
    "census: a number for a folder": (lambda: txl_pbc.census(5), "root"),
    # open() of an int reads that file descriptor: 0 would read what the process has open
    "bccd_links: a number for a file, 0 (stdin)": (lambda: bccd.bccd_links(0), "path"),
    "TXLPBCDataset: sources a number": (lambda: txl_pbc.TXLPBCDataset(sources=5), "sources"),
    "TXLPBCDataset: root a number": (lambda: txl_pbc.TXLPBCDataset(root=5), "root"),
    "parse_yolo_labels: no path": (lambda: bccd.parse_yolo_labels(None, (480, 640)), "path"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_wrong_argument_is_a_config_error_naming_it(case):
    call, argument = CASES[case]
    with pytest.raises(ConfigError) as raised:
        call()
    assert str(raised.value).startswith(f"{argument}:")


@pytest.mark.parametrize("size", [None, (-1, 640), (480,), (480, 640, 3)])
def test_a_label_file_is_not_read_for_an_impossible_image_size(txl_root, size):
    with pytest.raises(ConfigError) as raised:
        bccd.parse_yolo_labels(a_label_file(txl_root), size)
    assert str(raised.value).startswith("image_size:")


def test_the_checked_paths_still_give_the_right_results(txl_root):
    """Per-class thresholds, one (H, W) for all images, list-like boxes and a str root pass."""
    assert count.count_errors(predictions(2), PER_CLASS)["rbc"] == 0.0
    assert count.frame_predictions(predictions(2), (100, 100), MARGINS).gt_labels[1].tolist() \
        == [0]
    assert count.in_frame(BOX, [0], [100, 100], MARGINS, NAMES).tolist() == [True]
    assert sum(txl_pbc.census(str(txl_root)).values()) > 0
    label = a_label_file(txl_root)
    assert bccd.parse_yolo_labels(str(label), (480, 640)).objects
