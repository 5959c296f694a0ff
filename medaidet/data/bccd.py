"""BCCD as a ChainerCV dataset (notebook 01): the VOC layout, annotations parsed safely and
checked by one rule (:func:`check_annotation`), and :class:`BCCDDataset`. Files are found by
the split lists' ids, never by the XML's ``<filename>``, ``<path>`` or ``<folder>``::

    ROOT/ImageSets/Main/{train,val,trainval,test}.txt   one image id per line
    ROOT/Annotations/<id>.xml                            VOC XML, one <object> per box
    ROOT/JPEGImages/<id>.jpg

As ChainerCV's ``VOCBboxDataset``: ``img`` float32 (3, H, W), RGB, 0-255; ``bbox`` float32
(R, 4), ``(y_min, x_min, y_max, x_max)``, 0-based (VOC's 1-based coordinates minus 1);
``label`` int32 (R,), index into :data:`~medaidet.data.BCCD_LABEL_NAMES`; ``difficult`` bool (R,).

Untrusted files: XML with a DTD or entities is refused, label files are size-checked before
they are read. A defective file raises a DataError; a defective object is dropped or clipped
with an :class:`AnnotationWarning` (``strict=True``: raises). ``labels='txl-pbc'``: TXL-PBC's
boxes of the same smears (:mod:`medaidet.data.txl_pbc`), split by BCCD's lists.
"""
from __future__ import annotations

import csv
import functools
import math
import os
import re
import warnings
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NamedTuple

import defusedxml
import defusedxml.ElementTree as SafeET
import numpy as np
from chainercv.chainer_experimental.datasets.sliceable import GetterDataset
from chainercv.utils import bbox_iou

from medaidet.arguments import checked_path, checked_size, is_path
from medaidet.data import BCCD_LABEL_NAMES, CLASS_COLORS, LABELS, SPLITS
from medaidet.data.download import TXL_PBC, resolve_root
from medaidet.data.image import decode_image, read_image_size
from medaidet.errors import ConfigError, DataError, MedaidetError
from medaidet.files import not_a_regular_file
from medaidet.tables import Table

__all__ = ["split_path", "annotation_path", "image_path", "scan_split_file", "read_split",
           "Annotation", "AnnotatedObject", "parse_annotation", "MAX_XML_BYTES",
           "check_annotation", "Finding", "CheckedAnnotation", "BOUNDS_TOLERANCE",
           "NEAR_DUPLICATE_IOU", "AnnotationWarning", "QUIET_ENV", "warn_once",
           "parse_yolo_labels", "TXL_CLASSES", "MAX_LABEL_BYTES", "Link", "read_links",
           "bccd_links", "LINKS_FILE", "CLASS_COLORS", "BCCDDataset", "LABELS", "ObjectIssue",
           "annotation_report", "quiet_annotation_warnings"]


# ---------------------------------------------------------------------------------- the VOC layout
def split_path(root, split: str) -> Path:
    return Path(root) / "ImageSets" / "Main" / f"{split}.txt"


def annotation_path(root, image_id: str) -> Path:
    return Path(root) / "Annotations" / f"{image_id}.xml"


def image_path(root, image_id: str) -> Path:
    return Path(root) / "JPEGImages" / f"{image_id}.jpg"


_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,254}")


def scan_split_file(path) -> tuple[list[str], list[tuple]]:
    """Ids of a split list in order (first occurrence), and every problem found as ``(image id
    or None for the whole file, detail)``; a line holds one id (letters, digits, ``_.+-``)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        return [], [(None, f"split list {path} does not exist")]
    except (OSError, UnicodeDecodeError) as exc:
        return [], [(None, f"split list {path} cannot be read as UTF-8 text ({exc})")]
    problems, first_line = [], {}
    for number, entry in enumerate(map(str.strip, text.splitlines()), 1):
        if entry and (not _ID_RE.fullmatch(entry) or ".." in entry):
            problems.append((entry, f"{path} line {number}: {entry!r} is not an image id (one id "
                                    "per line; letters, digits and _.+- only)"))
        elif entry in first_line:
            problems.append((entry, f"{path} line {number}: id {entry} is listed twice (first on "
                                    f"line {first_line[entry]}); remove one"))
        elif entry:
            first_line[entry] = number
    if not first_line and not problems:
        problems.append((None, f"split list {path} is empty: it lists no image id"))
    return list(first_line), problems


def read_split(root, split: str) -> list[str]:
    """The ids of ``split`` (train, val, trainval or test); raises a ``"split"`` DataError."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}: choose one of {', '.join(SPLITS)}", "split")
    path = split_path(root, split)
    ids, problems = scan_split_file(path)
    if problems:
        (image_id, detail), more = problems[0], len(problems) - 1
        raise DataError(detail + (f" (and {more} more problem(s))" if more else ""), "split",
                        path=path, image_id=image_id)
    return ids


def _file_error(path: Path, kind: str, message: str, **fields) -> DataError:
    """A DataError of the file ``path``: its message is ``path`` followed by ``message``."""
    return DataError(f"{path}{message}", kind, path=path, image_id=path.stem, **fields)


def _read_small_file(path: Path, limit: int, kind: str, what: str, missing: str) -> bytes:
    """The bytes of a file of at most ``limit`` bytes; else a ``kind`` or ``missing`` DataError."""
    if why := not_a_regular_file(path):
        raise _file_error(path, kind, f" is {why}, not {what}")
    try:
        if (size := path.stat().st_size) > limit:
            raise _file_error(path, kind, f": {size} bytes is too large for {what} (limit {limit})")
        return path.read_bytes()
    except FileNotFoundError:
        raise _file_error(path, missing, " does not exist") from None
    except OSError as exc:
        raise _file_error(path, kind, f": cannot read it ({exc})") from None


# ------------------------------------------------------------------ VOC annotations, parsed safely
MAX_XML_BYTES = 8 << 20     # BCCD's largest annotation is ~6 kB


class AnnotatedObject(NamedTuple):
    """One ``<object>`` as written. ``index`` is its 0-based position in the file."""
    index: int
    name: str | None
    label: int | None                 # None when unknown
    bndbox: tuple[float, float, float, float] | None   # (xmin, ymin, xmax, ymax): VOC, 1-based
    problem: str | None               # why bndbox is None
    difficult: bool


@dataclass(frozen=True)
class Annotation:
    """A parsed VOC annotation file. Metadata fields are None when absent."""
    path: Path
    objects: tuple[AnnotatedObject, ...]
    size: tuple[int, int] | None = None   # (height, width) from <size>; None if absent or not > 0
    size_text: str | None = None          # <size> as written, for messages
    depth: int | None = None
    filename: str | None = None
    folder: str | None = None
    image_path: str | None = None         # the <path> element
    attributes: tuple[tuple[str, str], ...] = ()   # of <annotation>
    indent: str = ""                      # leading whitespace of the first indented line


def _text(element, tag):
    found = None if element is None else element.find(tag)
    return None if found is None or found.text is None else found.text.strip()


def _positive_int(text):
    try:
        return int(text) if int(text) > 0 else None
    except (TypeError, ValueError):
        return None


def _read_bndbox(element):
    """``((xmin, ymin, xmax, ymax), None)`` as written, or ``(None, why not)``."""
    box, values = element.find("bndbox"), []
    if box is None:
        return None, "it has no <bndbox>"
    for tag in ("xmin", "ymin", "xmax", "ymax"):
        if (text := _text(box, tag)) is None:
            return None, f"its <bndbox> has no <{tag}>"
        try:
            values.append(float(text))
        except ValueError:
            return None, f"its <{tag}> is {text!r}, not a number"
        if not math.isfinite(values[-1]):
            return None, f"its <{tag}> is {text!r}, not a finite number"
    return tuple(values), None


def parse_annotation(path, label_names=BCCD_LABEL_NAMES) -> Annotation:
    """Parse one VOC XML file safely (no DTD, no entities), judging nothing; a cached result, or
    a ``"missing_file"``, ``"xml"`` or ``"unsafe_xml"`` DataError."""
    path = Path(path)
    data = _read_small_file(path, MAX_XML_BYTES, "xml", "a VOC XML annotation file", "missing_file")
    return _parse_cached(str(path), data, tuple(label_names))


@functools.lru_cache(maxsize=4096)
def _parse_cached(path_text: str, data: bytes, label_names) -> Annotation:
    path = Path(path_text)
    try:
        root = SafeET.fromstring(data, forbid_dtd=True)
    except defusedxml.DefusedXmlException as exc:
        raise _file_error(path, "unsafe_xml", f": refused, it declares a DTD or entities "
                          f"({exc!r}); VOC needs neither: remove the <!DOCTYPE> block") from None
    except (ET.ParseError, ValueError, LookupError, UnicodeError) as exc:
        raise _file_error(path, "xml", f": not well-formed XML ({exc}); re-export it or restore "
                          "it from the original dataset") from None
    if root.tag != "annotation":
        raise _file_error(path, "xml", f": the root element is <{root.tag}>, not <annotation>: "
                          "not a Pascal VOC annotation")
    index_of = {name.lower(): i for i, name in enumerate(label_names)}
    objects = []
    for index, element in enumerate(root.findall("object")):
        name = element.findtext("name")
        label = None if name is None else index_of.get(name.strip().lower())
        difficult = (element.findtext("difficult") or "").strip().lower() in ("1", "true", "yes")
        objects.append(AnnotatedObject(index, name, label, *_read_bndbox(element), difficult))
    size = root.find("size")
    width, height, depth = (_positive_int(_text(size, tag)) for tag in ("width", "height", "depth"))
    indent = re.search(r"\n([ \t]+)<", data.decode("utf-8", "replace"))
    return Annotation(
        path=path, objects=tuple(objects), size=(height, width) if height and width else None,
        size_text=None if size is None else f"{_text(size, 'width')}x{_text(size, 'height')}",
        depth=depth, filename=_text(root, "filename"), folder=_text(root, "folder"),
        image_path=_text(root, "path"), attributes=tuple(sorted(root.attrib.items())),
        indent=indent.group(1) if indent else "")


# -------------------------------------------------- the checks: is an annotation usable as written
#: Pixels a box may overhang the image and be clipped, not dropped (0-based exports write 0).
BOUNDS_TOLERANCE = 2
#: Two boxes of one class overlapping at least this much (IoU) are the same cell boxed twice.
NEAR_DUPLICATE_IOU = 0.9


class AnnotationWarning(UserWarning):
    """Objects were dropped or clipped while loading (see ``.dropped`` / ``.clipped``)."""


#: Set (not empty, not "0"): no :class:`AnnotationWarning` here nor in child processes.
QUIET_ENV = "MEDAIDET_QUIET_ANNOTATIONS"
# Our own record: Python's "once" filter forgets whenever warning filters change.
_REPORTED = set()


def warn_once(message: str, stacklevel: int = 3) -> None:
    """An :class:`AnnotationWarning`, once per process and message, unless :data:`QUIET_ENV`."""
    if message not in _REPORTED and os.environ.get(QUIET_ENV, "") in ("", "0"):
        _REPORTED.add(message)
        warnings.warn(AnnotationWarning(message), stacklevel=stacklevel)


class Finding(NamedTuple):
    """One defect :func:`check_annotation` found and what the loader does with it."""
    index: int | None        # object index (0-based, order in the file); None: the whole file
    kind: str
    detail: str
    action: str              # "raise" | "drop" | "clip"


class CheckedAnnotation(NamedTuple):
    """The boxes kept, and the findings. bbox: float32 (R, 4) ``(y_min, x_min, y_max, x_max)``,
    0-based; label: int32 (R,); difficult: bool (R,); index: int64 (R,), object indices."""
    bbox: np.ndarray
    label: np.ndarray
    difficult: np.ndarray
    index: np.ndarray
    findings: tuple[Finding, ...]


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _duplicates(bbox, labels, threshold, keep):
    """Yield ``(j, k, iou)`` for each box ``j`` repeating an earlier kept box ``k`` of its class
    (IoU >= ``threshold``), setting ``keep[j]`` False. O(R) memory, not all pairs: IoU >= t needs
    ``y_min`` within ``(1 - t) * h`` of each other, so only that band is compared."""
    boxes = bbox.astype(np.float64)
    band = ((1 - threshold) * float(np.max(boxes[:, 2] - boxes[:, 0], initial=0)) + 1e-6
            if threshold > 0 else np.inf)
    order = np.argsort(boxes[:, 0], kind="stable")
    tops = boxes[order, 0]
    for j in range(1, len(boxes)):
        lo = np.searchsorted(tops, boxes[j, 0] - band, side="left")
        hi = np.searchsorted(tops, boxes[j, 0] + band, side="right")
        near_by = np.sort(order[lo:hi])
        earlier = near_by[(near_by < j) & keep[near_by] & (labels[near_by] == labels[j])]
        if not len(earlier):
            continue
        iou = bbox_iou(boxes[j:j + 1], boxes[earlier])[0]
        near = np.flatnonzero(iou >= threshold)
        if len(near):
            keep[j] = False
            yield j, int(earlier[near[0]]), float(iou[near[0]])


def _check_object(obj, height: int, width: int, tolerance: float, item: str, names: str):
    """``(findings, box)`` of one object: its box 0-based ``(y_min, x_min, y_max, x_max)``
    (clipped when it was within ``tolerance`` of the image), or None when it is not kept."""
    i = obj.index
    if obj.label is None:
        why = ("has no <name>" if obj.name is None else
               f"is named {obj.name!r}, not one of {names} (case-insensitive)")
        return [Finding(i, "unknown_label", f"{item} {i} {why}", "raise")], None
    if obj.bndbox is None:
        return [Finding(i, "bad_coordinates", f"{item} {i} ({obj.name.strip()}): "
                        f"{obj.problem}", "drop")], None
    xmin, ymin, xmax, ymax = obj.bndbox
    where = f"{item} {i} ({obj.name.strip()}, x {_fmt(xmin)}..{_fmt(xmax)}, " \
            f"y {_fmt(ymin)}..{_fmt(ymax)})"

    def drop(kind, why):
        return [Finding(i, kind, f"{where}: {why}", "drop")], None

    if xmax < xmin or ymax < ymin:
        axis = "xmax < xmin" if xmax < xmin else "ymax < ymin"
        return drop("bad_coordinates", f"reversed ({axis})")
    if xmax == xmin or ymax == ymin:
        return drop("zero_area", "zero " + ("width and height" if xmax == xmin and ymax == ymin
                                            else "width" if xmax == xmin else "height"))
    over, image = max(1 - xmin, 1 - ymin, xmax - width, ymax - height), f"{width}x{height} image"
    if over > tolerance:
        return drop("out_of_bounds", f"{_fmt(over)} px outside the {image} (VOC pixels are "
                    f"1..{width}, 1..{height})")
    # clipped (a box inside the image is unchanged)
    ymin, xmin, ymax, xmax = max(ymin, 1), max(xmin, 1), min(ymax, height), min(xmax, width)
    if xmax <= xmin or ymax <= ymin:
        return drop("out_of_bounds", f"outside the {image} (nothing left after clipping)")
    clipped = Finding(i, "out_of_bounds", f"{where}: {_fmt(over)} px outside the {image} "
                      f"(within {tolerance} px: clipped)", "clip")
    return [clipped] if over > 0 else [], (ymin - 1, xmin - 1, ymax - 1, xmax - 1)


def check_annotation(annotation: Annotation, image_size, label_names=BCCD_LABEL_NAMES,
                     tolerance: float = BOUNDS_TOLERANCE,
                     near_duplicate_iou: float = NEAR_DUPLICATE_IOU,
                     item: str = "object") -> CheckedAnnotation:
    """Judge every object of ``annotation`` against the real ``image_size`` (height, width);
    ``item``: what findings call an object (a YOLO file's objects are its lines).

    Rules, in order, on VOC coordinates (1-based inclusive): unknown or missing name ->
    ``unknown_label`` (raise); missing/non-numeric coordinate or max < min ->
    ``bad_coordinates`` (drop); max == min -> ``zero_area`` (drop); outside ``1..W`` x ``1..H``
    by more than ``tolerance`` px -> ``out_of_bounds`` (drop), else (clip); IoU >=
    ``near_duplicate_iou`` with an earlier kept box of its class -> ``near_duplicate_box``
    (drop); ``<size>`` unlike ``image_size`` -> ``size_mismatch`` (raise)."""
    height, width = image_size
    findings = []
    if annotation.size is not None and annotation.size != (height, width):
        findings.append(Finding(None, "size_mismatch",
                                f"<size> says {annotation.size[1]}x{annotation.size[0]} but "
                                f"the image is {width}x{height}: the boxes were drawn for "
                                "another image (resized copy?)", "raise"))
    names = ", ".join(label_names)
    checked = [(obj, *_check_object(obj, height, width, tolerance, item, names))
               for obj in annotation.objects]
    findings += [finding for _, found, _ in checked for finding in found]
    kept = [obj for obj, _, box in checked if box is not None]
    bbox = np.array([box for *_, box in checked if box is not None],
                    dtype=np.float32).reshape(-1, 4)
    labels = np.array([obj.label for obj in kept], dtype=np.int32)
    keep = np.ones(len(kept), dtype=bool)
    for j, k, iou in _duplicates(bbox, labels, near_duplicate_iou, keep):
        obj, name = kept[j], kept[j].name.strip()
        findings.append(Finding(obj.index, "near_duplicate_box",
                                f"{item} {obj.index} ({name}) overlaps {item} {kept[k].index} "
                                f"({name}) with IoU {iou:.2f}: the same cell boxed twice", "drop"))
    return CheckedAnnotation(bbox[keep], labels[keep],
                             np.array([obj.difficult for obj in kept], dtype=bool)[keep],
                             np.array([obj.index for obj in kept], dtype=np.int64)[keep],
                             tuple(findings))


# ------------------------------------------------------------- YOLO label files (TXL-PBC's format)
# A line: ``<class> <x_center> <y_center> <width> <height>``, fractions of the image size; pixels
# [x0, x1] are VOC's x0 + 1 .. x1. A file unreadable, too large, empty or naming an unknown class
# raises a "yolo" DataError; a bad line becomes an object without a box (index: line number).

#: TXL-PBC's classes in its id order (labels/classes.txt: WBC, RBC, Platelet).
TXL_CLASSES = ("wbc", "rbc", "platelets")
MAX_LABEL_BYTES = 1 << 20      # TXL-PBC's largest label file is under 4 kB


def _box(fields, size):
    """A line's ``(xmin, ymin, xmax, ymax)`` in VOC pixels, or ``(None, why)``."""
    if len(fields) != 5:
        return None, (f"has {len(fields)} fields, not 5 (<class> <x_center> <y_center> <width> "
                      "<height>)")
    (height, width), coordinates = size, " ".join(fields[1:])
    try:
        xc, yc, w, h = (float(f) for f in fields[1:])
    except ValueError:
        return None, f"coordinates {coordinates!r} are not all numbers"
    if not all(math.isfinite(v) for v in (xc, yc, w, h)):
        return None, f"coordinates {coordinates!r} are not all finite numbers"
    if w * width < 1 or h * height < 1:
        return None, (f"the box is {w * width:g} x {h * height:g} px (width x height): "
                      "under one pixel")
    x0, y0 = (xc - w / 2) * width, (yc - h / 2) * height
    # to 0.01 px: six-digit fractions would put a box drawn to the frame a hair outside it
    return tuple(round(v, 2) for v in (x0 + 1, y0 + 1, x0 + w * width, y0 + h * height)), None


def parse_yolo_labels(path, image_size, class_names=TXL_CLASSES,
                      label_names=BCCD_LABEL_NAMES) -> Annotation:
    """Read a YOLO label file of an image of ``image_size`` (height, width); judges no box.
    ``class_names[c]``, the file's class ``c``, is looked up in ``label_names``."""
    path = checked_path(path, "path", "a YOLO label file")
    image_size = checked_size(image_size, "image_size")
    data = _read_small_file(path, MAX_LABEL_BYTES, "yolo", "a YOLO label file", "yolo")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _file_error(path, "yolo", f": cannot read it as UTF-8 text ({exc})") from None
    index_of = {name.lower(): i for i, name in enumerate(label_names)}
    classes = ", ".join(f"{i} ({name})" for i, name in enumerate(class_names))
    objects = []
    for number, line in enumerate(text.splitlines(), 1):
        if not (fields := line.split()):
            continue
        token = fields[0]
        if not (token.isascii() and token.isdigit() and int(token) < len(class_names)):
            raise _file_error(path, "yolo", f" line {number}: class {token!r} is not one of "
                              f"{classes}; fix the line or the class list", line=number)
        name = class_names[int(token)]
        objects.append(AnnotatedObject(number, name, index_of.get(name.lower()),
                                       *_box(fields, image_size), False))
    if not objects:
        raise _file_error(path, "yolo", " is empty: it lists no box, yet every smear has cells; "
                          "restore the file from the dataset")
    return Annotation(path, tuple(objects))


# --------------------------------------------------------------------------------- TXL-PBC's links
#: The shipped table of the TXL-PBC images that are BCCD's (see :mod:`medaidet.data.txl_pbc`).
LINKS_FILE = Path(__file__).parent / "manifests" / "txl-pbc-bccd.tsv"


@dataclass(frozen=True)
class Link:
    """A TXL-PBC image that is a BCCD image: TXL-PBC's split and stem, BCCD's id and split."""
    txl_split: str
    txl_name: str
    bccd_id: str
    bccd_split: str

    def label_path(self, txl_root) -> Path:
        """TXL-PBC's label file of this image under ``txl_root``."""
        return Path(txl_root) / "TXL_PBC" / "labels" / self.txl_split / f"{self.txl_name}.txt"


def read_links(path, cls=Link) -> list:
    """A shipped table of links (``.tsv`` with ``cls``'s fields as its header)."""
    path = checked_path(path, "path", "a shipped table of links (.tsv)")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    header = [f.name for f in fields(cls)]
    if not rows or rows[0] != header:
        raise MedaidetError(f"{path}: expected the header {header}, found "
                            f"{rows[0] if rows else 'an empty file'}")
    return [cls(*row) for row in rows[1:]]


def bccd_links(path=LINKS_FILE) -> list[Link]:
    """The shipped table of TXL-PBC images that are BCCD images, at the pinned commit."""
    return read_links(path)


# ------------------------------------------------------------------------------------- the dataset
class ObjectIssue(NamedTuple):
    """An object the loader dropped or clipped."""
    image_id: str
    index: int
    kind: str
    detail: str


class BCCDDataset(GetterDataset):
    """BCCD (or any dataset in its VOC layout) for ChainerCV: ``(img, bbox, label)``.

    Args:
        root: dataset root (str or ``os.PathLike``, else ConfigError); None:
            ``$MEDAIDET_DATA``, else the cache directory.
        split: ``'train'`` (205), ``'val'`` (87), ``'trainval'`` (292) or ``'test'`` (72).
        strict: raise a DataError instead of dropping or clipping an object.
        use_difficult, return_difficult: as ChainerCV's (BCCD marks no object difficult).
        labels: ``'bccd'`` or ``'txl-pbc'`` (only the images TXL-PBC re-annotated).
        reannotated_only: only the 221 images TXL-PBC re-annotated, whatever ``labels``.
        txl_root: TXL-PBC's root; None: ``$MEDAIDET_TXL_PBC``, else the cache directory.

    Annotations are checked at construction, images decoded on access. :attr:`dropped` /
    :attr:`clipped` list the objects dropped and clipped; :attr:`sizes`, each (height, width).
    """

    def __init__(self, root=None, split: str = "train", strict: bool = False,
                 use_difficult: bool = False, return_difficult: bool = False,
                 labels: str = "bccd", reannotated_only: bool = False, txl_root=None):
        super().__init__()
        if root is not None and not is_path(root):
            raise ConfigError(f"root: {root!r} is not a folder path; pass a str or os.PathLike "
                              "(the folder with Annotations/), or None for $MEDAIDET_DATA")
        if labels not in LABELS:
            raise ConfigError(f"labels: {labels!r} is not one of {', '.join(LABELS)}")
        self.root, self.split, self.strict, self.labels = resolve_root(root), split, strict, labels
        self.label_names = BCCD_LABEL_NAMES
        self.ids = read_split(self.root, split)
        if labels == "txl-pbc" or reannotated_only:
            links = {link.bccd_id: link for link in bccd_links()}
            self.ids = [image_id for image_id in self.ids if image_id in links]
        if labels == "txl-pbc":
            self.txl_root = resolve_root(txl_root, TXL_PBC)
        self.dropped, self.clipped, self.sizes, self._boxes = [], [], [], []
        for image_id in self.ids:
            label_path = (annotation_path(self.root, image_id) if labels == "bccd" else
                          links[image_id].label_path(self.txl_root))
            self._read(image_id, label_path, use_difficult)
        if issues := self.dropped + self.clipped:
            shown = "; ".join(f"{d.image_id}: {d.detail}" for d in issues[:3])
            warn_once(f"BCCD {split} ({self.root}{', TXL-PBC labels' if labels != 'bccd' else ''})"
                      f": dropped {len(self.dropped)} and clipped {len(self.clipped)} object(s): "
                      + shown + (f"; and {len(issues) - 3} more" if len(issues) > 3 else "")
                      + ". See dataset.dropped / dataset.clipped; strict=True raises instead",
                      stacklevel=3)      # the line that built the dataset
        self.add_getter("img", self._get_image)
        self.add_getter(("bbox", "label", "difficult"), self._get_annotations)
        if not return_difficult:
            self.keys = ("img", "bbox", "label")

    def _read(self, image_id: str, label_path, use_difficult: bool) -> None:
        """One image's size and boxes, checked (dropped and clipped objects recorded)."""
        img_path = image_path(self.root, image_id)
        for path, what in ((label_path, "annotation"), (img_path, "image")):
            if not path.is_file():
                raise DataError(f"{split_path(self.root, self.split)} lists {image_id}, but its "
                                f"{what} {path} does not exist: restore the file or remove the id",
                                "missing_file", path=path, image_id=image_id)
        size, bccd = read_image_size(img_path, image_id), self.labels == "bccd"
        annotation = parse_annotation(label_path) if bccd else parse_yolo_labels(label_path, size)
        checked = check_annotation(annotation, size, item="object" if bccd else "line")
        for finding in checked.findings:
            if finding.action == "raise" or self.strict:
                raise self._error(finding, label_path, image_id, annotation)
            (self.dropped if finding.action == "drop" else self.clipped).append(
                ObjectIssue(image_id, finding.index, finding.kind, finding.detail))
        keep = slice(None) if use_difficult else ~checked.difficult
        self.sizes.append(size)
        self._boxes.append((checked.bbox[keep], checked.label[keep], checked.difficult[keep]))

    @staticmethod
    def _error(finding: Finding, path, image_id, annotation) -> DataError:
        message, where = f"{path}: {finding.detail}", {"path": path, "image_id": image_id}
        if finding.kind == "unknown_label":
            return DataError(message + "; fix the name in the XML", "label", **where,
                             object_index=finding.index,
                             name=annotation.objects[finding.index].name)
        if finding.kind == "size_mismatch":
            return DataError(message, "image_size", **where)
        default = "clips" if finding.action == "clip" else "drops"
        return DataError(f"{message} (strict mode; the default {default} it)", finding.kind,
                         **where, object_index=finding.index)

    def __len__(self):
        return len(self.ids)

    def _get_image(self, i):
        path = image_path(self.root, self.ids[i])
        # PIL, not cv2: PIL raises on a truncated file, cv2 returns the missing part grey
        img = decode_image(path, self.ids[i]).pixels.transpose(2, 0, 1).astype(np.float32)
        if img.shape[1:] != self.sizes[i]:
            raise DataError(f"{path} changed size since the dataset was built: {img.shape[1:]} "
                            f"!= {self.sizes[i]}", "image", path=path, image_id=self.ids[i])
        return img

    def _get_annotations(self, i):
        return tuple(array.copy() for array in self._boxes[i])


def quiet_annotation_warnings() -> None:
    """Set :data:`QUIET_ENV`; objects are still dropped, clipped and listed, without warning."""
    os.environ[QUIET_ENV] = "1"


def annotation_report(root=None, splits=("train", "val", "test")) -> Table:
    """One row per split: its images, the objects kept, dropped and clipped, and the kinds why."""
    table = Table(["split", "images", "objects kept", "dropped", "clipped", "why"])
    for split in splits:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AnnotationWarning)
            dataset = BCCDDataset(root, split)
        kept = sum(len(label) for label in dataset.slice[:, "label"])
        why = Counter(issue.kind for issue in dataset.dropped + dataset.clipped)
        table.append([split, len(dataset), kept, len(dataset.dropped), len(dataset.clipped),
                      ", ".join(f"{kind} {n}" for kind, n in why.items()) or "-"])
    return table
