"""A dataset pinned to one commit of its repository, the sha256 manifest of the files kept
from it, and where a copy lives (notebooks 01 and 10).

A :class:`PinnedSource` names what is fetched: a repository, a commit and the manifest of
the files kept, shipped in this package. Two are defined: :data:`BCCD`
(``manifests/bccd-d272fb14.sha256``) and :data:`TXL_PBC`, a re-annotation of BCCD's smears
and of three other sources (``manifests/txl-pbc-056d09e4.sha256``).
:func:`verify_dataset` re-hashes a copy against its manifest; a verified copy carries the
marker file :data:`MARKER_NAME` (:func:`is_verified`). :mod:`medaidet.data.download`
fetches a source.

Root resolution (:func:`resolve_root`, which only looks, never downloads): explicit argument >
the source's variable (``$MEDAIDET_DATA`` for BCCD, ``$MEDAIDET_TXL_PBC`` for TXL-PBC) > the
default cache directory ``<cache>/bccd`` or ``<cache>/txl-pbc``, where ``<cache>`` is
``$MEDAIDET_CACHE``, else ``$XDG_CACHE_HOME/medaidet``, else ``~/.cache/medaidet``.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.resources
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from medaidet.arguments import checked_path
from medaidet.checksums import sha256_file
from medaidet.errors import DataError, MedaidetError
from medaidet.files import default_cache_dir

__all__ = [
    "PinnedSource", "BCCD", "TXL_PBC", "SOURCES", "MARKER_NAME", "Problem", "load_manifest",
    "manifest_entries", "manifest_sha256", "verify_dataset", "is_verified",
    "summarize_problems", "default_root", "choose_root", "cli_flag", "resolve_root",
]


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
    return dict(manifest_entries(source))


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
    for rel, expected in manifest_entries(source):
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


def summarize_problems(problems: list[Problem], limit: int = 5) -> str:
    """The problems of :func:`verify_dataset` in one phrase for a message."""
    parts = []
    for kind, text in (("mismatch", "with a wrong sha256"), ("missing", "missing")):
        names = [p.path for p in problems if p.kind == kind]
        if names:
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
    env = os.environ.get(source.data_env)
    if env:
        return Path(env).expanduser(), f"from ${source.data_env}"
    return default_root(source), f"the default cache directory; ${source.data_env} is not set"


def cli_flag(source: PinnedSource) -> str:
    """The ``medaidet data download`` option that picks ``source`` (none for BCCD)."""
    return "" if source is BCCD else f" --dataset {source.cache_name}"


def _layout_help(source: PinnedSource = BCCD) -> str:
    function = f"download_{source.cache_name.replace('-', '_')}"
    return (
        f"Get it with `medaidet data download{cli_flag(source)} [--root DIR]` (Python: "
        f"medaidet.data.download.{function}()), which fetches "
        f"{source.repo} at commit {source.commit}, verifies every file and stores it at "
        f"{default_root(source)} unless --root or ${source.data_env} says otherwise.\n"
        f"Or place the files by hand, keeping {source.layout}\n"
        f"and set {source.data_env}=ROOT (or pass ROOT explicitly); "
        f"`medaidet data download{cli_flag(source)} --root ROOT` then verifies it without "
        "the network."
    )


def resolve_root(root=None, source: PinnedSource = BCCD) -> Path:
    """The dataset root: ``root`` > ``$MEDAIDET_DATA`` (``source.data_env``) > the default
    cache directory.

    Only looks (never downloads); raises a ``"not_found"`` DataError with
    instructions when the chosen folder has no ``Annotations/`` (``source.marks``).
    """
    path, how = choose_root(root, source)
    if not (path / source.marks).is_dir():
        state = "does not exist" if not path.exists() else f"has no {source.marks}/ folder"
        raise DataError(f"{source.name} not found: {path} ({how}) {state}.\n"
                        f"{_layout_help(source)}", "not_found")
    return path.resolve()

