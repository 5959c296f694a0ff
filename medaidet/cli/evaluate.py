"""``medaidet evaluate``: VOC average precision of a weights file (notebook 04)."""
from medaidet.arguments import positive_int
from medaidet.data import SPLITS
from medaidet.device import DEFAULT_DEVICE
from medaidet.ssd import MODEL_NAMES


def add_parser(commands) -> None:
    p = commands.add_parser(
        "evaluate", help="VOC AP of trained weights (score 0.01 and the course's 0.6)",
        description="Predict a BCCD split in the 'evaluate' preset and report VOC area AP "
                    "and VOC07 11-point AP at IoU 0.5, per class and mean, for score >= 0.01 "
                    "and for the course's score >= 0.6. --out writes evaluation.json and "
                    "pr_curves.png.")
    add_weights_arguments(p)
    p.set_defaults(func=_evaluate)


def add_weights_arguments(p) -> None:
    """The arguments ``medaidet evaluate`` and ``medaidet count`` share: the weights, the
    split they predict and how."""
    p.add_argument("weights", metavar="WEIGHTS", help="model-only .npz from medaidet train")
    p.add_argument("--split", default="test", choices=SPLITS,
                   help="split to predict (default: test)")
    p.add_argument("--model", default=None, choices=MODEL_NAMES,
                   help="architecture the weights were trained with (default: read from "
                        "the weights' parameter names)")
    p.add_argument("--root", default=None,
                   help="BCCD root (default: $MEDAIDET_DATA, else the cache)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write JSON and figures here")
    p.add_argument("--subset", type=positive_int, default=None, metavar="N",
                   help="only the first N images of the split")
    p.add_argument("--device", default=DEFAULT_DEVICE,
                   help="auto, cpu, gpu or a GPU number (default: auto)")
    p.add_argument("--batch-size", type=positive_int, default=8,
                   help="images per forward pass (default: 8)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _evaluate(args) -> int:
    from medaidet.evaluation.runs import evaluate_weights

    result = evaluate_weights(args.weights, split=args.split, model_name=args.model,
                              root=args.root, subset=args.subset, device=args.device,
                              out=args.out, batch_size=args.batch_size)
    print(result.to_json() if args.json else result)
    return 0
