"""The ``medaidet`` command.

Each command group is a module of this package (``cli/stack.py``, ``cli/data.py``, …): its
``add_parser`` defines the arguments without NumPy or chainer, and its handlers import what
they run only when they run, so ``medaidet --help`` and ``medaidet stack install`` work in an
environment that has no chainer yet (a command that needs it then says what to install).

A user's mistake ends in one line on stderr, exit status 2, never a traceback: a bad
argument (argparse and :mod:`medaidet.arguments` name it), any named
:class:`~medaidet.errors.MedaidetError`, and an operating-system error (a file that cannot be
read or written). Ctrl-C ends with one line and status 130. ``--debug``, anywhere on the
command line, shows the traceback instead.
"""
import argparse
import logging
import sys
import traceback
from pathlib import Path

from medaidet.cli import batch_size, count, course, data, doctor, evaluate, stack, train
from medaidet.errors import MedaidetError

DEBUG_FLAG = "--debug"
# The import names of the dependencies pyproject.toml lists: missing, `python -m medaidet` is
# running from a source checkout that was never installed.
OWN_DEPENDENCIES = ("numpy", "packaging", "PIL", "matplotlib", "papermill", "nbformat",
                    "ipykernel", "tqdm", "defusedxml")
# The commands that need the chainer stack (the others run before it is installed).
MODEL_COMMANDS = ("train", "evaluate", "count", "batch-size")


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

    for group in (stack, doctor, data, train, evaluate, count, batch_size, course):
        group.add_parser(commands)
    return parser


def _needs_stack(exc: ImportError, command: str):
    """What to run when a command needs chainer (or CuPy) and it does not import."""
    stack = (exc.name or "").split(".")[0] in ("chainer", "chainercv", "chainermn", "cupy")
    if not (stack or command in MODEL_COMMANDS):
        return None
    return (f"`medaidet {command}` needs the chainer stack ({type(exc).__name__}: {exc}): run "
            "`python -m medaidet stack install` first")


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
    checkout = Path(__file__).resolve().parents[2]  # medaidet/cli/__init__.py -> the checkout
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
    args = parser.parse_args(argv)
    _show_medaidet_logs()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("medaidet: interrupted", file=sys.stderr)
        return 130
    except ImportError as exc:
        hint = (_install_hint(exc) if isinstance(exc, ModuleNotFoundError) else None) \
            or _needs_stack(exc, args.command)
        if hint is None or debug:
            raise
        print(f"medaidet: error: {hint}", file=sys.stderr)
        return 2
    except (MedaidetError, OSError) as exc:
        if debug:
            traceback.print_exc()
        print(f"medaidet: error: {_one_line(exc)}", file=sys.stderr)
        return 2
