"""Scaling (notebooks 07 and 08): :func:`find_batch_size` halves the batch on out of memory to
the largest that fits, and the ``--accumulate`` that reaches the recipe's batch with it;
:func:`batch_size_on_bccd` runs it on SSD and BCCD; :func:`plot_memory` draws the report.
"""
from __future__ import annotations

import json
import time
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np
from matplotlib.figure import Figure

import chainer
from chainer.backends import cuda
from chainer.dataset import concat_examples
from chainer.datasets import TransformDataset

from medaidet.arguments import check_number, prepare_output_dir
from medaidet.colors import line_style
from medaidet.errors import ConfigError, DeviceError
from medaidet.data.bccd import AnnotationWarning, BCCDDataset
from medaidet.data.download import resolve_root
from medaidet.device import DEFAULT_DEVICE, device_name
from medaidet.files import png_bytes, write_files
from medaidet.training.memory import (PeakMemory, first_line, format_bytes, free_memory,
                                      is_out_of_memory, synchronize)
from medaidet.training.config import TrainConfig
from medaidet.training.train import Recipe

__all__ = ["BatchSizeTry", "BatchSizeReport", "check_search", "find_batch_size",
           "measure_batch_sizes", "batch_size_on_bccd", "plot_memory"]


# --------------------------------------------------------------------------- the finder

@dataclass
class BatchSizeTry:
    """One try of :func:`find_batch_size`. ``peak_bytes``: the most memory held above what was
    allocated before (parameters and optimizer state not in it); None if it failed.
    ``device_free_bytes``/``device_total_bytes``: the GPU's after backward; None on the CPU."""
    batch_size: int
    ok: bool
    error: str | None = None
    peak_bytes: int | None = None
    seconds: float | None = None
    device_free_bytes: int | None = None
    device_total_bytes: int | None = None

    @property
    def images_per_second(self) -> float | None:
        return self.batch_size / self.seconds if self.ok and self.seconds else None


@dataclass
class BatchSizeReport:
    """Every try of :func:`find_batch_size`, the largest batch size that fit and the
    ``--accumulate`` reaching ``target_batch_size``; ``memory_measure``: what ``peak_bytes`` is."""
    device: str
    memory_measure: str
    target_batch_size: int
    tries: list = field(default_factory=list)

    @property
    def best_batch_size(self) -> int | None:
        """The largest batch size that fit, or None."""
        return max((t.batch_size for t in self.tries if t.ok), default=None)

    @property
    def micro_batch_size(self) -> int | None:
        """The largest divisor of ``target_batch_size`` that fits (None if none does)."""
        best, target = self.best_batch_size, self.target_batch_size
        return None if best is None else max(d for d in range(1, min(best, target) + 1)
                                             if target % d == 0)

    @property
    def accumulate(self) -> int | None:
        """Micro-batches per batch: ``target_batch_size // micro_batch_size``."""
        micro = self.micro_batch_size
        return None if micro is None else self.target_batch_size // micro

    @property
    def suggestion(self) -> str:
        target, best = self.target_batch_size, self.best_batch_size
        if best is None:
            return (f"no batch size fits on {self.device}: free memory (other processes), "
                    "use a smaller model input, or train on another device")
        if best >= target:
            return (f"target batch {target} fits on {self.device}: use --batch-size {target} "
                    "(no accumulation needed)")
        micro, n = self.micro_batch_size, self.accumulate
        return (f"target batch {target} -> use --batch-size {target} --accumulate {n} "
                f"({n} micro-batches of {micro} image{'' if micro == 1 else 's'} per update: "
                f"the gradients of batch {target}, the activation memory of batch {micro})")

    def table(self) -> str:
        """One row per try, in the order they ran."""
        rows = [("batch", "result", "peak memory", "seconds", "images/s", "error")] + [
            (str(t.batch_size), "ok" if t.ok else "out of memory", format_bytes(t.peak_bytes),
             "-" if t.seconds is None else f"{t.seconds:.2f}",
             "-" if t.images_per_second is None else f"{t.images_per_second:.2f}", t.error or "")
            for t in self.tries]
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        align = (str.rjust, str.ljust, str.rjust, str.rjust, str.rjust)   # the error: as is
        return "\n".join("  ".join([f(cell, w) for f, cell, w in zip(align, row, widths)]
                                   + [row[5]]).rstrip() for row in rows)

    def __str__(self) -> str:
        best = self.best_batch_size
        result = "nothing fit" if best is None else f"largest batch size that fit: {best}"
        return (f"batch-size finder on {device_name(self.device)} (peak memory: "
                f"{self.memory_measure})\n{self.table()}\n{result}\n{self.suggestion}")

    @classmethod
    def from_dict(cls, data: dict) -> "BatchSizeReport":
        """The report :meth:`to_dict` described (e.g. read back from another process)."""
        fields = BatchSizeTry.__dataclass_fields__
        return cls(data["device"], data["memory_measure"], data["target_batch_size"],
                   [BatchSizeTry(**{k: v for k, v in t.items() if k in fields})
                    for t in data["tries"]])

    def to_dict(self) -> dict:
        return {"device": self.device, "memory_measure": self.memory_measure,
                "target_batch_size": self.target_batch_size,
                "best_batch_size": self.best_batch_size,
                "micro_batch_size": self.micro_batch_size, "accumulate": self.accumulate,
                "suggestion": self.suggestion,
                "tries": [{**asdict(t), "images_per_second": t.images_per_second}
                          for t in self.tries]}


def _forward_backward(train_chain, examples, device, t):
    """One try, measured; its arrays die with this frame (or, on an error, the traceback)."""
    with PeakMemory(device) as peak:
        began = time.perf_counter()
        try:
            in_arrays = concat_examples(examples, device)
            train_chain.cleargrads()
            loss = train_chain(*in_arrays)
            loss.backward()
            synchronize(device)
        finally:
            t.seconds = time.perf_counter() - began
    t.peak_bytes = peak.bytes
    t.device_free_bytes, t.device_total_bytes = peak.device_free_bytes, peak.device_total_bytes


def check_search(start, min_batch_size) -> tuple:
    """``(start, min_batch_size)``, whole, ``1 <= min_batch_size <= start``; else ConfigError."""
    start = check_number(start, "start", integer=True)
    min_batch_size = check_number(min_batch_size, "min_batch_size", integer=True)
    if min_batch_size > start:
        raise ConfigError(f"min_batch_size: {min_batch_size} is greater than start "
                          f"{start}; expected a batch size from 1 to start")
    return start, min_batch_size


def _check_sizes(sizes) -> list:
    """``sizes`` sorted and unique, each a whole number > 0; else a ConfigError."""
    expected = "expected a list of batch sizes (whole numbers > 0)"
    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__"):
        raise ConfigError(f"sizes: {sizes!r} is not a list; {expected}")
    if not (sizes := list(sizes)):
        raise ConfigError(f"sizes: [] is empty; {expected}")
    checked = set()
    for size in sizes:
        try:
            checked.add(check_number(size, "sizes", integer=True))
        except ConfigError:
            raise ConfigError(f"sizes: {sizes!r} holds {size!r}, not a batch size; "
                              f"{expected}") from None
    return sorted(checked)


def _try_sizes(train_chain, dataset, device, sizes, target_batch_size, log, until_fit):
    """``(report, device)`` of trying ``sizes`` in order (``until_fit``: up to the first fit):
    forward + backward of each size's examples (repeated as needed); out of memory is recorded
    in the try, other errors propagate; after each try the memory pools are emptied."""
    if len(dataset) == 0:
        what = "the finder" if until_fit else "measuring"
        raise ValueError(f"the dataset is empty: {what} needs at least one example")
    device = train_chain.device if device is None else chainer.get_device(device)
    train_chain.to_device(device)
    device.use()
    if device.xp is not np and not cuda.available:
        raise ValueError(f"device {device} is a GPU but CuPy is not available")
    report = BatchSizeReport(str(device), PeakMemory(device).measure, target_batch_size)
    examples = [dataset[i] for i in range(min(max(sizes), len(dataset)))]
    for batch_size in sizes:
        t = BatchSizeTry(batch_size, ok=True)
        with chainer.using_config("train", True):
            try:
                _forward_backward(train_chain, [examples[i % len(examples)]
                                                for i in range(batch_size)], device, t)
            except Exception as exc:                # noqa: BLE001 (re-raised unless OOM)
                if not is_out_of_memory(exc):
                    raise
                t.ok, t.error = False, first_line(exc)
        # the try's arrays are unreachable now (its frame and traceback are gone)
        train_chain.cleargrads()
        free_memory(device)
        report.tries.append(t)
        if log:
            log(f"batch {t.batch_size}: fits, peak {format_bytes(t.peak_bytes)}, "
                f"{t.seconds:.2f} s, {t.images_per_second:.2f} images/s" if t.ok else
                f"batch {t.batch_size}: out of memory after {t.seconds:.2f} s ({t.error})")
        if t.ok and until_fit:
            break
    return report, device


def measure_batch_sizes(train_chain, dataset, sizes=(1, 2, 4, 8), device=None,
                        log=print) -> BatchSizeReport:
    """Peak memory and speed of forward + backward at each of ``sizes`` (unlike
    :func:`find_batch_size`, all of them); ``target_batch_size``: the largest."""
    sizes = _check_sizes(sizes)
    return _try_sizes(train_chain, dataset, device, sizes, sizes[-1], log, False)[0]


def find_batch_size(train_chain, dataset, device=None, start: int = 32,
                    min_batch_size: int = 1, target_batch_size: int | None = None,
                    log=print) -> BatchSizeReport:
    """The largest batch size (``start``, ``start // 2``, ... ``min_batch_size``) whose forward
    + backward pass (no update) of ``train_chain`` on ``dataset``'s transformed examples fits in
    memory, every try reported. ``target_batch_size`` (default ``start``): what accumulation
    should reach; ``log``: one line per try (None: silent). Raises a ``"memory"`` DeviceError
    (with the report) when even ``min_batch_size`` runs out of memory."""
    start, min_batch_size = check_search(start, min_batch_size)
    if target_batch_size is not None:
        target_batch_size = check_number(target_batch_size, "target_batch_size", integer=True)
    sizes = [start]
    while sizes[-1] > min_batch_size:
        sizes.append(max(sizes[-1] // 2, min_batch_size))
    report, device = _try_sizes(train_chain, dataset, device, sizes,
                                target_batch_size or start, log, True)
    if report.tries[-1].ok:
        return report
    where = ("free GPU memory held by other processes (nvidia-smi lists them; restart other "
             "notebooks' kernels), train on the CPU (--device cpu: slow, but the host's memory)"
             if device.xp is not np else "close other programs, use a machine with more memory")
    raise DeviceError(
        f"no batch size fits in memory on {device}: tried "
        f"{' -> '.join(str(t.batch_size) for t in report.tries)}, and even batch "
        f"{report.tries[-1].batch_size} ran out of memory ({report.tries[-1].error}). Try: "
        f"{where}, or use a smaller model input (SSD300 instead of SSD512).", "memory",
        report=report)


# --------------------------------------------------------------------------- on BCCD

def batch_size_on_bccd(device=DEFAULT_DEVICE, model="ssd300", start: int = 32,
                       min_batch_size: int = 1, target_batch_size: int | None = None,
                       sizes=None, root=None, out=None, log=print) -> BatchSizeReport:
    """The finder (or, with ``sizes``, :func:`measure_batch_sizes`) for ``model`` (random
    weights) on BCCD training images encoded as the recipe does, without augmentation.
    ``out``: a folder for ``batch_size.json`` and ``memory.png`` (checked before any work).
    Bad arguments raise ConfigError before the model is built."""
    if sizes:
        sizes = _check_sizes(sizes)
    else:
        start, min_batch_size = check_search(start, min_batch_size)
    if target_batch_size is not None:
        target_batch_size = check_number(target_batch_size, "target_batch_size", integer=True)
    root = resolve_root(root)
    if out is not None:
        out = prepare_output_dir(out, "out", inputs=(root,))
    recipe = Recipe(TrainConfig(model=model, pretrained=None, augment=False, device=device,
                                root=str(root)))
    device = recipe.device       # DeviceError here when a GPU is asked for and unusable
    ssd = recipe.model()
    with warnings.catch_warnings():          # the loader's report on BCCD is not the point
        warnings.simplefilter("ignore", AnnotationWarning)
        images = BCCDDataset(root, "train")
    n = max(sizes) if sizes else start
    dataset = TransformDataset(images.slice[:min(n, len(images))], recipe.transform(ssd))
    chain = recipe.train_chain(ssd)
    report = (_try_sizes(chain, dataset, device, sizes, target_batch_size or sizes[-1], log,
                         until_fit=False)[0] if sizes else
              find_batch_size(chain, dataset, device, start, min_batch_size, target_batch_size,
                              log=log))
    if out is not None:  # both or neither (a full disk)
        write_files({out / "batch_size.json": json.dumps(report.to_dict(), indent=2) + "\n",
                     out / "memory.png": png_bytes(plot_memory(report), dpi=100)})
    return report


# --------------------------------------------------------------------------- the figure

def plot_memory(report, limit_bytes: int | None = None,
                limit_label: str = "memory limit"):
    """A ``Figure`` of peak memory against batch size for a :class:`BatchSizeReport`; failed
    tries are marked on the line ``limit_bytes`` (the memory a try could use) or at the top."""
    fig = Figure(figsize=(6.0, 4.0), layout="constrained")
    ax = fig.subplots()
    ok = sorted((t.batch_size, t.peak_bytes / 2**20) for t in report.tries
                if t.ok and t.peak_bytes is not None)
    failed = sorted(t.batch_size for t in report.tries if not t.ok)
    limit = None if limit_bytes is None else limit_bytes / 2**20
    top = max([mib for _, mib in ok] + ([limit] if limit else []), default=1.0) * 1.15
    if ok:
        ax.plot(*zip(*ok), label="fits (peak)", **line_style(0))
    if limit is not None:
        ax.axhline(limit, color="0.4", linestyle="--", lw=1.2,
                   label=f"{limit_label}: {limit:,.0f} MiB")
    if failed:
        ax.plot(failed, [limit if limit is not None else top * 1.1] * len(failed),
                linestyle="none", marker="x", ms=10, mew=2, color="black", clip_on=False,
                label="out of memory (needed more" + (" than the limit)" if limit else ")"))
    best = report.best_batch_size
    if best is not None:     # where nothing ran out of memory, the largest fit is unknown
        what = "largest that fit" if failed else "largest tried (all fit)"
        ax.axvline(best, color="0.6", linestyle=":", lw=1.5, label=f"{what}: {best}")
    sizes = sorted({t.batch_size for t in report.tries})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set(xlabel="batch size", ylabel="peak memory (MiB)", ylim=(0, top * 1.1))
    ax.set_title(f"Memory per batch size on {device_name(report.device)}\n"
                 f"(peak: {report.memory_measure})", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig

