"""Count errors of detectors on BCCD's re-annotated test images, whole image and in the
counting frame, against both annotations (the table of docs/cpu-detector.md, "Counting in a
frame"). A research record, not part of the package:

    python tools/framed_counts.py W1.npz W2.npz ... [--out counts.json] [--bootstrap 1000]

For each weight file: predictions on the 57 val and 40 test images TXL-PBC re-annotated,
scored against TXL-PBC's boxes and against BCCD's; margins per class from BCCD's train boxes
(:func:`medaidet.evaluation.count.frame_margins`); for each annotation and rule, thresholds
chosen on val with that rule, the test count error once with its bootstrap interval
(:func:`medaidet.evaluation.count.report_count_errors`).
"""
from __future__ import annotations

import argparse
import json
import warnings


def framed_counts(weights, bootstrap=1000) -> dict:
    from medaidet.data.bccd import BCCDDataset
    from medaidet.evaluation.count import frame_errors, frame_margins, frame_predictions
    from medaidet.evaluation.evaluate import load_model, predict_split
    from medaidet.evaluation.count import report_count_errors

    warnings.simplefilter("ignore")          # BCCD's dropped boxes: notebook 01 lists them
    train = BCCDDataset(None, "train")
    margins = frame_margins(*zip(*train.slice[:, ("bbox", "label")]), train.label_names)
    model = load_model(weights)
    both, sizes = {}, {}
    for split in ("val", "test"):
        txl = BCCDDataset(None, split, labels="txl-pbc")
        predictions = predict_split(model, txl, progress=False)
        both[split] = {"TXL-PBC": predictions, "BCCD": predictions.scored_against(
            BCCDDataset(None, split, reannotated_only=True))}
        sizes[split] = txl.sizes
    out = {"weights": str(weights), "margins": margins}
    for truth in ("TXL-PBC", "BCCD"):
        for rule in ("whole image", "frame"):
            val, test = (both[s][truth] if rule == "whole image" else
                         frame_predictions(both[s][truth], sizes[s], margins)
                         for s in ("val", "test"))
            out[f"{rule}, against {truth}"] = report_count_errors(val, test, n=bootstrap)
        chosen = {n: e["threshold"] for n, e in out[f"frame, against {truth}"].items()}
        errors = frame_errors(both["test"][truth], chosen, sizes["test"], margins)
        out[f"errors in the frame, against {truth}"] = {
            name: {kind: sum(1 for e in errors if e.label == c and e.kind == kind)
                   for kind in ("line +", "line -", "false", "missed")}
            for c, name in enumerate(train.label_names)}
        out[f"error list, against {truth}"] = [
            (both["test"][truth].ids[e.index], train.label_names[e.label], e.kind,
             round(e.score, 3)) for e in errors]
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("weights", nargs="+")
    parser.add_argument("--out")
    parser.add_argument("--bootstrap", type=int, default=1000)
    args = parser.parse_args(argv)
    results = []
    for weights in args.weights:
        result = framed_counts(weights, args.bootstrap)
        results.append(result)
        print(weights, "margins", result["margins"])
        for truth in ("TXL-PBC", "BCCD"):
            print(f"  errors in the frame, against {truth}:",
                  result[f"errors in the frame, against {truth}"])
        for key, errors in result.items():
            if key.startswith(("whole image,", "frame,")):
                print(f"  {key}: " + "; ".join(
                    f"{name} {100 * e['error']:.1f} % [{100 * e['low']:.1f}, "
                    f"{100 * e['high']:.1f}] of {e['cells']} (>= {e['threshold']:g})"
                    for name, e in errors.items()), flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
