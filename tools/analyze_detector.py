"""Where a detector's misses come from: error analysis of trained SSD weights on a split.

    python tools/analyze_detector.py WEIGHTS [--split test] [--out docs/figures/analysis]
        [--thresholds 0.5 0.6] [--no-figures]

Predicts the split in the 'evaluate' preset keeping the candidates before the caps and NMS
(medaidet.evaluation.analysis), prints a markdown summary (recall and precision per class,
the stage each missed box was lost at, misses by size and crowding; each on all images and
without the images the validator flags as missing a class) and writes figures to --out:

* <split>_recall_by_stage.png: recall vs score threshold per class, of the candidates, after
  the caps and NMS, and of the matched detections;
* <split>_scores.png: scores of true vs false positives per class;
* <split>_misses_by_size_crowding.png: miss rate by box size and by crowding;
* <split>_top_false_positives.png: the images with the highest-scoring false positives,
  detections beside annotations.
"""
import argparse
import warnings
from pathlib import Path

import numpy as np

import medaidet  # noqa: F401  (runtime settings before chainer)
from medaidet.data.bccd import AnnotationWarning, CLASS_COLORS
from medaidet.evaluation.analysis import (LOST_STAGES, box_outcomes, detection_scores,
                                          images_missing_class, missed_by,
                                          plot_detection_scores, recall_precision,
                                          stage_counts)
from medaidet.evaluation.evaluate import predict_weights
from medaidet.evaluation.analysis import plot_detections
from medaidet.tables import Table

SIZE_BINS = (0, 15, 20, 25, 30, 45, 60, 75, 100, np.inf)
CROWD_BINS = (0, 1, 2, 3, 5, np.inf)


def summary(preds, outcomes, flagged, thresholds) -> str:
    """The markdown summary: every table on all images and without the flagged ones."""
    kept = [i for i, image_id in enumerate(preds.ids) if image_id not in flagged]
    views = [("all images", preds, outcomes),
             ("without flagged images", preds.take(kept), outcomes.without(flagged))]
    lines = [f"## {preds.split}: {len(preds)} images, {len(outcomes)} boxes", "",
             f"Set aside ({len(flagged)} images flagged `missing_class` by the validator):", ""]
    lines += [f"* {i}: {'; '.join(d.split(';')[0] for d in details)}"
              for i, details in sorted(flagged.items())]
    for what, p, o in views:
        lines += ["", f"### {what} ({len(p)} images, {len(o)} boxes)", "",
                  format_table(recall_precision(p, thresholds),
                               ["score_thresh", "class", "n_gt", "tp", "fp", "missed",
                                "recall", "precision"]), ""]
        for t in thresholds:
            counts = stage_counts(o, t)
            rows = [{"class": n, "n_gt": c["n_gt"], "found": c["found"], **{
                s: c[s] for s in LOST_STAGES}, "recall": c["recall"]}
                for n, c in counts.items()]
            lines += [f"Where the missed boxes were lost, score >= {t:g}:", "",
                      format_table(rows), ""]
        t = thresholds[0]
        for by, bins in (("size", SIZE_BINS), ("crowding", CROWD_BINS)):
            rows = []
            for name, bins_rows in missed_by(o, t, by, bins).items():
                for r in bins_rows:
                    if r["n"]:
                        rows.append({"class": name, by: _bin(r["bin"]), "n": r["n"],
                                     "missed": r["missed"], "miss_rate": r["miss_rate"]})
            lines += [f"Misses by {by}, score >= {t:g}:", "", format_table(rows), ""]
    return "\n".join(lines)


def format_table(rows, columns=None) -> str:
    """A list of dicts as a markdown table (floats to 3 decimals, NaN as ``n/a``)."""
    columns = list(columns or rows[0].keys())
    return Table(columns, [[r[c] for c in columns] for r in rows]).to_markdown()


def _bin(b):
    lo, hi = b
    return f">= {lo:g}" if np.isinf(hi) else f"{lo:g}-{hi:g}"


def plot_recall_by_stage(outcomes, flagged, split):
    """Recall vs threshold per class: of the candidates, after cap + NMS (and keep_top_k),
    and of the matched detections; dashed: without the flagged images."""
    from matplotlib.figure import Figure

    ts = np.linspace(0.01, 0.99, 99)
    names = outcomes.label_names
    fig = Figure(figsize=(4.3 * len(names), 3.8), layout="constrained")
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    for ax, (l, name) in zip(axes, enumerate(names)):
        for o, ls, tag in ((outcomes, "-", ""), (outcomes.without(flagged), "--",
                                                 " (no flagged)")):
            of = o.label == l
            n = max(int(of.sum()), 1)
            for key, alpha, what in (("all", 0.35, "a candidate covers it"),
                                     ("kept", 1.0, "a detection covers it")):
                rec = [(o.best[key][of] >= t).sum() / n for t in ts]
                ax.plot(ts, rec, ls=ls, color=CLASS_COLORS[name], alpha=alpha,
                        label=what + tag if ls == "-" else None)
        for t, found in sorted(outcomes.found.items()):
            r = found[outcomes.label == l].mean()
            ax.plot([t], [r], "o", color="black", ms=5,
                    label="recall (VOC matching)" if t == min(outcomes.found) else None)
            ax.annotate(f"{r:.2f}", (t, r), textcoords="offset points", xytext=(4, 4),
                        fontsize=8)
        ax.set(title=f"{name} ({int((outcomes.label == l).sum())} boxes)",
               xlabel="score threshold", ylabel="fraction of boxes", xlim=(0, 1),
               ylim=(0, 1.02))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small", loc="lower left")
    fig.suptitle(f"Ground-truth boxes covered (IoU >= 0.5, same class) by a candidate before "
                 f"the caps and NMS vs by a detection after them, {split}; dashed: without "
                 "the images flagged missing_class", fontsize=9)
    return fig


def plot_misses(outcomes, split, t):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.8), layout="constrained")
    ax_size, ax_crowd = fig.subplots(1, 2)
    for ax, by, bins in ((ax_size, "size", SIZE_BINS), (ax_crowd, "crowding", CROWD_BINS)):
        table = missed_by(outcomes, t, by, bins)
        labels = [_bin(b) for b in zip(bins[:-1], bins[1:])]
        width = 0.8 / len(table)
        for k, (name, rows) in enumerate(table.items()):
            x = np.arange(len(rows)) + (k - (len(table) - 1) / 2) * width
            rate = [r["miss_rate"] if r["n"] else 0 for r in rows]
            ax.bar(x, rate, width, color=CLASS_COLORS[name], label=name)
            for xi, r in zip(x, rows):
                if r["n"]:
                    ax.text(xi, (r["miss_rate"] or 0) + 0.01, str(r["n"]), ha="center",
                            fontsize=6, rotation=90, va="bottom")
        ax.set_xticks(np.arange(len(labels)), labels, fontsize=8)
        ax.set(ylim=(0, 1.1), ylabel=f"missed at score >= {t:g}",
               xlabel=("box size sqrt(h*w) at 300x300 px" if by == "size" else
                       "other same-class boxes overlapping it (IoU > 0)"))
        ax.legend(fontsize="small")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"Miss rate by size and by crowding, {split} (numbers: boxes in the bin)",
                 fontsize=10)
    return fig


def top_false_positive_images(preds, t, n=6):
    """Indices of the ``n`` images whose highest-scoring false positive scores highest."""
    from medaidet.evaluation.analysis import match_predictions

    best = []
    for i, m in enumerate(match_predictions(preds, t, 0.5)):
        s = np.asarray(preds.pred_scores[i])[m.fp]
        best.append(s.max() if len(s) else 0.0)
    return [int(i) for i in np.argsort(best)[::-1][:n]]


def save_png(fig, path, photo=False):
    """Write ``fig`` as a small PNG: plots at 72 dpi; a figure of photographs at 60 dpi,
    reduced to a palette of 96 colours (a third of the size, the boxes still legible)."""
    import io

    from PIL import Image

    if not photo:
        fig.savefig(path, dpi=72)
        return
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=60)
    buffer.seek(0)
    Image.open(buffer).convert("RGB").quantize(colors=96).save(path, optimize=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("weights")
    parser.add_argument("--split", default="test")
    parser.add_argument("--out", default="docs/figures/analysis")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.5, 0.6])
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument("--root", default=None)
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnnotationWarning)   # the loader's own notes
        preds, cands = predict_weights(args.weights, args.split, root=args.root, device="cpu",
                                       progress=False, return_candidates=True)
    outcomes = box_outcomes(preds, cands, args.thresholds, root=args.root)
    flagged = images_missing_class(preds.ids, root=args.root)
    print(summary(preds, outcomes, flagged, args.thresholds))
    if args.no_figures:
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t = args.thresholds[0]
    figs = {
        "recall_by_stage": plot_recall_by_stage(outcomes, flagged, args.split),
        "scores": plot_detection_scores(detection_scores(preds), args.thresholds, args.split),
        "misses_by_size_crowding": plot_misses(outcomes, args.split, t),
    }
    idx = top_false_positive_images(preds, t)
    figs["top_false_positives"] = plot_detections(preds, indices=idx, score_thresh=t,
                                                  show_scores=True, root=args.root)
    for name, fig in figs.items():
        path = out / f"{args.split}_{name}.png"
        save_png(fig, path, photo=name == "top_false_positives")
        print(f"wrote {path} ({path.stat().st_size // 1024} KB)")
    print("top-false-positive images:", ", ".join(preds.ids[i] for i in idx))


if __name__ == "__main__":
    main()
