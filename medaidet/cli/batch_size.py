"""``medaidet batch-size``: the largest batch that fits, and memory per batch size (08)."""
import json

from medaidet.arguments import positive_int, prepare_output_dir
from medaidet.errors import ConfigError
from medaidet.device import DEFAULT_DEVICE
from medaidet.ssd import MODEL_NAMES


def add_parser(commands) -> None:
    p = commands.add_parser(
        "batch-size", help="the largest training batch that fits in memory, and --accumulate",
        description="Forward + backward of SSD on BCCD training images at --start, halving on "
                    "out of memory until a batch fits; every try reported (peak memory, "
                    "seconds, images/s) with the --accumulate that reaches --target. With "
                    "--sizes: measure each of those batch sizes instead.")
    p.add_argument("--device", default=DEFAULT_DEVICE,
                   help="auto, cpu, gpu or a GPU number (default: auto)")
    p.add_argument("--model", default="ssd300", choices=MODEL_NAMES)
    p.add_argument("--start", type=positive_int, default=32, help="first batch size (default 32)")
    p.add_argument("--min", type=positive_int, default=1, help="smallest batch size to try")
    p.add_argument("--target", type=positive_int, default=None,
                   help="batch to reach with accumulation (default: --start)")
    p.add_argument("--sizes", type=positive_int, nargs="+", default=None, metavar="N",
                   help="measure these batch sizes (all of them) instead of searching")
    p.add_argument("--root", default=None,
                   help="BCCD root (default: $MEDAIDET_DATA, else the cache)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write batch_size.json and memory.png here")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_batch_size)


def _batch_size(args) -> int:
    from medaidet.data.pinned import resolve_root
    from medaidet.scaling.batch_size import batch_size_on_bccd
    from medaidet.errors import DeviceError

    # checked here first, in the flags the user typed (batch_size_on_bccd checks it again)
    if not args.sizes and args.min > args.start:
        raise ConfigError(f"--min: {args.min} is greater than --start {args.start}; "
                                 "expected a batch size from 1 to --start")
    if args.out is not None:
        prepare_output_dir(args.out, "--out", inputs=(resolve_root(args.root),))
    log = None if args.json else print
    try:
        report = batch_size_on_bccd(args.device, args.model, args.start, args.min,
                                    args.target, args.sizes, args.root, args.out, log=log)
    except DeviceError as exc:
        if args.json:
            print(json.dumps({**exc.report.to_dict(), "error": str(exc)}, indent=2))
        raise
    print(json.dumps(report.to_dict(), indent=2) if args.json else f"\n{report}")
    return 0
