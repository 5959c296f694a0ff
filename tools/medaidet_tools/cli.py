"""``medaidet stack install|build|status`` and ``medaidet course run``: the tools' commands,
added to the ``medaidet`` command (:func:`add_parsers`). Each handler imports what it runs
only when it runs: ``medaidet stack install`` works before chainer exists."""
import json

from medaidet.arguments import positive_int, seed
from medaidet.env import COURSE_LANGS, COURSE_PROFILES


def add_parsers(commands) -> None:
    _add_stack(commands)
    _add_course(commands)


def _add_stack(commands) -> None:
    stack = commands.add_parser("stack", help="install and inspect chainer/chainercv/CuPy")
    stack_commands = stack.add_subparsers(dest="stack_command", required=True)
    p = stack_commands.add_parser("install", help="build (cached) and install patched "
                                  "chainer/chainercv wheels, and CuPy when a GPU is present")
    p.add_argument("--cuda", choices=["auto", "none", "12", "13"], default="auto",
                   help="CuPy to install: auto = the one fitting this machine's driver "
                        "and NumPy, none on a machine without a GPU (default: auto)")
    p.add_argument("--cache", default=None, help="wheel/sdist cache directory")
    p.add_argument("--force", action="store_true", help="rebuild and reinstall")
    p.set_defaults(func=_install)
    p = stack_commands.add_parser("build", help="only build the wheels and print their paths")
    p.add_argument("--cache", default=None, help="wheel/sdist cache directory")
    p.add_argument("--out", default=None, metavar="DIR", help="copy the wheels here too")
    p.add_argument("--force", action="store_true", help="rebuild even if cached")
    p.set_defaults(func=_build)
    p = stack_commands.add_parser("status", help="what is installed and whether it is ours")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_status)


def _install(args) -> int:
    from medaidet_tools.stack import install
    install(cuda=args.cuda, cache_dir=args.cache, force=args.force)
    return 0


def _build(args) -> int:
    from medaidet_tools.stack import build_wheels
    for path in build_wheels(cache_dir=args.cache, out=args.out, force=args.force):
        print(path)
    return 0


def _status(args) -> int:
    from medaidet_tools.stack import status
    report = status()
    print(json.dumps(report.to_dict(), indent=2) if args.json else report)
    return 0 if report.ok else 1


def _add_course(commands) -> None:
    course = commands.add_parser("course", help="run the course notebooks with papermill")
    course_commands = course.add_subparsers(dest="course_command", required=True)
    p = course_commands.add_parser("run", help="execute every notebook in order")
    p.add_argument("--profile", choices=["auto", *COURSE_PROFILES], default="auto",
                   help="auto: full on a GPU, else cpu (the small SSD, trained in minutes); "
                        "smoke: CI's quick check of the mechanics (default: auto)")
    p.add_argument("--only", action="append", default=None, metavar="NAME",
                   help="run only this notebook (name or stem; repeatable)")
    p.add_argument("--lang", choices=list(COURSE_LANGS), default="en",
                   help="the edition: en (notebooks/) or ja, the Japanese edition "
                        "(notebooks/ja/; 日本語版) (default: en)")
    p.add_argument("--out", default=None,
                   help="output directory (default: outputs; outputs/ja for --lang ja)")
    p.add_argument("--cell-timeout", type=positive_int, default=None,
                   help="seconds per cell (default: the profile's)")
    p.add_argument("--seed", type=seed, default=None,
                   help="the seed notebook 03 trains the detector with (default: the "
                        "profile's, 0)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from medaidet_tools.course import run_course
    out = args.out if args.out is not None else (
        "outputs" if args.lang == "en" else f"outputs/{args.lang}")
    summary = run_course(profile=args.profile, only=args.only, out=out,
                         cell_timeout=args.cell_timeout, lang=args.lang, seed=args.seed)
    return 0 if summary.ok else 1
