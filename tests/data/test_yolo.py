"""YOLO label files (TXL-PBC's format), judged by the same checks as BCCD's XML."""
import math

import numpy as np
import pytest

from medaidet.data.bccd import MAX_LABEL_BYTES, check_annotation, parse_yolo_labels
from medaidet.errors import DataError

SIZE = (480, 640)       # height, width


def _write(tmp_path, text, name="smear.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _check(tmp_path, text):
    return check_annotation(parse_yolo_labels(_write(tmp_path, text), SIZE), SIZE, item="line")


def test_boxes_become_course_boxes_in_the_course_label_order(tmp_path):
    # TXL-PBC's ids: 0 WBC, 1 RBC, 2 Platelet; the course's: 0 rbc, 1 wbc, 2 platelets
    checked = _check(tmp_path, "0 0.5 0.5 0.25 0.5\n1 0.125 0.25 0.25 0.5\n\n2 1 1 0.1 0.1\n")
    assert checked.label.tolist() == [1, 0]         # the platelet at the corner: dropped, below
    # x 240..400 and y 120..360 as pixel edges: the 0-based VOC box (120, 240, 359, 399)
    np.testing.assert_allclose(checked.bbox[0], [120, 240, 359, 399])
    np.testing.assert_allclose(checked.bbox[1], [0, 0, 239, 159])
    [finding] = checked.findings
    assert finding.kind == "out_of_bounds" and finding.action == "drop"
    assert finding.detail.startswith("line 4 (platelets, x 609..672, y 457..504): 32 px outside")


def test_a_box_drawn_to_the_frame_is_inside_it(tmp_path):
    # six-digit fractions put a box drawn to the frame a hair outside it: not a finding
    checked = _check(tmp_path, "1 0.927344 0.885417 0.145312 0.229167\n")
    assert checked.findings == () and checked.bbox[0, 2] <= 479 and checked.bbox[0, 3] <= 639


@pytest.mark.parametrize("line, why", [
    ("1 0.5 0.5 0.1", "line 1 (rbc): has 4 fields, not 5"),
    ("1 0.5 0.5 0.1 0.1 0.9", "line 1 (rbc): has 6 fields, not 5"),
    ("1 0.5 nan 0.1 0.1", "line 1 (rbc): coordinates '0.5 nan 0.1 0.1' are not all finite"),
    ("1 0.5 inf 0.1 0.1", "not all finite numbers"),
    ("1 0.5 0.5 x 0.1", "coordinates '0.5 0.5 x 0.1' are not all numbers"),
    ("1 0.5 0.5 0 0.1", "the box is 0 x 48 px (width x height): under one pixel"),
    ("1 0.5 0.5 -0.1 0.1", "under one pixel"),
])
def test_a_bad_line_is_dropped_and_named(tmp_path, line, why):
    checked = _check(tmp_path, f"{line}\n0 0.5 0.5 0.2 0.2\n")
    assert checked.label.tolist() == [1]             # the good line (a white cell) is kept
    [finding] = checked.findings
    assert finding.kind == "bad_coordinates" and finding.action == "drop" and finding.index == 1
    assert why in finding.detail


def test_strict_mode_raises_on_the_line_the_default_drops(tmp_path, bccd_root):
    from medaidet.data.bccd import BCCDDataset
    annotation = parse_yolo_labels(_write(tmp_path, "1 0.5 0.5 0.1 0.1\n1 2 2 0.1 0.1\n"), SIZE)
    finding = check_annotation(annotation, SIZE, item="line").findings[0]
    error = BCCDDataset._error(finding, annotation.path, "smear", annotation)
    assert isinstance(error, DataError) and error.path == annotation.path
    assert (error.kind, error.object_index) == ("out_of_bounds", 2)          # line 2


@pytest.mark.parametrize("line", ["3 0.5 0.5 0.1 0.1", "-1 0.5 0.5 0.1 0.1", "1.0 0.5 0.5 0.1 0.1",
                                  "RBC 0.5 0.5 0.1 0.1", "\u0661 0.5 0.5 0.1 0.1"])
def test_a_class_out_of_the_list_fails_the_file(tmp_path, line):
    path = _write(tmp_path, f"1 0.5 0.5 0.1 0.1\n{line}\n")
    with pytest.raises(DataError) as info:
        parse_yolo_labels(path, SIZE)
    assert (info.value.kind, info.value.path, info.value.line) == ("yolo", path, 2)
    assert repr(line.split()[0]) in str(info.value)              # the class, named


def _oversized(path):
    with open(path, "wb") as f:
        f.truncate(MAX_LABEL_BYTES + 1)


BAD_FILES = {"empty": lambda path: path.write_text(""),
             "blank": lambda path: path.write_text("\n  \n"),
             "missing": lambda path: None,
             "binary": lambda path: path.write_bytes(b"\xff\xfe\x00garbage"),
             "oversized": _oversized}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_an_empty_missing_unreadable_or_oversized_file_is_named(tmp_path, case):
    path = tmp_path / "smear.txt"
    BAD_FILES[case](path)
    with pytest.raises(DataError) as info:
        parse_yolo_labels(path, SIZE)
    assert (info.value.kind, info.value.path) == ("yolo", path)
    if case == "oversized":
        assert f"{MAX_LABEL_BYTES + 1} bytes" in str(info.value)  # the size that is refused


def test_the_same_box_written_twice_is_one_cell(tmp_path):
    checked = _check(tmp_path, "1 0.5 0.5 0.1 0.1\n1 0.5 0.5 0.1 0.1\n")
    assert len(checked.label) == 1 and checked.findings[0].kind == "near_duplicate_box"
    assert math.isclose(float(checked.bbox[0, 2] - checked.bbox[0, 0]), 47.0, abs_tol=1e-3)
