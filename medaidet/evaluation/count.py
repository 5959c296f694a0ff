"""Counting cells with a detector: predicted vs annotated counts per image and class.

A lab wants counts, not boxes. The predicted count of a class in an image is the number of
its detections scoring ``>= score_thresh``; the annotated count is the number of its boxes
(difficult ones included; BCCD marks none). Per class, over the images:

* ``mae``: mean absolute error, ``mean |predicted - annotated|`` (cells per image);
* ``bias``: mean signed error, ``mean (predicted - annotated)``: > 0 over-counts;
* ``relative_error``: ``sum |predicted - annotated| / sum annotated`` over the images: the
  share of the annotated cells the counts get wrong (an image with no box of the class
  adds its over-count to the top, nothing to the bottom); NaN when no image has a box of
  the class.

Predictions come from :func:`medaidet.evaluation.evaluate.predict_split` (score >= 0.01), capped at
``keep_top_k`` (200) detections per image: a count can never exceed that (BCCD images hold
~11 RBC boxes on average, so only an untrained model reaches the cap).

Read the RBC numbers with :data:`RBC_NOTE` in mind. Images the validator flags
``missing_class`` (no RBC or no WBC box although such cells are visible) can be *set aside*:
:func:`count_cells` then reports the errors on all images and, beside them, on the others,
and names the images and why (:func:`count_weights` does this by default).
"""
from __future__ import annotations

import html
import json
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
from matplotlib.figure import Figure

from medaidet.arguments import ArgumentValueError, check_number
from medaidet.data.bccd import CLASS_COLORS
from medaidet.device import DEFAULT_DEVICE
from medaidet.evaluation.analysis import images_missing_class
from medaidet.evaluation.evaluate import Predictions, check_run, predict_run
from medaidet.evaluation.protocol import COUNT_SCORE_THRESH, EVALUATE_SCORE_THRESH
from medaidet.files import png_bytes, write_files
from medaidet.numbers import finite_or_none

__all__ = ["RBC_NOTE", "SWEEP_NOTE", "DEFAULT_THRESHOLDS", "CountResult", "SweepResult",
           "count_cells", "threshold_sweep", "plot_counts", "plot_sweep", "count_weights"]

DEFAULT_THRESHOLDS = tuple(np.round(np.arange(0.05, 0.96, 0.05), 2))

RBC_NOTE = (
    "RBC counts are limited by the annotation, not only by the detector. BCCD's RBC boxes "
    "are incomplete: some images have no RBC box at all although red cells are visible "
    "(the validator's missing_class findings, notebook 01: set aside above when flagged), "
    "and cells cut by the image border or packed in clumps are often left unboxed; where "
    "BCCD has two photographs of the same field, their two RBC annotations disagree in "
    "count (medaidet.data.agreement, notebook 05). A detector that finds unboxed cells is "
    "scored as over-counting. Platelet and WBC boxes agree between such pairs. A class "
    "with a high AP but a low count at a fixed threshold is found but scored below it (a "
    "confidence problem: notebook 04 measures whether size plays a part): choose the "
    "threshold per class on val.")

#: :func:`plot_sweep`'s axis fits the thresholds from here up (lower ones may run off it).
SWEEP_AXIS_FROM = 0.2
SWEEP_NOTE = (
    "The best threshold is chosen on the same images it is scored on: on the test split "
    "that is optimistic. Choose the threshold on the val split and report test counts at it.")


def _counts(labels_per_image, n_class: int) -> np.ndarray:
    return np.array([np.bincount(np.asarray(lb, dtype=np.int64), minlength=n_class)[:n_class]
                     for lb in labels_per_image], dtype=np.int64).reshape(-1, n_class)


def _predicted_counts(preds: Predictions, score_thresh: float) -> np.ndarray:
    n_class = len(preds.label_names)
    return _counts([lb[s >= score_thresh] for lb, s in zip(preds.pred_labels,
                                                            preds.pred_scores)], n_class)


def _check_thresh(score_thresh, lowest: float, name: str = "score_thresh") -> float:
    """``score_thresh`` as a float from ``lowest`` (the predictions' own threshold) to 1.

    Scores are softmax probabilities: NaN or a value above 1 would count nothing, and a
    value below ``lowest`` would pretend to count detections the predictions do not hold.
    1 is allowed (float32 softmax scores do reach 1.0, and the test is ``>=``).
    """
    value = check_number(score_thresh, name, "probability")
    if value < lowest:
        raise ArgumentValueError(
            f"{name}: {score_thresh} is below {lowest:g}, the lowest score the predictions "
            f"hold (the detector keeps only detections scoring >= {lowest:g}); expected a "
            f"number from {lowest:g} to 1")
    return value


def _stats(predicted: np.ndarray, annotated: np.ndarray):
    """Per-class (mae, bias, relative_error) of (N, C) count arrays."""
    error = (predicted - annotated).astype(float)
    n = len(error)
    mae = np.abs(error).mean(axis=0) if n else np.full(error.shape[1], np.nan)
    bias = error.mean(axis=0) if n else np.full(error.shape[1], np.nan)
    total = annotated.sum(axis=0)
    rel = np.where(total > 0, np.abs(error).sum(axis=0) / np.maximum(total, 1), np.nan)
    return mae, bias, rel


@dataclass(repr=False)
class CountResult:
    """Counts at one score threshold. ``predicted``/``annotated``: int (N images, C classes).

    Per class (arrays of length C): ``mae``, ``bias``, ``relative_error``
    (see the module docs), on all images. ``set_aside``: image id -> why it is set aside;
    :meth:`without_set_aside` is the result on the other images. Shows as a table (``_repr_html_``, ``str``); :meth:`rows` is the
    per-image table, :meth:`to_dict` / :meth:`to_json` for files.
    """
    ids: list
    label_names: tuple
    score_thresh: float
    predicted: np.ndarray
    annotated: np.ndarray
    mae: np.ndarray
    bias: np.ndarray
    relative_error: np.ndarray
    split: str | None = None
    info: dict = field(default_factory=dict)
    set_aside: dict = field(default_factory=dict)

    @property
    def error(self) -> np.ndarray:
        """Signed error per image and class, ``predicted - annotated``."""
        return self.predicted - self.annotated

    def without_set_aside(self) -> "CountResult":
        """The same counts on the images not in :attr:`set_aside`."""
        keep = [i for i, image_id in enumerate(self.ids) if image_id not in self.set_aside]
        predicted, annotated = self.predicted[keep], self.annotated[keep]
        return CountResult([self.ids[i] for i in keep], self.label_names, self.score_thresh,
                           predicted, annotated, *_stats(predicted, annotated), self.split,
                           dict(self.info))

    def rows(self) -> list:
        """The per-image table: one dict per image with ``<class>_pred``/``_true``/``_error``."""
        out = []
        for i, image_id in enumerate(self.ids):
            row = {"image": image_id}
            for l, name in enumerate(self.label_names):
                row[f"{name}_pred"] = int(self.predicted[i, l])
                row[f"{name}_true"] = int(self.annotated[i, l])
                row[f"{name}_error"] = int(self.predicted[i, l] - self.annotated[i, l])
            out.append(row)
        return out

    def _summary(self):
        """Columns and rows of the table; with images set aside, the errors on the other
        images follow those on all."""
        views = [self] + ([self.without_set_aside()] if self.set_aside else [])
        cols = ["class", "annotated", "predicted", "MAE", "rel. error", "bias"]
        if self.set_aside:
            n = len(self.ids) - len(self.set_aside)
            cols += [f"{c} ({n} kept)" for c in ("MAE", "rel. error", "bias")]
        body = [[name, str(int(self.annotated[:, l].sum())),
                 str(int(self.predicted[:, l].sum()))]
                + [v for r in views for v in (_fmt(r.mae[l]), _fmt(r.relative_error[l], pct=True),
                                              _fmt(r.bias[l], sign=True))]
                for l, name in enumerate(self.label_names)]
        return cols, body

    def _set_aside_text(self) -> str:
        if not self.set_aside:
            return ""
        return (f"Set aside ({len(self.set_aside)} images the validator flags missing_class): "
                + "; ".join(f"{i}: {why}" for i, why in self.set_aside.items()))

    def __str__(self):
        cols, body = self._summary()
        table = [cols] + body
        widths = [max(len(r[i]) for r in table) for i in range(len(cols))]
        lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                           for i, (c, w) in enumerate(zip(r, widths))) for r in table]
        head = (f"Cell counts at score >= {self.score_thresh:g}, {self.split or 'split'} "
                f"({len(self.ids)} images); MAE and bias in cells per image")
        return "\n".join([head] + lines + ([self._set_aside_text()] if self.set_aside else [])
                         + ["", RBC_NOTE])

    def __repr__(self):      # the text view, also what a notebook stores beside the HTML
        return str(self)

    def _repr_html_(self):
        cols, body = self._summary()
        esc = html.escape
        return ("<table><caption>" + esc(f"Cell counts at score >= {self.score_thresh:g}, "
                                         f"{len(self.ids)} images") + "</caption><thead><tr>"
                + "".join(f"<th>{esc(c)}</th>" for c in cols) + "</tr></thead><tbody>"
                + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>"
                          for r in body)
                + "</tbody></table>"
                + (f"<p>{esc(self._set_aside_text())}</p>" if self.set_aside else "")
                + f"<p>{esc(RBC_NOTE)}</p>")

    def _per_class(self) -> dict:
        return {name: {"annotated_total": int(self.annotated[:, l].sum()),
                       "predicted_total": int(self.predicted[:, l].sum()),
                       "mae": finite_or_none(self.mae[l]),
                       "bias": finite_or_none(self.bias[l]),
                       "relative_error": finite_or_none(self.relative_error[l])}
                for l, name in enumerate(self.label_names)}

    def to_dict(self) -> dict:
        out = {"split": self.split, "score_thresh": self.score_thresh,
               "n_images": len(self.ids), "label_names": list(self.label_names),
               "per_class": self._per_class(), "per_image": self.rows(), "rbc_note": RBC_NOTE,
               **self.info}
        if self.set_aside:
            rest = self.without_set_aside()
            out.update(set_aside=dict(self.set_aside),
                       without_set_aside={"n_images": len(rest.ids),
                                          "per_class": rest._per_class()})
        return out

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), indent=2, **kwargs)


def _fmt(value, pct=False, sign=False) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    if pct:
        return f"{100 * value:.1f}%"
    return f"{value:+.2f}" if sign else f"{value:.2f}"


def count_cells(predictions: Predictions, score_thresh: float = COUNT_SCORE_THRESH,
                set_aside=None) -> CountResult:
    """Predicted (detections scoring ``>= score_thresh``) vs annotated counts.

    ``score_thresh``: from ``predictions.score_thresh`` (0.01) to 1; else
    :class:`medaidet.arguments.ArgumentValueError` (a ``ValueError``). ``set_aside``:
    ``{image id: why}`` of images to report apart (e.g.
    :func:`medaidet.evaluation.analysis.images_missing_class`); ids not among the
    predictions are ignored.
    """
    score_thresh = _check_thresh(score_thresh, predictions.score_thresh)
    n_class = len(predictions.label_names)
    predicted = _predicted_counts(predictions, score_thresh)
    annotated = _counts(predictions.gt_labels, n_class)
    mae, bias, rel = _stats(predicted, annotated)
    ids = list(predictions.ids)
    set_aside = {i: why for i, why in (set_aside or {}).items() if i in set(ids)}
    return CountResult(ids, predictions.label_names, float(score_thresh), predicted,
                       annotated, mae, bias, rel, predictions.split, set_aside=set_aside)


@dataclass(repr=False)
class SweepResult:
    """Count errors vs score threshold. Arrays (T thresholds, C classes): ``mae``,
    ``bias``, ``relative_error``; ``best_threshold`` per class: the lowest threshold of
    least MAE on *these* images (see :data:`SWEEP_NOTE`)."""
    thresholds: np.ndarray
    label_names: tuple
    mae: np.ndarray
    bias: np.ndarray
    relative_error: np.ndarray
    split: str | None = None

    @property
    def best_threshold(self) -> dict:
        return {name: float(self.thresholds[int(np.argmin(self.mae[:, l]))])
                for l, name in enumerate(self.label_names)}

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
    thresholds = np.sort([_check_thresh(t, predictions.score_thresh, "thresholds")
                          for t in np.asarray(thresholds, dtype=object).ravel()])
    if thresholds.size == 0:
        raise ArgumentValueError("thresholds: none given; expected score thresholds from "
                                 f"{predictions.score_thresh:g} to 1")
    if predictions.split == "test":
        warnings.warn("threshold_sweep on the test split: " + SWEEP_NOTE, UserWarning,
                      stacklevel=2)
    n_class = len(predictions.label_names)
    annotated = _counts(predictions.gt_labels, n_class)
    stats = [_stats(_predicted_counts(predictions, t), annotated) for t in thresholds]
    mae, bias, rel = (np.array([s[k] for s in stats]).reshape(len(thresholds), n_class)
                      for k in range(3))
    return SweepResult(thresholds, predictions.label_names, mae, bias, rel, predictions.split)


def plot_counts(result: CountResult):
    """Scatter of predicted vs annotated count per class, with the y = x line.

    Returns a matplotlib ``Figure``.
    """

    n = len(result.label_names)
    fig = Figure(figsize=(4.0 * n, 4.0), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    for l, (ax, name) in enumerate(zip(axes, result.label_names)):
        x, y = result.annotated[:, l], result.predicted[:, l]
        top = max(1, int(x.max(initial=0)), int(y.max(initial=0))) * 1.05 + 1
        ax.plot([0, top], [0, top], color="0.5", ls="--", lw=1, label="y = x")
        ax.scatter(x, y, s=18, alpha=0.7, color=CLASS_COLORS.get(name, f"C{l}"))
        ax.set(title=f"{name}: MAE {_fmt(result.mae[l])}, bias {_fmt(result.bias[l], sign=True)}",
               xlabel="annotated count", ylabel="predicted count",
               xlim=(-0.5, top), ylim=(-0.5, top), aspect="equal")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize="small")
    fig.suptitle(f"Counts per image at score >= {result.score_thresh:g} "
                 f"({len(result.ids)} images)")
    return fig


def plot_sweep(sweep: SweepResult):
    """Count MAE vs score threshold, one line per class, best threshold marked.

    Returns a matplotlib ``Figure``.
    """

    fig = Figure(figsize=(6.0, 4.0), layout="constrained")
    ax = fig.subplots()
    best = sweep.best_threshold
    for l, name in enumerate(sweep.label_names):
        color = CLASS_COLORS.get(name, f"C{l}")
        ax.plot(sweep.thresholds, sweep.mae[:, l], marker="o", ms=3, color=color,
                label=f"{name} (best {best[name]:g})")
        ax.plot([best[name]], [sweep.best_mae[name]], marker="*", ms=12, color=color)
    ax.set(xlabel="score threshold", ylabel="count MAE (cells per image)",
           title=f"Count error vs threshold ({sweep.split or 'split'}; choose on val)")
    # the lowest thresholds count thousands of background boxes: an MAE in the hundreds
    # would flatten every line that matters, so the axis stops above the rest
    rest = sweep.mae[sweep.thresholds >= SWEEP_AXIS_FROM]
    highest = float(np.nanmax(sweep.mae, initial=0.0))
    top = 1.3 * float(np.nanmax(rest, initial=0.0)) if rest.size else highest
    if top > 0 and highest > top:
        ax.set_ylim(0, top)
        ax.text(0.01, 0.98, f"below score {SWEEP_AXIS_FROM:g}: off the scale "
                f"(MAE up to {highest:.0f})", transform=ax.transAxes, va="top", fontsize="small")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def count_weights(weights_path, split: str = "test", score_thresh=COUNT_SCORE_THRESH,
                  model_name: str | None = None, root=None, subset=None, device=DEFAULT_DEVICE,
                  out=None, thresholds=DEFAULT_THRESHOLDS, batch_size: int = 8,
                  progress: bool = True):
    """Load, predict once, count at ``score_thresh`` and sweep ``thresholds``. The images
    the validator flags ``missing_class`` are set aside (reported apart, named with why).

    Writes ``counts.json`` (counts and sweep), ``counts.png`` and ``count_sweep.png`` to
    ``out`` when given. Returns ``(CountResult, SweepResult)``.

    Every argument is checked before the model is built (names as on the command line:
    ``--score-thresh`` from 0.01 to 1, ``--subset``, ``--batch-size``, ``--out``, which is
    created now), so a mistake fails at once, not after predicting the split.
    """
    score_thresh = _check_thresh(score_thresh, EVALUATE_SCORE_THRESH, "--score-thresh")
    for t in np.asarray(thresholds, dtype=object).ravel():
        _check_thresh(t, EVALUATE_SCORE_THRESH, "thresholds")
    run = check_run(weights_path, root, subset, batch_size, out)
    preds = predict_run(run, split, model_name, device, progress)
    result = count_cells(preds, score_thresh,
                         set_aside=images_missing_class(preds.ids, root=run.root, brief=True))
    result.info.update(weights=str(weights_path), model=preds.model, subset=run.subset)
    out = run.out
    with warnings.catch_warnings():
        if split != "test":
            warnings.simplefilter("ignore", UserWarning)
        sweep = threshold_sweep(preds, thresholds)
    if out is not None:  # all or none: a full disk leaves no result without its figures
        write_files({
            out / "counts.json": json.dumps({**result.to_dict(), "sweep": sweep.to_dict()},
                                            indent=2) + "\n",
            out / "counts.png": png_bytes(plot_counts(result), dpi=100),
            out / "count_sweep.png": png_bytes(plot_sweep(sweep), dpi=100)})
    return result, sweep
