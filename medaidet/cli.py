"""The ``medaidet`` command.

Sub-commands import their modules lazily, so ``medaidet stack install``
works in an environment that has no chainer yet.

A user's mistake ends in one line on stderr, exit status 2, never a traceback: a bad
argument (argparse and :mod:`medaidet.arguments` name it), any named
:class:`~medaidet.errors.MedaidetError`, and an operating-system error (a file that cannot be
read or written). Ctrl-C ends with one line and status 130. ``--debug``, anywhere on the
command line, shows the traceback instead.
"""
import argparse
import json
import logging
import sys
import traceback
from pathlib import Path

from medaidet.arguments import non_negative_int, positive_int
from medaidet.errors import MedaidetError

DEBUG_FLAG = "--debug"
# The import names of the dependencies pyproject.toml lists: missing, `python -m medaidet` is
# running from a source checkout that was never installed.
OWN_DEPENDENCIES = ("numpy", "packaging", "PIL", "matplotlib", "papermill", "nbformat",
                    "ipykernel", "tqdm", "defusedxml")


def _stack_install(args) -> int:
    from medaidet.stack import install
    install(cuda=args.cuda, cache_dir=args.cache, force=args.force)
    return 0


def _stack_build(args) -> int:
    from medaidet.stack import build_wheels
    for path in build_wheels(cache_dir=args.cache, dest=args.dest, force=args.force):
        print(path)
    return 0


def _stack_status(args) -> int:
    from medaidet.stack import status
    report = status()
    print(json.dumps(report.to_dict(), indent=2) if args.json else report)
    return 0 if report.ok else 1


def _doctor(args) -> int:
    from medaidet.env.doctor import run_doctor
    report = run_doctor(gpu_smoke=args.gpu_smoke)
    print(report.to_json() if args.json else report)
    return 1 if report.failed else 0


def _data_download(args) -> int:
    from medaidet.data.download import download_bccd
    print(download_bccd(dest=args.dest, force=args.force))
    return 0


def _data_validate(args) -> int:
    from medaidet.data.validate import validate_dataset
    report = validate_dataset(args.root)
    print(report.to_json() if args.json else report)
    return 0 if report.ok else 1


def _data_synth(args) -> int:
    from medaidet.data.synth import make_synthetic
    print(make_synthetic(args.dest, n=args.n, seed=args.seed))
    return 0


def _course_run(args) -> int:
    from medaidet.env.course import run_course
    summary = run_course(profile=args.profile, only=args.only, out_dir=args.out,
                         cell_timeout=args.cell_timeout)
    return 0 if summary.ok else 1


def _add_model_commands(commands) -> None:
    """train / evaluate / count / batch-size define their own arguments and need chainer. Before the
    stack is installed they are still listed, and say how to get it, so that
    `python -m medaidet stack install` works in an environment without chainer."""
    try:
        from medaidet.evaluation.count import add_count_parser
        from medaidet.evaluation.evaluate import add_evaluate_parser
        from medaidet.scaling.memory import add_batch_size_parser
        from medaidet.training.train import add_train_parser
    except ImportError as exc:
        missing = f"{type(exc).__name__}: {exc}"

        def needs_stack(args) -> int:
            raise MedaidetError(f"`medaidet {args.command}` needs the chainer stack ({missing}): "
                                "run `python -m medaidet stack install` first")

        for name in ("train", "evaluate", "count", "batch-size"):
            p = commands.add_parser(name, help=f"(needs chainer: {missing})")
            p.set_defaults(func=needs_stack, accepts_any_arguments=True)
        return
    add_train_parser(commands)
    add_evaluate_parser(commands)
    add_count_parser(commands)
    add_batch_size_parser(commands)


class CommandParser(argparse.ArgumentParser):
    """argparse, with a usage mistake said in one line (the command, what is wrong, where
    to look) instead of the usage block. Sub-command parsers are of this class too."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="medaidet", description="medaidet: the blood-cell detection course's command line.",
        epilog=f"{DEBUG_FLAG} (anywhere on the line): show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True)

    stack = commands.add_parser("stack", help="install and inspect chainer/chainercv/CuPy")
    stack_commands = stack.add_subparsers(dest="stack_command", required=True)
    p = stack_commands.add_parser("install", help="build (cached) and install patched "
                                  "chainer/chainercv wheels, and CuPy when a GPU is present")
    p.add_argument("--cuda", choices=["auto", "none", "12", "13"], default="auto",
                   help="CuPy to install: auto = the one fitting this machine's driver "
                        "and NumPy, none on a machine without a GPU (default: auto)")
    p.add_argument("--cache", default=None, help="wheel/sdist cache directory")
    p.add_argument("--force", action="store_true", help="rebuild and reinstall")
    p.set_defaults(func=_stack_install)
    p = stack_commands.add_parser("build", help="only build the wheels and print their paths")
    p.add_argument("--cache", default=None, help="wheel/sdist cache directory")
    p.add_argument("--dest", default=None, help="copy the wheels here too")
    p.add_argument("--force", action="store_true", help="rebuild even if cached")
    p.set_defaults(func=_stack_build)
    p = stack_commands.add_parser("status", help="what is installed and whether it is ours")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_stack_status)

    p = commands.add_parser("doctor", help="check the environment; exit 1 if a check fails")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--gpu-smoke", action="store_true",
                   help="also run a small real GPU workload with CUDA_LAUNCH_BLOCKING=1")
    p.set_defaults(func=_doctor)

    data = commands.add_parser("data", help="BCCD: download, validate, synthetic data")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    p = data_commands.add_parser("download", help="fetch BCCD at the pinned commit, verify "
                                 "every file, print the dataset root")
    p.add_argument("--dest", default=None, help="dataset root to create (default: "
                   "$MEDAIDET_DATA, else the cache directory)")
    p.add_argument("--force", action="store_true", help="download again even if verified")
    p.set_defaults(func=_data_download)
    p = data_commands.add_parser("validate", help="report every annotation defect; exit 1 "
                                 "when any is of severity error")
    p.add_argument("root", nargs="?", default=None,
                   help="dataset root (default: $MEDAIDET_DATA, else the cache directory)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_data_validate)
    p = data_commands.add_parser("synth", help="write a small synthetic VOC-layout dataset")
    p.add_argument("dest", help="folder to create")
    p.add_argument("--n", type=positive_int, default=24, help="number of images, at least 3: one per split (default: 24)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default: 0)")
    p.set_defaults(func=_data_synth)

    _add_model_commands(commands)

    course = commands.add_parser("course", help="run the course notebooks with papermill")
    course_commands = course.add_subparsers(dest="course_command", required=True)
    p = course_commands.add_parser("run", help="execute every notebook in order")
    p.add_argument("--profile", choices=["auto", "smoke", "full"], default="auto",
                   help="auto = full on a GPU, smoke on CPU (default: auto)")
    p.add_argument("--only", action="append", default=None, metavar="NAME",
                   help="run only this notebook (name or stem; repeatable)")
    p.add_argument("--out", default="outputs", help="output directory (default: outputs)")
    p.add_argument("--cell-timeout", type=positive_int, default=None,
                   help="seconds per cell (default: the profile's)")
    p.set_defaults(func=_course_run)
    return parser


def _one_line(exc: BaseException) -> str:
    """The message of a user-facing error, for one line of stderr."""
    if isinstance(exc, MedaidetError):
        return str(exc)
    # OSError: which file, and what the system said about it
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    what = exc.strerror or str(exc)
    return f"{where}: {what}" if where else what


def _install_hint(exc: ModuleNotFoundError):
    """The one command to run first when ``exc`` is one of medaidet's own dependencies."""
    if (exc.name or "").split(".")[0] not in OWN_DEPENDENCIES:
        return None
    checkout = Path(__file__).resolve().parent.parent
    target = f"-e {checkout}" if (checkout / "pyproject.toml").is_file() else "medaidet"
    return (f"{exc.name} is not installed: medaidet's own dependencies are missing in "
            f"this environment ({sys.executable}); run first: "
            f"{Path(sys.executable).name} -m pip install {target}")


def _show_medaidet_logs() -> None:
    """What medaidet's modules log at INFO (files left alone by a download, leftovers swept,
    weights loaded) goes to stderr, prefixed like every other line of the command."""
    logger = logging.getLogger("medaidet")
    if not any(getattr(h, "medaidet_cli", False) for h in logger.handlers):
        handler = logging.StreamHandler()   # stderr
        handler.setFormatter(logging.Formatter("medaidet: %(message)s"))
        handler.medaidet_cli = True
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in argv
    argv = [a for a in argv if a != DEBUG_FLAG]
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_any_arguments", False):
        parser.error("unrecognized arguments: " + " ".join(extra))
    _show_medaidet_logs()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("medaidet: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as exc:
        hint = _install_hint(exc)
        if hint is None or debug:
            raise
        print(f"medaidet: error: {hint}", file=sys.stderr)
        return 2
    except (MedaidetError, OSError) as exc:
        if debug:
            traceback.print_exc()
        print(f"medaidet: error: {_one_line(exc)}", file=sys.stderr)
        return 2
