"""Writing files so that a crash or a full disk never leaves half of one under its name, and
the untrusted-file rules: a reader refuses anything but a regular file (:func:`not_a_regular_file`);
an output (:func:`check_output`) never replaces a folder, device, FIFO, socket or an input. A
full disk's ``OSError`` (which names no file) raised from here names the file being written."""
import errno
import hashlib
import io
import os
import secrets
import stat
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

from medaidet.errors import ConfigError

__all__ = ["FULL_DISK_ERRNOS", "atomic_file", "check_output", "is_full_disk",
           "not_a_regular_file", "png_bytes", "sha256_file", "write_files"]

# The errors of a write that found no room: the disk, the user's quota, the file-size limit.
FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def not_a_regular_file(path) -> str | None:
    """What ``path`` (links followed) is, in words, when it is not a regular file (a FIFO
    blocks its reader, a device never ends); None for a regular file or no file at all."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe): reading it would wait for a writer for ever"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device: reading it might never end"
    return "not a regular file"


def check_output(path, inputs=()) -> Path:
    """``path``, if writing there replaces nothing but a regular file (or a link to one)
    that is none of ``inputs``; else :class:`ConfigError`."""
    path = Path(path)
    if os.path.lexists(path) and not path.is_file():
        what = ("a folder" if path.is_dir() else "a link to nothing" if path.is_symlink()
                else "a device, FIFO or socket, not a regular file")
        raise ConfigError(f"{path} is {what}: writing there would replace it; give a file name "
                          "(nothing was written)", "not_a_file", path=path)
    for source in inputs:
        with suppress(OSError):   # one of them does not exist: not the same file
            if os.path.samefile(path, source):
                raise ConfigError(f"{path} is also an input of this command ({source}): choose "
                                  "another output name (nothing was written)", "input", path=path)
    return path


def is_full_disk(exc: BaseException) -> bool:
    """True when ``exc`` is an ``OSError`` of a write that found no room."""
    return isinstance(exc, OSError) and exc.errno in FULL_DISK_ERRNOS


def _create_part_file(path: Path):
    """``(fd, name)`` of a new ``.<name>.<random>.part`` beside ``path``, mode 0o666 less the
    umask (mkstemp's 0600 would survive the rename and hide shared files from others)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.part")  # O_EXCL: never shared
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    return os.open(tmp, flags, 0o666), str(tmp)


@contextmanager
def atomic_file(path, mode: str = "wb", inputs=()):
    """``with atomic_file(path) as f: f.write(...)``: ``path`` holds its old content or
    everything written, never a part. ``mode``: "wb" or "w" (UTF-8)."""
    path = check_output(path, inputs)
    fd, tmp = _create_part_file(path)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
        os.replace(tmp, path)
    except OSError as exc:
        if is_full_disk(exc) and exc.filename is None:
            exc.filename = str(path)
        raise
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def png_bytes(fig, dpi=None) -> bytes:
    """A matplotlib figure as PNG bytes, for :func:`write_files`."""
    fig.savefig(buffer := io.BytesIO(), format="png", dpi=dpi)   # None: matplotlib's savefig.dpi
    return buffer.getvalue()


def write_files(contents: dict, inputs=()) -> None:
    """Write ``{path: bytes or str}`` as one result: every file gets its new content, or
    none changes; every path is checked before any is written."""
    for path in contents:
        check_output(path, inputs)
    with ExitStack() as stack:
        for path, data in contents.items():
            f = stack.enter_context(atomic_file(path, "wb", inputs))
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()  # a full disk fails here, before any file is renamed


def default_cache_dir() -> Path:
    """``$MEDAIDET_CACHE`` or ``~/.cache/medaidet``."""
    if os.environ.get("MEDAIDET_CACHE"):
        return Path(os.environ["MEDAIDET_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "medaidet"


def sha256_file(path) -> str:
    """Hex sha256 of the file at ``path``, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
