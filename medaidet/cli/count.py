"""``medaidet count``: predicted against annotated cell counts (notebook 05)."""
import argparse
import json

from medaidet.arguments import probability
from medaidet.cli.evaluate import add_weights_arguments
from medaidet.evaluation.protocol import COUNT_SCORE_THRESH, EVALUATE_SCORE_THRESH


def add_parser(commands) -> None:
    p = commands.add_parser(
        "count", help="count cells per image and class; compare with the annotation",
        description="Predict a BCCD split, count detections scoring >= --score-thresh per "
                    "image and class, and compare with the annotated counts (MAE, relative "
                    "error, bias), plus a threshold sweep. --out writes counts.json, "
                    "counts.png and count_sweep.png.")
    add_weights_arguments(p)
    p.add_argument("--score-thresh", type=count_threshold, default=COUNT_SCORE_THRESH,
                   help=f"count detections scoring at least this, from "
                        f"{EVALUATE_SCORE_THRESH:g} to 1 (default: {COUNT_SCORE_THRESH})")
    p.set_defaults(func=_count)


def count_threshold(text: str) -> float:
    """argparse type of ``--score-thresh``: a probability, and not below the 0.01 the
    detector predicts with (a lower threshold would count nothing more)."""
    value = probability(text)
    if value < EVALUATE_SCORE_THRESH:
        raise argparse.ArgumentTypeError(
            f"{text} is below {EVALUATE_SCORE_THRESH:g}, the lowest score the detector keeps; "
            f"expected a number from {EVALUATE_SCORE_THRESH:g} to 1")
    return value


def _count(args) -> int:
    from medaidet.evaluation.runs import count_weights

    result, sweep = count_weights(args.weights, split=args.split,
                                  score_thresh=args.score_thresh, model_name=args.model,
                                  root=args.root, subset=args.subset, device=args.device,
                                  out=args.out, batch_size=args.batch_size)
    if args.json:
        print(json.dumps({**result.to_dict(), "sweep": sweep.to_dict()}, indent=2))
    else:
        print(result)
        print()
        print(sweep)
    return 0
