"""The validation report on the real BCCD: the defects it finds, the JSON shape, the CLI."""
import json
import subprocess
import sys

import pytest

from medaidet.data.validate import KINDS, SEVERITIES, ValidationReport, validate_dataset
from conftest import BCCD_DROPPED as DROPPED
from conftest import CLEAN_IDS, REPO, edit_objects, split_ids


# The same field of view photographed twice (each pair checked by eye), with the splits.
SAME_FIELD = {(f"BloodImage_{a:05d}", f"BloodImage_{b:05d}"): (split_a, split_b)
              for a, b, split_a, split_b in [
    (37, 38, "val", "train"), (204, 277, "train", "val"), (205, 276, "test", "train"),
    (206, 278, "train", "train"), (223, 263, "val", "train"), (224, 264, "train", "train"),
    (226, 261, "test", "val"), (227, 260, "test", "val"), (228, 259, "val", "train"),
    (229, 258, "test", "train"), (230, 257, "val", "train"), (231, 256, "train", "train"),
    (233, 254, "test", "train"), (236, 253, "val", "test"), (237, 252, "train", "train"),
    (242, 249, "train", "test"), (243, 250, "train", "train"), (244, 247, "val", "train"),
    (248, 249, "train", "test"), (381, 397, "val", "val"), (382, 395, "train", "train"),
    (384, 393, "train", "train"), (386, 391, "val", "test")]}
# Files from another annotator/tool (labelImg on a Mac, folder "RBC"): only RBC boxed.
FOREIGN = {"BloodImage_00171", "BloodImage_00178", "BloodImage_00228"}
# Implausible sizes: a platelet boxed as WBC, two WBCs boxed as platelets, a tiny "RBC".
MISLABELS = {("BloodImage_00113", 12), ("BloodImage_00133", 9), ("BloodImage_00135", 8),
             ("BloodImage_00353", 12)}
NO_WBC = {"BloodImage_00133", "BloodImage_00135", "BloodImage_00327"} | FOREIGN
NO_RBC = {f"BloodImage_{n:05d}" for n in (134, 147, 150, 152, 224, 249, 250, 258, 267, 268,
                                           303, 322, 327, 330, 350)}


@pytest.fixture(scope="module")
def report(bccd_root) -> ValidationReport:
    return validate_dataset(bccd_root)


def keys(report, kind, severity=None):
    return {(i.image, i.object) for i in report.by_kind(kind)
            if severity is None or i.severity == severity}


def test_totals(report, bccd_root):
    """Images, raw objects and split sizes: notebook 01's ci-check cell."""
    assert report.root == str(bccd_root.resolve())
    assert report.objects_kept == report.objects_raw - len(DROPPED)
    assert report.per_class == {"rbc": 4155 - 9, "wbc": 372, "platelets": 361}


def test_kinds_found_on_bccd(report):
    assert set(report.counts()) == {
        "zero_area", "near_duplicate_box", "class_size_outlier", "missing_class",
        "metadata_mismatch", "foreign_annotation", "near_duplicate_image"}


def test_dropped_objects_match_the_loader_and_are_errors(report):
    """BCCD has 9 errors, the boxes the loader drops: the report is not ok."""
    errors = {(i.image, i.object): i.kind for i in report.issues if i.severity == "error"}
    assert errors == DROPPED
    assert sum(row["error"] for row in report.counts().values()) == len(DROPPED)
    assert report.ok is False


def test_class_size_outliers(report):
    assert keys(report, "class_size_outlier", "warning") == MISLABELS
    detail = {(i.image, i.object): i.detail for i in report.by_kind("class_size_outlier")}
    assert "fits platelets" in detail[("BloodImage_00113", 12)]      # a platelet boxed as wbc
    assert all(i.severity == "info" for i in report.by_kind("class_size_outlier")
               if (i.image, i.object) not in MISLABELS)


def test_missing_classes(report):
    issues = report.by_kind("missing_class")
    assert {i.image for i in issues if "no wbc box" in i.detail} == NO_WBC
    assert {i.image for i in issues if "no rbc box" in i.detail} == NO_RBC
    assert not any("no platelets box" in i.detail for i in issues)   # 55 %: not expected
    assert all(i.object is None and i.severity == "warning" for i in issues)


def test_foreign_annotations_and_metadata(report):
    assert keys(report, "foreign_annotation") == {(image, None) for image in FOREIGN}
    assert keys(report, "metadata_mismatch") == {(image, None) for image in FOREIGN}


def test_same_field_of_view_pairs(report):
    pairs = {(p.a, p.b): (p.splits_a[0], p.splits_b[0]) for p in report.image_pairs}
    assert pairs == SAME_FIELD
    issues = {i.image: i for i in report.by_kind("near_duplicate_image")}
    crossing = issues["BloodImage_00227"]
    assert crossing.severity == "warning" and "BloodImage_00260" in crossing.detail
    assert issues["BloodImage_00231"].severity == "info"
    assert sum(i.severity == "warning" for i in issues.values()) == sum(
        a != b for a, b in SAME_FIELD.values())


def test_json_shape_is_exact(report):
    data = json.loads(report.to_json())
    assert data == report.to_dict()
    assert list(data) == ["root", "images", "objects_raw", "objects_kept", "per_class", "splits",
                          "issues"]
    assert isinstance(data["root"], str)
    for key in ("images", "objects_raw", "objects_kept"):
        assert type(data[key]) is int
    assert list(data["per_class"]) == ["rbc", "wbc", "platelets"]
    assert list(data["splits"]) == ["train", "val", "trainval", "test"]
    assert all(type(n) is int for n in [*data["per_class"].values(), *data["splits"].values()])
    assert data["issues"]
    for issue in data["issues"]:
        assert list(issue) == ["image", "object", "kind", "severity", "detail", "action"]
        assert issue["image"] is None or isinstance(issue["image"], str)
        assert issue["object"] is None or type(issue["object"]) is int
        assert issue["kind"] in KINDS and issue["severity"] in SEVERITIES
        assert issue["detail"] and issue["action"]


def test_text(report):
    text = str(report)
    assert all(kind in text for kind in report.counts())
    assert repr(report) == text      # what a notebook stores as text: no raw fields


def _cli_validate(*args):
    return subprocess.run([sys.executable, "-m", "medaidet", "data", "validate", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


@pytest.mark.slow(seconds=7)
def test_cli_json(bccd_root, report):
    result = _cli_validate(str(bccd_root), "--json")
    assert result.returncode == 1, result.stderr     # errors reported: the 9 dropped boxes
    assert json.loads(result.stdout) == report.to_dict()


def test_cli_exits_0_without_errors(bccd_copy):
    result = _cli_validate(str(bccd_copy(CLEAN_IDS[:3])), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["images"] == 3 and data["issues"] == []


def test_cli_without_data_says_how_to_get_it(tmp_path):
    result = _cli_validate(str(tmp_path / "nowhere"))
    assert result.returncode == 2 and "medaidet data download" in result.stderr


def test_an_image_without_objects_is_not_missing_a_class(bccd_copy):
    root = bccd_copy()                          # 10 images: missing_class is on
    edit_objects(root, split_ids(root, "train")[:1])
    report = validate_dataset(root)
    assert report.images == 10 and report.issues == [] and report.ok


def test_an_id_listed_in_trainval_alone_is_validated(bccd_copy):
    """BCCDDataset(split="trainval") loads it, so the report checks it too."""
    ids = ["BloodImage_00000", "BloodImage_00001"]
    assert validate_dataset(bccd_copy(ids, {"train": ids[:1], "trainval": ids})).images == 2
