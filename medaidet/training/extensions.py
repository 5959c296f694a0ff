"""The trainer extensions the course adds (notebook 03): :class:`EveryOrEnd` (a trigger),
:class:`PresetEvaluator` (validation), :class:`Monitor` (progress) and :class:`Plotter` /
:func:`write_plots` (``loss.png`` and ``map.png``, redrawn while training runs)."""
from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

from chainer.training.triggers import IntervalTrigger
from chainercv.extensions import DetectionVOCEvaluator
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from medaidet.data import BCCD_LABEL_NAMES
from medaidet.data.bccd import CLASS_COLORS
from medaidet.files import png_bytes, write_files

__all__ = ["EveryOrEnd", "PresetEvaluator", "Monitor", "Plotter", "write_plots"]


class EveryOrEnd:
    """Fires every ``interval`` epochs (``None``: never) and at the end of training."""

    def __init__(self, interval, unit, is_end):
        self.interval = None if interval is None else IntervalTrigger(interval, unit)
        self.is_end = is_end

    def __call__(self, trainer):
        return (self.interval is not None and self.interval(trainer)) or self.is_end(trainer)

    def serialize(self, serializer):
        if self.interval is not None:
            self.interval.serialize(serializer["interval"])


class PresetEvaluator(DetectionVOCEvaluator):
    """DetectionVOCEvaluator in the 'evaluate' preset (score 0.01), counting its seconds."""

    seconds = 0.0

    def evaluate(self):
        target = self._targets["main"]
        old, start = (target.score_thresh, target.nms_thresh), time.perf_counter()
        target.use_preset("evaluate")
        try:
            return super().evaluate()
        finally:
            target.score_thresh, target.nms_thresh = old
            self.seconds += time.perf_counter() - start


class Monitor:
    """Each iteration: remember the loss; show progress in a tqdm bar, or in about ten plain
    lines in a headless course run (``MEDAIDET_COURSE_RUN``: every redraw would be stored)."""

    trigger = (1, "iteration")
    priority = 50     # after the evaluator (300) and LogReport (200)
    STORED_LINES = 10

    def __init__(self, total: int, progress: bool):
        self.total, self.progress, self.iterations_run = total, progress, 0
        self.lines_every = None          # iterations between progress lines (course run)
        self.bar = self.last_loss = self._start = None

    def initialize(self, trainer):
        if not self.progress or self.bar is not None or self.lines_every is not None:
            return
        if os.environ.get("MEDAIDET_COURSE_RUN"):
            self.lines_every = max(1, (self.total or 0) // self.STORED_LINES)
            self._start = time.perf_counter()
            return
        try:                     # tqdm's notebook bar where ipywidgets is installed
            import ipywidgets  # noqa: F401
            from tqdm.auto import tqdm
        except ImportError:
            from tqdm import tqdm
        self.bar = tqdm(total=self.total, initial=trainer.updater.iteration, desc="train",
                        unit="it", dynamic_ncols=True, mininterval=0.5, file=sys.stdout,
                        miniters=max(1, (self.total or 0) // 200))

    def __call__(self, trainer):
        self.iterations_run += 1
        if (loss := trainer.observation.get("main/loss")) is not None:
            self.last_loss = float(getattr(loss, "array", loss))
        postfix = {"loss": f"{self.last_loss:.3f}"} if self.last_loss is not None else {}
        if (mean_ap := trainer.observation.get("validation/main/map")) is not None:
            postfix["val mAP"] = f"{float(mean_ap):.3f}"
        if self.bar is not None:
            self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(1)
        elif self.lines_every is not None:
            iteration = trainer.updater.iteration
            if iteration % self.lines_every == 0 or iteration == self.total:
                seconds = time.perf_counter() - self._start
                done = f"{iteration}/{self.total}" if self.total else str(iteration)
                print(f"train: {done} iterations, {seconds:.0f} s, "
                      f"{self.iterations_run / max(seconds, 1e-9):.2f} it/s"
                      + "".join(f", {k} {v}" for k, v in postfix.items()), flush=True)

    def write(self, text):
        """A line among the progress (an evaluation's APs), unless ``progress`` is off."""
        if self.progress:
            (self.bar.write if self.bar is not None else print)(text)

    def finalize(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def write_plots(log, out, val_split: str = "val", lr_steps=()) -> dict:
    """``loss.png`` and ``map.png`` (on ``val_split``) vs iteration from a LogReport log, a
    dashed line at each of ``lr_steps``; returns their paths."""
    paths, curves = {}, {      # name: (y label, [(log key, legend, colour)])
        "loss": ("loss on the training batches",
                 [("main/loss", "loss (loc + conf)", "black"),      # greys: no class colour
                  ("main/loss/loc", "loc: smooth L1 of the offsets", "0.45"),
                  ("main/loss/conf", "conf: cross-entropy", "0.7")]),
        "map": (f"AP on {val_split} (VOC area, IoU 0.5, score >= 0.01)",
                [("validation/main/map", "mAP", "black")] + [
                    (f"validation/main/ap/{c}", c, CLASS_COLORS[c]) for c in BCCD_LABEL_NAMES]),
    }
    for name, (ylabel, series) in curves.items():
        FigureCanvasAgg(fig := Figure(figsize=(6, 4), dpi=100))
        ax = fig.add_subplot(1, 1, 1)
        for i, (key, label, color) in enumerate(series):
            if points := [(entry["iteration"], float(entry[key])) for entry in log if key in entry]:
                ax.plot(*zip(*points), marker="o" if len(points) < 20 else None, label=label,
                        color=color, linewidth=2 if i == 0 else 1)
        if not ax.lines:
            ax.text(0.5, 0.5, "no values yet", ha="center", va="center", transform=ax.transAxes)
        else:
            last = max(entry["iteration"] for entry in log)
            for i, iteration in enumerate(s for s in lr_steps if s <= last):
                ax.axvline(iteration, color="0.3", linestyle="--", linewidth=1,
                           label=None if i else "learning-rate step")
            ax.legend()
        ax.set(xlabel="iteration", ylabel=ylabel)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        paths[name] = str(path := Path(out) / f"{name}.png")
        write_files({path: png_bytes(fig)})   # redrawn while training: never half a file
    return paths


def _ap_text(value) -> str:
    """Three decimals, or "n/a" (ChainerCV's AP is NaN for a class without boxes)."""
    return "n/a (no boxes)" if value is None or not math.isfinite(value) else f"{value:.3f}"


class Plotter:
    """After LogReport: print each evaluation; redraw the PNGs every ``min_seconds`` and at end."""

    priority = 100

    def __init__(self, out, log_report, monitor, is_end, min_seconds=30.0,
                 val_split: str = "val", lr_steps=()):
        self.out, self.lr_steps, self.val_split = out, list(lr_steps), val_split
        self.log_report, self.monitor, self.is_end = log_report, monitor, is_end
        self.min_seconds, self._last, self._evals_shown = min_seconds, -math.inf, 0

    def __call__(self, trainer):
        evals = [e for e in self.log_report.log if "validation/main/map" in e]
        for entry in evals[self._evals_shown:]:
            aps = ", ".join(f"{c} {_ap_text(entry.get(f'validation/main/ap/{c}'))}"
                            for c in BCCD_LABEL_NAMES)
            self.monitor.write(f"iteration {entry['iteration']}: {self.val_split} mAP "
                               f"{_ap_text(entry['validation/main/map'])} ({aps})")
        self._evals_shown = len(evals)
        now = time.monotonic()
        if self.is_end(trainer) or now - self._last >= self.min_seconds:
            write_plots(self.log_report.log, self.out, self.val_split, self.lr_steps)
            self._last = now
