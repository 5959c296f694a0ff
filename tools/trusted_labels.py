"""Train the cpu profile on TXL-PBC's re-annotation of BCCD's train images and judge detectors
against both annotations (issue 39, item 5). A research record, not part of the package:

    python tools/trusted_labels.py train --seeds 0 1 2 --out runs/trusted [--set key=value ...]
    python tools/trusted_labels.py judge runs/trusted/seed0/model.npz ... --out judged.json

``judge`` predicts BCCD's val and test images that TXL-PBC re-annotated (57 and 40), chooses
a count threshold per class on val (the least count MAE), and reports on test, against the
re-annotation and against BCCD's own boxes: mAP (score >= 0.01 and >= 0.6), the count error
sum|predicted - annotated| / sum annotated per class, each with a bootstrap spread over the
test images (2.5 and 97.5 percentiles of 1,000 resamples).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path



def _train(args):
    from medaidet.training.config import TrainConfig
    from medaidet.training.run import train
    changes = {}
    for item in args.set:
        key, value = item.split("=", 1)
        changes[key] = json.loads(value)
    for seed in args.seeds:
        out = Path(args.out) / f"seed{seed}"
        if (out / "model.npz").exists():
            print(f"{out}: trained already")
            continue
        config = TrainConfig.profile("cpu", labels=args.labels, seed=seed, out=str(out),
                                     **changes)
        began = time.perf_counter()
        train(config, progress=False)
        print(f"{out}: {time.perf_counter() - began:.0f} s", flush=True)


def _dataset(split, labels):
    from medaidet.data.bccd import BCCDDataset
    return BCCDDataset(None, split, labels=labels, reannotated_only=True)


def _predict(model, split, labels):
    from medaidet.evaluation.evaluate import predict_split
    return predict_split(model, _dataset(split, labels), progress=False)


def _predict_other(model, split, source):
    from medaidet.data.txl_pbc import TXLPBCDataset
    from medaidet.evaluation.evaluate import predict_split
    return predict_split(model, TXLPBCDataset(None, split, source), progress=False)


def _figures(preds, thresholds):
    """mAP (0.01, 0.6), per-class AP and per-class count error at ``thresholds``."""
    from medaidet.evaluation.count import count_cells, count_errors
    from medaidet.evaluation.evaluate import evaluate
    result = evaluate(preds)
    counted = count_cells(preds, score_thresh=preds.score_thresh)
    predicted = [sum(int(((s >= thresholds[n]) & (lb == c)).sum())
                     for s, lb in zip(preds.pred_scores, preds.pred_labels))
                 for c, n in enumerate(preds.label_names)]
    out = {"map": {name: float(p.map_voc) for name, p in result.protocols.items()},
           "ap": {name: {n: float(v) for n, v in zip(preds.label_names, p.ap_voc)}
                  for name, p in result.protocols.items()},
           "count_error": count_errors(preds, thresholds),
           "predicted": predicted, "annotated": counted.annotated.sum(0).tolist()}
    return out, predicted, counted.annotated


def _bootstrap(preds, thresholds, n=1000, seed=0):
    """The spread of each mAP and count error (medaidet.evaluation.evaluate.bootstrap)."""
    from medaidet.evaluation.evaluate import bootstrap

    def flat(p):
        figures = _figures(p, thresholds)[0]
        return {**{f"map_{k}": v for k, v in figures["map"].items()},
                **{f"count_error_{k}": v for k, v in figures["count_error"].items()}}
    return {k: list(v) for k, v in bootstrap(preds, flat, n=n, seed=seed).items()}


def judge(weights, bootstrap=1000, other_sources=("PBC", "Raabin-WBC")) -> dict:
    """Every figure of the module docstring for one detector: per annotation (``'txl-pbc'``,
    ``'bccd'``) and per other source, the test figures at thresholds chosen on val, the val
    figures beside them, and with ``bootstrap`` the test figures' spreads."""
    from medaidet.evaluation.count import threshold_sweep
    from medaidet.evaluation.evaluate import load_model
    model = load_model(weights)
    val = _predict(model, "val", "txl-pbc")
    test_txl = _predict(model, "test", "txl-pbc")
    test_bccd = test_txl.scored_against(_dataset("test", "bccd"))
    val_bccd = val.scored_against(_dataset("val", "bccd"))
    entry = {}
    for name, (v, t) in {"txl-pbc": (val, test_txl), "bccd": (val_bccd, test_bccd)}.items():
        sweep = threshold_sweep(v)
        thresholds = sweep.best_threshold
        figures, _, _ = _figures(t, thresholds)
        figures["thresholds"] = thresholds
        # what a choice between runs may look at: val only (the count error there is at
        # thresholds chosen on val itself, so optimistic; comparable between runs)
        val_figures, _, _ = _figures(v, thresholds)
        figures["val"] = {"map": val_figures["map"], "count_error": val_figures["count_error"],
                          "count_mae": sweep.best_mae}
        if bootstrap:
            figures["spread"] = _bootstrap(t, thresholds, bootstrap)
        entry[name] = figures
    for source in other_sources:
        val_o, test_o = (_predict_other(model, split, source) for split in ("val", "test"))
        thresholds = threshold_sweep(val_o).best_threshold
        figures, _, _ = _figures(test_o, thresholds)
        val_figures, _, _ = _figures(val_o, thresholds)
        figures["thresholds"] = thresholds
        figures["val"] = {"map": val_figures["map"], "count_error": val_figures["count_error"]}
        entry[source] = figures
    return entry


def _judge(args):
    report = {}
    for weights in args.weights:
        entry = judge(weights, args.bootstrap, args.other_sources)
        report[str(weights)] = entry
        print(json.dumps({str(weights): entry}, indent=1), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("train")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--labels", default="txl-pbc")
    p.add_argument("--out", required=True)
    p.add_argument("--set", action="append", default=[], help="a TrainConfig field, key=JSON")
    p.set_defaults(func=_train)
    p = commands.add_parser("judge")
    p.add_argument("weights", nargs="+")
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--other-sources", nargs="*", default=["PBC", "Raabin-WBC"])
    p.add_argument("--out")
    p.set_defaults(func=_judge)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
