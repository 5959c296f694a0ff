"""A model's default boxes and variances (ChainerCV's ``MultiboxCoder`` keeps them private),
read through one public door by notebooks 01-04 and the package."""
from __future__ import annotations

import numpy as np
from chainer.backends import cuda

__all__ = ["default_boxes", "variances", "default_box_sizes"]


def _coder(model_or_coder):
    return getattr(model_or_coder, "coder", model_or_coder)


def default_boxes(model_or_coder) -> np.ndarray:
    """Every default box of an SSD (or its ``MultiboxCoder``), on the host: (K, 4)
    ``(center y, center x, height, width)`` in input pixels, in the heads' output order."""
    return cuda.to_cpu(_coder(model_or_coder)._default_bbox)


def variances(model_or_coder) -> tuple:
    """The coder's two variances ``(centre, size)`` that divide the encoded offsets (0.1, 0.2)."""
    return tuple(float(v) for v in _coder(model_or_coder)._variance)


def default_box_sizes(model_or_coder) -> np.ndarray:
    """The size of each default box, ``sqrt(height * width)`` in input pixels."""
    boxes = default_boxes(model_or_coder)
    return np.sqrt(boxes[:, 2] * boxes[:, 3])
