"""``medaidet stack install|build|status``: the chainer/chainercv/CuPy install path."""
import json


def add_parser(commands) -> None:
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
    from medaidet.stack import install
    install(cuda=args.cuda, cache_dir=args.cache, force=args.force)
    return 0


def _build(args) -> int:
    from medaidet.stack import build_wheels
    for path in build_wheels(cache_dir=args.cache, out=args.out, force=args.force):
        print(path)
    return 0


def _status(args) -> int:
    from medaidet.stack import status
    report = status()
    print(json.dumps(report.to_dict(), indent=2) if args.json else report)
    return 0 if report.ok else 1
