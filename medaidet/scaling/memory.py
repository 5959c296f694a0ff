"""Device memory, measured: how much a block of work held at once, and whether an error
means the device ran out of it (notebook 07, section 4; notebook 08).

:class:`PeakMemory` measures a block's peak (tracemalloc on the CPU, CuPy's memory pool on a
GPU); :func:`is_out_of_memory` tells an out-of-memory error from any other;
:func:`free_memory` gives a failed try's memory back. :mod:`medaidet.scaling.batch_size`
builds the batch-size finder on them; :func:`plot_memory` draws its report.
"""
from __future__ import annotations

import gc
import tracemalloc

import chainer
import numpy as np
from chainer.backends import cuda
from matplotlib.figure import Figure

from medaidet.colors import line_style
from medaidet.device import device_name

__all__ = ["PeakMemory", "is_out_of_memory", "free_memory", "first_line", "format_bytes",
           "synchronize", "plot_memory"]


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


def plot_memory(report, limit_bytes: int | None = None,
                limit_label: str = "memory limit"):
    """Peak memory against batch size, the tries that ran out of memory marked: ``report``, a
    :class:`~medaidet.scaling.batch_size.BatchSizeReport`.

    ``limit_bytes``: the memory a try could use, when known (e.g. the out-of-memory demo's
    room above what the model holds): drawn as a line, the failed tries on it (they needed
    more). Without it the failed tries are marked at the top of the axis: a failed try has
    no peak to plot. Lines and markers in black and grey: no class colour.

    Returns a matplotlib ``Figure``.
    """

    fig = Figure(figsize=(6.0, 4.0), layout="constrained")
    ax = fig.subplots()
    ok = sorted((t.batch_size, t.peak_bytes / 2**20) for t in report.tries
                if t.ok and t.peak_bytes is not None)
    failed = sorted(t.batch_size for t in report.tries if not t.ok)
    limit = None if limit_bytes is None else limit_bytes / 2**20
    top = max([mib for _, mib in ok] + ([limit] if limit else []), default=1.0) * 1.15
    if ok:
        ax.plot([b for b, _ in ok], [mib for _, mib in ok], label="fits (peak)",
                **line_style(0))
    if limit is not None:
        ax.axhline(limit, color="0.4", linestyle="--", lw=1.2,
                   label=f"{limit_label}: {limit:,.0f} MiB")
    if failed:
        ax.plot(failed, [limit if limit is not None else top * 1.1] * len(failed),
                linestyle="none", marker="x", ms=10, mew=2, color="black", clip_on=False,
                label="out of memory (needed more" + (" than the limit)" if limit else ")"))
    best = report.best_batch_size
    if best is not None:
        ax.axvline(best, color="0.6", linestyle=":", lw=1.5, label=f"largest fit: {best}")
    sizes = sorted({t.batch_size for t in report.tries})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_ylim(0, top * 1.1)
    ax.set(xlabel="batch size", ylabel="peak memory (MiB)")
    ax.set_title(f"Memory per batch size on {device_name(report.device)}\n"
                 f"(peak: {report.memory_measure})", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig

