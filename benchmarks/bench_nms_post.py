"""How much the NumPy ``_nms_gpu_post`` costs, next to chainercv's CPU NMS.

chainercv's compiled post-processing step could not be kept (its C no longer
builds); this prints, for the same boxes in one run, the seconds of our NumPy
replacement and of a whole CPU NMS, and their ratio.

    python benchmarks/bench_nms_post.py
"""
import argparse
import time

import numpy as np
from chainercv.utils import non_maximum_suppression
from chainercv.utils.bbox._nms_gpu_post import _nms_gpu_post

THREADS_PER_BLOCK = 64


def suppression_mask(bbox, thresh):
    """The bitmask chainercv's CUDA kernel produces, computed with NumPy."""
    n = len(bbox)
    col_blocks = -(-n // THREADS_PER_BLOCK)
    tl = np.maximum(bbox[:, None, :2], bbox[None, :, :2])
    br = np.minimum(bbox[:, None, 2:], bbox[None, :, 2:])
    inter = np.prod(np.clip(br - tl, 0, None), axis=2)
    area = np.prod(bbox[:, 2:] - bbox[:, :2], axis=1)
    iou = inter / (area[:, None] + area[None, :] - inter)
    suppress = np.triu(iou >= thresh, k=1)
    padded = np.zeros((n, col_blocks * THREADS_PER_BLOCK), dtype=bool)
    padded[:, :n] = suppress
    return np.packbits(padded, axis=1, bitorder="little").view("<u8").ravel(), col_blocks


def best_of(fn, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="best of N timings per size")
    repeat = parser.parse_args().repeat
    rng = np.random.RandomState(0)
    print(f"{'boxes':>6} {'post (ms)':>10} {'cpu nms (ms)':>13} {'ratio':>6}")
    for n in (100, 1000, 4000, 8732):
        tl = rng.uniform(0, 300, (n, 2))
        bbox = np.hstack([tl, tl + rng.uniform(5, 60, (n, 2))]).astype(np.float32)
        mask, col_blocks = suppression_mask(bbox, 0.45)
        post = best_of(lambda: _nms_gpu_post(mask, n, THREADS_PER_BLOCK, col_blocks), repeat)
        cpu = best_of(lambda: non_maximum_suppression(bbox, 0.45), repeat)
        print(f"{n:>6} {post * 1e3:>10.2f} {cpu * 1e3:>13.2f} {post / cpu:>6.2f}")


if __name__ == "__main__":
    main()
