"""Fetch a pinned dataset (:mod:`medaidet.data.pinned`), verify every file, install it.

The download is GitHub's archive of the pinned commit. GitHub builds these archives on the
fly, so their own bytes are not stable: instead of checking the archive, every extracted
file is checked against the manifest.

Safety rules of :func:`download` (:func:`download_bccd`, :func:`download_txl_pbc`):

* the URL must be ``https://``, ``http://`` or ``file://``
  (a ``"url"`` DataError otherwise, before anything is written);
* the archive is extracted by :func:`medaidet.data.archive.extract` through tarfile's
  ``data`` filter: only the manifest's regular files are written, with size limits;
* everything is staged under temporary names beside the destination and verified before
  anything is installed. A new dataset appears with one directory rename, the marker file
  ``.medaidet-verified`` already inside. Into an existing copy of the same dataset
  (``force``), each file of the manifest is renamed over its old copy and nothing else is
  touched: files the user added stay where they are. The marker is removed first and put
  back last, so an interrupted install is never taken for a verified copy. A folder that
  holds another dataset is refused: a dataset root holds one dataset;
* the temporary folder (``.<name>.*.partial`` beside the destination, made by
  :mod:`tempfile`) is removed on any failure; nothing else is ever deleted. A download killed
  outright (``kill -9``, a power cut) leaves it behind, to be deleted by hand;
* nothing is ever downloaded implicitly: :func:`~medaidet.data.pinned.resolve_root` only
  looks.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import urllib.parse
from pathlib import Path, PureWindowsPath

from medaidet import __version__
from medaidet.data.archive import extract
from medaidet.data.pinned import (BCCD, MARKER_NAME, SOURCES, TXL_PBC, PinnedSource, choose_root,
                                  cli_flag, is_verified, load_manifest, manifest_entries,
                                  manifest_sha256, summarize_problems, verify_dataset)
from medaidet.downloads import stream_url
from medaidet.errors import DataError

__all__ = ["download", "download_bccd", "download_txl_pbc", "URL_SCHEMES"]

logger = logging.getLogger(__name__)


#: The URL schemes :func:`download_bccd` accepts.
URL_SCHEMES = ("https", "http", "file")
TIMEOUT_S = 60.0
#: Far above the real archives (BCCD ~11 MB, TXL-PBC ~44 MB).
MAX_DOWNLOAD_BYTES = 1 << 30


def _by_hand(source: PinnedSource, dest: Path) -> str:
    return (
        "To place the data by hand: on a machine with network access download\n"
        f"  {source.url}\n"
        f"(the archive of {source.repo} at commit {source.commit}), then either\n"
        f"  - copy it here and run `{source.url_env}=file:///path/to/archive.tar.gz medaidet "
        f"data download{cli_flag(source)} --root {dest}` (extracts and verifies every "
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


def _looks_like_dataset(root: Path, source: PinnedSource) -> bool:
    """Whether ``root`` holds a folder of ``source``'s (every dataset's copy has a marker)."""
    names = {source.marks} | {rel.split("/")[0] for rel, _ in manifest_entries(source) if "/" in rel}
    return any((root / name).exists() for name in names)


# --------------------------------------------------------------------------- temporary files
#
# Beside the dataset root ROOT, a download writes ``.ROOT.<tag>.download`` (the archive)
# and ``.ROOT.partial-<tag>/`` (the files being extracted and verified), with
# ``<tag> = <host>-<pid>-<8 hex digits>``: a later run can tell whether the process that
# made them still runs.

def _install(source: PinnedSource, staging: Path, root: Path) -> None:
    """Put the verified files of ``staging`` (the manifest's and the marker) in ``root``, as
    the module docstring says: :func:`verify_dataset` passes on a copy only once every file
    is in place, and the marker goes in last."""
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
        for rel, _ in manifest_entries(source):
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


def _temp_folder(source: PinnedSource, root: Path) -> Path:
    """This run's temporary folder beside ``root`` (on its file system, so that the install
    is a rename), created; a ``"destination"`` DataError when it cannot be."""
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(".partial", f".{root.name}.", root.parent))
    except OSError as exc:
        raise DataError(f"cannot write beside {root}: {exc}. Choose another --root "
                        f"or set ${source.data_env}.", "destination") from None


def _usable_copy(source: PinnedSource, root: Path, force: bool) -> bool:
    """Whether ``root`` already holds a verified copy to use as it is (a copy placed by hand
    whose files all match is marked now); a ``"destination"`` DataError when ``root`` cannot
    take a download (not a folder, another copy without ``force``, foreign content)."""
    if not root.exists():
        return False
    if not root.is_dir():
        raise DataError(f"{root} exists and is not a folder; choose another --root.",
                        "destination")
    other = [s.name for s in SOURCES.values() if s is not source and _looks_like_dataset(root, s)]
    if other:     # one dataset per root: --force replaces only a copy of this one
        raise DataError(f"{root} holds {other[0]}, not {source.name}: a dataset root holds one "
                        f"dataset. Choose another --root for {source.name}.", "destination")
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
                f"({summarize_problems(problems)}). Pass --force (force=True) to replace the "
                f"files of {source.name} with a fresh download (files that are not part "
                f"of {source.name} are left where they are), or choose another --root.",
                "destination")
    elif any(root.iterdir()) and not _looks_like_dataset(root, source):
        raise DataError(
            f"refusing to replace {root}: it is not empty and does not look like a "
            f"{source.name} copy (no {source.marks}/). Choose a new or empty "
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
    root, how = choose_root(root, source)
    root = root.resolve()
    url = url or os.environ.get(source.url_env) or source.url
    _check_url(url, source)
    manifest = load_manifest(source)
    if _usable_copy(source, root, force):
        return root
    work = None
    had_root = root.exists()   # else a failed download is said to have found no copy
    try:
        work = _temp_folder(source, root)
        archive, staging = work / "archive.download", work / root.name
        staging.mkdir()        # with the user's umask: it becomes the dataset's folder
        try:
            _fetch(source, url, archive, root, timeout, progress)
        except DataError as exc:         # "download", "url" or "archive"
            if had_root:
                raise
            raise DataError(f"{source.name} is not at {root} ({how}), and {exc}",
                            "download") from None
        extract(source, archive, staging, manifest, url)
        archive.unlink()
        problems = verify_dataset(staging, source)
        if problems:
            raise DataError(
                f"{len(problems)} of {len(manifest)} files from {url} do not match the pinned "
                f"manifest {source.manifest_name} ({source.name} commit {source.commit}): "
                f"{summarize_problems(problems)}. The archive is not {source.name} at that "
                "commit or was corrupted on the way; nothing was installed.", "checksum",
                problems=problems)
        _write_marker(source, staging, f"downloaded from {url}")  # last, before the install
        existed = root.exists()
        _install(source, staging, root)
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
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
