"""tests/synthetic.py's BCCD-like data: layout, exact boxes, clean for loader and validator."""
import hashlib
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import synthetic as synth
from synthetic import DestinationNotEmptyError, SynthError, make_synthetic


LABELS = ("RBC", "WBC", "Platelets")
SPLITS = ("train", "val", "trainval", "test")


def files_of(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def read_split(root: Path, name: str) -> list:
    return (root / "ImageSets" / "Main" / f"{name}.txt").read_text().split()


def parse(root: Path, image_id: str):
    """(width, height, [(name, difficult, xmin, ymin, xmax, ymax)]) from the XML."""
    tree = ET.parse(root / "Annotations" / f"{image_id}.xml").getroot()
    size = tree.find("size")
    w, h = int(size.find("width").text), int(size.find("height").text)
    assert int(size.find("depth").text) == 3
    assert tree.find("filename").text == f"{image_id}.jpg"
    objects = []
    for obj in tree.iter("object"):
        box = obj.find("bndbox")
        objects.append((obj.find("name").text, int(obj.find("difficult").text),
                        *(int(box.find(k).text) for k in ("xmin", "ymin", "xmax", "ymax"))))
    return w, h, objects


def iou(a, b):
    ix = min(a[2], b[2]) - max(a[0], b[0]) + 1
    iy = min(a[3], b[3]) - max(a[1], b[1]) + 1
    if ix <= 0 or iy <= 0:
        return 0.0
    area = lambda q: (q[2] - q[0] + 1) * (q[3] - q[1] + 1)  # noqa: E731
    return ix * iy / (area(a) + area(b) - ix * iy)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return make_synthetic(tmp_path_factory.mktemp("synth") / "ds", n=12, seed=3)


@pytest.fixture(scope="module")
def all_ids(root) -> list:
    return sorted(read_split(root, "trainval") + read_split(root, "test"))


def test_same_seed_gives_identical_bytes_and_other_seed_differs(tmp_path):
    a = files_of(make_synthetic(tmp_path / "a", n=5, seed=7))
    b = files_of(make_synthetic(tmp_path / "b", n=5, seed=7))
    c = files_of(make_synthetic(tmp_path / "c", n=5, seed=8))
    assert a == b and a.keys() == c.keys()
    assert len([k for k in a if k.startswith("JPEGImages/")]) == 5
    assert all(a[k] != c[k] for k in a if k.startswith(("JPEGImages/", "Annotations/")))


def test_image_depends_only_on_seed_and_index(tmp_path):
    small = files_of(make_synthetic(tmp_path / "small", n=3, seed=2))
    large = files_of(make_synthetic(tmp_path / "large", n=4, seed=2))
    # the per-image WBC/platelet schedule depends on n, so compare images with the same counts
    same = [k for k in small if k.startswith("Annotations/") and small[k] == large[k]]
    for key in same:
        jpg = key.replace("Annotations/", "JPEGImages/").replace(".xml", ".jpg")
        assert small[jpg] == large[jpg]


def test_layout_readme_and_checksums(root, all_ids):
    assert all_ids == [f"SynthImage_{i:05d}" for i in range(12)]
    assert sorted(p.stem for p in (root / "JPEGImages").iterdir()) == all_ids
    assert sorted(p.stem for p in (root / "Annotations").iterdir()) == all_ids
    assert sorted(p.name for p in (root / "ImageSets" / "Main").iterdir()) == \
        sorted(f"{s}.txt" for s in SPLITS)
    assert (root / "README.txt").read_text().startswith(synth.README_MARKER)
    listed = {rel: digest for digest, rel in (
        line.split("  ", 1) for line in (root / "SHA256SUMS").read_text().splitlines())}
    assert set(listed) == set(files_of(root)) - {"SHA256SUMS"}
    for rel, digest in listed.items():
        assert hashlib.sha256((root / rel).read_bytes()).hexdigest() == digest, rel
    # nothing left beside the dataset (the temporary build folder was renamed into place)
    assert [p.name for p in root.parent.iterdir()] == [root.name]


def test_images_are_640x480_rgb_jpeg_and_match_their_xml(root, all_ids):
    for image_id in all_ids:
        with Image.open(root / "JPEGImages" / f"{image_id}.jpg") as im:
            assert (im.format, im.mode, im.size) == ("JPEG", "RGB", (640, 480))
            pixels = np.asarray(im)
        w, h, _ = parse(root, image_id)
        assert (w, h) == (640, 480)
        # a pale smear: bright background, not flat, not saturated
        assert 170 < pixels.mean() < 235 and pixels.std() > 8


def test_no_duplicate_or_near_duplicate_boxes(root, all_ids):
    for image_id in all_ids:
        _, _, objects = parse(root, image_id)
        for label in LABELS:
            boxes = [o[2:] for o in objects if o[0] == label]
            for i in range(len(boxes)):
                for j in range(i):
                    assert iou(boxes[i], boxes[j]) < 0.5, (image_id, label, boxes[i], boxes[j])


def test_counts_and_sizes_per_class_are_plausible(root, all_ids):
    per_image = {label: [] for label in LABELS}
    sides = {label: [] for label in LABELS}
    for image_id in all_ids:
        _, _, objects = parse(root, image_id)
        count = Counter(o[0] for o in objects)
        for label in LABELS:
            per_image[label].append(count[label])
        for name, _, xmin, ymin, xmax, ymax in objects:
            sides[name] += [xmax - xmin + 1, ymax - ymin + 1]
    assert min(per_image["RBC"]) >= 5
    assert max(per_image["WBC"]) <= 2 and max(per_image["Platelets"]) <= 3
    assert 0 < sum(per_image["WBC"]) < sum(per_image["RBC"]) / 4
    assert 0 < sum(per_image["Platelets"]) < sum(per_image["RBC"]) / 4
    # a third of the images have no WBC / no platelet: neither is "in almost every image"
    assert per_image["WBC"].count(0) == 4 and per_image["Platelets"].count(0) == 4
    rbc, wbc, plt = (np.array(sides[k]) for k in LABELS)
    assert 65 <= rbc.min() and rbc.max() <= 125 and 85 <= np.median(rbc) <= 110
    assert 140 <= wbc.min() and wbc.max() <= 215
    assert 18 <= plt.min() and plt.max() <= 42
    assert plt.max() < rbc.min() and rbc.max() < wbc.min()


def test_boxes_are_tight_around_the_drawn_cells(root, all_ids):
    """Darker pixels 4 px inside each side, background 3-6 px outside (blur and JPEG)."""
    checked = 0
    for image_id in all_ids:
        w, h, objects = parse(root, image_id)
        with Image.open(root / "JPEGImages" / f"{image_id}.jpg") as im:
            green = np.asarray(im, dtype=np.float32)[:, :, 1]   # the channel every stain darkens
        boxes = [tuple(v - 1 for v in o[2:]) for o in objects]    # 0-based inclusive
        for k, (x0, y0, x1, y1) in enumerate(boxes):
            near = any(bx0 - 10 <= x1 and x0 <= bx1 + 10 and by0 - 10 <= y1 and y0 <= by1 + 10
                       for j, (bx0, by0, bx1, by1) in enumerate(boxes) if j != k)
            if near:
                continue
            sides = []
            if y0 >= 6:
                sides.append((green[y0:y0 + 4, x0:x1 + 1], green[y0 - 6:y0 - 2, x0:x1 + 1]))
            if y1 <= h - 7:
                sides.append((green[y1 - 3:y1 + 1, x0:x1 + 1], green[y1 + 3:y1 + 7, x0:x1 + 1]))
            if x0 >= 6:
                sides.append((green[y0:y1 + 1, x0:x0 + 4], green[y0:y1 + 1, x0 - 6:x0 - 2]))
            if x1 <= w - 7:
                sides.append((green[y0:y1 + 1, x1 - 3:x1 + 1], green[y0:y1 + 1, x1 + 3:x1 + 7]))
            for inside, outside in sides:
                background = np.median(outside)
                assert inside.min() < background - 15, (image_id, objects[k])
                assert outside.min() > background - 15, (image_id, objects[k])
                checked += 1
    assert checked >= 40


def test_shape_box_matches_the_half_coverage_outline():
    h, w = 200, 300
    y0, x0, d = synth._shape(h, w, 150.3, 90.7, 40.0, 30.0, 0.4, np.array([0.02, -0.01]),
                             np.array([0.3, 1.2]))
    box = synth._box_of(y0, x0, d <= 1.0)
    alpha = synth._alpha(d, 35.0)
    on = alpha >= 0.5
    rows, cols = np.flatnonzero(on.any(axis=1)), np.flatnonzero(on.any(axis=0))
    assert box == (x0 + cols[0] + 1, y0 + rows[0] + 1, x0 + cols[-1] + 1, y0 + rows[-1] + 1)
    # clipped at the image's edge: the box ends on the last pixel, 1-based
    y0, x0, d = synth._shape(h, w, 290.0, 5.0, 40.0, 40.0, 0.0, np.array([]), np.array([]))
    xmin, ymin, xmax, ymax = synth._box_of(y0, x0, d <= 1.0)
    assert (ymin, xmax) == (1, w) and xmin == round(290.0 - 40.0) + 1 and ymax == 45 + 1


def test_splits_are_disjoint_cover_everything_and_trainval_is_train_plus_val(root, all_ids):
    train, val, trainval, test = (read_split(root, s) for s in SPLITS)
    assert (len(train), len(val), len(test)) == (8, 2, 2)
    assert not set(train) & set(val) and not set(train) & set(test) and not set(val) & set(test)
    assert sorted(train + val) == trainval
    assert sorted(trainval + test) == all_ids
    for ids in (train, val, trainval, test):
        assert ids == sorted(ids) and len(set(ids)) == len(ids)


@pytest.mark.parametrize("n, expected", [(3, (1, 1, 1)), (4, (2, 1, 1)), (5, (3, 1, 1)),
                                         (24, (14, 5, 5))])
def test_split_sizes(n, expected):
    ids = [f"x{i}" for i in range(n)]
    splits = synth._splits(np.random.default_rng(0), ids)
    assert (len(splits["train"]), len(splits["val"]), len(splits["test"])) == expected
    assert sorted(splits["trainval"] + splits["test"]) == sorted(ids)


def test_the_loader_reads_it_without_dropping_anything(root):
    from medaidet.data import BCCD_LABEL_NAMES
    from medaidet.data.bccd import BCCDDataset
    for split in SPLITS:
        dataset = BCCDDataset(root, split=split, strict=True)   # raises where it would drop
        ids = read_split(root, split)
        assert len(dataset) == len(ids)
        for i, image_id in enumerate(ids):
            img, bbox, label = dataset[i]
            _, _, objects = parse(root, image_id)
            assert img.shape == (3, 480, 640) and img.dtype == np.float32
            assert bbox.shape == (len(objects), 4) and bbox.dtype == np.float32
            assert label.dtype == np.int32 and set(label.tolist()) <= {0, 1, 2}
            assert [BCCD_LABEL_NAMES[k] for k in label] == [o[0].lower() for o in objects]
            # VOC 1-based (xmin, ymin, xmax, ymax) -> 0-based (ymin, xmin, ymax, xmax)
            expected = np.array([[o[3] - 1, o[2] - 1, o[5] - 1, o[4] - 1] for o in objects],
                                dtype=np.float32)
            np.testing.assert_array_equal(bbox, expected)


def _warnings_and_errors(root):
    from medaidet.data.validate import validate_dataset
    report = validate_dataset(root).to_dict()
    return report, [i for i in report["issues"] if i["severity"] in ("error", "warning")]


def test_the_validator_finds_nothing_to_warn_about(root):
    report, bad = _warnings_and_errors(root)
    assert not bad, bad
    assert report["images"] == 12 and report["objects_raw"] == report["objects_kept"]


@pytest.mark.parametrize("n, seed", [(24, 0), (30, 1)])
def test_the_validator_accepts_larger_sets(tmp_path, n, seed):
    # >= 20 boxes per class and >= 10 images: class-size, missing-class, same-field checks run
    report, bad = _warnings_and_errors(make_synthetic(tmp_path / "ds", n=n, seed=seed))
    assert not bad, bad
    assert all(v >= 20 for v in report["per_class"].values()), report["per_class"]
    assert not [i for i in report["issues"] if i["kind"] in
                ("class_size_outlier", "missing_class", "near_duplicate_image")]


def test_non_empty_destination_is_refused_and_left_alone(tmp_path):
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "keep.txt").write_text("precious")
    with pytest.raises(DestinationNotEmptyError, match="not empty"):
        make_synthetic(dest, n=3)
    with pytest.raises(DestinationNotEmptyError, match="does not hold a synthetic dataset"):
        make_synthetic(dest, n=3, overwrite=True)
    assert [p.name for p in dest.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(DestinationNotEmptyError, match="not a folder"):
        make_synthetic(afile, n=3)


def test_overwrite_replaces_a_previous_synthetic_dataset(tmp_path):
    dest = make_synthetic(tmp_path / "ds", n=3, seed=1)
    make_synthetic(tmp_path / "ds", n=4, seed=2, overwrite=True)
    assert len(list((dest / "JPEGImages").iterdir())) == 4
    assert files_of(dest) == files_of(make_synthetic(tmp_path / "ref", n=4, seed=2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "ref"]


def test_an_empty_destination_folder_is_used(tmp_path):
    dest = tmp_path / "empty"
    dest.mkdir()
    assert make_synthetic(dest, n=3) == dest
    assert (dest / "README.txt").is_file()


def test_a_failure_leaves_no_half_dataset(tmp_path, monkeypatch):
    real = synth._make_image

    def failing(seed, index, *args):
        if index == 2:
            raise RuntimeError("disk on fire")
        return real(seed, index, *args)

    monkeypatch.setattr(synth, "_make_image", failing)
    with pytest.raises(RuntimeError, match="disk on fire"):
        make_synthetic(tmp_path / "ds", n=4)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(synth, "_make_image", real)
    old = files_of(make_synthetic(tmp_path / "ds", n=3, seed=5))
    monkeypatch.setattr(synth, "_make_image", failing)
    with pytest.raises(RuntimeError):
        make_synthetic(tmp_path / "ds", n=4, overwrite=True)
    assert files_of(tmp_path / "ds") == old
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]


# n < 3 leaves a split empty, which the loader refuses: refused before anything is written
@pytest.mark.parametrize("kwargs, match", [
    ({"n": 2}, "at least 3"), ({"n": 1}, "at least 3"), ({"n": 0}, "at least 3"),
    ({"n": -3}, "at least 3"), ({"n": 2.5}, "whole number"),
    ({"seed": -1}, "non-negative"), ({"size": (32, 640)}, "too small"),
    ({"size": "big"}, "height, width"),
])
def test_bad_arguments_are_named_errors(tmp_path, kwargs, match):
    with pytest.raises(SynthError, match=match):
        make_synthetic(tmp_path / "ds", **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_smaller_images_scale_the_cells(tmp_path):
    root = make_synthetic(tmp_path / "ds", n=3, seed=4, size=(240, 320))
    for image_id in read_split(root, "trainval") + read_split(root, "test"):
        with Image.open(root / "JPEGImages" / f"{image_id}.jpg") as im:
            assert im.size == (320, 240)
        w, h, objects = parse(root, image_id)
        assert (w, h) == (320, 240) and any(o[0] == "RBC" for o in objects)
        for name, _, xmin, ymin, xmax, ymax in objects:
            assert 1 <= xmin < xmax <= w and 1 <= ymin < ymax <= h
            if name == "RBC":
                assert xmax - xmin + 1 <= 65
