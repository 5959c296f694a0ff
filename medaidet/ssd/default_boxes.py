"""A model's default boxes and variances, read through one public door.

ChainerCV's ``MultiboxCoder`` builds every default box of an SSD once and keeps them, with
the two variances that scale the offsets, in private attributes. Notebooks 01-04 look at them
and the package decodes with them; this module is where both read them.
"""
from __future__ import annotations

import numpy as np
from chainer.backends import cuda

__all__ = ["default_boxes", "variances", "default_box_sizes"]


def _coder(model_or_coder):
    return getattr(model_or_coder, "coder", model_or_coder)


def default_boxes(model_or_coder) -> np.ndarray:
    """Every default box of an SSD (or of its ``MultiboxCoder``), one row per box:
    ``(center y, center x, height, width)`` in pixels of the model's input (300x300 for
    SSD300 and the small SSD), in the order of the heads' outputs; on the host."""
    return cuda.to_cpu(_coder(model_or_coder)._default_bbox)


def variances(model_or_coder) -> tuple:
    """The coder's two variances ``(centre, size)``: the offsets of a box from its default box
    are divided by them when encoded (ChainerCV's SSD: 0.1 and 0.2)."""
    return tuple(float(v) for v in _coder(model_or_coder)._variance)


def default_box_sizes(model_or_coder) -> np.ndarray:
    """The size of each default box, ``sqrt(height * width)`` in input pixels."""
    boxes = default_boxes(model_or_coder)
    return np.sqrt(boxes[:, 2] * boxes[:, 3])
