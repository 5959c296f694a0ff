"""Which TXL-PBC images are BCCD's: the shipped table, and the same table derived again from the
real data (TXL-PBC beside the checkout in CI, ../shared/txl-pbc)."""
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

from medaidet.data.txl_pbc import LINKS_FILE, bccd_links, find_bccd_images, links_tsv
from medaidet.data.voc import read_split
from medaidet.errors import MedaidetError

TXL_ROOT = Path(__file__).resolve().parents[2].parent / "shared" / "txl-pbc"
needs_txl = pytest.mark.skipif(not (TXL_ROOT / "TXL_PBC").is_dir()
                               and os.environ.get("CI_REQUIRE_TXL") != "1",
                               reason=f"TXL-PBC is not at {TXL_ROOT} (CI requires it)")


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


@needs_txl
@pytest.mark.slow(seconds=5)
def test_the_table_is_derived_again_from_the_pixels(bccd_root):
    links = find_bccd_images(TXL_ROOT, bccd_root)
    assert links_tsv(links) == LINKS_FILE.read_text(encoding="utf-8")


def test_two_bccd_images_with_the_same_pixels_are_refused(bccd_root, tmp_path):
    root = tmp_path / "bccd"
    shutil.copytree(bccd_root / "ImageSets", root / "ImageSets")
    (root / "JPEGImages").mkdir()
    ids = sorted(i for s in ("train", "val", "test") for i in read_split(bccd_root, s))
    first, second = ids[:2]
    for image_id in ids:
        source = first if image_id == second else image_id     # second: a copy of first
        (root / "JPEGImages" / f"{image_id}.jpg").symlink_to(
            bccd_root / "JPEGImages" / f"{source}.jpg")
    with pytest.raises(MedaidetError, match=f"BCCD images {first} and {second} have the same"):
        find_bccd_images(tmp_path / "no-txl", root)


def test_a_table_without_its_header_is_named(tmp_path):
    bad = tmp_path / "links.tsv"
    bad.write_text("test\tabc\tBloodImage_00001\ttest\n")
    with pytest.raises(MedaidetError, match="links.tsv: expected the header"):
        bccd_links(bad)
