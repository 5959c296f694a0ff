"""Troubleshooting helpers for notebook 07: the samples behind a bad label, whether OpenCV
survives forked workers here, and a real out-of-memory error without a GPU; each reproduced
safely, two in a child (``python -m medaidet.extras.troubleshoot fork-check THREADS`` or
``... oom-demo '[ROOT, START, HEADROOM]'``)."""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import resource
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass

import cv2
import numpy as np
from chainer.dataset import concat_examples
from chainer.datasets import TransformDataset

from medaidet.data.bccd import BCCDDataset
from medaidet.data.download import resolve_root
from medaidet.errors import DataError, DeviceError
from medaidet.extras.scaling import BatchSizeReport, find_batch_size
from medaidet.ssd.transforms import check_sample
from medaidet.training.config import TrainConfig
from medaidet.training.train import Recipe

__all__ = ["InvalidSample", "find_invalid_samples", "OpenCVForkCheck", "opencv_fork_check",
           "OutOfMemoryDemo", "out_of_memory_demo"]


@dataclass
class InvalidSample:
    """One sample :func:`find_invalid_samples` rejected."""

    index: int
    image_id: str | None
    kind: str
    message: str

    def __str__(self):
        return (f"sample {self.index}" + (f" ({self.image_id})" if self.image_id else "")
                + f": {self.message}")


def find_invalid_samples(dataset, n_fg_class: int = 3) -> list:
    """Every sample of ``dataset`` (``(img, bbox, label)``, untransformed) that
    :func:`~medaidet.ssd.transforms.check_sample` rejects, in order, with its id if known."""
    ids = getattr(dataset, "ids", None)
    found = []
    for index in range(len(dataset)):
        try:
            check_sample(*dataset[index][:3], n_fg_class)
        except DataError as exc:
            image_id = ids[index] if ids is not None and index < len(ids) else None
            found.append(InvalidSample(index, image_id, exc.kind, str(exc)))
    return found


@dataclass
class OpenCVForkCheck:
    """What :func:`opencv_fork_check` saw."""

    threads: int
    hung: bool
    seconds: float
    parallel_framework: str
    output: str

    def summary(self) -> str:
        what = (f"HUNG (killed after {self.seconds:.0f} s)" if self.hung else
                f"finished in {self.seconds:.1f} s")
        return (f"cv2.setNumThreads({self.threads}) in the parent, then cv2.resize in 2 forked "
                f"workers: {what}; OpenCV's parallel framework here: {self.parallel_framework}")


def opencv_fork_check(threads: int = 4, timeout: float = 20.0,
                      program: str = "medaidet.extras.troubleshoot fork-check") -> OpenCVForkCheck:
    """The OpenCV fork hang (forked workers wait forever where the thread pool is not fork-safe)
    reproduced in a child (:func:`_fork_check`) with a time limit; ``threads=0`` is medaidet's
    fix. ``program``: the module (and arguments before ``THREADS``) the child runs."""
    start, hung = time.monotonic(), False
    # a session of its own: on a hang, the stuck workers are killed with their parent
    proc = subprocess.Popen([sys.executable, "-m", *program.split(), str(int(threads))],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        hung = True
    if not hung and proc.returncode != 0:
        raise RuntimeError(f"the OpenCV fork check failed (exit {proc.returncode}): "
                           f"{output.strip()[-800:]}")
    seconds = time.monotonic() - start
    match = re.search(r"Parallel framework:\s*(.+)", cv2.getBuildInformation())
    return OpenCVForkCheck(int(threads), hung, seconds, match.group(1).strip() if match
                           else "not stated in cv2.getBuildInformation()", output)


@dataclass
class OutOfMemoryDemo:
    """What :func:`out_of_memory_demo` saw: the finder's report and log, the child's memory."""

    report: BatchSizeReport
    lines: list
    one_image_bytes: int
    limit_bytes: int
    headroom: float
    error: str | None = None   # DeviceError's message when nothing fit

    @property
    def room_bytes(self) -> int:
        """What a try could allocate above what the model held: ``headroom`` x one image."""
        return int(self.headroom * self.one_image_bytes)

    def summary(self) -> str:
        return (f"address space limited to {self.limit_bytes / 2**20:.0f} MiB: what the model "
                f"held plus {self.headroom:g}x one image's forward + backward "
                f"({self.one_image_bytes / 2**20:.0f} MiB)\n{self.report}"
                + (f"\nDeviceError: {self.error}" if self.error else ""))


def out_of_memory_demo(root=None, start: int = 8, headroom: float = 1.5,
                       timeout: float = 600) -> OutOfMemoryDemo:
    """A real out-of-memory error without a GPU: a child (:func:`_oom_demo`) limits its address
    space (``RLIMIT_AS``, Linux) to SSD300 plus ``headroom`` x one image's forward + backward and
    runs :func:`find_batch_size` from ``start``; nothing fitting is ``error`` (its message)."""
    if not sys.platform.startswith("linux"):
        raise RuntimeError("out_of_memory_demo limits memory with RLIMIT_AS: Linux only")
    # one BLAS thread: more threads' buffers would take address space after the measure
    proc = subprocess.run([sys.executable, "-m", "medaidet.extras.troubleshoot", "oom-demo",
                           json.dumps([str(resolve_root(root)), int(start), float(headroom)])],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                               "MKL_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"the out-of-memory demo failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-1500:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return OutOfMemoryDemo(BatchSizeReport.from_dict(result["report"]), result["lines"],
                           result["one_image"], result["limit"], float(headroom), result["error"])


_IMAGE = None   # the children's


def _resize(i: int) -> float:
    return float(cv2.resize(_IMAGE, (300 + i % 3, 300)).sum())


def _fork_check(threads: str) -> int:
    """The child of :func:`opencv_fork_check`: ``threads`` OpenCV threads, then 2 forked workers."""
    global _IMAGE
    cv2.setNumThreads(int(threads))   # after `import medaidet` set it to 0: the check sets its own
    _IMAGE = np.random.rand(1200, 1600, 3).astype(np.float32)
    for _ in range(5):           # this process's OpenCV thread pool exists now
        cv2.resize(_IMAGE, (300, 300))
    with multiprocessing.get_context("fork").Pool(2) as pool:
        print(len(pool.map(_resize, range(16))), "resizes done in the workers")
    return 0


def _vm(key: str) -> int:
    """This process's ``VmSize``/``VmPeak`` in bytes (Linux)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def _oom_demo(arguments: str) -> int:
    """The child of :func:`out_of_memory_demo`: prints one JSON line."""
    root, start, headroom = json.loads(arguments)
    np.random.seed(0)
    recipe = Recipe(TrainConfig(model="ssd300", pretrained=None, augment=False, device="cpu",
                                root=root, subset=2))
    chain = recipe.train_chain(model := recipe.model())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = BCCDDataset(root, "train")
    dataset = TransformDataset(base.slice[:2], recipe.transform(model))
    before = _vm("VmSize")
    chain(*concat_examples([dataset[0]])).backward()
    chain.cleargrads()
    one_image = _vm("VmPeak") - before
    limit = _vm("VmSize") + int(headroom * one_image)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    lines, error = [], None
    try:
        report = find_batch_size(chain, dataset, start=start, log=lines.append)
    except DeviceError as exc:
        report, error = exc.report, str(exc)
    print(json.dumps({"one_image": one_image, "limit": limit, "lines": lines,
                      "report": report.to_dict(), "error": error}))
    return 0


if __name__ == "__main__":
    command, argument = sys.argv[1:3]
    raise SystemExit({"fork-check": _fork_check, "oom-demo": _oom_demo}[command](argument))
