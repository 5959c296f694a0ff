"""Very many boxes: the duplicate checks stay near-linear in memory and match the pairwise rule."""
import re
import shutil
import tracemalloc
import warnings

import numpy as np
import pytest

from medaidet.data.bccd import (AnnotationWarning, BCCDDataset, NEAR_DUPLICATE_IOU,
                                check_annotation, parse_annotation)
from medaidet.data.validate import validate_dataset

IMAGE_ID = "BloodImage_00001"
NAMES = ("RBC", "WBC", "Platelets")
N_BOXES = 10_000
# all pairs take 8 x N^2 bytes per array (800 MB at 10,000 boxes); the file is under 2 MB
PEAK_LIMIT = 200 << 20


def annotation_xml(boxes, labels) -> str:
    """VOC XML for a 640x480 image; ``boxes``: (xmin, ymin, xmax, ymax) 1-based."""
    objects = "".join(
        f"<object><name>{NAMES[label]}</name><pose>Unspecified</pose><truncated>0</truncated>"
        f"<difficult>0</difficult><bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin><xmax>{x1}</xmax>"
        f"<ymax>{y1}</ymax></bndbox></object>\n"
        for (x0, y0, x1, y1), label in zip(boxes, labels))
    return (f"<annotation>\n\t<folder>JPEGImages</folder>\n\t<filename>{IMAGE_ID}.jpg"
            "</filename>\n\t<size><width>640</width><height>480</height><depth>3</depth>"
            f"</size>\n{objects}</annotation>\n")


def lattice_with_planted_duplicates(n):
    """20x20 boxes on a 6x4 px lattice (IoU <= 0.67) with planted copies (IoU 1 and 0.905)."""
    boxes, labels = [], []
    for i in range(n):
        x0, y0 = 1 + 6 * (i % 100), 1 + 4 * (i // 100)
        boxes.append((x0, y0, x0 + 20, y0 + 20))
        labels.append(i % 3)
    exact = {k: k - 37 for k in range(100, n, 100)}
    near = {k: k - 23 for k in range(50, n, 100)}
    for k, source in exact.items():
        boxes[k], labels[k] = boxes[source], labels[source]
    for k, source in near.items():
        x0, y0, x1, y1 = boxes[source]
        boxes[k], labels[k] = (x0 + 1, y0, x1 + 1, y1), labels[source]
    return boxes, labels, exact, near


@pytest.fixture
def many_boxes_root(bccd_root, tmp_path):
    root = tmp_path / "many"
    for folder in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (root / folder).mkdir(parents=True)
    shutil.copy(bccd_root / "JPEGImages" / f"{IMAGE_ID}.jpg", root / "JPEGImages")
    for split in ("train", "trainval"):
        (root / "ImageSets" / "Main" / f"{split}.txt").write_text(f"{IMAGE_ID}\n")
    boxes, labels, exact, near = lattice_with_planted_duplicates(N_BOXES)
    (root / "Annotations" / f"{IMAGE_ID}.xml").write_text(annotation_xml(boxes, labels))
    return root, exact, near


def referenced(detail) -> int:
    """The earlier object a duplicate finding names ("overlaps object 63")."""
    return int(re.search(r"overlaps object (\d+)", detail).group(1))


@pytest.mark.slow(seconds=14)     # tracemalloc slows the XML parsing down a few times
def test_ten_thousand_boxes_validate_in_bounded_memory(many_boxes_root):
    root, exact, near = many_boxes_root
    assert (root / "Annotations" / f"{IMAGE_ID}.xml").stat().st_size > 1_000_000
    tracemalloc.start()
    try:
        report = validate_dataset(root)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK_LIMIT, f"peak {peak / 2**20:.0f} MiB"
    assert report.objects_raw == N_BOXES
    assert report.objects_kept == N_BOXES - len(exact) - len(near)
    found = {i.object: referenced(i.detail) for i in report.by_kind("near_duplicate_box")}
    assert found == {**exact, **near}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnnotationWarning)
        dataset = BCCDDataset(root, "train")
    assert len(dataset.dropped) == len(exact) + len(near)
    assert len(dataset[0][1]) == report.objects_kept


def reference_duplicates(boxes, labels, threshold):
    """{j: k}: box j dropped for k, the first earlier *kept* box of its class, IoU >= threshold."""
    def iou(a, b):
        w = min(a[2], b[2]) - max(a[0], b[0])
        h = min(a[3], b[3]) - max(a[1], b[1])
        inter = max(w, 0) * max(h, 0)
        union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
        return inter / union if union > 0 else 0.0

    kept, dropped = [], {}
    for j, box in enumerate(boxes):
        near = [k for k in kept if labels[k] == labels[j] and iou(boxes[k], box) >= threshold]
        if near:
            dropped[j] = near[0]
        else:
            kept.append(j)
    return dropped


def test_duplicate_rule_matches_the_pairwise_reference(tmp_path):
    """Chains A~B, B~C, A!~C and copies of dropped boxes; 900 boxes span several chunks."""
    rng = np.random.default_rng(0)
    centres = rng.integers(30, 450, size=(150, 2))
    boxes, labels = [], []
    for _ in range(900):
        cx, cy = centres[rng.integers(len(centres))]
        x0, y0 = int(cx + rng.integers(-1, 2)), int(cy + rng.integers(-1, 2))
        size = int(rng.choice([19, 20]))
        boxes.append((x0, y0, x0 + size, y0 + size))
        labels.append(int(rng.integers(2)))
    path = tmp_path / f"{IMAGE_ID}.xml"
    path.write_text(annotation_xml(boxes, labels))
    checked = check_annotation(parse_annotation(path), (480, 640))
    expected = reference_duplicates(boxes, labels, NEAR_DUPLICATE_IOU)
    found = {f.index: referenced(f.detail) for f in checked.findings}
    assert found == expected and {f.kind for f in checked.findings} == {"near_duplicate_box"}
    exact = [j for j, k in expected.items() if boxes[j] == boxes[k]]
    assert len(expected) > 300 and 0 < len(exact) < len(expected)
    assert checked.index.tolist() == [j for j in range(len(boxes)) if j not in expected]
