"""The Pascal VOC layout BCCD comes in: where each file of an image is, and the split lists.

Layout::

    ROOT/ImageSets/Main/{train,val,trainval,test}.txt   one image id per line
    ROOT/Annotations/<id>.xml                            VOC XML, one <object> per box
    ROOT/JPEGImages/<id>.jpg

Files are found by the ids in the split lists, never by the XML's ``<filename>``,
``<path>`` or ``<folder>`` (BCCD's carry annotators' machine paths).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

from medaidet.data import SPLITS
from medaidet.errors import DataError

__all__ = ["split_path", "annotation_path", "image_path", "SplitProblem", "scan_split_file",
           "read_split"]

_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,254}")


# --------------------------------------------------------------------------- paths

def split_path(root, split: str) -> Path:
    return Path(root) / "ImageSets" / "Main" / f"{split}.txt"


def annotation_path(root, image_id: str) -> Path:
    return Path(root) / "Annotations" / f"{image_id}.xml"


def image_path(root, image_id: str) -> Path:
    return Path(root) / "JPEGImages" / f"{image_id}.jpg"


# --------------------------------------------------------------------------- split lists

class SplitProblem(NamedTuple):
    """One defect of a split list; ``image_id`` is None for the whole file."""
    kind: str                # "missing" | "unreadable" | "empty" | "bad_id" | "duplicate"
    image_id: str | None
    line: int | None         # 1-based line number
    detail: str


def scan_split_file(path) -> tuple[list[str], list[SplitProblem]]:
    """Ids of a split list in order (first occurrence), and every problem found.

    Blank lines are ignored; a line must hold one id (letters, digits, ``_.+-``; no
    path separators, no spaces).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        return [], [SplitProblem("missing", None, None, f"split list {path} does not exist")]
    except (OSError, UnicodeDecodeError) as exc:
        return [], [SplitProblem("unreadable", None, None,
                                 f"split list {path} cannot be read as UTF-8 text ({exc})")]
    ids, problems, first_line = [], [], {}
    for number, raw in enumerate(text.splitlines(), 1):
        entry = raw.strip()
        if not entry:
            continue
        if not _ID_RE.fullmatch(entry) or ".." in entry:
            problems.append(SplitProblem(
                "bad_id", entry, number,
                f"{path} line {number}: {entry!r} is not an image id (one id per line; "
                "letters, digits and _.+- only)"))
            continue
        if entry in first_line:
            problems.append(SplitProblem(
                "duplicate", entry, number,
                f"{path} line {number}: id {entry} is listed twice (first on line "
                f"{first_line[entry]}); remove one"))
            continue
        first_line[entry] = number
        ids.append(entry)
    if not ids and not problems:
        problems.append(SplitProblem("empty", None, None,
                                     f"split list {path} is empty: it lists no image id"))
    return ids, problems


def read_split(root, split: str) -> list[str]:
    """The ids of ``split`` (train, val, trainval or test); raises a ``"split"`` DataError."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}: choose one of {', '.join(SPLITS)}", "split")
    path = split_path(root, split)
    ids, problems = scan_split_file(path)
    if problems:
        first = problems[0]
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise DataError(first.detail + more, "split", path=path, image_id=first.image_id)
    return ids
