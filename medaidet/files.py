"""Writing a file so that a crash never leaves half of one under its name.

:func:`atomic_file` writes to a temporary ``.<name>.<random>.part`` beside the target and
renames it onto the target only when the writing finished. The temporary file is created
with the mode the umask gives any new file (typically 0644): ``tempfile.mkstemp`` would give
0600, which the rename carries over, and weights or wheels in a shared folder would then be
unreadable to everyone but their writer.
"""
import os
import secrets
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_file"]


def _create_part_file(path: Path):
    """``(fd, name)`` of a new, empty ``.<name>.<random>.part`` file beside ``path``."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.part")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                           | getattr(os, "O_BINARY", 0), 0o666), str(tmp)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


@contextmanager
def atomic_file(path, mode: str = "wb"):
    """``with atomic_file(path) as f: f.write(...)``: ``path`` holds either its old content
    or everything written, never a part. ``mode``: "wb" or "w" (text, UTF-8)."""
    path = Path(path)
    fd, tmp = _create_part_file(path)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
