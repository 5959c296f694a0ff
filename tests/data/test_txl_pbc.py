"""Which TXL-PBC images are BCCD's, the table derived again from the real data (TXL-PBC beside
the checkout in CI, ../shared/txl-pbc); BCCD's images with either annotation."""
import shutil
import sys
from collections import Counter
from dataclasses import astuple
from pathlib import Path

import numpy as np
import pytest

from medaidet.data.bccd import AnnotationWarning, BCCDDataset, LINKS_FILE, bccd_links, read_split
from medaidet.data.txl_pbc import (REEXPORTED_FILE, TXLPBCDataset, _txl_images, census,
                                   reexported_links)
from medaidet.errors import ConfigError, DataError, MedaidetError
from medaidet.training.config import TrainConfig
from medaidet.training.train import Recipe

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from txl_links import (_ranks, _thumbnail, find_bccd_images,  # noqa: E402  (tools/: no package)
                       find_reexported_bccd, links_tsv)


def test_the_shipped_table_links_221_bccd_images_by_bccds_own_splits(bccd_root):
    links = bccd_links()
    assert len(links) == 221 and len({link.bccd_id for link in links}) == 221
    assert len({(link.txl_split, link.txl_name) for link in links}) == 221
    assert Counter(link.bccd_split for link in links) == {"train": 124, "val": 57, "test": 40}
    split_of = {i: s for s in ("train", "val", "test") for i in read_split(bccd_root, s)}
    assert all(split_of[link.bccd_id] == link.bccd_split for link in links)
    # TXL-PBC's own training split holds BCCD val and test images: its splits cannot be used
    crossing = Counter(link.bccd_split for link in links if link.txl_split == "train")
    assert crossing["val"] == 38 and crossing["test"] == 26


@pytest.mark.slow(seconds=2)
def test_the_table_is_derived_again_from_the_pixels(bccd_root, txl_root):
    links = find_bccd_images(txl_root, bccd_root)
    assert links_tsv(links) == LINKS_FILE.read_text(encoding="utf-8")


def test_two_bccd_images_with_the_same_pixels_are_refused(bccd_root, tmp_path):
    root = tmp_path / "bccd"
    shutil.copytree(bccd_root / "ImageSets", root / "ImageSets")
    (root / "JPEGImages").mkdir()
    ids = sorted(i for s in ("train", "val", "test") for i in read_split(bccd_root, s))
    first, second = ids[:2]
    for image_id in ids:
        source = first if image_id == second else image_id
        (root / "JPEGImages" / f"{image_id}.jpg").symlink_to(
            bccd_root / "JPEGImages" / f"{source}.jpg")
    with pytest.raises(MedaidetError, match=f"BCCD images {first} and {second} have the same"):
        find_bccd_images(tmp_path / "no-txl", root)


def test_a_table_without_its_header_is_named(tmp_path):
    bad = tmp_path / "links.tsv"
    bad.write_text("test\tabc\tBloodImage_00001\ttest\n")
    with pytest.raises(MedaidetError, match="links.tsv: expected the header"):
        bccd_links(bad)


def _counts(dataset):
    return np.bincount(np.concatenate(list(dataset.slice[:, "label"])), minlength=3).tolist()


@pytest.mark.slow(seconds=2)
def test_the_re_annotation_boxes_twice_the_red_cells_bccd_boxed(bccd_root, txl_root):
    counts = {}
    for split, n in (("train", 124), ("val", 57), ("test", 40)):
        txl = BCCDDataset(split=split, labels="txl-pbc")
        with pytest.warns(AnnotationWarning, match=f"BCCD {split} \\([^,]*\\): dropped"):
            bccd = BCCDDataset(split=split, reannotated_only=True)   # BCCD's own defects
        assert txl.ids == bccd.ids and len(txl) == n
        assert txl.dropped == [] and txl.clipped == []
        counts[split] = (_counts(txl), _counts(bccd))
    # rbc, wbc, platelets on the 40 test images: the re-annotation's, then BCCD's
    assert counts["test"] == ([926, 43, 37], [433, 38, 31])
    assert sum(c[0][0] for c in counts.values()) == 5130
    img, bbox, label = BCCDDataset(split="test", labels="txl-pbc")[0]
    assert img.shape == (3, 480, 640) and bbox.dtype == np.float32 and label.dtype == np.int32
    assert (bbox[:, :2] >= 0).all() and (bbox[:, 2] <= 479).all() and (bbox[:, 3] <= 639).all()
    assert (bbox[:, 2:] > bbox[:, :2]).all()


def test_no_bccd_val_or_test_image_reaches_training_through_txl_pbcs_splits(bccd_root, txl_root):
    held_out = set(read_split(bccd_root, "val")) | set(read_split(bccd_root, "test"))
    train = BCCDDataset(split="train", labels="txl-pbc")
    assert not set(train.ids) & held_out
    assert set(train.ids) <= set(read_split(bccd_root, "train"))
    config = TrainConfig.profile("smoke", labels="txl-pbc", subset=None)
    recipe = Recipe(config)
    data = recipe.datasets(recipe.model())
    assert data.images.ids == train.ids and data.images.labels == "txl-pbc"
    assert len(data.val) == 2


def test_labels_are_checked_by_name(bccd_root):
    with pytest.raises(ConfigError, match="^labels: 'txl'"):
        BCCDDataset(split="test", labels="txl")
    with pytest.raises(ConfigError, match="^labels: 'TXL'"):
        TrainConfig(labels="TXL")


def test_without_txl_pbc_the_re_annotation_says_how_to_get_it(bccd_root, tmp_path, monkeypatch):
    monkeypatch.setenv("MEDAIDET_TXL_PBC", str(tmp_path / "nowhere"))
    with pytest.raises(DataError) as info:
        BCCDDataset(split="test", labels="txl-pbc")
    assert info.value.kind == "not_found"
    assert "medaidet data download --dataset txl-pbc" in str(info.value)


def test_sources_by_image_size(txl_root):
    counts = census(txl_root)
    assert sum(counts.values()) == 1440 and not any("unknown" in s for _, s in counts)
    by_source = Counter()
    for (_, source), n in counts.items():
        by_source[source] += n
    assert by_source == {"BCCD": 221, "BCCD, re-exported": 219, "PBC": 500, "Raabin-WBC": 500}
    for source in ("PBC", "Raabin-WBC"):       # split 350 / 100 / 50
        assert [counts["train", source], counts["val", source], counts["test", source]] == [
            350, 100, 50]


@pytest.mark.slow(seconds=9)
def test_the_416_pixel_images_are_bccds_own_again_and_the_table_is_derived_again(bccd_root,
                                                                                txl_root):
    found = find_reexported_bccd(txl_root, bccd_root)
    shipped = reexported_links()
    # the same links; the similarity to within rounding (image decoders differ in the last bit)
    assert [r[:4] for r in map(astuple, found)] == [r[:4] for r in map(astuple, shipped)]
    assert all(abs(float(a.similarity) - float(b.similarity)) <= 0.01
               for a, b in zip(found, shipped))
    assert links_tsv(shipped) == REEXPORTED_FILE.read_text(encoding="utf-8")
    assert len(found) == 219 and sum(float(r.similarity) >= 0.75 for r in found) == 216
    # ...while no image of another laboratory resembles a BCCD image that much
    bccd = np.stack([_ranks(_thumbnail(p)) for p in sorted((bccd_root / "JPEGImages").glob("*"))])
    others = [p for split, p, size in _txl_images(txl_root) if size in ((575, 575), (360, 363))]
    best = max(float(np.max(bccd @ _ranks(np.rot90(_thumbnail(p), k))))
               for p in others[::10] for k in range(4))
    assert best < 0.7
    # TXL-PBC's train split holds re-exports of 38 BCCD val and 27 BCCD test images
    leaks = Counter(r.bccd_split for r in found if r.txl_split == "train")
    assert leaks["val"] == 38 and leaks["test"] == 27


def test_other_laboratories_load_with_txl_pbcs_boxes_and_their_defects_named(txl_root):
    with pytest.warns(AnnotationWarning, match=r"TXL-PBC test \(PBC; .*\): dropped 36 and "
                      "clipped 0 line"):
        pbc = TXLPBCDataset(txl_root, "test", "PBC")
    with pytest.warns(AnnotationWarning, match=r"TXL-PBC test \(PBC, Raabin-WBC; "):
        both = TXLPBCDataset(txl_root, "test")
    assert len(pbc) == 50 and len(both) == 100 and Counter(both.sources) == {
        "PBC": 50, "Raabin-WBC": 50}
    assert all(i.startswith("PBC/") for i in pbc.ids)
    assert _counts(pbc) == [831, 53, 32]
    # two PBC test files list boxes twice: the copies are dropped, named by line
    assert len(pbc.dropped) == 36 and len({image for image, _ in pbc.dropped}) == 2
    img, bbox, label = pbc[0]
    assert img.shape == (3, 363, 360) and bbox.shape == (len(label), 4)
    for bad in ({"sources": "BCCD"}, {"sources": ()}, {"split": "trainval"}):
        with pytest.raises(ConfigError):
            TXLPBCDataset(txl_root, **{"split": "test", **bad})


@pytest.mark.slow(seconds=8)
@pytest.mark.filterwarnings("ignore::medaidet.data.bccd.AnnotationWarning")   # the sources' defects
def test_training_can_add_other_laboratories_images(bccd_root, txl_root):
    config = TrainConfig.profile("smoke", labels="txl-pbc", subset=None,
                                 other_sources=["PBC", "Raabin-WBC"])
    assert TrainConfig.from_dict(config.to_dict()) == config
    recipe = Recipe(config)
    data = recipe.datasets(recipe.model())
    assert len(data.images) == 124 + 700           # BCCD's train split decides; val stays BCCD's
    with pytest.raises(ConfigError, match="other_sources: \\['BCCD'\\]"):
        TrainConfig(other_sources=["BCCD"])
