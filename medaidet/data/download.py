"""Fetch BCCD at the pinned upstream commit, verify every file, resolve the data root.

The download is GitHub's archive of the pinned commit. GitHub builds these
archives on the fly, so their own bytes are not stable: instead of checking
the archive, every extracted file is checked against the sha256 manifest
shipped in this package (``manifests/bccd-d272fb14.sha256``).

Safety rules of :func:`download_bccd`:

* members with absolute names or ``..`` components, links and special files
  are refused (:class:`UnsafeArchiveError`), and only regular files named in
  the manifest are written, with size limits;
* everything is staged under temporary names beside the destination; the
  dataset appears with one directory rename, and only after every file
  verified, with the marker file ``.medaidet-verified`` already inside. A
  half-finished download never looks like a dataset, and temporary files are
  removed on any failure;
* nothing is ever downloaded implicitly: :func:`resolve_root` only looks.

Root resolution (both functions): explicit argument > ``$MEDAIDET_DATA`` >
the default cache directory ``<cache>/bccd``, where ``<cache>`` is
``$MEDAIDET_CACHE``, else ``$XDG_CACHE_HOME/medaidet``, else
``~/.cache/medaidet``.
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import http.client
import importlib.resources
import os
import re
import secrets
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from pathlib import Path, PureWindowsPath
from typing import NamedTuple

from medaidet.checksums import sha256_file
from medaidet.errors import MedaidetError

__all__ = [
    "BCCD_COMMIT", "DEFAULT_URL", "UPSTREAM_REPO", "MANIFEST_NAME", "MARKER_NAME",
    "download_bccd", "resolve_root", "default_root", "verify_dataset", "is_verified",
    "load_manifest", "manifest_sha256", "Problem",
    "DataNotFoundError", "DownloadError", "CorruptArchiveError", "UnsafeArchiveError",
    "ChecksumError", "DestinationError",
]

UPSTREAM_REPO = "https://github.com/Shenggan/BCCD_Dataset"
BCCD_COMMIT = "d272fb14cdff6e473fafeeeba32aba5f560e9e43"
DEFAULT_URL = f"{UPSTREAM_REPO}/archive/{BCCD_COMMIT}.tar.gz"

DATA_ENV = "MEDAIDET_DATA"
URL_ENV = "MEDAIDET_BCCD_URL"
MANIFEST_NAME = f"bccd-{BCCD_COMMIT[:8]}.sha256"
MARKER_NAME = ".medaidet-verified"

TIMEOUT_S = 60.0
# Limits far above the real data (the largest file is ~200 kB, all of BCCD ~11 MB).
MAX_DOWNLOAD_BYTES = 1 << 30
MAX_MEMBER_BYTES = 64 << 20
MAX_EXTRACTED_BYTES = 512 << 20
_CHUNK = 1 << 20


# --------------------------------------------------------------------------- errors

class DataNotFoundError(MedaidetError):
    """The dataset root has no ``Annotations/`` folder."""


class DownloadError(MedaidetError):
    """The archive could not be fetched (offline, HTTP error, connection dropped)."""


class CorruptArchiveError(DownloadError):
    """The fetched file is not a readable tar archive (truncated, or not an archive)."""


class UnsafeArchiveError(MedaidetError):
    """The archive holds a member that could write outside the destination."""

    def __init__(self, message: str, member: str):
        super().__init__(message)
        self.member = member


class ChecksumError(MedaidetError):
    """Extracted files are missing or differ from the pinned manifest."""

    def __init__(self, message: str, problems: list[Problem]):
        super().__init__(message)
        self.problems = problems


class DestinationError(MedaidetError):
    """The destination exists with other content, or cannot be written."""


# --------------------------------------------------------------------------- manifest

class Problem(NamedTuple):
    """One file that does not match the manifest."""
    path: str              # relative to the dataset root, e.g. "JPEGImages/BloodImage_00000.jpg"
    kind: str              # "missing" | "mismatch"
    expected: str          # sha256 from the manifest
    actual: str | None     # sha256 found, None when missing


def _manifest_bytes() -> bytes:
    return (importlib.resources.files("medaidet.data") / "manifests" / MANIFEST_NAME).read_bytes()


@functools.lru_cache(maxsize=1)
def _manifest() -> tuple[tuple[str, str], ...]:
    entries = []
    for number, line in enumerate(_manifest_bytes().decode("utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([0-9a-f]{64}) [ *](\S.*)", line)
        if not match:
            raise MedaidetError(f"manifest {MANIFEST_NAME} line {number} is malformed: {line!r}")
        entries.append((match.group(2), match.group(1)))
    return tuple(entries)


def load_manifest() -> dict[str, str]:
    """``{relative path: sha256}`` of every file of BCCD at the pinned commit."""
    return dict(_manifest())


@functools.lru_cache(maxsize=1)
def manifest_sha256() -> str:
    """sha256 of the manifest itself: the content of the marker file."""
    return hashlib.sha256(_manifest_bytes()).hexdigest()


def verify_dataset(root) -> list[Problem]:
    """Re-hash every manifest file under ``root``; ``[]`` when all match.

    Files not in the manifest are ignored. Takes well under a second for BCCD.
    """
    root = Path(root)
    problems = []
    for rel, expected in _manifest():
        path = root / rel
        if not path.is_file():
            problems.append(Problem(rel, "missing", expected, None))
            continue
        actual = sha256_file(path)
        if actual != expected:
            problems.append(Problem(rel, "mismatch", expected, actual))
    return problems


def is_verified(root) -> bool:
    """Whether ``root`` carries our marker for the current manifest (no re-hashing)."""
    root = Path(root)
    try:
        first = (root / MARKER_NAME).read_text(encoding="utf-8").split("\n", 1)[0].strip()
    except (OSError, UnicodeDecodeError):
        return False
    return first == manifest_sha256() and (root / "Annotations").is_dir()


def _summarize(problems: list[Problem], limit: int = 5) -> str:
    parts = []
    for kind, text in (("mismatch", "with a wrong sha256"), ("missing", "missing")):
        names = [p.path for p in problems if p.kind == kind]
        if names:
            shown = ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
            parts.append(f"{len(names)} {text} ({shown})")
    return "; ".join(parts)


# --------------------------------------------------------------------------- roots

def default_root() -> Path:
    """``<cache>/bccd``, the cache being ``$MEDAIDET_CACHE``, else
    ``$XDG_CACHE_HOME/medaidet``, else ``~/.cache/medaidet``."""
    from medaidet.stack.build import default_cache_dir
    return default_cache_dir() / "bccd"


def _choose_root(root) -> tuple[Path, str]:
    if root is not None:
        return Path(os.fspath(root)).expanduser(), "given explicitly"
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser(), f"from ${DATA_ENV}"
    return default_root(), "the default cache directory"


def _layout_help() -> str:
    return (
        "Get it with `medaidet data download [--dest DIR]` (Python: "
        "medaidet.data.download_bccd()), which fetches "
        f"{UPSTREAM_REPO} at commit {BCCD_COMMIT}, verifies every file and stores it at "
        f"{default_root()} unless --dest or ${DATA_ENV} says otherwise.\n"
        "Or place the files by hand, in this layout (the BCCD/ folder of that repository "
        "at that commit, plus LICENSE and test.csv from its top level):\n"
        "  ROOT/Annotations/BloodImage_00000.xml ...   (364 files)\n"
        "  ROOT/JPEGImages/BloodImage_00000.jpg ...    (364 files)\n"
        "  ROOT/ImageSets/Main/{train,val,trainval,test}.txt\n"
        "  ROOT/LICENSE, ROOT/test.csv\n"
        f"and set {DATA_ENV}=ROOT (or pass ROOT explicitly); "
        "`medaidet data download --dest ROOT` then verifies it without the network."
    )


def resolve_root(root=None) -> Path:
    """The dataset root: ``root`` > ``$MEDAIDET_DATA`` > the default cache directory.

    Only looks (never downloads); raises :class:`DataNotFoundError` with
    instructions when the chosen folder has no ``Annotations/``.
    """
    path, source = _choose_root(root)
    if not (path / "Annotations").is_dir():
        state = "does not exist" if not path.exists() else "has no Annotations/ folder"
        raise DataNotFoundError(f"BCCD not found: {path} ({source}) {state}.\n{_layout_help()}")
    return path.resolve()


# --------------------------------------------------------------------------- download

def _by_hand(url: str, dest: Path) -> str:
    return (
        "To place the data by hand: on a machine with network access download\n"
        f"  {DEFAULT_URL}\n"
        f"(the archive of {UPSTREAM_REPO} at commit {BCCD_COMMIT}), then either\n"
        f"  - copy it here and run `{URL_ENV}=file:///path/to/archive.tar.gz medaidet data "
        f"download --dest {dest}` (extracts and verifies every file), or\n"
        "  - extract it and use its BCCD/ folder (Annotations/, JPEGImages/, ImageSets/Main/) "
        "with LICENSE and test.csv from the top level copied beside them; point "
        f"{DATA_ENV} at that folder, or pass it as --dest (it is then verified in place)."
    )


def _download_error(url: str, dest: Path, reason: str, offline_hint: bool) -> DownloadError:
    hint = (" Are you offline, or behind a proxy (urllib honors https_proxy/no_proxy)?"
            if offline_hint else "")
    override = ("" if url == DEFAULT_URL
                else f" (the URL came from url= or ${URL_ENV}; the default is {DEFAULT_URL})")
    return DownloadError(f"could not download BCCD from {url}{override}: {reason}.{hint}\n"
                         f"{_by_hand(url, dest)}")


def _user_agent() -> str:
    from medaidet import __version__
    return f"medaidet/{__version__} (BCCD download; +{UPSTREAM_REPO})"


def _fetch(url: str, target: Path, dest: Path, timeout: float, progress: bool) -> int:
    """Stream ``url`` into ``target``; returns the number of bytes."""
    request = urllib.request.Request(url, headers={"User-Agent": _user_agent()})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        raise _download_error(url, dest, f"the server answered HTTP {exc.code} {exc.reason}",
                              offline_hint=False) from None
    except urllib.error.URLError as exc:
        raise _download_error(url, dest, f"{exc.reason}", offline_hint=True) from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise _download_error(url, dest, f"{type(exc).__name__}: {exc}",
                              offline_hint=True) from None

    from tqdm.auto import tqdm

    with response:
        length = response.headers.get("Content-Length")
        total = int(length) if length and length.strip().isdigit() else None
        if total is not None and total > MAX_DOWNLOAD_BYTES:
            raise _download_error(url, dest, f"it announces {total} bytes, more than the "
                                  f"{MAX_DOWNLOAD_BYTES} allowed", offline_hint=False)
        received = 0
        with open(target, "wb") as out, tqdm(total=total, unit="B", unit_scale=True,
                                             unit_divisor=1024, desc="BCCD download",
                                             disable=not progress, leave=False) as bar:
            while True:
                try:
                    chunk = response.read(_CHUNK)
                except (OSError, http.client.HTTPException) as exc:
                    raise _download_error(
                        url, dest, f"the connection broke after {received} bytes "
                        f"({type(exc).__name__}: {exc})", offline_hint=True) from None
                if not chunk:
                    break
                received += len(chunk)
                if received > MAX_DOWNLOAD_BYTES:
                    raise _download_error(url, dest, f"more than {MAX_DOWNLOAD_BYTES} bytes",
                                          offline_hint=False)
                out.write(chunk)
                bar.update(len(chunk))
    if total is not None and received != total:
        raise _download_error(url, dest, f"got {received} of the {total} bytes announced",
                              offline_hint=True)
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


def _map_member(name: str, manifest: dict[str, str]) -> str | None:
    """Upstream member name -> manifest path, or None when we do not keep it.

    ``<top>/BCCD/<sub>/<file>`` -> ``<sub>/<file>``; ``<top>/<file>`` -> ``<file>``.
    """
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if len(parts) < 2:
        return None
    parts = parts[1:]  # the top folder, BCCD_Dataset-<commit>
    if parts[0] == "BCCD" and len(parts) > 2:
        rel = "/".join(parts[1:])
    elif len(parts) == 1:
        rel = parts[0]
    else:
        return None
    return rel if rel in manifest else None


def _extract(archive: Path, staging: Path, manifest: dict[str, str], url: str) -> None:
    seen: set[str] = set()
    extracted = 0
    try:
        with open(archive, "rb") as raw, tarfile.open(fileobj=raw, mode="r|*") as tar:
            for member in tar:
                reason = _unsafe_reason(member)
                if reason:
                    raise UnsafeArchiveError(
                        f"unsafe member {member.name!r} in the archive from {url}: {reason}. "
                        "Nothing was installed; this is not the pinned BCCD archive.",
                        member.name)
                if member.isdir():
                    continue
                rel = _map_member(member.name, manifest)
                if rel is None:
                    continue
                if rel in seen:
                    raise UnsafeArchiveError(
                        f"member {member.name!r} appears twice in the archive from {url}. "
                        "Nothing was installed.", member.name)
                if member.size > MAX_MEMBER_BYTES or extracted + member.size > MAX_EXTRACTED_BYTES:
                    raise UnsafeArchiveError(
                        f"member {member.name!r} in the archive from {url} is too large "
                        f"({member.size} bytes). Nothing was installed.", member.name)
                seen.add(rel)
                extracted += member.size
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                with open(target, "xb") as out:
                    shutil.copyfileobj(source, out, _CHUNK)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise CorruptArchiveError(
            f"the file downloaded from {url} is not a complete tar archive "
            f"({type(exc).__name__}: {exc}); the download was probably cut short, or the "
            "server sent something else (an error or proxy page). Nothing was installed; "
            "run the download again.") from None


def _looks_like_dataset(root: Path) -> bool:
    return any((root / name).exists() for name in (MARKER_NAME, "Annotations", "JPEGImages"))


def _install(staging: Path, root: Path) -> None:
    """Move the verified ``staging`` folder to ``root``, replacing what is there."""
    if not root.exists():
        os.replace(staging, root)
        return
    old = root.parent / f".{root.name}.old-{secrets.token_hex(4)}"
    os.replace(root, old)
    try:
        os.replace(staging, root)
    except BaseException:
        os.replace(old, root)
        raise
    shutil.rmtree(old, ignore_errors=True)


def download_bccd(dest=None, url=None, force=False, progress=True, timeout=TIMEOUT_S) -> Path:
    """Fetch BCCD at commit :data:`BCCD_COMMIT`, verify every file, return the dataset root.

    ``dest``: the dataset root to create (default: ``$MEDAIDET_DATA``, else
    :func:`default_root`). ``url``: the archive (default: ``$MEDAIDET_BCCD_URL``,
    else :data:`DEFAULT_URL`; ``file://`` works for an archive fetched elsewhere).

    A root already verified is returned without network access unless
    ``force``. An existing folder without the marker whose files all match
    the manifest (placed by hand) is marked and returned, also without network.
    ``force`` replaces an existing dataset, but never a folder that does not
    look like one.
    """
    root, _ = _choose_root(dest)
    root = root.resolve()
    url = url or os.environ.get(URL_ENV) or DEFAULT_URL
    manifest = load_manifest()

    if root.exists():
        if not root.is_dir():
            raise DestinationError(f"{root} exists and is not a folder; choose another --dest.")
        if not force:
            if is_verified(root):
                return root
            if any(root.iterdir()):
                problems = verify_dataset(root)
                if not problems:
                    _write_marker(root, "verified in place")
                    return root
                raise DestinationError(
                    f"{root} exists and is not a verified BCCD copy "
                    f"({_summarize(problems)}). Pass --force (force=True) to replace it with a "
                    "fresh download, or choose another --dest.")
        elif any(root.iterdir()) and not _looks_like_dataset(root):
            raise DestinationError(
                f"refusing to replace {root}: it is not empty and does not look like a BCCD "
                "copy (no Annotations/, JPEGImages/ or marker). Choose a new or empty --dest.")

    parent = root.parent
    archive = staging = None
    try:
        try:
            parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f".{root.name}.", suffix=".download", dir=parent)
            os.close(fd)
            archive = Path(name)
            staging = parent / f".{root.name}.partial-{secrets.token_hex(4)}"
            staging.mkdir()
        except OSError as exc:
            raise DestinationError(f"cannot write beside {root}: {exc}. Choose another --dest "
                                   f"or set ${DATA_ENV}.") from None

        _fetch(url, archive, root, timeout, progress)
        _extract(archive, staging, manifest, url)
        archive.unlink()
        archive = None
        problems = verify_dataset(staging)
        if problems:
            raise ChecksumError(
                f"{len(problems)} of {len(manifest)} files from {url} do not match the pinned "
                f"manifest {MANIFEST_NAME} (BCCD commit {BCCD_COMMIT}): "
                f"{_summarize(problems)}. The archive is not BCCD at that commit or was "
                "corrupted on the way; nothing was installed.", problems)
        _write_marker(staging, f"downloaded from {url}")  # last file, before the rename
        try:
            _install(staging, root)
        except OSError:
            if not is_verified(root):
                raise
            # another process installed a verified copy first; ours is removed below
        else:
            staging = None
    finally:
        if archive is not None:
            archive.unlink(missing_ok=True)
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return root


def _write_marker(root: Path, how: str) -> None:
    text = f"{manifest_sha256()}\n# every file of {MANIFEST_NAME} verified; {how}\n"
    try:
        (root / MARKER_NAME).write_text(text, encoding="utf-8")
    except OSError:
        pass  # a read-only copy verified in place stays usable; it is re-hashed next time
