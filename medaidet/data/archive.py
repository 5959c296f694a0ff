"""A downloaded dataset archive, extracted safely (notebook 01, section 1).

:func:`extract` streams a tar archive (any compression tarfile reads) and writes only the
regular files its :class:`~medaidet.data.pinned.PinnedSource`'s manifest names, each under
its manifest path, through tarfile's ``data`` filter (the standard library's rules for
untrusted archives), with size limits. A member the filter refuses (a path out of the
folder, a link to an absolute path or out of it, a device or FIFO) is an ``"unsafe_archive"``
DataError before anything is installed; a member the manifest does not name is never
written. A file that is not a readable tar archive is named for what it is instead
(:func:`identify`: empty, a ZIP, an HTML page, gzip data cut short, ...) with what to do.
"""
from __future__ import annotations

import gzip
import re
import tarfile
import zlib
from pathlib import Path

from medaidet.data.pinned import BCCD, PinnedSource
from medaidet.errors import DataError

__all__ = ["extract", "identify", "MAX_MEMBER_BYTES", "MAX_EXTRACTED_BYTES"]

_CHUNK = 1 << 20
# Limits far above the real data (the largest file is ~200 kB; BCCD ~11 MB, TXL-PBC ~44 MB).
MAX_MEMBER_BYTES = 64 << 20
MAX_EXTRACTED_BYTES = 512 << 20


def _manifest_path(name: str, manifest: dict[str, str], subfolder: str | None) -> str | None:
    """Upstream member name -> manifest path, or None when we do not keep it:
    ``<top>/<path>`` -> ``<path>``; with ``subfolder`` (BCCD's ``BCCD``),
    ``<top>/<subfolder>/<sub>/<file>`` -> ``<sub>/<file>``."""
    parts = [p for p in name.split("/") if p not in ("", ".")][1:]   # without the top folder
    if subfolder is not None and parts[:1] == [subfolder] and len(parts) > 2:
        parts = parts[1:]
    rel = "/".join(parts)
    return rel if rel in manifest else None


def _refusal(member: tarfile.TarInfo, rel: str | None, staging: Path, total: int) -> str | None:
    """Why ``member`` may not be extracted, or None."""
    try:
        tarfile.data_filter(member, str(staging))
    except tarfile.FilterError as exc:
        return str(exc)
    if rel is None:
        return None
    if not member.isreg():
        return "it is a link or folder where the dataset has a file"
    if (staging / rel).exists():
        return "it appears twice"
    if member.size > MAX_MEMBER_BYTES or total > MAX_EXTRACTED_BYTES:
        return f"it is too large ({member.size:,} bytes)"
    return None


def extract(source: PinnedSource, archive: Path, staging: Path, manifest: dict[str, str],
            url: str) -> None:
    """Write the members of ``archive`` (fetched from ``url``) that ``manifest`` names into
    ``staging``; an ``"unsafe_archive"`` or ``"archive"`` DataError otherwise."""
    total = 0
    try:
        with open(archive, "rb") as raw, tarfile.open(fileobj=raw, mode="r|*") as tar:
            for member in tar:
                rel = _manifest_path(member.name, manifest, source.subfolder)
                total += member.size if rel else 0
                reason = _refusal(member, rel, staging, total)
                if reason:
                    raise DataError(
                        f"unsafe member {member.name!r} in the archive from {url}: {reason}. "
                        f"Nothing was installed; this is not the pinned {source.name} "
                        "archive.", "unsafe_archive", member=member.name)
                if rel is not None:
                    tar.extract(member.replace(name=rel, deep=False), staging, filter="data")
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        what, fix = identify(archive, source)
        raise DataError(
            f"the file downloaded from {url} is not a complete tar archive: it {what} "
            f"(tarfile: {type(exc).__name__}: {exc}). {fix}; expected a .tar.gz archive "
            f"like {source.url}. Nothing was installed.", "archive") from None


_CUT_SHORT = "The download was probably cut short: run the download again"


def identify(path: Path, source: PinnedSource = BCCD) -> tuple[str, str]:
    """What a file that is not a readable tar archive really is, from its content:
    ``(what it is, what to do)``, each a phrase for the error message."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(4096)
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    check_url = (f"Check the URL (from url= or ${source.url_env}): it does not point to the "
                 f"{source.name} archive")
    if size == 0:
        return "is empty (0 bytes)", "The server sent nothing: run the download again"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return (f"is a ZIP archive ({size} bytes)",
                "Use the .tar.gz archive of the same commit instead (GitHub serves both: "
                ".../archive/<commit>.tar.gz rather than .../archive/<commit>.zip)")
    if text.startswith((b"<!doctype html", b"<html")) or b"<html" in text[:1024]:
        title = re.search(rb"<title[^>]*>([^<]{1,80})", head, re.IGNORECASE)
        named = f" titled {title.group(1).decode('utf-8', 'replace').strip()!r}" if title else ""
        return (f"is an HTML page{named} ({size} bytes)",
                "The server sent a web page (an error, login or proxy page): check the URL "
                f"(from url= or ${source.url_env}) and your proxy settings")
    if head.startswith(b"\x1f\x8b"):
        try:
            with gzip.open(path, "rb") as fh:
                read = 0
                while read <= MAX_EXTRACTED_BYTES and (chunk := fh.read(_CHUNK)):
                    read += len(chunk)
        except (EOFError, OSError, zlib.error):
            return f"is gzip data cut short ({size} bytes)", _CUT_SHORT
        return (f"is a complete gzip file whose content is not a tar archive ({size} bytes)",
                check_url)
    if head.startswith((b"BZh", b"\xfd7zXZ\x00")) or head[257:262] == b"ustar":
        return f"is a compressed or tar archive cut short ({size} bytes)", _CUT_SHORT
    return f"is not an archive ({size} bytes, starting {head[:24]!r})", check_url

