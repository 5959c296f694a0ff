"""Counting cells with a detector: predicted vs annotated counts per image and class.

Notebook 05, section 1 (which writes :func:`per_image_counts` and :func:`count_stats`); the
threshold a class is counted at is chosen on val with :mod:`medaidet.evaluation.thresholds`.

A lab wants counts, not boxes. The predicted count of a class in an image is the number of
its detections scoring ``>= score_thresh``; the annotated count is the number of its boxes
(difficult ones included; BCCD marks none). Per class, over the images:

* ``mae``: mean absolute error, ``mean |predicted - annotated|`` (cells per image);
* ``bias``: mean signed error, ``mean (predicted - annotated)``: > 0 over-counts;
* ``relative_error``: ``sum |predicted - annotated| / sum annotated`` over the images: the
  share of the annotated cells the counts get wrong (an image with no box of the class
  adds its over-count to the top, nothing to the bottom); NaN when no image has a box of
  the class.

Predictions come from :func:`medaidet.evaluation.predictions.predict_split` (score >=
0.01), capped at ``keep_top_k`` (200) detections per image: a count can never exceed that
(BCCD images hold ~11 RBC boxes on average, so only an untrained model reaches the cap).

Read the RBC numbers with :data:`RBC_NOTE` in mind. Images the validator flags
``missing_class`` (no RBC or no WBC box although such cells are visible) can be *set aside*:
:func:`count_cells` then reports the errors on all images and, beside them, on the others,
and names the images and why
(:func:`medaidet.evaluation.runs.count_weights` does this by default).
"""
from __future__ import annotations

import html
import json
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from medaidet.arguments import check_number, check_type
from medaidet.errors import ConfigError
from medaidet.data.bccd import CLASS_COLORS
from medaidet.evaluation.predictions import Predictions, checked
from medaidet.evaluation.protocol import COUNT_SCORE_THRESH
from medaidet.numbers import finite_or_none

__all__ = ["RBC_NOTE", "CountResult", "count_cells", "count_errors", "images_at_points",
           "plot_counts", "per_image_counts", "predicted_counts", "count_stats",
           "check_score_thresh"]

RBC_NOTE = (
    "RBC counts are limited by the annotation, not only by the detector. BCCD's RBC boxes "
    "are incomplete: some images have no RBC box at all although red cells are visible "
    "(the validator's missing_class findings, notebook 01: set aside above when flagged), "
    "and cells cut by the image border or packed in clumps are often left unboxed; where "
    "BCCD has two photographs of the same field, their two RBC annotations disagree in "
    "count (medaidet.data.agreement, notebook 05), and TXL-PBC's independent re-annotation "
    "of 221 BCCD images boxes about twice as many red cells (notebook 10: count against it, "
    "labels='txl-pbc'). A detector that finds unboxed cells is scored as over-counting. "
    "Platelet and WBC boxes agree between such pairs. A class "
    "with a high AP but a low count at a fixed threshold is found but scored below it (a "
    "confidence problem: notebook 04 measures whether size plays a part): choose the "
    "threshold per class on val.")


def per_image_counts(labels_per_image, n_class: int) -> np.ndarray:
    """Cells per image and class, (N images, n_class) ints, from each image's labels (written
    in notebook 05, section 1)."""
    return np.array([np.bincount(np.asarray(lb, dtype=np.int64), minlength=n_class)[:n_class]
                     for lb in labels_per_image], dtype=np.int64).reshape(-1, n_class)


def predicted_counts(preds: Predictions, score_thresh: float) -> np.ndarray:
    """Cells per image and class as :func:`per_image_counts`, of the detections scoring
    ``>= score_thresh``."""
    n_class = len(preds.label_names)
    kept = [lb[s >= score_thresh] for lb, s in zip(preds.pred_labels, preds.pred_scores)]
    return per_image_counts(kept, n_class)


def check_score_thresh(score_thresh, lowest: float, name: str = "score_thresh") -> float:
    """``score_thresh`` as a float from ``lowest`` (the predictions' own threshold) to 1.

    Scores are softmax probabilities: NaN or a value above 1 would count nothing, and a
    value below ``lowest`` would pretend to count detections the predictions do not hold.
    1 is allowed (float32 softmax scores do reach 1.0, and the test is ``>=``).
    """
    value = check_number(score_thresh, name, "probability")
    if value < lowest:
        raise ConfigError(
            f"{name}: {score_thresh} is below {lowest:g}, the lowest score the predictions "
            f"hold (the detector keeps only detections scoring >= {lowest:g}); expected a "
            f"number from {lowest:g} to 1")
    return value


def count_stats(predicted: np.ndarray, annotated: np.ndarray):
    """Per class, from (N images, C classes) counts: the MAE (mean |predicted - annotated|
    per image), the bias (the mean signed error) and the relative error (all absolute
    errors over all annotated cells; nan for a class without any). Written in notebook 05,
    section 1."""
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
    :meth:`without_set_aside` is the result on the other images. Shows as a table
    (``_repr_html_``, ``str``); :meth:`rows` is the per-image table, :meth:`to_dict` /
    :meth:`to_json` for files.
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
                           predicted, annotated, *count_stats(predicted, annotated),
                           self.split, dict(self.info))

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

    def set_aside_reasons(self) -> dict:
        """How many set-aside images give each reason (``{"no wbc box": 4, ...}``, most
        first); an image missing two classes counts under both."""
        reasons = Counter(part.strip() for why in self.set_aside.values()
                          for part in str(why).split(";") if part.strip())
        return dict(reasons.most_common())

    def _set_aside_text(self) -> str:
        if not self.set_aside:
            return ""
        tally = ", ".join(f"{k} {why}" for why, k in self.set_aside_reasons().items())
        return (f"Set aside ({len(self.set_aside)} images the validator flags missing_class; "
                f"{tally}): "
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
    :class:`~medaidet.errors.ConfigError` (a ``ValueError``). ``set_aside``:
    ``{image id: why}`` of images to report apart (e.g.
    :func:`medaidet.evaluation.analysis.images_missing_class`); ids not among the
    predictions are ignored.
    """
    score_thresh = check_score_thresh(score_thresh, checked(predictions).score_thresh)
    n_class = len(predictions.label_names)
    predicted = predicted_counts(predictions, score_thresh)
    annotated = per_image_counts(predictions.gt_labels, n_class)
    mae, bias, rel = count_stats(predicted, annotated)
    ids = list(predictions.ids)
    set_aside = {i: why for i, why in (set_aside or {}).items() if i in set(ids)}
    return CountResult(ids, predictions.label_names, float(score_thresh), predicted,
                       annotated, mae, bias, rel, predictions.split, set_aside=set_aside)


def count_errors(predictions: Predictions, thresholds: dict) -> dict:
    """``{class: relative error}`` (``sum |predicted - annotated| / sum annotated`` over the
    images) with each class counted at its own threshold, e.g. those
    :func:`~medaidet.evaluation.thresholds.threshold_sweep` chose on val."""
    kept = checked(predictions).filter(check_type(thresholds, dict, "thresholds",
                                                  "a dict {class name: score threshold}"))
    names = predictions.label_names
    annotated = per_image_counts(predictions.gt_labels, len(names))
    relative = count_stats(predicted_counts(kept, kept.score_thresh), annotated)[2]
    return {name: float(relative[c]) for c, name in enumerate(names)}


#: :func:`plot_counts`: a dot's area in points² per image at its place.
AREA_PER_IMAGE = 20.0


def images_at_points(annotated, predicted):
    """The distinct ``(annotated, predicted)`` count pairs and how many images share each.

    Counts are integers: many images fall on one point (most WBC images on (1, 1)).
    Returns ``(points (P, 2) int, n_images (P,) int)``, sorted by point; ``n_images`` sums to
    the number of images.
    """
    try:
        pairs = np.stack([np.asarray(annotated, dtype=np.int64).ravel(),
                          np.asarray(predicted, dtype=np.int64).ravel()], axis=1)
    except (TypeError, ValueError):
        raise ConfigError(f"annotated, predicted: {annotated!r:.40}, {predicted!r:.40}; "
                          "expected two arrays of whole counts of the same shape") from None
    if not len(pairs):
        return pairs.reshape(0, 2), np.zeros(0, dtype=np.int64)
    points, n_images = np.unique(pairs, axis=0, return_counts=True)
    return points, n_images


def plot_counts(result: CountResult):
    """Scatter of predicted vs annotated count per class, with the y = x line.

    Counts are integers, so images pile up on the same point: each point is drawn once, its
    area proportional to the number of images on it (:data:`AREA_PER_IMAGE` points² each), and
    a point of more than one image is labelled with that number. Every image is in the figure.

    Returns a matplotlib ``Figure``.
    """

    n = len(result.label_names)
    fig = Figure(figsize=(4.2 * n, 4.8), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    for l, (ax, name) in enumerate(zip(axes, result.label_names)):
        points, n_images = images_at_points(result.annotated[:, l], result.predicted[:, l])
        x, y = points[:, 0], points[:, 1]
        top = max(1, int(x.max(initial=0)), int(y.max(initial=0))) * 1.05 + 1
        ax.plot([0, top], [0, top], color="0.5", ls="--", lw=1, label="y = x")
        ax.scatter(x, y, s=AREA_PER_IMAGE * n_images, alpha=0.6,
                   color=CLASS_COLORS.get(name, f"C{l}"), edgecolors="white", linewidths=0.5,
                   label="images (area and number: how many)")
        for (px, py), k in zip(points, n_images):
            if k > 1:
                ax.annotate(str(k), (px, py), textcoords="offset points", ha="left",
                            va="bottom", fontsize="x-small", in_layout=False,
                            xytext=(1 + 0.4 * math.sqrt(AREA_PER_IMAGE * k),) * 2)
        ax.set(title=f"{name}: MAE {_fmt(result.mae[l])}, bias {_fmt(result.bias[l], sign=True)}",
               xlabel="annotated count", ylabel="predicted count",
               xlim=(-0.5, top), ylim=(-0.5, top), aspect="equal")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        legend = ax.legend(loc="upper left", fontsize="small", scatterpoints=1)
        handles = getattr(legend, "legend_handles", None) or legend.legendHandles  # < 3.7
        handles[1].set_sizes([2 * AREA_PER_IMAGE])    # a small dot, not the largest one
    fig.suptitle(f"Counts per image at score >= {result.score_thresh:g} "
                 f"({len(result.ids)} images; a dot's area and number: the images on it)")
    return fig


