"""Fetch a dataset at its pinned upstream commit, verify every file, resolve its root.

A :class:`PinnedSource` names what is fetched: a repository, a commit and the sha256
manifest of the files kept, shipped in this package. Two are defined: :data:`BCCD`
(``manifests/bccd-d272fb14.sha256``) and :data:`TXL_PBC`, a re-annotation of BCCD's
smears and of three other sources (``manifests/txl-pbc-056d09e4.sha256``). The download is
GitHub's archive of the pinned commit. GitHub builds these archives on the fly, so their
own bytes are not stable: instead of checking the archive, every extracted file is
checked against the manifest.

Safety rules of :func:`download` (:func:`download_bccd`, :func:`download_txl_pbc`):

* members with absolute names or ``..`` components, links and special files
  are refused (an ``"unsafe_archive"`` DataError), and only regular files named in
  the manifest are written, with size limits;
* the URL must be ``https://``, ``http://`` or ``file://``
  (a ``"url"`` DataError otherwise, before anything is written);
* everything is staged under temporary names beside the destination and
  verified before anything is installed. A new dataset appears with one
  directory rename, the marker file ``.medaidet-verified`` already inside.
  Into an existing folder (``force``), each file of the manifest is renamed
  over its old copy and nothing else is touched: files the user added stay
  where they are. The marker is removed first and put back last, so an
  interrupted install is never taken for a verified copy;
* temporary files are removed on any failure, and the leftovers of a
  download that was killed (``.<name>.partial-*`` folders,
  ``.<name>.*.download`` files beside the destination) are removed by the
  next one (:func:`sweep_leftovers`); nothing else is ever deleted;
* nothing is ever downloaded implicitly: :func:`resolve_root` only looks.

Root resolution (both functions): explicit argument > the source's variable
(``$MEDAIDET_DATA`` for BCCD, ``$MEDAIDET_TXL_PBC`` for TXL-PBC) > the default cache
directory ``<cache>/bccd`` or ``<cache>/txl-pbc``, where ``<cache>`` is
``$MEDAIDET_CACHE``, else ``$XDG_CACHE_HOME/medaidet``, else ``~/.cache/medaidet``.
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.resources
import logging
import os
import re
import secrets
import shutil
import socket
import tarfile
import time
import urllib.parse
import zlib
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath
from typing import NamedTuple

from medaidet import __version__
from medaidet.checksums import sha256_file
from medaidet.downloads import stream_url
from medaidet.errors import DataError
from medaidet.errors import MedaidetError
from medaidet.files import default_cache_dir

__all__ = [
    "PinnedSource", "BCCD", "TXL_PBC", "SOURCES", "MARKER_NAME", "download", "download_bccd",
    "download_txl_pbc", "resolve_root", "default_root", "verify_dataset", "is_verified",
    "load_manifest", "manifest_sha256", "sweep_leftovers", "Problem", "URL_SCHEMES",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PinnedSource:
    """A dataset as a repository at one commit, the files kept from it and their sha256.

    Upstream member ``<top>/<path>`` is kept as ``<path>`` when the manifest lists it;
    with ``subfolder``, ``<top>/<subfolder>/<dir>/<file>`` is kept as ``<dir>/<file>``
    (BCCD's VOC folders sit in ``BCCD/``). ``marks``: the folder every copy has (what
    :func:`resolve_root` looks for). ``layout``: how to place the files by hand.
    """

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
#: The URL schemes :func:`download_bccd` accepts.
URL_SCHEMES = ("https", "http", "file")
#: Temporary files of another machine's download are removed once untouched this long.
STALE_AFTER_S = 24 * 3600

TIMEOUT_S = 60.0
# Limits far above the real data (the largest file is ~200 kB; BCCD ~11 MB, TXL-PBC ~44 MB).
MAX_DOWNLOAD_BYTES = 1 << 30
MAX_MEMBER_BYTES = 64 << 20
MAX_EXTRACTED_BYTES = 512 << 20
_CHUNK = 1 << 20


# --------------------------------------------------------------------------- errors

# --------------------------------------------------------------------------- manifest

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
def _manifest(source: PinnedSource = BCCD) -> tuple[tuple[str, str], ...]:
    entries = []
    for number, line in enumerate(_manifest_bytes(source).decode("utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([0-9a-f]{64}) [ *](\S.*)", line)
        if not match:
            raise MedaidetError(f"manifest {source.manifest_name} line {number} is "
                                f"malformed: {line!r}")
        entries.append((match.group(2), match.group(1)))
    return tuple(entries)


def load_manifest(source: PinnedSource = BCCD) -> dict[str, str]:
    """``{relative path: sha256}`` of every file of ``source`` at its pinned commit."""
    return dict(_manifest(source))


@functools.lru_cache(maxsize=None)
def manifest_sha256(source: PinnedSource = BCCD) -> str:
    """sha256 of the manifest itself: the content of the marker file."""
    return hashlib.sha256(_manifest_bytes(source)).hexdigest()


def verify_dataset(root, source: PinnedSource = BCCD) -> list[Problem]:
    """Re-hash every manifest file under ``root``; ``[]`` when all match.

    Files not in the manifest are ignored. Takes well under a second for BCCD.
    """
    root = Path(root)
    problems = []
    for rel, expected in _manifest(source):
        path = root / rel
        if not path.is_file():
            problems.append(Problem(rel, "missing", expected, None))
            continue
        actual = sha256_file(path)
        if actual != expected:
            problems.append(Problem(rel, "mismatch", expected, actual))
    return problems


def is_verified(root, source: PinnedSource = BCCD) -> bool:
    """Whether ``root`` carries our marker for the current manifest (no re-hashing)."""
    root = Path(root)
    try:
        first = (root / MARKER_NAME).read_text(encoding="utf-8").split("\n", 1)[0].strip()
    except (OSError, UnicodeDecodeError):
        return False
    return first == manifest_sha256(source) and (root / source.marks).is_dir()


def _summarize(problems: list[Problem], limit: int = 5) -> str:
    parts = []
    for kind, text in (("mismatch", "with a wrong sha256"), ("missing", "missing")):
        names = [p.path for p in problems if p.kind == kind]
        if names:
            shown = ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
            parts.append(f"{len(names)} {text} ({shown})")
    return "; ".join(parts)


# --------------------------------------------------------------------------- roots

def default_root(source: PinnedSource = BCCD) -> Path:
    """``<cache>/bccd`` (``<cache>/txl-pbc``...), the cache being ``$MEDAIDET_CACHE``,
    else ``$XDG_CACHE_HOME/medaidet``, else ``~/.cache/medaidet``."""
    return default_cache_dir() / source.cache_name


def _choose_root(root, source: PinnedSource = BCCD) -> tuple[Path, str]:
    if root is not None:
        return Path(os.fspath(root)).expanduser(), "given explicitly"
    env = os.environ.get(source.data_env)
    if env:
        return Path(env).expanduser(), f"from ${source.data_env}"
    return default_root(source), f"the default cache directory; ${source.data_env} is not set"


def _cli_flag(source: PinnedSource) -> str:
    return "" if source is BCCD else f" --dataset {source.cache_name}"


def _layout_help(source: PinnedSource = BCCD) -> str:
    function = f"download_{source.cache_name.replace('-', '_')}"
    return (
        f"Get it with `medaidet data download{_cli_flag(source)} [--root DIR]` (Python: "
        f"medaidet.data.download.{function}()), which fetches "
        f"{source.repo} at commit {source.commit}, verifies every file and stores it at "
        f"{default_root(source)} unless --root or ${source.data_env} says otherwise.\n"
        f"Or place the files by hand, keeping {source.layout}\n"
        f"and set {source.data_env}=ROOT (or pass ROOT explicitly); "
        f"`medaidet data download{_cli_flag(source)} --root ROOT` then verifies it without "
        "the network."
    )


def resolve_root(root=None, source: PinnedSource = BCCD) -> Path:
    """The dataset root: ``root`` > ``$MEDAIDET_DATA`` (``source.data_env``) > the default
    cache directory.

    Only looks (never downloads); raises a ``"not_found"`` DataError with
    instructions when the chosen folder has no ``Annotations/`` (``source.marks``).
    """
    path, how = _choose_root(root, source)
    if not (path / source.marks).is_dir():
        state = "does not exist" if not path.exists() else f"has no {source.marks}/ folder"
        raise DataError(f"{source.name} not found: {path} ({how}) {state}.\n"
                        f"{_layout_help(source)}", "not_found")
    return path.resolve()


# --------------------------------------------------------------------------- download

def _by_hand(source: PinnedSource, dest: Path) -> str:
    return (
        "To place the data by hand: on a machine with network access download\n"
        f"  {source.url}\n"
        f"(the archive of {source.repo} at commit {source.commit}), then either\n"
        f"  - copy it here and run `{source.url_env}=file:///path/to/archive.tar.gz medaidet "
        f"data download{_cli_flag(source)} --root {dest}` (extracts and verifies every "
        "file), or\n"
        f"  - extract it and keep {source.layout}\n"
        f"then point {source.data_env} at that folder, or pass it as --root (it is then "
        "verified in place)."
    )


def _download_error(source: PinnedSource, url: str, dest: Path, reason: str,
                    offline_hint: bool) -> DataError:
    hint = (" Are you offline, or behind a proxy (urllib honors https_proxy/no_proxy)?"
            if offline_hint else "")
    override = ("" if url == source.url else
                f" (the URL came from url= or ${source.url_env}; the default is {source.url})")
    return DataError(f"could not download {source.name} from {url}{override}: "
                     f"{reason}.{hint}\n{_by_hand(source, dest)}", "download")


def _check_url(url: str, source: PinnedSource = BCCD) -> None:
    """Raise a ``"url"`` DataError unless ``url`` is https://, http:// or file://.

    urllib would take a plain path for a relative URL and fail with a bare ValueError,
    and would try FTP; a path of an archive on this machine is answered with its file://
    URL.
    """
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file" or scheme in URL_SCHEMES and parts.netloc:
        return
    if not scheme or PureWindowsPath(url).drive:
        what = "it has no scheme (a plain path?)"
    elif scheme in URL_SCHEMES:
        what = "it names no host"
    else:
        what = f"its scheme {scheme}:// is not supported"
    local = Path(url).expanduser()
    if local.is_file():
        how = f"{local} is a file here: pass {local.resolve().as_uri()}"
    else:
        how = ("for an archive on this machine pass its file:// URL, e.g. "
               f"file:///path/to/{source.name}.tar.gz")
    raise DataError(
        f"cannot download {source.name} from {url!r}: {what}. Accepted URLs start with "
        f"https://, http:// or file://; {how} (as url=, or in ${source.url_env}). The default "
        f"is {source.url}.", "url")


def _fetch(source: PinnedSource, url: str, target: Path, dest: Path, timeout: float,
           progress: bool) -> int:
    """Stream ``url`` into ``target``; returns the number of bytes."""
    agent = f"medaidet/{__version__} ({source.name} download; +{source.repo})"
    try:
        with open(target, "wb") as out:
            received, _ = stream_url(url, out, timeout=timeout, user_agent=agent,
                                     desc=f"{source.name} download", progress=progress,
                                     max_bytes=MAX_DOWNLOAD_BYTES)
    except DataError as exc:             # stream_url's: a "download" error
        raise _download_error(source, url, dest, str(exc), offline_hint=exc.offline) from None
    return received


def _unsafe_reason(member: tarfile.TarInfo) -> str | None:
    name = member.name
    if not name or "\x00" in name:
        return "it has an empty or invalid name"
    if name.startswith(("/", "\\")) or PureWindowsPath(name).drive:
        return "it has an absolute path"
    if ".." in re.split(r"[/\\]", name):
        return "its path has a '..' component"
    if member.issym():
        return f"it is a symbolic link (to {member.linkname!r})"
    if member.islnk():
        return f"it is a hard link (to {member.linkname!r})"
    if not (member.isreg() or member.isdir()):
        return "it is a device, FIFO or other special file"
    return None


def _map_member(name: str, manifest: dict[str, str], subfolder: str | None) -> str | None:
    """Upstream member name -> manifest path, or None when we do not keep it.

    ``<top>/<path>`` -> ``<path>``; with ``subfolder`` (BCCD's ``BCCD``),
    ``<top>/<subfolder>/<sub>/<file>`` -> ``<sub>/<file>``.
    """
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if len(parts) < 2:
        return None
    parts = parts[1:]  # the top folder, e.g. BCCD_Dataset-<commit>
    if subfolder is not None and parts[0] == subfolder and len(parts) > 2:
        parts = parts[1:]
    rel = "/".join(parts)
    return rel if rel in manifest else None


def _extract(source: PinnedSource, archive: Path, staging: Path, manifest: dict[str, str],
             url: str) -> None:
    seen: set[str] = set()
    extracted = 0
    try:
        with open(archive, "rb") as raw, tarfile.open(fileobj=raw, mode="r|*") as tar:
            for member in tar:
                reason = _unsafe_reason(member)
                if reason:
                    raise DataError(
                        f"unsafe member {member.name!r} in the archive from {url}: {reason}. "
                        f"Nothing was installed; this is not the pinned {source.name} "
                        "archive.", "unsafe_archive",
                        member=member.name)
                if member.isdir():
                    continue
                rel = _map_member(member.name, manifest, source.subfolder)
                if rel is None:
                    continue
                if rel in seen:
                    raise DataError(
                        f"member {member.name!r} appears twice in the archive from {url}. "
                        "Nothing was installed.", "unsafe_archive", member=member.name)
                if member.size > MAX_MEMBER_BYTES or extracted + member.size > MAX_EXTRACTED_BYTES:
                    raise DataError(
                        f"member {member.name!r} in the archive from {url} is too large "
                        f"({member.size} bytes). Nothing was installed.",
                        "unsafe_archive", member=member.name)
                seen.add(rel)
                extracted += member.size
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "xb") as out:
                    shutil.copyfileobj(tar.extractfile(member), out, _CHUNK)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        what, fix = _identify(archive, source)
        raise DataError(
            f"the file downloaded from {url} is not a complete tar archive: it {what} "
            f"(tarfile: {type(exc).__name__}: {exc}). {fix}; expected a .tar.gz archive "
            f"like {source.url}. Nothing was installed.", "archive") from None


_CUT_SHORT = "The download was probably cut short: run the download again"


def _identify(path: Path, source: PinnedSource = BCCD) -> tuple[str, str]:
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


def _looks_like_dataset(root: Path, source: PinnedSource) -> bool:
    names = {MARKER_NAME, source.marks} | {rel.split("/")[0] for rel, _ in _manifest(source)
                                           if "/" in rel}
    return any((root / name).exists() for name in names)


# --------------------------------------------------------------------------- temporary files
#
# Beside the dataset root ROOT, a download writes ``.ROOT.<tag>.download`` (the archive)
# and ``.ROOT.partial-<tag>/`` (the files being extracted and verified), with
# ``<tag> = <host>-<pid>-<8 hex digits>``: a later run can tell whether the process that
# made them still runs.

def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "", socket.gethostname()) or "host"


def _temp_paths(root: Path) -> tuple[Path, Path]:
    """(archive file, staging folder) of this run, beside ``root``."""
    tag = f"{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
    return (root.parent / f".{root.name}.{tag}.download",
            root.parent / f".{root.name}.partial-{tag}")


_TAG = re.compile(r"(?P<host>[A-Za-z0-9.]+)-(?P<pid>[0-9]+)-[0-9a-f]{8}")


def _process_alive(pid: int) -> bool:
    if os.name == "nt":            # os.kill(pid, 0) would send CTRL_C_EVENT there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                # e.g. PermissionError: it exists, another user's
        return True
    return True


def _is_leftover(path: Path, root_name: str, started: float) -> bool:
    """Whether ``path`` is a temporary file of a download of ``root_name`` that can no
    longer finish: its process (on this machine) is gone, or it is untouched for
    :data:`STALE_AFTER_S`. Names we do not make are never leftovers."""
    name, prefix = path.name, f".{root_name}."
    if not name.startswith(prefix):
        return False
    rest = name[len(prefix):]
    if rest.startswith("partial-"):
        tag = rest[len("partial-"):]
    elif rest.endswith(".download"):
        tag = rest[:-len(".download")]
    else:
        return False
    match = _TAG.fullmatch(tag)
    if not match:
        return False
    try:
        age = started - path.lstat().st_mtime
    except OSError:
        return False
    if match["host"] == _host() and not _process_alive(int(match["pid"])):
        return True
    return age > STALE_AFTER_S


def sweep_leftovers(root) -> list[str]:
    """Remove what killed downloads of ``root`` left beside it; returns the names removed.

    Only our own temporary names (see the module docstring) are considered, and only
    those whose process is gone or that are untouched for a day (a download running
    elsewhere keeps its files). Called at the start of every :func:`download_bccd`.
    """
    root = Path(root)
    started = time.time()
    try:
        entries = list(root.parent.iterdir())
    except OSError:
        return []
    removed = []
    for path in sorted(entries):
        if not _is_leftover(path, root.name, started):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        if not os.path.lexists(path):
            removed.append(path.name)
    if removed:
        logger.info("removed %d leftover(s) of interrupted downloads beside %s: %s",
                    len(removed), root, ", ".join(removed))
    return removed


def _install(source: PinnedSource, staging: Path, root: Path) -> None:
    """Put the verified files of ``staging`` (the manifest's and the marker) in ``root``.

    A new ``root`` is one rename of the folder. Into an existing one, each manifest file
    is renamed over its old copy and nothing else is touched: files the user added stay.
    The old marker is removed first and the new one renamed in last, so an install cut
    short is never taken for a verified copy (and :func:`verify_dataset` passes on it
    only once every file is in place).
    """
    if not root.exists():
        try:
            os.replace(staging, root)
            return
        except OSError:
            if is_verified(root, source):
                return      # another process installed a verified copy first
            # something appeared there meanwhile: install file by file, below
    current = root / MARKER_NAME
    try:
        current.unlink(missing_ok=True)
        for rel, _ in _manifest(source):
            current = root / rel
            current.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / rel, current)
        current = root / MARKER_NAME
        os.replace(staging / MARKER_NAME, current)
    except OSError as exc:
        raise DataError(
            f"cannot install {current} ({exc}); {root} is left unverified, with every file "
            f"that is not part of {source.name} where it was. Make that path writable (or move what "
            "is in its way) and run the download again with --force.", "destination") from None


def _files_not_ours(root: Path, source: PinnedSource) -> list[str]:
    """Files under ``root`` that are neither in the manifest nor the marker."""
    ours = set(load_manifest(source)) | {MARKER_NAME}
    return sorted(rel for rel in (p.relative_to(root).as_posix() for p in root.rglob("*")
                                  if p.is_file()) if rel not in ours)


def _temp_files(source: PinnedSource, root: Path) -> tuple[Path, Path]:
    """This run's archive file and staging folder beside ``root`` (:func:`_temp_paths`),
    created; a ``"destination"`` DataError, with nothing left behind, when they cannot be."""
    archive, staging = _temp_paths(root)
    made = []
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        archive.touch(exist_ok=False)
        made.append(archive)
        staging.mkdir()
    except OSError as exc:
        for path in made:
            path.unlink(missing_ok=True)
        raise DataError(f"cannot write beside {root}: {exc}. Choose another --root "
                        f"or set ${source.data_env}.", "destination") from None
    return archive, staging


def _usable_copy(source: PinnedSource, root: Path, force: bool) -> bool:
    """Whether ``root`` already holds a verified copy to use as it is (a copy placed by hand
    whose files all match is marked now); a ``"destination"`` DataError when ``root`` cannot
    take a download (not a folder, another copy without ``force``, foreign content)."""
    if not root.exists():
        return False
    if not root.is_dir():
        raise DataError(f"{root} exists and is not a folder; choose another --root.",
                        "destination")
    if not force:
        if is_verified(root, source):
            return True
        if any(root.iterdir()):
            problems = verify_dataset(root, source)
            if not problems:
                _write_marker(source, root, "verified in place")
                return True
            raise DataError(
                f"{root} exists and is not a verified {source.name} copy "
                f"({_summarize(problems)}). Pass --force (force=True) to replace the "
                f"files of {source.name} with a fresh download (files that are not part "
                f"of {source.name} are left where they are), or choose another --root.",
                "destination")
    elif any(root.iterdir()) and not _looks_like_dataset(root, source):
        raise DataError(
            f"refusing to replace {root}: it is not empty and does not look like a "
            f"{source.name} copy (no {source.marks}/ or marker). Choose a new or empty "
            "--root.", "destination")
    return False


def _log_kept(source: PinnedSource, root: Path) -> None:
    """Log the files of ``root`` a forced download left in place (not part of ``source``)."""
    kept = _files_not_ours(root, source)
    if kept:
        shown = ", ".join(kept[:10]) + (", ..." if len(kept) > 10 else "")
        logger.info("%s: replaced the files of %s; left %d file(s) that are not part of "
                    "%s where they were: %s", root, source.name, len(kept), source.name,
                    shown)


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

    ``root``: the dataset root to create (default: ``$MEDAIDET_DATA`` for BCCD,
    ``source.data_env`` in general, else :func:`default_root`). ``url``: the archive
    (default: ``$MEDAIDET_BCCD_URL`` (``source.url_env``), else ``source.url``;
    ``file://`` works for an archive fetched elsewhere).

    A root already verified is returned without network access unless
    ``force``. An existing folder without the marker whose files all match
    the manifest (placed by hand) is marked and returned, also without network.
    ``force`` replaces the manifest's files of an existing dataset and leaves
    every other file in it where it is (they are logged); it refuses a folder
    that does not look like a dataset. Raises a ``"url"`` DataError for
    a URL that is not https://, http:// or file://.
    """
    root, how = _choose_root(root, source)
    root = root.resolve()
    url = url or os.environ.get(source.url_env) or source.url
    _check_url(url, source)
    manifest = load_manifest(source)
    sweep_leftovers(root)
    if _usable_copy(source, root, force):
        return root
    archive = staging = None
    had_root = root.exists()   # else a failed download is said to have found no copy
    try:
        archive, staging = _temp_files(source, root)
        try:
            _fetch(source, url, archive, root, timeout, progress)
        except DataError as exc:         # "download", "url" or "archive"
            if had_root:
                raise
            raise DataError(f"{source.name} is not at {root} ({how}), and {exc}",
                            "download") from None
        _extract(source, archive, staging, manifest, url)
        archive.unlink()
        archive = None
        problems = verify_dataset(staging, source)
        if problems:
            raise DataError(
                f"{len(problems)} of {len(manifest)} files from {url} do not match the pinned "
                f"manifest {source.manifest_name} ({source.name} commit {source.commit}): "
                f"{_summarize(problems)}. The archive is not {source.name} at that commit or "
                "was corrupted on the way; nothing was installed.", "checksum", problems=problems)
        _write_marker(source, staging, f"downloaded from {url}")  # last, before the install
        existed = root.exists()
        _install(source, staging, root)
    finally:
        if archive is not None:
            archive.unlink(missing_ok=True)
        if staging is not None and staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    if existed:
        _log_kept(source, root)
    return root


def _write_marker(source: PinnedSource, root: Path, how: str) -> None:
    text = (f"{manifest_sha256(source)}\n# every file of {source.manifest_name} verified; "
            f"{how}\n")
    if not root.stat().st_mode & 0o222:
        return  # a copy made read-only on purpose is not written to, even by root
    try:
        (root / MARKER_NAME).write_text(text, encoding="utf-8")
    except OSError:
        pass  # a read-only copy verified in place stays usable; it is re-hashed next time
