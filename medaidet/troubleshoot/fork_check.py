"""``python -m medaidet.troubleshoot.fork_check THREADS``: the OpenCV fork hang, in a child.

Uses OpenCV with ``THREADS`` threads in this process (its thread pool starts), then forks two
workers that call ``cv2.resize``. With an OpenCV whose thread pool is not fork-safe the
workers wait forever; :func:`medaidet.troubleshoot.opencv_fork_check` runs this with a time
limit and kills it on a hang.
"""
import multiprocessing
import sys

import cv2
import numpy as np

_IMAGE = None


def _resize(i: int) -> float:
    return float(cv2.resize(_IMAGE, (300 + i % 3, 300)).sum())


def main(argv=None) -> int:
    global _IMAGE
    threads = int((sys.argv[1:] if argv is None else argv)[0])
    cv2.setNumThreads(threads)   # after `import medaidet` set it to 0: the check sets its own
    _IMAGE = np.random.rand(1200, 1600, 3).astype(np.float32)
    for _ in range(5):           # this process's OpenCV thread pool exists now
        cv2.resize(_IMAGE, (300, 300))
    with multiprocessing.get_context("fork").Pool(2) as pool:
        print(len(pool.map(_resize, range(16))), "resizes done in the workers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
