"""A VOC annotation file, parsed safely: no DTD, no entity expansion, no external entities.

:func:`parse_annotation` reads what is written and judges nothing: an unknown class name gets
``label=None``, an unusable box ``bndbox=None`` with the reason (the judging is
:func:`medaidet.data.annotation_checks.check_annotation`'s).
"""
from __future__ import annotations

import functools
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import defusedxml
import defusedxml.ElementTree as SafeET

from medaidet.data import BCCD_LABEL_NAMES
from medaidet.errors import DataError
from medaidet.files import not_a_regular_file

__all__ = ["Annotation", "AnnotatedObject", "parse_annotation", "MAX_XML_BYTES"]

MAX_XML_BYTES = 8 << 20     # BCCD's largest annotation is ~6 kB
_COORDS = ("xmin", "ymin", "xmax", "ymax")


class AnnotatedObject(NamedTuple):
    """One ``<object>`` as written. ``index`` is its 0-based position in the file."""
    index: int
    name: str | None                  # <name> text as written; None when missing
    label: int | None                 # index into the label names; None when unknown
    bndbox: tuple[float, float, float, float] | None   # (xmin, ymin, xmax, ymax): VOC, 1-based
    problem: str | None               # why bndbox is None
    difficult: bool
    truncated: bool


@dataclass(frozen=True)
class Annotation:
    """A parsed VOC annotation file. Metadata fields are None when absent."""
    path: Path
    objects: tuple[AnnotatedObject, ...]
    size: tuple[int, int] | None      # (height, width) from <size>; None if absent or not > 0
    size_text: str | None             # <size> as written, for messages
    depth: int | None
    filename: str | None
    folder: str | None
    image_path: str | None            # the <path> element
    attributes: tuple[tuple[str, str], ...]   # attributes of <annotation>
    indent: str                       # leading whitespace of the first indented line


def _text(element, tag):
    found = element.find(tag)
    return None if found is None or found.text is None else found.text.strip()


def _positive_int(text):
    try:
        value = int(text)
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


def _read_bndbox(element):
    box = element.find("bndbox")
    if box is None:
        return None, "it has no <bndbox>"
    values = []
    for tag in _COORDS:
        text = _text(box, tag)
        if text is None:
            return None, f"its <bndbox> has no <{tag}>"
        try:
            value = float(text)
        except ValueError:
            return None, f"its <{tag}> is {text!r}, not a number"
        if not math.isfinite(value):
            return None, f"its <{tag}> is {text!r}, not a finite number"
        values.append(value)
    return tuple(values), None


def _flag(text) -> bool:
    return (text or "").strip().lower() in ("1", "true", "yes")


def _label_index(label_names):
    return {name.lower(): i for i, name in enumerate(label_names)}


def parse_annotation(path, label_names=BCCD_LABEL_NAMES) -> Annotation:
    """Parse one VOC XML file safely: no DTD, no entity expansion, no external entities.

    Does not judge the objects (see :func:`check_annotation`): unknown names get
    ``label=None``, unusable boxes ``bndbox=None`` with the reason in ``problem``.
    Raises an ``"missing_file"`` DataError, an ``"xml"`` DataError or
    an ``"unsafe_xml"`` DataError. Parsed files are cached in memory, keyed by path and content.
    """
    path = Path(path)
    image_id = path.stem
    why = not_a_regular_file(path)
    if why:
        raise DataError(f"{path} is {why}, not a VOC XML annotation file", "xml", path=path,
                        image_id=image_id)
    try:
        size = path.stat().st_size
        if size > MAX_XML_BYTES:
            raise DataError(
                f"{path}: {size} bytes is too large for an annotation file (limit "
                f"{MAX_XML_BYTES}); is it really VOC XML?", "xml", path=path, image_id=image_id)
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"annotation file {path} does not exist", "missing_file", path=path,
                        image_id=image_id) from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read the annotation ({exc})", "xml",
                        path=path, image_id=image_id) from None
    return _parse_cached(str(path), data, tuple(label_names))


@functools.lru_cache(maxsize=4096)
def _parse_cached(path_text: str, data: bytes, label_names) -> Annotation:
    path = Path(path_text)
    image_id = path.stem

    def fail(kind, why):
        return DataError(f"{path}: {why}", kind, path=path, image_id=image_id)

    try:
        root = SafeET.fromstring(data, forbid_dtd=True)
    except defusedxml.DefusedXmlException as exc:
        raise fail("unsafe_xml", f"refused: the XML declares a DTD or entities ({exc!r}); "
                   "VOC annotations need neither, so nothing is expanded or fetched. "
                   "Remove the <!DOCTYPE ...> block") from None
    except (ET.ParseError, ValueError, LookupError, UnicodeError) as exc:
        raise fail("xml", f"not well-formed XML ({exc}); re-export it from "
                   "the annotation tool or restore it from the original dataset") from None
    if root.tag != "annotation":
        raise fail("xml", f"the root element is <{root.tag}>, not "
                   "<annotation>: not a Pascal VOC annotation")

    index_of = _label_index(label_names)
    objects = []
    for index, element in enumerate(root.findall("object")):
        name_element = element.find("name")
        name = None if name_element is None else (name_element.text or "")
        label = None if name is None else index_of.get(name.strip().lower())
        bndbox, problem = _read_bndbox(element)
        objects.append(AnnotatedObject(index, name, label, bndbox, problem,
                                       _flag(element.findtext("difficult")),
                                       _flag(element.findtext("truncated"))))

    size_element = root.find("size")
    height = width = depth = None
    size_text = None
    if size_element is not None:
        width = _positive_int(_text(size_element, "width"))
        height = _positive_int(_text(size_element, "height"))
        depth = _positive_int(_text(size_element, "depth"))
        size_text = f"{_text(size_element, 'width')}x{_text(size_element, 'height')}"
    text = data.decode("utf-8", "replace")
    indent = re.search(r"\n([ \t]+)<", text)
    return Annotation(
        path=path, objects=tuple(objects),
        size=(height, width) if height and width else None, size_text=size_text, depth=depth,
        filename=_text(root, "filename"), folder=_text(root, "folder"),
        image_path=_text(root, "path"), attributes=tuple(sorted(root.attrib.items())),
        indent=indent.group(1) if indent else "")
