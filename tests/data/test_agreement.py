"""medaidet.data.agreement on BCCD's real same-field pairs."""
import numpy as np
import pytest

from medaidet.data.agreement import count_agreement, pair_counts
from medaidet.data.bccd import annotation_path, parse_annotation
from medaidet.data.validate import validate_dataset
from medaidet.data.same_field import ImagePair


@pytest.fixture(scope="module")
def report(bccd_root):
    return validate_dataset(bccd_root)


def itself(image):
    """``image`` paired with itself, unshifted."""
    return ImagePair(image, image, (), (), 0, 0, 1.0, 1.0)


def test_an_image_paired_with_itself_agrees_exactly_inside_the_margin(bccd_root):
    image = "BloodImage_00037"
    [row] = pair_counts(bccd_root, [itself(image)], margin=0)
    objs = parse_annotation(annotation_path(bccd_root, image)).objects
    expected = np.bincount([o.label for o in objs], minlength=3)
    assert row.counts_a.tolist() == row.counts_b.tolist() == expected.tolist()
    result = count_agreement([row])
    assert all(result[c]["relative_error"] == 0 for c in ("rbc", "wbc", "platelets"))
    # the margin keeps only boxes whose centre is inside
    [inner] = pair_counts(bccd_root, [itself(image)], margin=100)
    assert inner.region == (100, 100, 540, 380)
    assert 0 < inner.counts_a.sum() < expected.sum()


def test_bccd_pairs_agree_on_wbc_and_platelets_but_not_on_rbc(bccd_root, report):
    """The measurement docs/cpu-detector.md reports; flagged images are left out."""
    flagged = {i.image for i in report.by_kind("missing_class")}
    rows = pair_counts(bccd_root, report.image_pairs)
    result = count_agreement(rows, exclude=flagged)
    assert result["wbc"]["n_pairs"] >= 15
    assert result["wbc"]["relative_error"] == 0
    assert result["platelets"]["relative_error"] == 0
    assert 0.1 < result["rbc"]["relative_error"] < 0.4
    assert result["rbc"]["n_pairs"] < count_agreement(rows)["rbc"]["n_pairs"]
    # with the shift the wrong way round the white cells no longer line up
    flipped = [p._replace(dx=-p.dx, dy=-p.dy) for p in report.image_pairs]
    wrong = count_agreement(pair_counts(bccd_root, flipped), exclude=flagged)
    assert wrong["wbc"]["relative_error"] > 0.1


def test_an_empty_class_gives_no_ratio(bccd_root):
    # a pair whose shared part holds no platelet: no ratio to take
    rows = pair_counts(bccd_root, [itself("BloodImage_00230")])
    assert count_agreement(rows)["platelets"]["relative_error"] is None


def test_an_annotation_without_size_takes_it_from_the_image(bccd_root, tmp_path):
    import re
    import shutil

    image = "BloodImage_00037"
    (tmp_path / "Annotations").mkdir()
    (tmp_path / "JPEGImages").mkdir()
    xml = annotation_path(bccd_root, image).read_text()
    (tmp_path / "Annotations" / f"{image}.xml").write_text(
        re.sub(r"<size>.*?</size>", "", xml, flags=re.S))
    shutil.copy(bccd_root / "JPEGImages" / f"{image}.jpg", tmp_path / "JPEGImages")
    assert parse_annotation(tmp_path / "Annotations" / f"{image}.xml").size is None
    [row] = pair_counts(tmp_path, [itself(image)], margin=100)
    assert row.region == (100, 100, 540, 380)           # 640 x 480 read from the JPEG
    [reference] = pair_counts(bccd_root, [itself(image)], margin=100)
    assert row.counts_a.tolist() == reference.counts_a.tolist()


def test_the_re_annotation_agrees_with_itself_far_better_than_bccd_on_red_cells(bccd_root,
                                                                               txl_root, report):
    """Notebook 10's yardstick: TXL-PBC's own red-cell disagreement (about a tenth)."""
    txl = pair_counts(bccd_root, report.image_pairs, labels="txl-pbc", txl_root=txl_root)
    assert 20 <= len(txl) < len(report.image_pairs)
    bccd = pair_counts(bccd_root, [p for p in report.image_pairs
                                   if (p.a, p.b) in {(r.a, r.b) for r in txl}])
    assert [(r.a, r.b) for r in bccd] == [(r.a, r.b) for r in txl]
    ours, theirs = count_agreement(txl), count_agreement(bccd)
    assert ours["wbc"]["abs_difference"] <= 1 and ours["platelets"]["abs_difference"] <= 1
    assert 0.05 < ours["rbc"]["relative_error"] < 0.15
    assert theirs["rbc"]["relative_error"] > 3 * ours["rbc"]["relative_error"]
    assert ours["rbc"]["boxes_a"] > 1.5 * theirs["rbc"]["boxes_a"]
    with pytest.raises(ValueError, match="^labels: 'voc'"):
        pair_counts(bccd_root, report.image_pairs, labels="voc")
