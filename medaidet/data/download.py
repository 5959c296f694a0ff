"""Where the course's data comes from: datasets pinned to one commit, their shipped sha256
manifests, where a copy lives, and the download (notebooks 01 and 10). A verified copy carries
the marker :data:`MARKER_NAME`. The root is the argument, else ``$MEDAIDET_DATA``
(``$MEDAIDET_TXL_PBC``), else :func:`default_root`.

The download is GitHub's archive of the commit (not byte-stable: each file is checked against
the manifest). Untrusted-archive rules: https, http or file URLs only; only the manifest's
regular files are written, through tarfile's ``data`` filter, with size limits; all is staged
beside the destination and verified first. The marker is removed first and put back last, so
an interrupted install is never taken for a verified copy; a root holds one dataset.
"""
from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import importlib.resources
import logging
import os
import re
import tarfile
import tempfile
import urllib.parse
import zlib
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath
from typing import NamedTuple

from medaidet import __version__
from medaidet.arguments import checked_path
from medaidet.downloads import stream_url
from medaidet.errors import DataError, MedaidetError
from medaidet.files import default_cache_dir, sha256_file

__all__ = [
    "PinnedSource", "BCCD", "TXL_PBC", "SOURCES", "MARKER_NAME", "Problem", "load_manifest",
    "manifest_entries", "manifest_sha256", "verify_dataset", "is_verified",
    "summarize_problems", "default_root", "choose_root", "cli_flag", "resolve_root",
    "extract", "identify", "MAX_MEMBER_BYTES", "MAX_EXTRACTED_BYTES", "download",
    "download_bccd", "download_txl_pbc", "URL_SCHEMES"]

logger = logging.getLogger(__name__)


# ------------------------------------------------------------- the pinned sources and their copies
@dataclass(frozen=True)
class PinnedSource:
    """A dataset as a repository at one commit, the files kept from it and their sha256.
    ``marks``: the folder every copy has; ``layout``: how to place the files by hand."""
    name: str
    repo: str
    commit: str
    cache_name: str
    data_env: str
    url_env: str
    marks: str
    layout: str
    subfolder: str | None = None

    @property
    def url(self) -> str:
        return f"{self.repo}/archive/{self.commit}.tar.gz"

    @property
    def manifest_name(self) -> str:
        return f"{self.cache_name}-{self.commit[:8]}.sha256"


BCCD = PinnedSource(
    "BCCD", "https://github.com/Shenggan/BCCD_Dataset",
    "d272fb14cdff6e473fafeeeba32aba5f560e9e43", "bccd", "MEDAIDET_DATA", "MEDAIDET_BCCD_URL",
    "Annotations", subfolder="BCCD", layout=(
        "the BCCD/ folder of that repository at that commit, plus LICENSE and test.csv from "
        "its top level, laid out as\n"
        "  ROOT/Annotations/BloodImage_00000.xml ...   (364 files)\n"
        "  ROOT/JPEGImages/BloodImage_00000.jpg ...    (364 files)\n"
        "  ROOT/ImageSets/Main/{train,val,trainval,test}.txt\n"
        "  ROOT/LICENSE, ROOT/test.csv"))

TXL_PBC = PinnedSource(
    "TXL-PBC", "https://github.com/lugan113/TXL-PBC_Dataset",
    "056d09e45403f4d1321b99cdb2cfcc3eb605edcf", "txl-pbc", "MEDAIDET_TXL_PBC",
    "MEDAIDET_TXL_PBC_URL", "TXL_PBC", layout=(
        "the repository at that commit without its code, laid out as\n"
        "  ROOT/TXL_PBC/images/{train,val,test}/<uuid>.jpg   (1,440 files)\n"
        "  ROOT/TXL_PBC/labels/{train,val,test}/<uuid>.txt   (1,440 files; and classes.txt)\n"
        "  ROOT/TXL_PBC/labels/classes.txt, ROOT/TXL_PBC/data.yaml, ROOT/TXL_PBC/README.md\n"
        "  ROOT/LICENSE.txt, ROOT/README.md"))

SOURCES = {"bccd": BCCD, "txl-pbc": TXL_PBC}
MARKER_NAME = ".medaidet-verified"


class Problem(NamedTuple):
    """One file that does not match the manifest."""
    path: str              # relative to the dataset root, e.g. "JPEGImages/BloodImage_00000.jpg"
    kind: str              # "missing" | "mismatch"
    expected: str          # sha256 from the manifest
    actual: str | None     # sha256 found, None when missing


def _manifest_bytes(source: PinnedSource = BCCD) -> bytes:
    return (importlib.resources.files("medaidet.data") / "manifests"
            / source.manifest_name).read_bytes()


@functools.lru_cache(maxsize=None)
def manifest_entries(source: PinnedSource = BCCD) -> tuple[tuple[str, str], ...]:
    """``(relative path, sha256)`` of every file of ``source``, in the manifest's order."""
    entries = []
    for number, line in enumerate(_manifest_bytes(source).decode("utf-8").splitlines(), 1):
        if line.strip() and not line.startswith("#"):
            if not (match := re.fullmatch(r"([0-9a-f]{64}) [ *](\S.*)", line)):
                raise MedaidetError(f"manifest {source.manifest_name} line {number} is "
                                    f"malformed: {line!r}")
            entries.append((match.group(2), match.group(1)))
    return tuple(entries)


def load_manifest(source: PinnedSource = BCCD) -> dict[str, str]:
    """``{relative path: sha256}`` of every file of ``source`` at its pinned commit."""
    return dict(manifest_entries(source))


@functools.lru_cache(maxsize=None)
def manifest_sha256(source: PinnedSource = BCCD) -> str:
    """sha256 of the manifest itself: the content of the marker file."""
    return hashlib.sha256(_manifest_bytes(source)).hexdigest()


def verify_dataset(root, source: PinnedSource = BCCD) -> list[Problem]:
    """Re-hash every manifest file under ``root`` (others are ignored); ``[]`` when all match."""
    problems = []
    for rel, expected in manifest_entries(source):
        path = Path(root) / rel
        if (actual := sha256_file(path) if path.is_file() else None) != expected:
            problems.append(Problem(rel, "mismatch" if actual else "missing", expected, actual))
    return problems


def is_verified(root, source: PinnedSource = BCCD) -> bool:
    """Whether ``root`` carries our marker for the current manifest (no re-hashing)."""
    try:
        first = Path(root, MARKER_NAME).read_text(encoding="utf-8").split("\n", 1)[0].strip()
    except (OSError, UnicodeDecodeError):
        return False
    return first == manifest_sha256(source) and Path(root, source.marks).is_dir()


def summarize_problems(problems: list[Problem], limit: int = 5) -> str:
    """The problems of :func:`verify_dataset` in one phrase for a message."""
    parts = []
    for kind, text in (("mismatch", "with a wrong sha256"), ("missing", "missing")):
        if names := [p.path for p in problems if p.kind == kind]:
            shown = ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
            parts.append(f"{len(names)} {text} ({shown})")
    return "; ".join(parts)


def default_root(source: PinnedSource = BCCD) -> Path:
    """``<cache>/bccd`` (``<cache>/txl-pbc``...), the cache being ``$MEDAIDET_CACHE``,
    else ``$XDG_CACHE_HOME/medaidet``, else ``~/.cache/medaidet``."""
    return default_cache_dir() / source.cache_name


def choose_root(root, source: PinnedSource = BCCD) -> tuple[Path, str]:
    """The dataset root asked for, and how it was chosen (for messages); not checked."""
    if root is not None:
        return checked_path(root, "root", "a dataset folder").expanduser(), "given explicitly"
    if env := os.environ.get(source.data_env):
        return Path(env).expanduser(), f"from ${source.data_env}"
    return default_root(source), f"the default cache directory; ${source.data_env} is not set"


def cli_flag(source: PinnedSource) -> str:
    """The ``medaidet data download`` option that picks ``source`` (none for BCCD)."""
    return "" if source is BCCD else f" --dataset {source.cache_name}"


def resolve_root(root=None, source: PinnedSource = BCCD) -> Path:
    """The dataset root (never downloads); a ``"not_found"`` DataError with instructions when
    it has no ``source.marks`` folder."""
    path, how = choose_root(root, source)
    if not (path / source.marks).is_dir():
        state = "does not exist" if not path.exists() else f"has no {source.marks}/ folder"
        command = f"medaidet data download{cli_flag(source)}"
        raise DataError(
            f"{source.name} not found: {path} ({how}) {state}.\nRun `{command} [--root DIR]` "
            f"(Python: medaidet.data.download.download_{source.cache_name.replace('-', '_')}()) "
            f"to fetch {source.repo} "
            f"at commit {source.commit}, verified, into {default_root(source)} or the --root; or "
            f"place by hand {source.layout}\nand set {source.data_env}=ROOT (`{command} --root "
            "ROOT` then verifies it offline).", "not_found")
    return path.resolve()


# -------------------------------------------------------------------------------------- extraction
_CHUNK = 1 << 20
# Limits far above the real data (the largest file is ~200 kB; BCCD ~11 MB, TXL-PBC ~44 MB).
MAX_MEMBER_BYTES = 64 << 20
MAX_EXTRACTED_BYTES = 512 << 20


def _manifest_path(name: str, manifest: dict[str, str], subfolder: str | None) -> str | None:
    """Upstream member name -> manifest path, or None: ``<top>/<path>`` -> ``<path>``; with
    ``subfolder`` (BCCD's ``BCCD``), ``<top>/<subfolder>/<sub>/<file>`` -> ``<sub>/<file>``."""
    parts = [p for p in name.split("/") if p not in ("", ".")][1:]   # without the top folder
    if parts[:1] == [subfolder] and len(parts) > 2:
        parts = parts[1:]
    return rel if (rel := "/".join(parts)) in manifest else None


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
                if reason := _refusal(member, rel, staging, total):
                    raise DataError(f"unsafe member {member.name!r} in the archive from {url}: "
                                    f"{reason}; nothing was installed (not the pinned "
                                    f"{source.name} archive)", "unsafe_archive", member=member.name)
                if rel is not None:
                    tar.extract(member.replace(name=rel, deep=False), staging, filter="data")
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        what, fix = identify(archive, source)
        raise DataError(f"the file downloaded from {url} is not a complete tar archive: it {what} "
                        f"({type(exc).__name__}: {exc}). {fix}; expected a .tar.gz like "
                        f"{source.url}. Nothing was installed.", "archive") from None


_CUT_SHORT = "The download was probably cut short: run the download again"


def identify(path: Path, source: PinnedSource = BCCD) -> tuple[str, str]:
    """What a file that is not a readable tar archive really is, from its content:
    ``(what it is, what to do)``, each a phrase for the error message."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(4096)
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    check_url = f"Check the URL (from url= or ${source.url_env}): not the {source.name} archive"
    if size == 0:
        return "is empty (0 bytes)", "The server sent nothing: run the download again"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return (f"is a ZIP archive ({size} bytes)", "Use the .tar.gz archive of the same commit "
                "(.../archive/<commit>.tar.gz, not .../archive/<commit>.zip)")
    if text.startswith((b"<!doctype html", b"<html")) or b"<html" in text[:1024]:
        title = re.search(rb"<title[^>]*>([^<]{1,80})", head, re.IGNORECASE)
        named = f" titled {title.group(1).decode('utf-8', 'replace').strip()!r}" if title else ""
        return (f"is an HTML page{named} ({size} bytes)", "The server sent a web page (an "
                f"error, login or proxy page): check the URL (from url= or ${source.url_env}) "
                "and your proxy settings")
    if head.startswith(b"\x1f\x8b"):
        try:
            with gzip.open(path, "rb") as fh:
                while fh.tell() <= MAX_EXTRACTED_BYTES and fh.read(_CHUNK):
                    pass
        except (EOFError, OSError, zlib.error):
            return f"is gzip data cut short ({size} bytes)", _CUT_SHORT
        return f"is gzip data, complete, but not a tar archive ({size} bytes)", check_url
    if head.startswith((b"BZh", b"\xfd7zXZ\x00")) or head[257:262] == b"ustar":
        return f"is a compressed or tar archive cut short ({size} bytes)", _CUT_SHORT
    return f"is not an archive ({size} bytes, starting {head[:24]!r})", check_url


# ------------------------------------------------------------------------------------ the download
URL_SCHEMES = ("https", "http", "file")
TIMEOUT_S = 60.0
MAX_DOWNLOAD_BYTES = 1 << 30


def _check_url(url: str, source: PinnedSource = BCCD) -> None:
    """Raise a ``"url"`` DataError unless ``url`` is https://, http:// or file:// (urllib
    would fail on a plain path with a bare ValueError, and would try FTP)."""
    parts = urllib.parse.urlsplit(url)
    if (scheme := parts.scheme.lower()) == "file" or scheme in URL_SCHEMES and parts.netloc:
        return
    what = ("it has no scheme (a plain path?)" if not scheme or PureWindowsPath(url).drive else
            "it names no host" if scheme in URL_SCHEMES else
            f"its scheme {scheme}:// is not supported")
    local = Path(url).expanduser()
    how = (f"pass {local.resolve().as_uri()}" if local.is_file() else
           f"for a local archive pass its file:// URL, e.g. file:///path/to/{source.name}.tar.gz")
    raise DataError(f"cannot download {source.name} from {url!r}: {what}. Use an https://, "
                    f"http:// or file:// URL: {how} (as url=, or in ${source.url_env}); the "
                    f"default is {source.url}", "url")


def _fetch(source: PinnedSource, url: str, target: Path, root: Path, how: str | None,
           timeout: float, progress: bool) -> None:
    """Stream ``url`` into ``target``; else a ``"download"`` DataError saying how to place the
    data by hand (``how``: how ``root``, not there yet, was chosen; None when it exists)."""
    agent = f"medaidet/{__version__} ({source.name} download; +{source.repo})"
    try:
        with open(target, "wb") as out:
            stream_url(url, out, timeout=timeout, user_agent=agent, progress=progress,
                       desc=f"{source.name} download", max_bytes=MAX_DOWNLOAD_BYTES)
    except DataError as exc:             # stream_url's: a "download" error
        missing = "" if how is None else f"{source.name} is not at {root} ({how}), and "
        override = ("" if url == source.url else
                    f" (the URL came from url= or ${source.url_env}; the default is {source.url})")
        hint = " Offline, or behind a proxy (https_proxy, no_proxy)?" if exc.offline else ""
        raise DataError(
            f"{missing}could not download {source.name} from {url}{override}: {exc}.{hint}\n"
            f"By hand: download {source.url} where there is network, then run `{source.url_env}"
            f"=file:///path/to/archive.tar.gz medaidet data download{cli_flag(source)} --root "
            f"{root}`, or extract it keeping {source.layout}\nand pass that folder as --root or "
            f"${source.data_env} (it is then verified in place).", "download") from None


def _looks_like_dataset(root: Path, source: PinnedSource) -> bool:
    """Whether ``root`` holds a folder of ``source``'s (every dataset's copy has a marker)."""
    names = {rel.split("/")[0] for rel, _ in manifest_entries(source) if "/" in rel}
    return any((root / name).exists() for name in names | {source.marks})


def _install(source: PinnedSource, staging: Path, root: Path) -> None:
    """Put the verified files of ``staging`` in ``root``, the marker last (module docstring)."""
    if not root.exists():
        try:
            os.replace(staging, root)
            return
        except OSError:
            if is_verified(root, source):
                return      # another process installed a verified copy first
            # something appeared there meanwhile: install file by file
    current = root / MARKER_NAME
    try:
        current.unlink(missing_ok=True)
        for rel in [rel for rel, _ in manifest_entries(source)] + [MARKER_NAME]:
            current = root / rel
            current.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / rel, current)
    except OSError as exc:
        raise DataError(f"cannot install {current} ({exc}); {root} is left unverified (other "
                        "files untouched): make that path writable (or move what is in its way) "
                        "and run the download again with --force.", "destination") from None


def _usable_copy(source: PinnedSource, root: Path, force: bool) -> bool:
    """Whether ``root`` holds a verified copy to use as is (a matching copy placed by hand is
    marked now); a ``"destination"`` DataError when ``root`` cannot take a download."""
    if not root.exists():
        return False
    if not root.is_dir():
        raise DataError(f"{root} is not a folder; choose another --root.", "destination")
    if other := [s.name for s in SOURCES.values()
                 if s is not source and _looks_like_dataset(root, s)]:
        raise DataError(f"{root} holds {other[0]}, and a dataset root holds one dataset: choose "
                        f"another --root for {source.name}.", "destination")
    if force and any(root.iterdir()) and not _looks_like_dataset(root, source):
        raise DataError(f"refusing to replace {root}: it is not empty and has no "
                        f"{source.marks}/ of {source.name}. Choose a new or empty --root.",
                        "destination")
    if force or not any(root.iterdir()):
        return False          # download (--force replaces only the files of this dataset)
    if is_verified(root, source):
        return True
    if problems := verify_dataset(root, source):
        raise DataError(f"{root} exists and is not a verified {source.name} copy "
                        f"({summarize_problems(problems)}). Pass --force (force=True) to replace "
                        f"its {source.name} files (others stay), or choose another --root.",
                        "destination")
    _write_marker(source, root, "verified in place")
    return True


def download_bccd(root=None, url=None, force=False, progress=True, timeout=TIMEOUT_S) -> Path:
    """BCCD at its pinned commit: :func:`download` of :data:`BCCD`."""
    return download(BCCD, root, url, force, progress, timeout)


def download_txl_pbc(root=None, url=None, force=False, progress=True,
                     timeout=TIMEOUT_S) -> Path:
    """TXL-PBC at its pinned commit: :func:`download` of :data:`TXL_PBC`."""
    return download(TXL_PBC, root, url, force, progress, timeout)


def download(source: PinnedSource, root=None, url=None, force=False, progress=True,
             timeout=TIMEOUT_S) -> Path:
    """Fetch ``source`` at its pinned commit, verify every file, return the dataset root.
    ``url``: default ``$MEDAIDET_BCCD_URL`` (``source.url_env``), else ``source.url``. A copy
    that verifies is used without the network unless ``force`` (which replaces only its files)."""
    root, how = choose_root(root, source)
    root = root.resolve()
    url = url or os.environ.get(source.url_env) or source.url
    _check_url(url, source)
    manifest = load_manifest(source)
    if _usable_copy(source, root, force):
        return root
    try:        # staged beside root, so that the install is a rename
        root.parent.mkdir(parents=True, exist_ok=True)
        temporary = tempfile.TemporaryDirectory(".partial", f".{root.name}.", root.parent,
                                                ignore_cleanup_errors=True)
    except OSError as exc:
        raise DataError(f"cannot write beside {root}: {exc}. Choose another --root "
                        f"or set ${source.data_env}.", "destination") from None
    with temporary as work:
        archive, staging = Path(work, "archive.download"), Path(work, root.name)
        staging.mkdir()        # with the user's umask: it becomes the dataset's folder
        _fetch(source, url, archive, root, None if root.exists() else how, timeout, progress)
        extract(source, archive, staging, manifest, url)
        archive.unlink()
        if problems := verify_dataset(staging, source):
            raise DataError(f"{len(problems)} of {len(manifest)} files from {url} do not match "
                            f"{source.manifest_name} ({source.name} at {source.commit}): "
                            f"{summarize_problems(problems)}; nothing was installed (another "
                            "archive, or corrupted on the way)", "checksum", problems=problems)
        _write_marker(source, staging, f"downloaded from {url}")  # last, before the install
        _install(source, staging, root)
    ours = set(load_manifest(source)) | {MARKER_NAME}    # a forced download leaves other files
    if kept := sorted(rel for rel in (p.relative_to(root).as_posix() for p in root.rglob("*")
                                      if p.is_file()) if rel not in ours):
        logger.info("%s: replaced the files of %s; left %d file(s) that are not part of %s "
                    "where they were: %s", root, source.name, len(kept), source.name,
                    ", ".join(kept[:10]) + (", ..." if len(kept) > 10 else ""))
    return root


def _write_marker(source: PinnedSource, root: Path, how: str) -> None:
    if root.stat().st_mode & 0o222:  # a copy made read-only on purpose is not written to
        with contextlib.suppress(OSError):  # else it stays usable, re-hashed next time
            (root / MARKER_NAME).write_text(f"{manifest_sha256(source)}\n# every file of "
                                            f"{source.manifest_name} verified; {how}\n",
                                            encoding="utf-8")
