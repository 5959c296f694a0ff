"""``medaidet train``: the course recipe from a terminal (notebook 03)."""
from medaidet.arguments import non_negative_int, positive_float, positive_int, seed
from medaidet.data import LABELS, OTHER_SOURCES
from medaidet.training.config import PRECISIONS, PROFILES, TrainConfig


def add_parser(commands) -> None:
    p = commands.add_parser(
        "train", help="train an SSD on BCCD (the course recipe, the small SSD on a CPU, or a smoke run)",
        description="Train an SSD on BCCD. Settings: the profile's, then --config FILE, "
                    "then the flags.")
    p.add_argument("--profile", choices=list(PROFILES), default="full",
                   help="smoke: a few iterations on a few images from random weights; "
                        "cpu: the small SSD from random weights, minutes on a CPU; "
                        "cpu-long: three times as long, with SSD's colour distortion and a "
                        "2x zoom-out; "
                        "full: the course recipe, SSD300 (default: full)")
    p.add_argument("--config", metavar="FILE", default=None,
                   help="JSON (or YAML, with PyYAML) file of TrainConfig options")
    p.add_argument("--device", default=None, help="auto, cpu, gpu (= GPU 0) or a GPU number (default: the profile's, auto)")
    p.add_argument("--out", default=None, help="output directory")
    p.add_argument("--resume", metavar="SNAPSHOT", default=None,
                   help="continue from a trainer snapshot (snapshot_latest.npz)")
    p.add_argument("--iterations", type=positive_int, default=None, help="stop after N iterations")
    p.add_argument("--epochs", type=positive_float, default=None, help="stop after N epochs")
    p.add_argument("--batch-size", type=positive_int, default=None)
    p.add_argument("--subset", type=positive_int, default=None, help="train on the first N images")
    p.add_argument("--seed", type=seed, default=None,
                   help="seed Python, NumPy, CuPy and the data workers (see medaidet.training.seeding)")
    p.add_argument("--deterministic", action="store_true", default=None,
                   help="bitwise reproducible where possible: no worker processes, "
                        "deterministic cuDNN; needs --seed")
    p.add_argument("--accumulate", type=positive_int, default=None, metavar="N",
                   help="split each batch into N micro-batches (gradient accumulation: the "
                        "memory of batch/N, the gradients of the whole batch)")
    p.add_argument("--memory-limit", type=positive_float, default=None, metavar="GIB",
                   help="the memory the run may hold, in GiB (default: what the GPU has free; "
                        "on a GPU also CuPy's pool limit): the batch is split into "
                        "micro-batches until one fits")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="float32 (default), tf32 (a GPU's tensor cores for float32 products) "
                        "or mixed16 (float16 compute, float32 weights, loss scaling)")
    p.add_argument("--communicator", default=None, metavar="NAME",
                   help="ChainerMN multi-process training under mpiexec: naive (CPU or GPU), "
                        "pure_nccl (GPUs), ...; batch size is the total over all ranks")
    p.add_argument("--no-augment", dest="augment", action="store_false", default=None,
                   help="no random augmentation (resize and encode only)")
    p.add_argument("--root", default=None, help="BCCD root (default: $MEDAIDET_DATA, else the cache)")
    p.add_argument("--labels", choices=LABELS, default=None,
                   help="train on BCCD's boxes or on TXL-PBC's re-annotation of BCCD's images "
                        "(notebook 10; $MEDAIDET_TXL_PBC, else the cache) (default: bccd)")
    p.add_argument("--other-sources", nargs="+", choices=OTHER_SOURCES, default=None,
                   metavar="SOURCE", help="also train on TXL-PBC's train images of these "
                   f"laboratories ({', '.join(OTHER_SOURCES)})")
    p.add_argument("--pretrained", default=None,
                   help="imagenet, voc0712, none, or a model-only .npz")
    p.add_argument("--n-processes", type=non_negative_int, default=None,
                   help="data-loading worker processes (0: none)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_train)


def config_from_args(args) -> TrainConfig:
    """The config of a ``medaidet train`` command line: profile, then file, then flags."""
    config = TrainConfig.profile(args.profile)
    if args.config:
        config = TrainConfig.from_file(args.config, base=config)
    flags = {"device": args.device, "out": args.out, "iterations": args.iterations,
             "epochs": args.epochs, "batch_size": args.batch_size, "subset": args.subset,
             "seed": args.seed, "root": args.root, "n_processes": args.n_processes,
             "deterministic": args.deterministic, "augment": args.augment,
             "accumulate": args.accumulate, "communicator": args.communicator,
             "labels": args.labels, "other_sources": args.other_sources,
             "memory_limit": args.memory_limit, "precision": args.precision}
    changes = {k: v for k, v in flags.items() if v is not None}
    if args.epochs is not None and args.iterations is None:
        changes["iterations"] = None      # --epochs alone: the profile's iteration count yields
    if args.pretrained is not None:
        changes["pretrained"] = None if args.pretrained.lower() == "none" else args.pretrained
    return config.replace(**changes) if changes else config


def _train(args) -> int:
    from medaidet.cli import flags_in_messages

    config = config_from_args(args)
    if config.communicator is not None:    # one rank of an mpiexec run (notebook 08)
        from medaidet.extras.mpi import train
    else:
        from medaidet.training.run import train
    # the messages of the checks before any work name the flags the user typed
    typed = {field: f"--{field}" for field in ("out", "resume", "pretrained")
             if getattr(args, field) is not None}
    with flags_in_messages(typed):
        train(config, resume=args.resume, progress=not args.no_progress)
    return 0
