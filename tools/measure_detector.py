"""One line of numbers per trained detector: what issue-style comparisons of recipes need.

    python tools/measure_detector.py RUN_DIR_OR_WEIGHTS... [--test] [--json FILE]

For each weights file (``RUN_DIR/model.npz`` when a run folder is given), predicts val (and
test with ``--test``) once and prints, per split:

* mAP (VOC area, IoU 0.5) at score >= 0.01 and at the course's score >= 0.6, per class;
* counts: the threshold per class with the least count MAE **on val** (chosen there, never on
  test), and at it the relative count error sum|predicted - annotated| / sum annotated, on
  all images of the split and without the images the validator flags ``missing_class``.

Tune with val only; ``--test`` is for the one report of a recipe already chosen.
"""
import argparse
import json
import warnings
from pathlib import Path

import medaidet  # noqa: F401  (runtime settings before chainer)
from medaidet.data.bccd import AnnotationWarning
from medaidet.evaluation.analysis import images_missing_class
from medaidet.evaluation.count import count_cells
from medaidet.evaluation.count import threshold_sweep
from medaidet.evaluation.evaluate import evaluate
from medaidet.evaluation.evaluate import predict_weights
from medaidet.numbers import finite_or_none


def count_errors(preds, thresholds: dict, set_aside: dict) -> tuple:
    """Per class, the relative count error (sum |predicted - annotated| / sum annotated) at
    the class's threshold: on all images, and without the images in ``set_aside``."""
    everything, kept = {}, {}
    for l, name in enumerate(preds.label_names):
        result = count_cells(preds, thresholds[name], set_aside=set_aside)
        everything[name] = finite_or_none(result.relative_error[l])
        kept[name] = finite_or_none(result.without_set_aside().relative_error[l])
    return everything, kept


def measure(weights: Path, splits) -> dict:
    preds = {s: predict_weights(weights, s, progress=False) for s in splits}
    chosen = threshold_sweep(preds["val"]).best_threshold
    flagged = images_missing_class(brief=True)
    result = {"weights": str(weights), "count_thresholds_chosen_on_val": chosen}
    for s, p in preds.items():
        ev = evaluate(p)
        everything, kept = count_errors(p, chosen, flagged)
        result[s] = {
            "n_images": len(p), "ids": list(p.ids),
            "map": ev["evaluate"].map_voc, "map_course": ev["course"].map_voc,
            "ap": dict(zip(p.label_names, map(float, ev["evaluate"].ap_voc))),
            "ap_course": dict(zip(p.label_names, map(float, ev["course"].ap_voc))),
            "count_error": everything, "count_error_unflagged": kept,
            "n_unflagged": len([i for i in p.ids if i not in flagged]),
        }
    return result


def line(r: dict, split: str) -> str:
    m = r[split]
    ce, cu = m["count_error"], m["count_error_unflagged"]
    return (f"{split:5s} mAP {m['map']:.3f} (" + " ".join(f"{v:.3f}" for v in m["ap"].values())
            + f")  course {m['map_course']:.3f} (platelets {m['ap_course']['platelets']:.3f})"
            "  count err " + "/".join(f"{100 * v:.1f}" for v in ce.values())
            + " %, unflagged " + "/".join(f"{100 * v:.1f}" for v in cu.values()) + " %")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--test", action="store_true", help="also the test split (report once)")
    ap.add_argument("--json", type=Path, help="append one JSON line per run here")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", AnnotationWarning)
    splits = ("val", "test") if args.test else ("val",)
    for run in args.runs:
        weights = run / "model.npz" if run.is_dir() else run
        r = measure(weights, splits)
        print(weights, "thresholds (val):",
              " ".join(f"{k} {v:g}" for k, v in r["count_thresholds_chosen_on_val"].items()))
        for s in splits:
            print("  " + line(r, s))
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
