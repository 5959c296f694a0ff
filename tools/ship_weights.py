"""Ship a `medaidet train --profile cpu` run's weights with the package.

    python tools/ship_weights.py RUN_DIR                    # trained on BCCD's boxes
    python tools/ship_weights.py RUN_DIR --labels txl-pbc   # on TXL-PBC's re-annotation
    python tools/ship_weights.py --refresh [--labels txl-pbc]  # the shipped copy's figures again

Reads RUN_DIR/model.npz and RUN_DIR/metrics.json, writes the model as float16 into
medaidet/ssd/weights/ssd_small_bccd.npz (with its .sha256), evaluates the float16 copy and
writes ssd_small_bccd.json: the command and seed that reproduce the run, the run's numbers, the
shipped copy's test AP at both protocols (score >= 0.01 and the course's >= 0.6) and its count
errors on test at thresholds chosen on val (tools/measure_detector.py), on all test images and
without those the validator flags missing_class (tests/ssd/test_shipped_weights.py checks the
recorded numbers against a fresh evaluation).

With ``--labels txl-pbc`` (a run of `medaidet train --profile cpu --labels txl-pbc`) the copy
goes to ssd_small_txl-pbc.npz and its record holds tools/trusted_labels.py's figures: on the
re-annotated test images against both annotations at thresholds chosen on the re-annotated val
images, with bootstrap spreads, and on the other laboratories' test images.
"""
import argparse
import json
from pathlib import Path

import medaidet  # noqa: F401  (runtime settings before chainer)
from measure_detector import measure  # tools/, beside this file

from medaidet.evaluation.analysis import images_missing_class
from medaidet.evaluation.evaluate import load_model
from medaidet.ssd.weights import SHIPPED_WEIGHTS, save_weights
from medaidet.ssd.small import SIZES
from medaidet.training.config import TrainConfig


def _rounded(values: dict) -> dict:
    return {n: None if v is None else round(v, 4) for n, v in values.items()}


def main(run_dir: str, labels: str = "bccd") -> None:
    run = Path(run_dir)
    metrics = json.loads((run / "metrics.json").read_text())
    config = {"other_sources": [], **metrics["config"]}   # runs from before the field
    if config["model"] != "ssd_small":
        raise SystemExit(f"{run} trained {config['model']}; medaidet ships ssd_small only")
    # the record's command must reproduce the run: its config is the cpu profile's
    command = f"python -m medaidet train --profile cpu --seed {config['seed']}"
    command += "" if labels == "bccd" else f" --labels {labels}"
    profile = TrainConfig.profile("cpu", seed=config["seed"], labels=labels).to_dict()
    differ = sorted(k for k in profile if k not in ("out", "root") and profile[k] != config[k])
    if differ:
        raise SystemExit(f"{run} is not `{command}`: "
                         f"{', '.join(f'{k}={config[k]!r} (profile: {profile[k]!r})' for k in differ)}")
    target = SHIPPED_WEIGHTS["ssd_small", labels]
    model = load_model(run / "model.npz", device="cpu")
    sha256 = save_weights(model, target, compression=True, half=True)
    head = {"model": "ssd_small", "file": target.name, "sha256": sha256,
            "dtype": "float16 (loaded as float32)", "command": command, "seed": config["seed"],
            "default_box_sizes": list(SIZES),
            "config": {k: v for k, v in config.items() if k not in ("out", "root")},
            "trained": {k: metrics[k] for k in ("iterations", "epochs", "seconds",
                                                "train_seconds", "images_per_second",
                                                "n_processes", "device", "versions")}}
    _write(target, {**head, **evaluation(target, labels)})
    print(f"{target}: {target.stat().st_size / 1e6:.2f} MB, sha256 {sha256}")


def refresh(labels: str = "bccd") -> None:
    """Evaluate the shipped copy again and rewrite its record's figures (after a change to
    how they are measured, e.g. how count thresholds are chosen on val); what the record says
    of the run that trained it is kept."""
    target = SHIPPED_WEIGHTS["ssd_small", labels]
    old = json.loads(target.with_suffix(".json").read_text())
    head = {k: v for k, v in old.items() if k not in ("judged", "test", "val", "counts")}
    _write(target, {**head, **evaluation(target, labels)})


def _write(target, record) -> None:
    target.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k in ("judged", "test", "val", "counts")},
                     indent=1))


def evaluation(target, labels: str) -> dict:
    """The record's figures of the weights at ``target``: tools/trusted_labels.py's for
    ``labels="txl-pbc"``, else test and val mAP and the count errors on test."""
    if labels != "bccd":
        from trusted_labels import judge  # tools/, beside this file
        return {"judged": judge(target)}
    numbers = measure(target, ("val", "test"))
    test = numbers["test"]
    return {
        "test": {"split": "test", "n_images": test["n_images"],
                 "score_thresh": 0.01, "iou_thresh": 0.5,
                 "map_voc": round(test["map"], 4),
                 "ap_voc": {n: round(v, 4) for n, v in test["ap"].items()},
                 "course_protocol": {"score_thresh": 0.6,
                                     "map_voc": round(test["map_course"], 4),
                                     "ap_voc": {n: round(v, 4)
                                                for n, v in test["ap_course"].items()}}},
        "val": {"split": "val", "n_images": numbers["val"]["n_images"],
                "map_voc": round(numbers["val"]["map"], 4),
                "course_protocol_map_voc": round(numbers["val"]["map_course"], 4)},
        "counts": {
            "definition": "sum |predicted - annotated| / sum annotated per class, on test, "
                          "counting detections scoring >= the class's threshold",
            "thresholds_chosen_on_val": numbers["count_thresholds_chosen_on_val"],
            "test_relative_error": _rounded(test["count_error"]),
            "test_relative_error_without_set_aside": _rounded(test["count_error_unflagged"]),
            "set_aside": images_missing_class(test["ids"], brief=True)},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", nargs="?",
                        help="a `medaidet train --profile cpu` output folder")
    parser.add_argument("--labels", choices=("bccd", "txl-pbc"), default="bccd")
    parser.add_argument("--refresh", action="store_true",
                        help="no run: evaluate the shipped copy again, rewrite its figures")
    args = parser.parse_args()
    if args.refresh == bool(args.run_dir):
        parser.error("give a RUN_DIR, or --refresh without one")
    if args.refresh:
        refresh(args.labels)
    else:
        main(args.run_dir, args.labels)
