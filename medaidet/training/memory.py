"""Device memory, measured: how much a block of work held at once, and whether an error
means the device ran out of it (notebook 03, section 3: the batch fitted to the device;
notebook 07, section 4; notebook 08).

:class:`PeakMemory` measures a block's peak (tracemalloc on the CPU, CuPy's memory pool on a
GPU); :func:`is_out_of_memory` tells an out-of-memory error from any other;
:func:`free_memory` gives a failed try's memory back. :mod:`medaidet.training.train`
fits the recipe's batch with them, :mod:`medaidet.extras.scaling` builds the batch-size
finder on them.
"""
from __future__ import annotations

import gc
import tracemalloc

import chainer
import numpy as np
from chainer.backends import cuda

__all__ = ["PeakMemory", "is_out_of_memory", "free_memory", "first_line", "format_bytes",
           "synchronize"]


def _cupy():
    return cuda.cupy if cuda.available else None


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` means the device ran out of memory.

    ``MemoryError`` on the CPU (NumPy's ``_ArrayMemoryError`` is one); on a GPU CuPy's
    ``cupy.cuda.memory.OutOfMemoryError``, and the allocation failures cuDNN, cuBLAS and
    the CUDA runtime report under memory pressure (``..._ALLOC_FAILED``,
    ``cudaErrorMemoryAllocation``).
    """
    if isinstance(exc, MemoryError):
        return True
    cupy = _cupy()
    if cupy is None:
        return False
    if isinstance(exc, cupy.cuda.memory.OutOfMemoryError):
        return True
    text = str(exc)
    return type(exc).__module__.startswith("cupy") and (
        "ALLOC_FAILED" in text or "cudaErrorMemoryAllocation" in text
        or "out of memory" in text.lower())


def free_memory(device) -> None:
    """Collect garbage and, on a GPU ``device`` (a chainer device or spec), give CuPy's
    cached blocks back to the driver.

    CuPy keeps freed device memory in its memory pool for reuse; after an out-of-memory
    the pool holds the blocks of the failed try, so the next, smaller try would fail too
    (or other processes could not use the memory). ``free_all_blocks`` of the default
    pool and of the pinned host pool returns every block not in use.
    """
    gc.collect()
    cupy = _cupy()
    on_gpu = chainer.get_device(device).xp is not np
    if cupy is not None and on_gpu:
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def format_bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def synchronize(device) -> None:
    if device.xp is not np:
        device.device.synchronize()


class PeakMemory:
    """``with PeakMemory(device) as peak: ...``: the most memory the block held at once on
    ``device`` (a chainer device or spec), above what was allocated when it began
    (``peak.bytes``, set on leaving the block).

    * CPU: ``tracemalloc`` (started for the block unless it already runs). NumPy reports
      every array it allocates to tracemalloc, so this is the peak of the arrays (and
      Python objects) the block allocated; BLAS's own buffers and memory the C allocator
      keeps cached are not in it. Tracing slows Python's own allocations, not NumPy's
      arithmetic: a forward + backward of SSD300 takes about as long.
    * GPU: CuPy's default memory pool, which every chainer array on the GPU comes from.
      The pool is emptied (:func:`free_memory`) on entering, so the bytes it holds on
      leaving (``total_bytes``: freed blocks stay cached) are the most the block held,
      fragmentation included; minus the bytes in use on entering (parameters, optimizer
      state) that is the block's peak. cuDNN's workspaces come from the pool too; the
      CUDA context and cuBLAS's workspace do not. Leaving synchronizes the device and
      records ``cudaMemGetInfo`` (``device_free_bytes``, ``device_total_bytes``: other
      processes' memory counts there).

    ``measure`` (class attribute per kind, also on the instance): the words for the
    report.
    """

    HOST = "tracemalloc peak of NumPy and Python allocations"
    GPU = "CuPy memory pool bytes held (pool emptied before)"

    def __init__(self, device):
        self.device = chainer.get_device(device)
        self.on_gpu = self.device.xp is not np
        self.measure = self.GPU if self.on_gpu else self.HOST
        self.bytes = None
        self.device_free_bytes = self.device_total_bytes = None

    def __enter__(self):
        if self.on_gpu:
            free_memory(self.device)
            self._base = _cupy().get_default_memory_pool().used_bytes()
        else:
            self._started = not tracemalloc.is_tracing()
            if self._started:
                tracemalloc.start()
            tracemalloc.reset_peak()
            self._base = tracemalloc.get_traced_memory()[0]
        return self

    def __exit__(self, *exc):
        if self.on_gpu:
            cupy = _cupy()
            synchronize(self.device)
            self.bytes = max(0, cupy.get_default_memory_pool().total_bytes() - self._base)
            self.device_free_bytes, self.device_total_bytes = cupy.cuda.runtime.memGetInfo()
        else:
            self.bytes = max(0, tracemalloc.get_traced_memory()[1] - self._base)
            if self._started:
                tracemalloc.stop()
        return False
