"""MultiboxCoder.encode on real BCCD boxes: a box with no default box at IoU >= 0.5 (mostly a
platelet) is still forced onto exactly its best default box, as notebooks 01 and 02 teach."""
import warnings

import numpy as np
import pytest
from chainercv.links import SSD300
from chainercv.transforms import resize_bbox
from chainercv.utils import bbox_iou

from medaidet.data import BCCD_LABEL_NAMES, BCCDDataset
from medaidet.data.bccd import image_path
from medaidet.data.image import read_image_size


def _corners(boxes):
    """(center y, center x, height, width) -> (y_min, x_min, y_max, x_max)."""
    return np.hstack([boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, :2] + boxes[:, 2:] / 2])


def _decode(loc, default_bbox, variance):
    """The inverse of MultiboxCoder.encode's offsets, as boxes (y_min, x_min, y_max, x_max)."""
    center = default_bbox[:, :2] + loc[:, :2] * variance[0] * default_bbox[:, 2:]
    hw = default_bbox[:, 2:] * np.exp(loc[:, 2:] * variance[1])
    return np.hstack([center - hw / 2, center + hw / 2])


@pytest.fixture(scope="module")
def bccd_train(bccd_root):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # the loader's note on the objects it drops
        dataset = BCCDDataset(bccd_root, split="train")
    annotations = dataset.slice[:, ("bbox", "label")]
    examples = []
    for i in range(len(dataset)):
        bbox, label = annotations[i]
        size = read_image_size(image_path(bccd_root, dataset.ids[i]))
        examples.append((dataset.ids[i], resize_bbox(bbox, size, (300, 300)), label))
    return examples


def test_a_box_below_the_threshold_gets_exactly_its_best_default_box(bccd_train):
    coder = SSD300(n_fg_class=len(BCCD_LABEL_NAMES), pretrained_model=None).coder
    default_bbox = coder._default_bbox
    corners = _corners(default_bbox)
    checked = {name: 0 for name in BCCD_LABEL_NAMES}
    for image_id, bbox, label in bccd_train:
        iou = bbox_iou(bbox, corners)                         # (R, K)
        best = iou.argmax(axis=1)
        mb_loc, mb_label = coder.encode(bbox, label)
        positive = np.flatnonzero(mb_label > 0)
        owner = bbox_iou(_decode(mb_loc[positive], default_bbox[positive], coder._variance),
                         bbox).argmax(axis=1)     # the ground-truth box of each positive
        for j in np.flatnonzero(iou.max(axis=1) < 0.5):
            # skip the rare default boxes another box claimed first with a higher IoU
            rivals = iou[:, best[j]] > iou[j, best[j]]
            if rivals.any():
                continue
            mine = positive[owner == j]
            assert mine.tolist() == [best[j]], (
                f"{image_id} box {j} ({BCCD_LABEL_NAMES[label[j]]}, best IoU "
                f"{iou[j].max():.3f}): positives {mine.tolist()}, expected only {best[j]}")
            assert mb_label[best[j]] == label[j] + 1
            checked[BCCD_LABEL_NAMES[label[j]]] += 1
    assert checked["platelets"] >= 50, checked
