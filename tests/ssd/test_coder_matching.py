"""ChainerCV's MultiboxCoder.encode on real BCCD boxes: a ground-truth box that overlaps no
default box at IoU >= 0.5 is not lost. encode first matches every ground-truth box to its best
default box (a forced match, whatever the IoU), then applies the 0.5 threshold to the other
default boxes; so such a box (most often a platelet under SSD300's 30-pixel default boxes) is
the target of exactly one default box, its best one. Notebooks 01 and 02 teach this."""
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
    # random weights (pretrained_model=None): nothing is downloaded, only the coder is used
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
                         bbox).argmax(axis=1)                 # the ground-truth box of each positive
        for j in np.flatnonzero(iou.max(axis=1) < 0.5):
            # the greedy forced match gives box j its best default box unless another box
            # claimed that default box first with a higher IoU: skip those rare shared ones
            rivals = iou[:, best[j]] > iou[j, best[j]]
            if rivals.any():
                continue
            mine = positive[owner == j]
            assert mine.tolist() == [best[j]], (
                f"{image_id} box {j} ({BCCD_LABEL_NAMES[label[j]]}, best IoU "
                f"{iou[j].max():.3f}): positives {mine.tolist()}, expected only {best[j]}")
            assert mb_label[best[j]] == label[j] + 1
            checked[BCCD_LABEL_NAMES[label[j]]] += 1
    # on BCCD these are mostly platelets: the case the notebooks describe
    assert checked["platelets"] >= 50, checked
