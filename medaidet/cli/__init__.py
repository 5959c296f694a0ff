"""The ``medaidet`` command.

Each command group is a module of this package (``cli/data.py``, ``cli/train.py``, …; ``stack``
and ``course`` are the course's tools', :mod:`medaidet_tools.cli`): its
``add_parser`` defines the arguments without NumPy or chainer, and its handlers import what
they run only when they run, so ``medaidet --help`` and ``medaidet stack install`` work in an
environment that has no chainer yet (a command that needs it then says what to install).

A user's mistake ends in one line on stderr, exit status 2, never a traceback: a bad
argument (argparse and :mod:`medaidet.arguments` name it), any named
:class:`~medaidet.errors.MedaidetError`, and an operating-system error (a file that cannot be
read or written; a full disk names the file and says what to do). Ctrl-C ends with one line
and status 130. ``--debug``, anywhere on the
command line, shows the traceback instead.
"""
import argparse
import contextlib
import errno
import logging
import sys
import traceback
from pathlib import Path

from medaidet.cli import batch_size, count, data, deploy, doctor, evaluate, train
from medaidet.errors import MedaidetError
from medaidet.files import is_full_disk

DEBUG_FLAG = "--debug"
# The import names of the dependencies pyproject.toml lists: missing, `python -m medaidet` is
# running from a source checkout that was never installed.
OWN_DEPENDENCIES = ("numpy", "packaging", "PIL", "matplotlib", "papermill", "nbformat",
                    "ipykernel", "tqdm", "defusedxml", "safetensors",
                    "medaidet_tools")   # installed with medaidet, from tools/
# The commands that need the chainer stack (the others run before it is installed).
MODEL_COMMANDS = ("train", "evaluate", "count", "batch-size", "export")


class CommandParser(argparse.ArgumentParser):
    """argparse, with a usage mistake said in one line (the command, what is wrong, where
    to look) instead of the usage block. Sub-command parsers are of this class too."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from medaidet_tools import cli as tools

    parser = CommandParser(
        prog="medaidet", description="medaidet: the blood-cell detection course's command line.",
        epilog=f"{DEBUG_FLAG} (anywhere on the line): show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True)

    tools.add_parsers(commands)          # stack, course: the course's tools (medaidet_tools)
    for group in (doctor, data, train, evaluate, count, batch_size, deploy):
        group.add_parser(commands)
    return parser


def _needs_stack(exc: ImportError, command: str):
    """What to run when a command needs chainer (or CuPy) and it does not import."""
    stack = (exc.name or "").split(".")[0] in ("chainer", "chainercv", "chainermn", "cupy")
    if not (stack or command in MODEL_COMMANDS):
        return None
    return (f"`medaidet {command}` needs the chainer stack ({type(exc).__name__}: {exc}): run "
            "`python -m medaidet stack install` first")


@contextlib.contextmanager
def flags_in_messages(flags: dict):
    """An error raised inside whose message begins with a field name of ``flags``
    (``"out: ..."``, as the Python API names it) begins with the flag the user typed
    instead (``"--out: ..."``)."""
    try:
        yield
    except MedaidetError as exc:
        message = str(exc)
        for field, flag in flags.items():
            if message.startswith(field + ":"):
                exc.args = (flag + message[len(field):],) + exc.args[1:]
                break
        raise


def _one_line(exc: BaseException, args=None) -> str:
    """The message of a user-facing error, for one line of stderr. ``args``: the parsed
    command line, for what to do about a full disk."""
    if isinstance(exc, MedaidetError):
        return str(exc)
    # OSError: which file, and what the system said about it
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
    if exc.filename:
        target = Path(exc.filename).expanduser().resolve()
        folder = target if target.is_dir() else target.parent
    elif out:  # an error that names no file: the output folder
        target = folder = Path(out).expanduser().resolve()
    disk = f"the disk that holds {folder}" if folder else "the disk this command writes to"
    if exc.errno == errno.EFBIG:
        fix = "the file outgrew the file-size limit (`ulimit -f`) or the file system's; raise it"
    elif exc.errno == errno.EDQUOT:
        fix = f"free space in your quota on {disk}"
    else:
        fix = f"free space on {disk}"
    caches = [Path(p).expanduser().resolve()
              for p in (getattr(args, "cache", None), default_cache_dir()) if p]
    if target and out and target.is_relative_to(Path(out).expanduser().resolve()):
        return fix + ", or choose an --out folder on another disk"
    if target and any(target.is_relative_to(cache) for cache in caches):
        return fix + ", or set $MEDAIDET_CACHE (or --cache) to a folder on another disk"
    return fix + ", or write to a folder on another disk"


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
    """What medaidet's modules log at INFO (files left alone by a download,
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
    try:
        parser = build_parser()
    except ModuleNotFoundError as exc:   # a checkout that was never installed
        hint = _install_hint(exc)
        if hint is None or debug:
            raise
        print(f"medaidet: error: {hint}", file=sys.stderr)
        return 2
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
        print(f"medaidet: error: {_one_line(exc, args)}", file=sys.stderr)
        return 2
