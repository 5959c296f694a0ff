"""Choosing the count threshold on the validation split (notebook 05, section 2).

A count keeps the detections scoring at least a threshold: too low counts background, too
high misses cells. :func:`threshold_sweep` measures the count errors of every class at each
threshold of a list and names, per class, the one of least MAE (:class:`SweepResult`);
:func:`plot_sweep` draws them. Chosen on val, the thresholds are then used on test
(:func:`medaidet.evaluation.count.count_errors`): a threshold chosen on the images it is
scored on is optimistic (:data:`SWEEP_NOTE`). :func:`threshold_change` follows one class
from one threshold to another image by image: which images' counts moved closer to their
annotation, which further, and how that adds up to the change of the MAE.
"""
from __future__ import annotations

import html
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
from matplotlib.figure import Figure

from medaidet.data.bccd import CLASS_COLORS
from medaidet.errors import ConfigError
from medaidet.evaluation.count import (check_score_thresh, count_cells, count_errors,
                                       count_stats, per_image_counts, predicted_counts)
from medaidet.evaluation.predictions import Predictions, bootstrap, checked

__all__ = ["DEFAULT_THRESHOLDS", "SWEEP_NOTE", "SweepResult", "ThresholdChange",
           "threshold_sweep", "threshold_change", "plot_sweep", "report_count_errors"]

DEFAULT_THRESHOLDS = tuple(np.round(np.arange(0.05, 0.96, 0.05), 2))


#: :func:`plot_sweep`'s axis fits the thresholds from here up (lower ones may run off it)...
SWEEP_AXIS_FROM = 0.2


#: ... when a lower one's MAE is more than this many times the highest of the rest.
SWEEP_FLATTENS = 3.0


SWEEP_NOTE = (
    "The best threshold is chosen on the same images it is scored on: on the test split "
    "that is optimistic. Choose the threshold on the val split and report test counts at it.")


@dataclass(repr=False)
class ThresholdChange:
    """One class counted at two score thresholds, image by image: what moving the threshold
    did to each image's error and to the MAE. From :func:`threshold_change`.

    ``error_before``/``error_after``: int (N,), ``predicted - annotated`` of the class per
    image in ``ids``. ``images``: ids to list one by one (e.g. the images a figure shows).
    ``str()`` explains the change with these numbers.
    """
    class_name: str
    split: str | None
    before: float
    after: float
    ids: list
    annotated: np.ndarray
    error_before: np.ndarray
    error_after: np.ndarray
    images: list = field(default_factory=list)

    @property
    def mae_before(self) -> float:
        return float(np.abs(self.error_before).mean()) if len(self.ids) else math.nan

    @property
    def mae_after(self) -> float:
        return float(np.abs(self.error_after).mean()) if len(self.ids) else math.nan

    @property
    def bias_before(self) -> float:
        return float(self.error_before.mean()) if len(self.ids) else math.nan

    @property
    def bias_after(self) -> float:
        return float(self.error_after.mean()) if len(self.ids) else math.nan

    @property
    def closer(self) -> np.ndarray:
        """Per image: its count moved closer to its annotation (bool (N,))."""
        return np.abs(self.error_after) < np.abs(self.error_before)

    @property
    def further(self) -> np.ndarray:
        """Per image: its count moved further from its annotation (bool (N,))."""
        return np.abs(self.error_after) > np.abs(self.error_before)

    @property
    def gained(self) -> int:
        """Cells of error the images brought closer lost, summed."""
        change = np.abs(self.error_before) - np.abs(self.error_after)
        return int(change[self.closer].sum())

    @property
    def lost(self) -> int:
        """Cells of error the images pushed further gained, summed."""
        change = np.abs(self.error_after) - np.abs(self.error_before)
        return int(change[self.further].sum())

    def __str__(self):
        name, n = self.class_name, len(self.ids)
        where = f"{self.split or 'these images'} ({n} images)"
        head = f"{name}, score >= {self.before:g} -> >= {self.after:g}, {where}"
        if self.after == self.before or not n:
            return f"{head}: the same threshold, nothing changes"
        raised = self.after > self.before
        lines = [f"{head}: MAE {self.mae_before:.2f} -> {self.mae_after:.2f}, "
                 f"bias {self.bias_before:+.2f} -> {self.bias_after:+.2f}"]
        for image_id in self.images:
            i = self.ids.index(image_id)
            a = int(self.annotated[i])
            lines.append(f"  {image_id}: {a + int(self.error_before[i])}/{a} -> "
                         f"{a + int(self.error_after[i])}/{a} (error "
                         f"{int(self.error_before[i]):+d} -> {int(self.error_after[i]):+d})")
        # raising the threshold can only lower a count (lowering it, only raise one): an
        # image already off in that direction moves further off, one off the other way closer
        wrong_way = self.error_before < 0 if raised else self.error_before > 0
        shown = [self.ids.index(i) for i in self.images]
        direction = "raised" if raised else "lowered"
        off = "under" if raised else "over"
        lines.append(
            f"The threshold was {direction}: no {name} count can {'rise' if raised else 'fall'}"
            f". An image {off}-counted at {self.before:g} can only move further from its "
            f"annotation; one {'over' if raised else 'under'}-counted moves closer, unless its "
            f"count passes the annotation by more than it was off.")
        if shown:
            lines.append(f"Of the {len(shown)} images listed, {int(wrong_way[shown].sum())} "
                         f"were {off}-counted at {self.before:g}; {int(self.further[shown].sum())}"
                         f" moved further from their annotation, "
                         f"{int(self.closer[shown].sum())} closer.")
        same = n - int(self.closer.sum()) - int(self.further.sum())
        change = (self.lost - self.gained) / n
        verdict = ("it falls, although some images look worse" if change < 0 and self.lost
                   else "it falls" if change < 0
                   else "it rises; here the images pushed further outweigh those brought "
                        "closer" if change > 0 else "it stays where it was")
        lines.append(
            f"Over all {n} images, {int(wrong_way.sum())} were {off}-counted at "
            f"{self.before:g}; {int(self.closer.sum())} moved closer to their annotation (by "
            f"{self.gained} cells in all), {int(self.further.sum())} further (by {self.lost} "
            f"cells), {same} kept their error. The MAE, the mean over all of them, changes by "
            f"({self.lost} - {self.gained}) / {n} = {change:+.2f} cells per image: {verdict}.")
        return "\n".join(lines)

    def __repr__(self):
        return str(self)


def threshold_change(predictions: Predictions, class_name: str, before: float, after: float,
                     images=()) -> ThresholdChange:
    """``class_name`` counted at ``before`` and at ``after`` on ``predictions``, image by image.

    ``images``: ids (or positions) of images to list one by one. Thresholds as
    :func:`count_cells` takes them. Returns a :class:`ThresholdChange`; print it for the
    explanation in this run's numbers.
    """
    names = list(checked(predictions).label_names)
    if class_name not in names:
        raise ConfigError(f"class_name: {class_name!r} is not a class of the "
                                 f"predictions; expected one of {names}")
    l = names.index(class_name)
    first, second = (count_cells(predictions, t) for t in (before, after))
    ids = list(predictions.ids)
    listed = [ids[i] if isinstance(i, (int, np.integer)) else i for i in images]
    unknown = [i for i in listed if i not in ids]
    if unknown:
        raise ConfigError(f"images: {unknown} are not among the predictions' images")
    return ThresholdChange(class_name, predictions.split, first.score_thresh,
                           second.score_thresh, ids, first.annotated[:, l].copy(),
                           first.error[:, l].copy(), second.error[:, l].copy(), listed)


@dataclass(repr=False)
class SweepResult:
    """Count errors vs score threshold. Arrays (T thresholds, C classes): ``mae``,
    ``bias``, ``relative_error``; ``best_threshold`` per class: the threshold of least MAE on
    *these* images (see :data:`SWEEP_NOTE`), the middle one where several tie (the white
    cells of val are often counted exactly over a wide range: its middle is the choice
    furthest from both ends, and on halves of val it counts the other half better than the
    lowest; docs/cpu-detector.md)."""
    thresholds: np.ndarray
    label_names: tuple
    mae: np.ndarray
    bias: np.ndarray
    relative_error: np.ndarray
    split: str | None = None

    @property
    def best_threshold(self) -> dict:
        out = {}
        for l, name in enumerate(self.label_names):
            mae = self.mae[:, l]       # all NaN without images: the first threshold, as argmin
            tied = np.flatnonzero(mae == np.nanmin(mae)) if np.isfinite(mae).any() else [0]
            out[name] = float(self.thresholds[tied[len(tied) // 2]])
        return out

    @property
    def best_mae(self) -> dict:
        return {name: float(np.min(self.mae[:, l])) for l, name in enumerate(self.label_names)}

    def rows(self) -> list:
        return [{"score_thresh": float(t),
                 **{f"{name}_mae": float(self.mae[i, l])
                    for l, name in enumerate(self.label_names)}}
                for i, t in enumerate(self.thresholds)]

    def __str__(self):
        cols = ["score>="] + [f"{n} MAE" for n in self.label_names]
        table = [cols] + [[f"{t:g}"] + [f"{self.mae[i, l]:.2f}"
                                        for l in range(len(self.label_names))]
                          for i, t in enumerate(self.thresholds)]
        widths = [max(len(r[i]) for r in table) for i in range(len(cols))]
        lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in table]
        best = ", ".join(f"{n} {t:g} (MAE {self.best_mae[n]:.2f})"
                         for n, t in self.best_threshold.items())
        return "\n".join(lines + [f"best threshold on {self.split or 'these images'}: {best}",
                                  SWEEP_NOTE])

    def __repr__(self):      # the text view, also what a notebook stores beside the HTML
        return str(self)

    def _repr_html_(self):
        esc = html.escape
        cols = ["score &gt;="] + [f"{esc(n)} MAE" for n in self.label_names]
        best = self.best_threshold
        body = ""
        for i, t in enumerate(self.thresholds):
            cells = "".join(
                f"<td><b>{self.mae[i, l]:.2f}</b></td>" if best[n] == float(t)
                else f"<td>{self.mae[i, l]:.2f}</td>" for l, n in enumerate(self.label_names))
            body += f"<tr><td>{t:g}</td>{cells}</tr>"
        return ("<table><thead><tr>" + "".join(f"<th>{c}</th>" for c in cols)
                + f"</tr></thead><tbody>{body}</tbody></table><p>{esc(SWEEP_NOTE)}</p>")

    def to_dict(self) -> dict:
        return {"split": self.split, "thresholds": [float(t) for t in self.thresholds],
                "label_names": list(self.label_names),
                "mae": {n: [float(v) for v in self.mae[:, l]]
                        for l, n in enumerate(self.label_names)},
                "bias": {n: [float(v) for v in self.bias[:, l]]
                         for l, n in enumerate(self.label_names)},
                "best_threshold": self.best_threshold, "best_mae": self.best_mae,
                "note": SWEEP_NOTE}


def threshold_sweep(predictions: Predictions, thresholds=DEFAULT_THRESHOLDS) -> SweepResult:
    """Count MAE, bias and relative error per class at each score threshold.

    Warns (``UserWarning``) when ``predictions.split == 'test'``: a threshold chosen there
    is optimistic; choose it on val.
    """
    thresholds = np.sort([check_score_thresh(t, checked(predictions).score_thresh, "thresholds")
                          for t in np.asarray(thresholds, dtype=object).ravel()])
    if thresholds.size == 0:
        raise ConfigError("thresholds: none given; expected score thresholds from "
                          f"{predictions.score_thresh:g} to 1")
    if predictions.split == "test":
        warnings.warn("threshold_sweep on the test split: " + SWEEP_NOTE, UserWarning,
                      stacklevel=2)
    n_class = len(predictions.label_names)
    annotated = per_image_counts(predictions.gt_labels, n_class)
    stats = [count_stats(predicted_counts(predictions, t), annotated) for t in thresholds]
    mae, bias, rel = (np.array([s[k] for s in stats]).reshape(len(thresholds), n_class)
                      for k in range(3))
    return SweepResult(thresholds, predictions.label_names, mae, bias, rel, predictions.split)


def report_count_errors(val, test, n: int = 1000, seed: int = 0) -> dict:
    """Each class's threshold chosen on ``val`` (:class:`Predictions`), its count error on
    ``test`` once, with the bootstrap interval over the test images and the annotated cells
    it rests on: ``{class: {"threshold", "error", "low", "high", "cells"}}``. Written in
    notebook 05, section 4."""
    chosen = threshold_sweep(val).best_threshold
    errors = count_errors(test, chosen)
    spread = bootstrap(test, lambda p: count_errors(p, chosen), n=n, seed=seed)
    cells = per_image_counts(test.gt_labels, len(test.label_names)).sum(axis=0)
    return {name: {"threshold": chosen[name], "error": errors[name], "low": spread[name][0],
                   "high": spread[name][1], "cells": int(cells[c])}
            for c, name in enumerate(test.label_names)}


def plot_sweep(sweep: SweepResult):
    """Count MAE vs score threshold: one panel per class, each on its own scale, the best
    threshold starred.

    One panel per class because the classes' MAEs differ tenfold (an image holds about ten
    red cells and one white cell): on a shared axis the small ones lie flat along the
    bottom, and the place of their minimum, which is what the sweep is for, cannot be read.
    Where the lowest thresholds (below :data:`SWEEP_AXIS_FROM`) count so much background
    that they would flatten the rest of a panel's curve (an MAE over :data:`SWEEP_FLATTENS`
    times the rest's highest), that panel's axis stops above the rest and says what it left
    off.

    Returns a matplotlib ``Figure``.
    """

    n = len(sweep.label_names)
    fig = Figure(figsize=(3.6 * n, 3.6), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False, sharex=True)[0]
    best = sweep.best_threshold
    for l, (ax, name) in enumerate(zip(axes, sweep.label_names)):
        color = CLASS_COLORS.get(name, f"C{l}")
        mae = sweep.mae[:, l]
        ax.plot(sweep.thresholds, mae, marker="o", ms=3, color=color)
        ax.plot([best[name]], [sweep.best_mae[name]], marker="*", ms=12, color=color,
                linestyle="none", label=f"best {best[name]:g} (MAE {sweep.best_mae[name]:.2f})")
        # the lowest thresholds count background by the hundred: an MAE in the hundreds
        # would flatten every point that matters, so the axis stops above the rest
        rest = float(np.nanmax(mae[sweep.thresholds >= SWEEP_AXIS_FROM], initial=0.0))
        highest = float(np.nanmax(mae, initial=0.0))
        top = 1.3 * rest
        if rest > 0 and highest > SWEEP_FLATTENS * rest:
            ax.set_ylim(0, top)
            ax.text(0.02, 0.02, f"below score {SWEEP_AXIS_FROM:g}: off the scale\n"
                    f"(MAE up to {highest:.0f})", transform=ax.transAxes, va="bottom",
                    fontsize="x-small")
        else:
            ax.set_ylim(0, 1.1 * highest if highest > 0 else 1)
        ax.set(title=name, xlabel="score threshold")
        if l == 0:
            ax.set_ylabel("count MAE (cells per image)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="upper center")
    fig.suptitle(f"Count error vs threshold ({sweep.split or 'split'}; choose on val); "
                 "each panel on its own scale")
    return fig

