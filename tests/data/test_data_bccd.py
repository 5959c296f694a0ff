"""The BCCD loader on the real data: published facts, conversions, drops, strict mode."""
import os
import shutil
import subprocess
import sys
import warnings
import xml.etree.ElementTree as ET
from collections import Counter

import numpy as np
import pytest

from medaidet.data import BCCD_LABEL_NAMES
from medaidet.data.bccd import (AnnotationWarning, BCCDDataset, annotation_report,
                                parse_annotation, read_split)
from medaidet.errors import ConfigError, DataError, MedaidetError
from conftest import BCCD_DROPPED as DROPPED

SPLIT_SIZES = {"train": 205, "val": 87, "trainval": 292, "test": 72}


@pytest.fixture(scope="module")
def datasets(bccd_root):
    with pytest.warns(AnnotationWarning):
        result = {split: BCCDDataset(bccd_root, split) for split in SPLIT_SIZES}
    return result


def test_label_names_in_course_order():
    assert BCCD_LABEL_NAMES == ("rbc", "wbc", "platelets")


def test_published_split_facts(bccd_root):
    ids = {split: read_split(bccd_root, split) for split in SPLIT_SIZES}
    assert {split: len(v) for split, v in ids.items()} == SPLIT_SIZES
    train, val, trainval, test = (set(ids[s]) for s in ("train", "val", "trainval", "test"))
    assert trainval == train | val
    assert not train & val and not trainval & test
    assert len(trainval | test) == 364
    assert len(list((bccd_root / "Annotations").glob("*.xml"))) == 364


def test_published_box_counts(bccd_root):
    names = Counter()
    for path in sorted((bccd_root / "Annotations").glob("*.xml")):
        names.update(o.name for o in parse_annotation(path).objects)
    assert sum(names.values()) == 4888
    assert names == {"RBC": 4155, "WBC": 372, "Platelets": 361}


def test_dataset_lengths_and_keys(datasets):
    for split, dataset in datasets.items():
        assert len(dataset) == SPLIT_SIZES[split]
        assert dataset.keys == ("img", "bbox", "label")


def test_example_types_shapes_and_ranges(datasets):
    dataset = datasets["test"]
    for i in (0, len(dataset) // 2, len(dataset) - 1):
        img, bbox, label = dataset[i]
        assert img.dtype == np.float32 and img.shape == (3, 480, 640)
        assert 0 <= img.min() and img.max() <= 255 and img.max() > 1
        assert bbox.dtype == np.float32 and bbox.ndim == 2 and bbox.shape[1] == 4
        assert label.dtype == np.int32 and label.shape == (len(bbox),)
        assert len(bbox) > 0
        assert np.all(bbox[:, :2] >= 0)
        assert np.all(bbox[:, 2] <= 479) and np.all(bbox[:, 3] <= 639)
        assert np.all(bbox[:, 2] > bbox[:, 0]) and np.all(bbox[:, 3] > bbox[:, 1])
        assert set(label.tolist()) <= {0, 1, 2}


def test_all_boxes_valid_and_counted(datasets):
    counts = Counter()
    for split in ("trainval", "test"):
        for bbox, label in datasets[split].slice[:, ("bbox", "label")]:
            assert np.all(bbox[:, 2:] > bbox[:, :2])
            counts.update(BCCD_LABEL_NAMES[x] for x in label)
    # 4888 raw boxes minus the 9 dropped ones (2 zero-area RBC, 7 RBC boxed twice)
    assert counts == {"rbc": 4155 - 9, "wbc": 372, "platelets": 361}


def test_known_box_round_trips_to_its_xml(datasets, bccd_root):
    root = ET.parse(bccd_root / "Annotations" / "BloodImage_00000.xml").getroot()
    first = root.findall("object")[0]
    xml = {tag: int(first.find("bndbox").findtext(tag))
           for tag in ("xmin", "ymin", "xmax", "ymax")}
    assert first.findtext("name") == "WBC" and xml == {"xmin": 260, "ymin": 177, "xmax": 491,
                                                       "ymax": 376}
    dataset = datasets["val"]
    _, bbox, label = dataset[dataset.ids.index("BloodImage_00000")]
    assert bbox[0].tolist() == [176.0, 259.0, 375.0, 490.0]      # (y_min, x_min, y_max, x_max) - 1
    assert label[0] == BCCD_LABEL_NAMES.index("wbc")
    assert len(bbox) == len(root.findall("object"))


def test_dropped_objects_are_reported_with_reasons(datasets):
    dropped = {(d.image_id, d.index): d for s in ("trainval", "test") for d in datasets[s].dropped}
    assert {key: d.kind for key, d in dropped.items()} == DROPPED
    zero = dropped[("BloodImage_00338", 12)]
    assert "zero width and height" in zero.detail and "504..504" in zero.detail
    assert "IoU 0.93" in dropped[("BloodImage_00020", 14)].detail
    assert all(not d.clipped for d in datasets.values())


def test_default_mode_warns_naming_the_drops(bccd_root):
    with pytest.warns(AnnotationWarning, match=r"dropped 1 .*BloodImage_00284.*object 1"):
        BCCDDataset(bccd_root, "test")


def test_strict_mode_raises_naming_file_and_object(bccd_root):
    with pytest.raises(DataError) as info:
        BCCDDataset(bccd_root, "test", strict=True)
    error = info.value
    assert error.path.name == "BloodImage_00284.xml" and error.object_index == 1
    assert error.kind == "near_duplicate_box"
    assert str(error.path) in str(error) and "object 1" in str(error)


def test_slice_like_chainercv(datasets):
    dataset = datasets["val"]
    bboxes = dataset.slice[:4, "bbox"]
    assert len(bboxes) == 4 and bboxes[0].shape[1] == 4
    pairs = dataset.slice[1:3, ("img", "label")]
    img, label = pairs[0]
    assert img.shape == (3, 480, 640) and label.dtype == np.int32
    assert dataset.slice[:, ("bbox", "label")].keys == ("bbox", "label")


def test_return_difficult(bccd_root):
    with pytest.warns(AnnotationWarning):
        dataset = BCCDDataset(bccd_root, "test", return_difficult=True)
    assert dataset.keys == ("img", "bbox", "label", "difficult")
    bbox, difficult = dataset.slice[:1, ("bbox", "difficult")][0]
    assert difficult.dtype == bool and difficult.shape == (len(bbox),) and not difficult.any()


def test_root_from_environment(bccd_root, monkeypatch):
    monkeypatch.setenv("MEDAIDET_DATA", str(bccd_root))
    with pytest.warns(AnnotationWarning):
        dataset = BCCDDataset(split="test")
    assert dataset.root == bccd_root.resolve() and len(dataset) == 72


def test_unknown_split_is_a_named_error(bccd_root):
    with pytest.raises(DataError) as info:
        BCCDDataset(bccd_root, "validation")
    assert info.value.kind == "split" and "'validation'" in str(info.value)


def test_examples_are_copies(datasets):
    dataset = datasets["val"]
    _, bbox, _ = dataset[0]
    bbox[:] = -1
    assert dataset[0][1].min() >= 0


def test_labels_match_case_insensitively(bccd_root, tmp_path):
    """Other exports write ``rbc``/``platelets``; spaces around the name are ignored."""
    image_id = "BloodImage_00000"
    for folder in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (tmp_path / folder).mkdir(parents=True)
    shutil.copy(bccd_root / "JPEGImages" / f"{image_id}.jpg", tmp_path / "JPEGImages")
    text = (bccd_root / "Annotations" / f"{image_id}.xml").read_text()
    text = text.replace("<name>RBC</name>", "<name> rbc </name>", 3)
    text = text.replace("<name>WBC</name>", "<name>wBc</name>")
    (tmp_path / "Annotations" / f"{image_id}.xml").write_text(text)
    (tmp_path / "ImageSets/Main/test.txt").write_text(image_id + "\n")
    with pytest.warns(AnnotationWarning):
        original = BCCDDataset(bccd_root, "val")
    expected = original[original.ids.index(image_id)]
    dataset = BCCDDataset(tmp_path, "test", strict=True)
    _, bbox, label = dataset[0]
    np.testing.assert_array_equal(bbox, expected[1])
    np.testing.assert_array_equal(label, expected[2])


def test_parsed_annotations_are_cached(bccd_root):
    path = bccd_root / "Annotations" / "BloodImage_00000.xml"
    assert parse_annotation(path) is parse_annotation(path)


def test_a_splits_annotation_report_is_shown_once_per_process(bccd_root):
    # notebook, recipe and evaluator load a split: its report shows the first time only
    program = ("from medaidet.data.bccd import BCCDDataset\n"
               "def notebook(): return BCCDDataset(None, 'val')\n"
               "def recipe(): return BCCDDataset(None, 'val')\n"
               "notebook(); recipe(); BCCDDataset(None, 'test'); BCCDDataset(None, 'test')\n")
    env = {**os.environ, "MEDAIDET_DATA": str(bccd_root)}
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    reports = [line for line in done.stderr.splitlines() if "AnnotationWarning" in line]
    assert len(reports) == 2, done.stderr
    assert "BCCD val" in reports[0] and "BCCD test" in reports[1]


def test_quiet_annotation_warnings_reach_the_processes_it_starts(bccd_root):
    program = ("import subprocess, sys\n"
               "from medaidet.data.bccd import BCCDDataset, quiet_annotation_warnings\n"
               "quiet_annotation_warnings()\n"
               "print(len(BCCDDataset(None, 'val').dropped))\n"
               "subprocess.run([sys.executable, '-c', 'from medaidet.data.bccd import "
               "BCCDDataset; BCCDDataset(None, \"test\")'], check=True)\n")
    env = {**os.environ, "MEDAIDET_DATA": str(bccd_root)}
    env.pop("MEDAIDET_QUIET_ANNOTATIONS", None)
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3"]
    assert "AnnotationWarning" not in done.stderr, done.stderr


def test_the_annotation_report_counts_what_each_split_drops(bccd_root):
    table = annotation_report(bccd_root)
    rows = {row[0]: row[1:] for row in table.rows}
    assert rows["train"][:4] == [205, 2800, 5, 0]
    assert rows["val"][:4] == [87, 1135, 3, 0]
    assert rows["test"] == [72, 944, 1, 0, "near_duplicate_box 1"]
    assert sum(row[1] for row in rows.values()) == 4879        # notebook 01's total kept
    assert "| test | 72 | 944 | 1 | 0 | near_duplicate_box 1 |" in table.to_markdown()


@pytest.mark.parametrize("bad", [123, 1.5, True, b"/data/bccd", ["/data/bccd"], "", "  "])
def test_root_that_is_no_path_is_named(bad):
    with pytest.raises(ConfigError) as info:
        BCCDDataset(bad)
    msg = str(info.value)
    assert isinstance(info.value, MedaidetError)
    assert msg.startswith(f"root: {bad!r} is not a folder path; expected a str or "
                          "os.PathLike naming the dataset root")
    assert msg.endswith("or None for $MEDAIDET_DATA, else the cache directory")


def test_root_as_path_str_or_none_loads_the_same_split(bccd_root, monkeypatch):
    monkeypatch.setenv("MEDAIDET_DATA", str(bccd_root))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnnotationWarning)
        loaded = [BCCDDataset(root, "test") for root in (bccd_root, str(bccd_root), None)]
    assert {d.root for d in loaded} == {bccd_root.resolve()}
    assert [len(d) for d in loaded] == [SPLIT_SIZES["test"]] * 3
