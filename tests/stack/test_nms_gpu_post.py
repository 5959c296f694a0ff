"""Our NumPy ``_nms_gpu_post`` (installed inside chainercv) equals greedy NMS."""
import numpy as np
import pytest

from chainercv.utils import non_maximum_suppression
from chainercv.utils.bbox._nms_gpu_post import _nms_gpu_post

THREADS_PER_BLOCK = 64  # as chainercv's CUDA kernel


def _iou(box, boxes):
    tl = np.maximum(box[:2], boxes[:, :2])
    br = np.minimum(box[2:], boxes[:, 2:])
    inter = np.prod(np.clip(br - tl, 0, None), axis=1)
    area = np.prod(box[2:] - box[:2])
    areas = np.prod(boxes[:, 2:] - boxes[:, :2], axis=1)
    return inter / (area + areas - inter)


def _kernel_mask(bbox, thresh):
    """The bitmask chainercv's CUDA kernel writes: row i, bit j set if i suppresses j > i."""
    n = len(bbox)
    col_blocks = -(-n // THREADS_PER_BLOCK)
    mask = np.zeros((n, col_blocks), dtype=np.uint64)
    for i in range(n):
        suppress = np.zeros(col_blocks * THREADS_PER_BLOCK, dtype=bool)
        suppress[i + 1:n] = _iou(bbox[i], bbox[i + 1:]) >= thresh
        mask[i] = np.packbits(suppress, bitorder="little").view("<u8")
    return mask.ravel(), col_blocks


def _greedy(bbox, thresh):
    kept = []
    for i in range(len(bbox)):
        if not kept or np.all(_iou(bbox[i], bbox[kept]) < thresh):
            kept.append(i)
    return np.array(kept, dtype=np.int32)


def _clustered_boxes(n, seed):
    rng = np.random.RandomState(seed)
    tl = rng.uniform(0, 120, (n, 2))
    size = rng.uniform(4, 40, (n, 2))
    return np.hstack([tl, tl + size]).astype(np.float32)


@pytest.mark.parametrize("n_bbox", [0, 1, 63, 64, 65,
                                    pytest.param(8732, marks=pytest.mark.slow(seconds=14))])
@pytest.mark.parametrize("thresh", [0.45, 0.7])
def test_matches_brute_force_greedy_nms(n_bbox, thresh):
    bbox = _clustered_boxes(n_bbox, seed=n_bbox)
    mask, col_blocks = _kernel_mask(bbox, thresh)
    selection, n_selected = _nms_gpu_post(mask, n_bbox, THREADS_PER_BLOCK, col_blocks)
    expected = _greedy(bbox, thresh)
    assert selection.dtype == np.int32 and selection.shape == (n_bbox,)
    assert n_selected == len(expected)
    np.testing.assert_array_equal(selection[:n_selected], expected)
    assert not selection[n_selected:].any()  # padding is zeros, as the Cython original
    # chainercv's CPU path (in score order: scores decreasing with index) agrees too
    if n_bbox:
        scores = np.linspace(1, 0, n_bbox, endpoint=False).astype(np.float32)
        np.testing.assert_array_equal(non_maximum_suppression(bbox, thresh, scores),
                                      expected)


def test_suppression_crosses_word_boundaries():
    """Box 0 suppresses boxes 63, 64 and 130 only: bits in three different words."""
    bbox = np.array([[0, 0, 10, 10]] + [[100 + 20 * i, 0, 110 + 20 * i, 10]
                                        for i in range(199)], dtype=np.float32)
    for i in (63, 64, 130):
        bbox[i] = [0, 0, 10, 10.5]
    mask, col_blocks = _kernel_mask(bbox, 0.5)
    selection, n_selected = _nms_gpu_post(mask, len(bbox), THREADS_PER_BLOCK, col_blocks)
    kept = set(selection[:n_selected].tolist())
    assert n_selected == len(bbox) - 3 and not kept & {63, 64, 130}
