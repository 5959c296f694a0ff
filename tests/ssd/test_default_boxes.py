"""medaidet.ssd.default_boxes: the public door to a model's default boxes and variances."""
import numpy as np
from chainercv.links import SSD300

from medaidet.ssd.default_boxes import default_box_sizes, default_boxes, variances
from medaidet.ssd.small import SSDSmall


def test_default_boxes_are_the_coders_own_in_center_size_form():
    model = SSD300(n_fg_class=3)
    boxes = default_boxes(model)
    assert boxes.shape == (8732, 4)            # SSD300's count, from the paper
    np.testing.assert_array_equal(boxes, default_boxes(model.coder))
    first = boxes[0]                           # the first cell of the 38x38 map, square s_0
    np.testing.assert_allclose(first, (4, 4, 30, 30))
    assert variances(model) == (0.1, 0.2)


def test_default_box_sizes_are_the_square_roots_of_the_areas():
    small = SSDSmall(3)
    sizes = default_box_sizes(small)
    boxes = default_boxes(small)
    np.testing.assert_allclose(sizes, np.sqrt(boxes[:, 2] * boxes[:, 3]))
    assert sizes.min() == 20                   # the small SSD's smallest box (SIZES[0])
