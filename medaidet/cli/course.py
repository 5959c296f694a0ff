"""``medaidet course run``: every notebook, in order, with papermill."""
from medaidet.arguments import non_negative_int, positive_int
from medaidet.env import COURSE_LANGS, COURSE_PROFILES


def add_parser(commands) -> None:
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
    p.add_argument("--seed", type=non_negative_int, default=None,
                   help="the seed notebook 03 trains the detector with (default: the "
                        "profile's, 0)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from medaidet.env.course import run_course
    out = args.out or ("outputs" if args.lang == "en" else f"outputs/{args.lang}")
    summary = run_course(profile=args.profile, only=args.only, out=out,
                         cell_timeout=args.cell_timeout, lang=args.lang, seed=args.seed)
    return 0 if summary.ok else 1
