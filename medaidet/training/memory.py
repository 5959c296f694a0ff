"""Device memory, measured (notebook 03, section 3; notebook 07, section 4; notebook 08):
:class:`PeakMemory` measures a block's peak, :func:`is_out_of_memory` tells an out-of-memory
error from any other, :func:`free_memory` gives a failed try's memory back."""
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
    """Whether ``exc`` means the device ran out of memory: ``MemoryError``, CuPy's
    ``OutOfMemoryError``, or a cuDNN, cuBLAS or CUDA allocation failure."""
    if isinstance(exc, MemoryError):
        return True
    if (cupy := _cupy()) is None:
        return False
    text = str(exc)
    return isinstance(exc, cupy.cuda.memory.OutOfMemoryError) or (
        type(exc).__module__.startswith("cupy") and ("ALLOC_FAILED" in text
        or "cudaErrorMemoryAllocation" in text or "out of memory" in text.lower()))


def free_memory(device) -> None:
    """Collect garbage and, on a GPU ``device``, give CuPy's cached blocks back to the driver
    (after an out-of-memory they would make the next, smaller try fail too)."""
    gc.collect()
    if (cupy := _cupy()) is not None and chainer.get_device(device).xp is not np:
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
    """``with PeakMemory(device) as peak: ...``: the most memory the block held at once above
    what it began with (``peak.bytes``, set on leaving). CPU: the ``tracemalloc`` peak (not
    BLAS's buffers). GPU: CuPy's default pool, emptied on entering, its ``total_bytes`` on
    leaving (not the CUDA context or cuBLAS's workspace); also ``device_free_bytes`` and
    ``device_total_bytes``. ``measure``: the words for the report."""

    def __init__(self, device):
        self.device = chainer.get_device(device)
        self.on_gpu = self.device.xp is not np
        self.measure = ("CuPy memory pool bytes held (pool emptied before)" if self.on_gpu
                        else "tracemalloc peak of NumPy and Python allocations")
        self.bytes = self.device_free_bytes = self.device_total_bytes = None

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
