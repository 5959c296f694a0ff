"""Device memory per batch size, drawn (notebook 07, section 4; notebook 08):
:func:`plot_memory` draws a :class:`~medaidet.scaling.batch_size.BatchSizeReport`. The
measuring itself is :mod:`medaidet.training.memory` (the training run fits its batch with it).
"""
from __future__ import annotations

from matplotlib.figure import Figure

from medaidet.colors import line_style
from medaidet.device import device_name

__all__ = ["plot_memory"]


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
    if best is not None:     # where nothing ran out of memory, the largest fit is unknown
        what = "largest that fit" if failed else "largest tried (all fit)"
        ax.axvline(best, color="0.6", linestyle=":", lw=1.5, label=f"{what}: {best}")
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

