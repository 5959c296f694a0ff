# Added by medaidet's chainercv build: a NumPy version of chainercv's only
# compiled module, whose Cython-0.28-generated C no longer builds on
# Python >= 3.11. Used after the CUDA NMS kernel: a greedy pass over the
# suppression bitmask, in score order.
import numpy as np


def _nms_gpu_post(mask, n_bbox, threads_per_block, col_blocks):
    """Select boxes from the NMS kernel's suppression bitmask.

    Args:
        mask (numpy.ndarray): uint64 array of shape (n_bbox * col_blocks,).
            Bit ``j % threads_per_block`` of word ``i * col_blocks + j //
            threads_per_block`` is set when box ``i`` suppresses box ``j``
            (boxes sorted by descending score).
        n_bbox (int): number of boxes.
        threads_per_block (int): bits used per word (64).
        col_blocks (int): words per box, ``ceil(n_bbox / threads_per_block)``.

    Returns:
        (numpy.ndarray, int): int32 indices of the kept boxes, padded with
        zeros to length ``n_bbox``, and the number of kept boxes.
    """
    n_bbox = int(n_bbox)
    threads_per_block = int(threads_per_block)
    col_blocks = int(col_blocks)
    mask = np.asarray(mask, dtype=np.uint64).reshape(n_bbox, col_blocks)
    selection = np.zeros((n_bbox,), dtype=np.int32)
    removed = np.zeros((col_blocks,), dtype=np.uint64)
    n_selection = 0
    for i in range(n_bbox):
        block, bit = divmod(i, threads_per_block)
        if (int(removed[block]) >> bit) & 1:
            continue
        selection[n_selection] = i
        n_selection += 1
        removed[block:] |= mask[i, block:]
    return selection, n_selection
