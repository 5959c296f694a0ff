"""The ``medaidet`` command: one argparse parser, one handler per command.

Handlers import what they run only when run, so ``--help`` and ``stack install`` work before
chainer is installed. A user's mistake (a bad argument, a MedaidetError, an ``OSError``) ends in
one line on stderr and status 2 (Ctrl-C: 130); ``--debug`` shows the traceback instead.
"""
import argparse
import errno
import io
import json
import logging
import os
import sys
import traceback
from pathlib import Path

from medaidet.arguments import (non_negative_int, positive_float, positive_int,
                                prepare_output_dir, probability, seed)
from medaidet.data import LABELS, OTHER_SOURCES, SPLITS
from medaidet.device import DEFAULT_DEVICE
from medaidet.errors import ConfigError, MedaidetError
from medaidet.evaluation.protocol import COUNT_SCORE_THRESH, EVALUATE_SCORE_THRESH
from medaidet.files import check_output, is_full_disk, write_files
from medaidet.ssd import MODEL_NAMES
from medaidet.training.config import PRECISIONS, PROFILES, TrainConfig

DEBUG_FLAG = "--debug"
# pyproject.toml's dependencies: missing, this is a source checkout that was never installed.
OWN_DEPENDENCIES = ("numpy", "packaging", "PIL", "matplotlib", "papermill", "nbformat", "ipykernel",
                    "tqdm", "defusedxml", "safetensors", "medaidet_tools")   # tools/, installed too
# The commands that need the chainer stack (the others run before it is installed).
MODEL_COMMANDS = ("train", "evaluate", "count", "export")


class CommandParser(argparse.ArgumentParser):
    """argparse, with a usage mistake said in one line instead of the usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


# the optional dependencies of the deploy commands, by the extra that installs them
EXTRAS = {"onnx": "export", "onnx_chainer": "export", "onnxruntime": "deploy"}


def build_parser() -> argparse.ArgumentParser:
    from medaidet_tools import cli as tools

    parser = CommandParser(
        prog="medaidet", description="medaidet: the blood-cell detection course's command line.",
        epilog=f"{DEBUG_FLAG} (anywhere on the line): show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True)
    tools.add_parsers(commands)          # stack, course: the course's tools (medaidet_tools)
    for add in (_add_doctor, _add_data, _add_train, _add_evaluation, _add_deploy):
        add(commands)
    return parser


# --------------------------------------------------------------------------- doctor (00)

def _add_doctor(commands) -> None:
    p = commands.add_parser("doctor", help="check the environment; exit 1 if a check fails")
    p.add_argument("--gpu-smoke", action="store_true",
                   help="also run a small real GPU workload with CUDA_LAUNCH_BLOCKING=1")
    p.set_defaults(func=_doctor)


def _doctor(args) -> int:
    from medaidet.env.doctor import run_doctor
    print(report := run_doctor(gpu_smoke=args.gpu_smoke))
    return 1 if report.failed else 0


# --------------------------------------------------------------------------- data (01, 10)

def _add_data(commands) -> None:
    data = commands.add_parser("data", help="BCCD (and TXL-PBC): download, validate")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    p = data_commands.add_parser(
        "download", help="fetch a dataset at its pinned commit, verify every file, print the "
        "dataset root")
    p.add_argument("--dataset", choices=("bccd", "txl-pbc"), default="bccd",
                   help="bccd (default), or txl-pbc: TXL-PBC, a re-annotation of 221 BCCD images "
                        "and of three other sources")
    p.add_argument("--root", help="dataset root to create (default: $MEDAIDET_DATA for bccd, "
                   "$MEDAIDET_TXL_PBC for txl-pbc, else the cache directory)")
    p.add_argument("--force", action="store_true", help="download again even if verified "
                   "(replaces the dataset's own files only)")
    p.set_defaults(func=_download)
    p = data_commands.add_parser(
        "validate", help="report every annotation defect; exit 1 when any is of severity error")
    p.add_argument("root", nargs="?",
                   help="dataset root (default: $MEDAIDET_DATA, else the cache directory)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_validate)


def _download(args) -> int:
    from medaidet.data.download import SOURCES, download
    print(download(SOURCES[args.dataset], root=args.root, force=args.force))
    return 0


def _validate(args) -> int:
    from medaidet.data.validate import validate_dataset
    report = validate_dataset(args.root)
    print(report.to_json() if args.json else report)
    return 0 if report.ok else 1


# --------------------------------------------------------------------------- train (03)

def _add_train(commands) -> None:
    p = commands.add_parser(
        "train", help="train an SSD on BCCD (the course recipe, the small SSD on a CPU, or a "
        "smoke run)", description="Train an SSD on BCCD. Settings: the profile's, then --config "
        "FILE, then the flags.")
    p.add_argument("--profile", choices=list(PROFILES), default="full",
                   help="smoke: a few iterations on a few images from random weights; cpu: the "
                        "small SSD from random weights, minutes on a CPU; cpu-long: three times "
                        "as long, with SSD's colour distortion and a 2x zoom-out; full: the "
                        "course recipe, SSD300 (default: full)")
    p.add_argument("--config", metavar="FILE",
                   help="JSON (or YAML, with PyYAML) file of TrainConfig options")
    p.add_argument("--device", help="auto, cpu, gpu (= GPU 0) or a GPU number "
                   "(default: the profile's, auto)")
    p.add_argument("--out", help="output directory")
    p.add_argument("--resume", metavar="SNAPSHOT", help="continue from a trainer snapshot "
                   "(snapshot_latest.npz)")
    p.add_argument("--iterations", type=positive_int, help="stop after N iterations")
    p.add_argument("--epochs", type=positive_float, help="stop after N epochs")
    p.add_argument("--batch-size", type=positive_int)
    p.add_argument("--subset", type=positive_int, help="train on the first N images")
    p.add_argument("--seed", type=seed, help="seed Python, NumPy, CuPy and the data workers "
                   "(see medaidet.training.train)")
    p.add_argument("--deterministic", action="store_true", default=None,
                   help="bitwise reproducible where possible: no worker processes, "
                        "deterministic cuDNN; needs --seed")
    p.add_argument("--accumulate", type=positive_int, metavar="N",
                   help="split each batch into N micro-batches (gradient accumulation: the "
                        "memory of batch/N, the gradients of the whole batch)")
    p.add_argument("--memory-limit", type=positive_float, metavar="GIB", help="the memory the "
                   "run may hold, in GiB (default: what the GPU has free; on a GPU also CuPy's "
                   "pool limit): the batch is split into micro-batches until one fits")
    p.add_argument("--precision", choices=PRECISIONS,
                   help="float32 (default) or tf32 (a GPU's tensor cores for float32 products)")
    p.add_argument("--communicator", metavar="NAME",
                   help="ChainerMN multi-process training under mpiexec: naive (CPU or GPU), "
                        "pure_nccl (GPUs), ...; batch size is the total over all ranks")
    p.add_argument("--no-augment", dest="augment", action="store_false", default=None,
                   help="no random augmentation (resize and encode only)")
    p.add_argument("--root", help="BCCD root (default: $MEDAIDET_DATA, else the cache)")
    p.add_argument("--labels", choices=LABELS, help="train on BCCD's boxes or on TXL-PBC's "
                   "re-annotation of BCCD's images (notebook 10; $MEDAIDET_TXL_PBC, else the "
                   "cache) (default: bccd)")
    p.add_argument("--other-sources", nargs="+", choices=OTHER_SOURCES, metavar="SOURCE",
                   help="also train on TXL-PBC's train images of these laboratories "
                        f"({', '.join(OTHER_SOURCES)})")
    p.add_argument("--pretrained", help="imagenet, voc0712, none, or a model-only .npz")
    p.add_argument("--n-processes", type=non_negative_int, help="data-loading worker processes "
                   "(0: none)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_train)


# the TrainConfig fields a `medaidet train` flag of the same name sets
TRAIN_FLAGS = ("device", "out", "iterations", "epochs", "batch_size", "subset", "seed", "root",
               "n_processes", "deterministic", "augment", "accumulate", "communicator",
               "labels", "other_sources", "memory_limit", "precision")


def config_from_args(args) -> TrainConfig:
    """The config of a ``medaidet train`` command line: profile, then file, then flags."""
    config = TrainConfig.profile(args.profile)
    if args.config:
        config = TrainConfig.from_file(args.config, base=config)
    changes = {k: getattr(args, k) for k in TRAIN_FLAGS if getattr(args, k) is not None}
    if args.epochs is not None and args.iterations is None:
        changes["iterations"] = None      # --epochs alone: the profile's iteration count yields
    if args.pretrained is not None:
        changes["pretrained"] = None if args.pretrained.lower() == "none" else args.pretrained
    return config.replace(**changes) if changes else config


def _train(args) -> int:
    config = config_from_args(args)
    if config.communicator is not None:    # one rank of an mpiexec run (notebook 08)
        from medaidet.extras.mpi import train
    else:
        from medaidet.training.train import train
    try:
        train(config, resume=args.resume, progress=not args.no_progress)
    except MedaidetError as exc:   # the checks before any work name the flag the user typed
        field = str(exc).split(":")[0]
        if field in ("out", "resume", "pretrained") and getattr(args, field) is not None:
            exc.args = ("--" + str(exc),) + exc.args[1:]
        raise
    return 0


# ------------------------------------------------------------ evaluate (04), count (05)

def _add_evaluation(commands) -> None:
    p = commands.add_parser(
        "evaluate", help="VOC AP of trained weights (score 0.01 and the course's 0.6)",
        description="Predict a BCCD split in the 'evaluate' preset and report VOC area AP and "
        "VOC07 11-point AP at IoU 0.5, per class and mean, for score >= 0.01 and for the "
        "course's score >= 0.6. --out writes evaluation.json and pr_curves.png.")
    add_weights_arguments(p)
    p.set_defaults(func=_evaluate)
    p = commands.add_parser(
        "count", help="count cells per image and class; compare with the annotation",
        description="Predict a BCCD split, count detections scoring >= --score-thresh per image "
        "and class, and compare with the annotated counts (MAE, relative error, bias), plus a "
        "threshold sweep. --out writes counts.json, counts.png and count_sweep.png.")
    add_weights_arguments(p)
    p.add_argument("--score-thresh", type=count_threshold, default=COUNT_SCORE_THRESH,
                   help=f"count detections scoring at least this, from {EVALUATE_SCORE_THRESH:g} "
                        f"to 1 (default: {COUNT_SCORE_THRESH})")
    p.set_defaults(func=_count)


def add_weights_arguments(p) -> None:
    """The arguments ``medaidet evaluate`` and ``medaidet count`` share."""
    p.add_argument("weights", metavar="WEIGHTS", help="model-only .npz from medaidet train")
    p.add_argument("--split", default="test", choices=SPLITS,
                   help="split to predict (default: test)")
    p.add_argument("--model", choices=MODEL_NAMES, help="architecture the weights were trained "
                   "with (default: read from the weights' parameter names)")
    p.add_argument("--root", help="BCCD root (default: $MEDAIDET_DATA, else the cache)")
    p.add_argument("--out", metavar="DIR", help="write JSON and figures here")
    p.add_argument("--subset", type=positive_int, metavar="N", help="only the first N images of "
                   "the split")
    p.add_argument("--device", default=DEFAULT_DEVICE, help="auto, cpu, gpu or a GPU number "
                   "(default: auto)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="images per forward pass "
                   "(default: 8)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _evaluate(args) -> int:
    from medaidet.evaluation.evaluate import evaluate_weights

    result = evaluate_weights(args.weights, split=args.split, model_name=args.model, root=args.root,
                              subset=args.subset, device=args.device, out=args.out,
                              batch_size=args.batch_size)
    print(result.to_json() if args.json else result)
    return 0


def count_threshold(text: str) -> float:
    """argparse type of ``--score-thresh``: a probability, not below the detector's 0.01."""
    value = probability(text)
    if value < EVALUATE_SCORE_THRESH:
        raise argparse.ArgumentTypeError(
            f"{text} is below {EVALUATE_SCORE_THRESH:g}, the lowest score the detector keeps; "
            f"expected a number from {EVALUATE_SCORE_THRESH:g} to 1")
    return value


def _count(args) -> int:
    from medaidet.evaluation.count import count_weights

    result, sweep = count_weights(args.weights, split=args.split, score_thresh=args.score_thresh,
                                  model_name=args.model, root=args.root, subset=args.subset,
                                  device=args.device, out=args.out, batch_size=args.batch_size)
    print(json.dumps({**result.to_dict(), "sweep": sweep.to_dict()}, indent=2) if args.json
          else f"{result}\n\n{sweep}")
    return 0


# ------------------------------------------------------------ export, count-image (09)

def _missing_extra(exc: ModuleNotFoundError, command: str):
    extra = EXTRAS.get((exc.name or "").split(".")[0])
    if extra is None:
        return exc
    return ConfigError(f"`medaidet {command}` needs {exc.name}, which is not installed: "
                       f"pip install 'medaidet[{extra}]' (from a checkout: "
                       f"pip install -e '.[{extra}]')", "extra")


def _add_deploy(commands) -> None:
    p = commands.add_parser(
        "export", help="write a trained SSD as an ONNX model (for onnxruntime, a browser, ...)",
        description="Write the SSD trained into WEIGHTS (a model-only .npz, as `medaidet train` "
        "writes) as an ONNX model: input `image` (1, 3, S, S) RGB 0-255, outputs `locs` and "
        "`scores`; the default boxes and class names are in its metadata. Needs the chainer "
        "stack and `pip install 'medaidet[export]'`.")
    p.add_argument("weights", help="the trained weights (.npz)")
    p.add_argument("--out", required=True, help="the .onnx file to write, or a folder (an "
                   "existing one, or a name ending in /) to write <weights name>.onnx into")
    p.add_argument("--opset", type=int, default=11, choices=list(range(9, 12)),
                   help="ONNX opset, 9 to 11 (default: 11)")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    p.set_defaults(func=_export)

    p = commands.add_parser(
        "count-image", help="count cells in smear images with an exported model (no chainer)",
        description="Count red cells, white cells and platelets in each IMAGE with a model "
        "written by `medaidet export`, with onnxruntime (no chainer: `pip install "
        "'medaidet[deploy]'`). A detection counts when it scores at least --score-thresh. --out "
        "writes <image>.json and <image>.png (the detections drawn) per image.")
    p.add_argument("images", nargs="+", help="image files (JPEG, PNG, ...)")
    p.add_argument("--model", required=True, help="the .onnx file `medaidet export` wrote")
    p.add_argument("--score-thresh", type=count_threshold, default=COUNT_SCORE_THRESH,
                   help=f"count detections scoring at least this (default: {COUNT_SCORE_THRESH}, "
                        "as notebook 05)")
    p.add_argument("--out", help="folder for a .json and an annotated .png per image")
    p.add_argument("--json", action="store_true", help="print the counts as JSON")
    p.set_defaults(func=_count_image)


def _results_folder(out, images) -> Path:
    """``--out``, created, once no two images would write the same result files (one stem)
    and no result would replace an image or anything but a regular file."""
    stems = {}
    for image in images:
        stems.setdefault(Path(image).stem, []).append(image)
    if same := [paths for paths in stems.values() if len(paths) > 1]:
        raise ConfigError(f"{' and '.join(same[0])} would both write {Path(same[0][0]).stem}.json "
                          f"and .png into {out}: count them in separate runs with separate "
                          "--out folders, or rename one (nothing was written).", "clash", path=out)
    for stem in stems:          # every result checked before any image is counted
        for suffix in (".json", ".png"):
            check_output(Path(out) / f"{stem}{suffix}", images)
    return prepare_output_dir(out, "--out")


def _export(args) -> int:
    try:
        from medaidet.extras.deploy import export_onnx
        out = args.out
        if out.endswith(("/", os.sep)) or Path(out).is_dir():
            out = Path(out) / f"{Path(args.weights).stem}.onnx"
        exported = export_onnx(args.weights, out, opset=args.opset)
    except ModuleNotFoundError as exc:
        raise _missing_extra(exc, "export") from None
    print(json.dumps({"path": str(exported.path), "model": exported.model,
                      "insize": exported.insize, "opset": exported.opset,
                      "default_boxes": exported.n_default_boxes}) if args.json
          else f"wrote {exported}")
    return 0


def _count_image(args) -> int:
    try:
        from medaidet.extras.deploy import OnnxDetector, draw_detections, read_rgb
        detector = OnnxDetector(args.model)
    except ModuleNotFoundError as exc:
        raise _missing_extra(exc, "count-image") from None
    out = _results_folder(args.out, args.images) if args.out else None
    names, results = detector.label_names, []
    for path in map(Path, args.images):
        image = read_rgb(path)
        (bbox,), (label,), (score,) = detector.predict([image])
        kept = score >= args.score_thresh
        bbox, label, score = bbox[kept], label[kept], score[kept]
        result = {"image": str(path),
                  "counts": {name: int((label == i).sum()) for i, name in enumerate(names)},
                  "score_thresh": args.score_thresh,
                  "detections": [{"class": names[l], "score": round(float(s), 4),
                                  "box_yxyx": [round(float(v), 1) for v in b]}
                                 for b, l, s in zip(bbox, label, score)]}
        results.append(result)
        if out is not None:
            drawing = io.BytesIO()
            draw_detections(image, bbox, label, names).save(drawing, "PNG")
            write_files({out / f"{path.stem}.json": json.dumps(result, indent=1) + "\n",
                         out / f"{path.stem}.png": drawing.getvalue()}, inputs=args.images)
    if args.json:
        print(json.dumps(results, indent=1))      # a list, for one image as for several
        return 0
    width = max(len(r["image"]) for r in results)
    print(f"{'image':{width}s}  " + "  ".join(f"{n:>9s}" for n in names))
    for r in results:
        print(f"{r['image']:{width}s}  " + "  ".join(f"{r['counts'][n]:9d}" for n in names))
    return 0


# --------------------------------------------------------------------------- errors

def _needs_stack(exc: ImportError, command: str):
    """What to run when a command needs chainer (or CuPy) and it does not import."""
    stack = (exc.name or "").split(".")[0] in ("chainer", "chainercv", "chainermn", "cupy")
    if stack or command in MODEL_COMMANDS:
        return (f"`medaidet {command}` needs the chainer stack ({type(exc).__name__}: {exc}): "
                "run `python -m medaidet stack install` first")


def _one_line(exc: BaseException, args=None) -> str:
    """A user-facing error's message for one line of stderr (``args``: for a full disk's fix)."""
    if isinstance(exc, MedaidetError):
        return str(exc)
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    what = exc.strerror or str(exc)
    if is_full_disk(exc):
        what = f"{what}: {_no_room_fix(exc, args)}"
    return f"{where}: {what}" if where else what


def _no_room_fix(exc: OSError, args) -> str:
    """What to do when a write found no room (a full disk or quota, the file-size limit)."""
    from medaidet.files import default_cache_dir

    out = getattr(args, "out", None)
    target = folder = None
    if exc.filename or out:  # an error that names no file: the output folder
        target = folder = Path(exc.filename or out).expanduser().resolve()
        if exc.filename and not target.is_dir():
            folder = target.parent
    disk = f"the disk that holds {folder}" if folder else "the disk this command writes to"
    too_big = "the file outgrew the file-size limit (`ulimit -f`) or the file system's; raise it"
    fix = {errno.EFBIG: too_big, errno.EDQUOT: f"free space in your quota on {disk}"}.get(
        exc.errno, f"free space on {disk}")
    caches = [Path(p).expanduser().resolve()
              for p in (getattr(args, "cache", None), default_cache_dir()) if p]
    if target and out and target.is_relative_to(Path(out).expanduser().resolve()):
        return fix + ", or choose an --out folder on another disk"
    if target and any(target.is_relative_to(cache) for cache in caches):
        return fix + ", or set $MEDAIDET_CACHE (or --cache) to a folder on another disk"
    return fix + ", or write to a folder on another disk"


def _install_hint(exc: ImportError):
    """The one command to run first when ``exc`` is one of medaidet's own dependencies missing."""
    if not (isinstance(exc, ModuleNotFoundError)
            and (exc.name or "").split(".")[0] in OWN_DEPENDENCIES):
        return None
    checkout = Path(__file__).resolve().parents[1]
    target = f"-e {checkout}" if (checkout / "pyproject.toml").is_file() else "medaidet"
    return (f"{exc.name} is not installed: medaidet's own dependencies are missing in "
            f"this environment ({sys.executable}); run first: "
            f"{Path(sys.executable).name} -m pip install {target}")


def _show_medaidet_logs() -> None:
    """medaidet's INFO logs go to stderr, prefixed like every other line of the command."""
    logger = logging.getLogger("medaidet")
    if not any(getattr(h, "medaidet_cli", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("medaidet: %(message)s"))
        handler.medaidet_cli = True
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in argv
    argv = [a for a in argv if a != DEBUG_FLAG]
    args = None
    try:
        args = build_parser().parse_args(argv)   # ImportError: a checkout never installed
        _show_medaidet_logs()
        return args.func(args)
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("medaidet: interrupted", file=sys.stderr)
        return 130
    except ImportError as exc:
        message = _install_hint(exc) or (args and _needs_stack(exc, args.command))
        if not message or debug:
            raise
    except (MedaidetError, OSError) as exc:
        if debug:
            traceback.print_exc()
        message = _one_line(exc, args)
    print(f"medaidet: error: {message}", file=sys.stderr)
    return 2
