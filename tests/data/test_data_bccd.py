"""The BCCD loader on the real data: published facts, conversions, drops, strict mode."""
import os
import subprocess
import sys
import warnings
import xml.etree.ElementTree as ET
from collections import Counter

import numpy as np
import pytest

from medaidet.data import BCCD_LABEL_NAMES, SPLITS
from medaidet.data.bccd import (AnnotationWarning, BCCDDataset, annotation_report,
                                parse_annotation, read_split)
from medaidet.errors import ConfigError, DataError
from conftest import BCCD_DROPPED as DROPPED


@pytest.fixture(scope="module")
def datasets(bccd_root):
    with pytest.warns(AnnotationWarning):
        result = {split: BCCDDataset(bccd_root, split) for split in SPLITS}
    return result


def test_published_split_facts_and_the_datasets(bccd_root, datasets):
    """The split sizes, and 364 images, are notebook 01's ci-check cell's."""
    ids = {split: read_split(bccd_root, split) for split in SPLITS}
    train, val, trainval, test = (set(ids[s]) for s in ("train", "val", "trainval", "test"))
    assert trainval == train | val
    assert not train & val and not trainval & test
    assert trainval | test == {p.stem for p in (bccd_root / "Annotations").glob("*.xml")}
    for split, dataset in datasets.items():
        assert dataset.ids == ids[split] and dataset.keys == ("img", "bbox", "label")
    assert BCCD_LABEL_NAMES == ("rbc", "wbc", "platelets")        # the course's order


def test_examples_and_every_box(datasets):
    dataset = datasets["test"]
    for i in (0, len(dataset) // 2, len(dataset) - 1):
        img, bbox, label = dataset[i]
        assert img.dtype == np.float32 and img.shape == (3, 480, 640)
        assert 0 <= img.min() and img.max() <= 255 and img.max() > 1
        assert bbox.dtype == np.float32 and bbox.ndim == 2 and bbox.shape[1] == 4
        assert label.dtype == np.int32 and label.shape == (len(bbox),) and len(bbox) > 0
    counts = Counter()
    for split in ("trainval", "test"):
        for bbox, label in datasets[split].slice[:, ("bbox", "label")]:
            assert np.all(bbox[:, :2] >= 0) and np.all(bbox[:, 2:] > bbox[:, :2])
            assert np.all(bbox[:, 2] <= 479) and np.all(bbox[:, 3] <= 639)
            assert set(label.tolist()) <= {0, 1, 2}
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
    assert "504..504" in dropped[("BloodImage_00338", 12)].detail     # the box, named
    assert all(not d.clipped for d in datasets.values())


def test_strict_mode_raises_naming_file_and_object(bccd_root):
    with pytest.raises(DataError) as info:
        BCCDDataset(bccd_root, "test", strict=True)
    assert (info.value.kind, info.value.path.name, info.value.object_index) == (
        "near_duplicate_box", "BloodImage_00284.xml", 1)


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


def test_unknown_split_is_a_named_error(bccd_root):
    with pytest.raises(DataError) as info:
        BCCDDataset(bccd_root, "validation")
    assert info.value.kind == "split"


def test_examples_are_copies(datasets):
    dataset = datasets["val"]
    _, bbox, _ = dataset[0]
    bbox[:] = -1
    assert dataset[0][1].min() >= 0


def test_parsed_annotations_are_cached(bccd_root):
    path = bccd_root / "Annotations" / "BloodImage_00000.xml"
    assert parse_annotation(path) is parse_annotation(path)


def _python(program, bccd_root):
    """Run ``program`` in a fresh interpreter reading ``bccd_root``; it must succeed."""
    env = {**os.environ, "MEDAIDET_DATA": str(bccd_root)}
    env.pop("MEDAIDET_QUIET_ANNOTATIONS", None)
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def test_a_splits_annotation_report_is_shown_once_per_process(bccd_root):
    # notebook, recipe and evaluator load a split: its report shows the first time only
    done = _python("from medaidet.data.bccd import BCCDDataset\n"
                   "def notebook(): return BCCDDataset(None, 'val')\n"
                   "def recipe(): return BCCDDataset(None, 'val')\n"
                   "notebook(); recipe(); BCCDDataset(None, 'test'); BCCDDataset(None, 'test')\n",
                   bccd_root)
    reports = [line for line in done.stderr.splitlines() if "AnnotationWarning" in line]
    assert len(reports) == 2, done.stderr
    assert "BCCD val" in reports[0] and "BCCD test" in reports[1]


def test_quiet_annotation_warnings_reach_the_processes_it_starts(bccd_root):
    done = _python("import subprocess, sys\n"
                   "from medaidet.data.bccd import BCCDDataset, quiet_annotation_warnings\n"
                   "quiet_annotation_warnings()\n"
                   "print(len(BCCDDataset(None, 'val').dropped))\n"
                   "subprocess.run([sys.executable, '-c', 'from medaidet.data.bccd import "
                   "BCCDDataset; BCCDDataset(None, \"test\")'], check=True)\n", bccd_root)
    assert done.stdout.split() == ["3"]
    assert "AnnotationWarning" not in done.stderr, done.stderr


def test_the_annotation_report_counts_what_each_split_drops(bccd_root):
    table = annotation_report(bccd_root)
    rows = {row[0]: row[1:] for row in table.rows}
    assert rows["train"][1:4] == [2800, 5, 0]                 # kept, dropped, clipped
    assert rows["val"][1:4] == [1135, 3, 0]
    assert rows["test"][1:] == [944, 1, 0, "near_duplicate_box 1"]
    assert sum(row[1] for row in rows.values()) == 4879        # notebook 01's total kept


@pytest.mark.parametrize("bad", [123, 1.5, True, b"/data/bccd", ["/data/bccd"], "", "  "])
def test_root_that_is_no_path_is_named(bad):
    with pytest.raises(ConfigError) as info:
        BCCDDataset(bad)
    assert str(info.value).startswith(f"root: {bad!r} ")       # the field, then the value


def test_root_as_path_str_or_none_loads_the_same_split(bccd_root, monkeypatch):
    monkeypatch.setenv("MEDAIDET_DATA", str(bccd_root))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnnotationWarning)
        loaded = [BCCDDataset(root, "test") for root in (bccd_root, str(bccd_root), None)]
    assert {d.root for d in loaded} == {bccd_root.resolve()}
    assert [d.ids for d in loaded] == [read_split(bccd_root, "test")] * 3
