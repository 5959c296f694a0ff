"""Two annotations of the same images compared box by box (BCCD's own and TXL-PBC's)."""
import numpy as np
import pytest

from medaidet.data.compare import compare_annotations, draw_both, match_boxes


def test_match_boxes_pairs_the_closest_boxes_of_one_class_once():
    a = [[0, 0, 10, 10], [0, 0, 10, 12], [50, 50, 60, 60], [80, 80, 90, 90]]
    b = [[0, 0, 10, 12], [50, 50, 60, 60], [80, 80, 90, 90], [200, 200, 210, 210]]
    pairs, only_a, only_b = match_boxes(a, [0, 0, 1, 1], b, [0, 1, 2, 1])
    # a[1] equals b[0] exactly (IoU 1) and takes it before a[0] (IoU 0.83) can;
    # a[3] and b[2] overlap fully but are of different classes
    assert pairs.tolist() == [[1, 0], [2, 1]]
    assert only_a.tolist() == [0, 3] and only_b.tolist() == [2, 3]
    pairs, only_a, only_b = match_boxes(np.zeros((0, 4)), [], b, [0, 1, 2, 1])
    assert pairs.shape == (0, 2) and only_a.size == 0 and only_b.tolist() == [0, 1, 2, 3]


@pytest.mark.slow(seconds=2)
@pytest.mark.filterwarnings("ignore::medaidet.data.bccd.AnnotationWarning")   # BCCD's defects
def test_the_re_annotation_keeps_bccds_boxes_and_adds_the_cells_it_left_out(bccd_root, txl_root):
    from medaidet.data.bccd import BCCDDataset
    bccd = BCCDDataset(split="test", reannotated_only=True)
    txl = BCCDDataset(split="test", labels="txl-pbc")
    comparison = compare_annotations(bccd, txl, names=("BCCD", "TXL-PBC"))
    table = {row[0]: row[1:] for row in comparison.table().rows}
    # boxes BCCD, boxes TXL-PBC, matched, only BCCD, only TXL-PBC
    assert table == {"rbc": [433, 926, 428, 5, 498], "wbc": [38, 43, 38, 0, 5],
                     "platelets": [31, 37, 30, 1, 7]}
    frame = {(row[0], row[1]): row[2:] for row in comparison.by("frame").rows}
    assert frame["0-2 px", "rbc"] == [1, 333]         # two thirds: cells the frame cuts
    assert sum(comparison.per_image("rbc")[i][1] for i in txl.ids) == 926
    img, bbox, label = txl[0]
    _, bbox_b, label_b = bccd[0]
    _, only_txl, only_bccd = match_boxes(bbox, label, bbox_b, label_b)
    fig = draw_both(img, [(bbox_b, label_b, only_bccd), (bbox, label, only_txl)],
                    ("BCCD", "TXL-PBC"))
    assert len(fig.axes) == 2 and len(fig.axes[1].patches) == len(bbox)
    with pytest.raises(ValueError, match="different images"):
        compare_annotations(BCCDDataset(split="val", reannotated_only=True), txl)
