"""BCCD as a ChainerCV dataset, and the annotation checks the validator shares.

Layout (Pascal VOC)::

    ROOT/ImageSets/Main/{train,val,trainval,test}.txt   one image id per line
    ROOT/Annotations/<id>.xml                            VOC XML, one <object> per box
    ROOT/JPEGImages/<id>.jpg

Files are found by the ids in the split lists, never by the XML's ``<filename>``,
``<path>`` or ``<folder>`` (BCCD's carry annotators' machine paths).

Conventions (the same as ChainerCV's ``VOCBboxDataset``):

* ``img``: float32, shape (3, H, W), RGB, values 0-255.
* ``bbox``: float32, shape (R, 4), ``(y_min, x_min, y_max, x_max)``, 0-based. VOC XML
  stores 1-based inclusive pixel indices; 1 is subtracted from every coordinate.
* ``label``: int32, shape (R,), index into :data:`BCCD_LABEL_NAMES`.
* ``difficult``: bool, shape (R,) (only with ``return_difficult=True``).

Images are decoded by :func:`decode_image` (PIL), the one rule of what is readable, shared
with ``validate_dataset``: 8-bit RGB as is; other 8-bit modes (grayscale, palette, CMYK)
converted to RGB; 16-bit grayscale scaled to 0-255 (``value / 257``, never clipped to
white); an alpha channel dropped when every pixel is opaque. A truncated file, transparent
pixels or another pixel format raise :class:`ImageError` when the image is read.

What the loader does with defective annotations (``validate_dataset`` reports the same
findings, from the same code: :func:`parse_annotation` and :func:`check_annotation`):

* a defect of the whole file raises, in both modes: XML that is not well-formed or uses a
  DTD/entities (:class:`AnnotationParseError`, :class:`UnsafeXMLError`), a label that is not
  rbc/wbc/platelets (:class:`UnknownLabelError`), ``<size>`` that disagrees with the image
  (:class:`ImageSizeError`), a listed id without its files (:class:`MissingFileError`), a bad
  split list (:class:`SplitError`), an unreadable image (:class:`ImageError`);
* a defective object is dropped with an :class:`AnnotationWarning` (``strict=True``: raises
  :class:`InvalidObjectError`): missing ``<bndbox>`` or coordinate, non-numeric coordinate,
  reversed coordinates, zero width or height, more than :data:`BOUNDS_TOLERANCE` px outside
  the image, an exact or near duplicate (IoU >= :data:`NEAR_DUPLICATE_IOU`, same class) of an
  earlier box. A box overhanging the image by at most :data:`BOUNDS_TOLERANCE` px is clipped
  (strict: raises). The dataset lists them in :attr:`BCCDDataset.dropped` and
  :attr:`BCCDDataset.clipped`.
"""
from __future__ import annotations

import functools
import math
import re
import warnings
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import defusedxml
import defusedxml.ElementTree as SafeET
import numpy as np
from chainercv.chainer_experimental.datasets.sliceable import GetterDataset
from PIL import Image

from medaidet.arguments import ArgumentValueError, is_path
from medaidet.data import SPLITS
from medaidet.data.download import resolve_root
from medaidet.errors import MedaidetError

__all__ = [
    "BCCD_LABEL_NAMES", "CLASS_COLORS", "BOUNDS_TOLERANCE", "NEAR_DUPLICATE_IOU",
    "BCCDDataset", "Annotation", "AnnotatedObject", "Finding", "CheckedAnnotation",
    "ObjectIssue", "DecodedImage", "parse_annotation", "check_annotation", "read_split",
    "scan_split_file", "read_image_size", "decode_image", "annotation_path", "image_path",
    "split_path",
    "AnnotationError", "AnnotationParseError", "UnsafeXMLError", "UnknownLabelError",
    "InvalidObjectError", "ImageSizeError", "SplitError", "MissingFileError", "ImageError",
    "AnnotationWarning",
]

#: Class names in the course's order: label 0 is rbc, 1 wbc, 2 platelets. The XML
#: says ``RBC``, ``WBC``, ``Platelets``; names are matched case-insensitively, stripped.
BCCD_LABEL_NAMES = ("rbc", "wbc", "platelets")
#: One matplotlib colour per class, the same in every figure of the course.
CLASS_COLORS = {"rbc": "tab:red", "wbc": "tab:blue", "platelets": "tab:green"}

#: Pixels a box may overhang the image and be clipped rather than dropped
#: (0-based exports write ``xmin = 0``; VOC's smallest index is 1).
BOUNDS_TOLERANCE = 2
#: Two boxes of one class overlapping at least this much (IoU) are the same cell boxed twice.
NEAR_DUPLICATE_IOU = 0.9

MAX_XML_BYTES = 8 << 20     # BCCD's largest annotation is ~6 kB
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,254}")
_COORDS = ("xmin", "ymin", "xmax", "ymax")


# --------------------------------------------------------------------------- errors

class AnnotationError(MedaidetError):
    """An annotation file (or one object in it) the loader cannot use as written."""

    def __init__(self, message: str, path=None, image_id=None, object_index=None):
        super().__init__(message)
        self.path = None if path is None else Path(path)
        self.image_id = image_id
        self.object_index = object_index


class AnnotationParseError(AnnotationError):
    """The file is not well-formed XML, or not a VOC ``<annotation>``."""


class UnsafeXMLError(AnnotationParseError):
    """The XML declares a DTD or entities (entity expansion, external entities): refused."""


class UnknownLabelError(AnnotationError):
    """An object's ``<name>`` is missing or not one of :data:`BCCD_LABEL_NAMES`."""

    def __init__(self, message: str, path=None, image_id=None, object_index=None, name=None):
        super().__init__(message, path, image_id, object_index)
        self.name = name


class InvalidObjectError(AnnotationError):
    """``strict=True``: an object the default mode would drop or clip."""

    def __init__(self, message: str, path=None, image_id=None, object_index=None, kind=None):
        super().__init__(message, path, image_id, object_index)
        self.kind = kind


class ImageSizeError(AnnotationError):
    """The XML's ``<size>`` disagrees with the image: the boxes were drawn for another image."""


class SplitError(MedaidetError):
    """A split list is missing, empty, has a duplicate or malformed id, or the split is unknown."""

    def __init__(self, message: str, path=None, image_id=None):
        super().__init__(message)
        self.path = None if path is None else Path(path)
        self.image_id = image_id


class MissingFileError(MedaidetError):
    """An id listed in a split has no annotation or no image file."""

    def __init__(self, message: str, path=None, image_id=None):
        super().__init__(message)
        self.path = None if path is None else Path(path)
        self.image_id = image_id


class ImageError(MedaidetError):
    """An image file cannot be decoded (not an image, truncated, corrupt), or not as 8-bit
    RGB (transparent pixels, a pixel format other than those :func:`decode_image` takes)."""

    def __init__(self, message: str, path=None, image_id=None):
        super().__init__(message)
        self.path = None if path is None else Path(path)
        self.image_id = image_id


class AnnotationWarning(UserWarning):
    """Objects were dropped or clipped while loading (see ``.dropped`` / ``.clipped``)."""


# Every split is loaded several times in a run (a notebook, the training recipe, the
# evaluator): its report is shown the first time only, wherever the loading happens (a
# record of our own: Python's "once" filter forgets whenever warning filters change).
_REPORTED = set()


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
    """The ids of ``split`` (train, val, trainval or test); raises :class:`SplitError`."""
    if split not in SPLITS:
        raise SplitError(f"unknown split {split!r}: choose one of {', '.join(SPLITS)}")
    path = split_path(root, split)
    ids, problems = scan_split_file(path)
    if problems:
        first = problems[0]
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise SplitError(first.detail + more, path=path, image_id=first.image_id)
    return ids


# --------------------------------------------------------------------------- parsing

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
    Raises :class:`MissingFileError`, :class:`AnnotationParseError` or
    :class:`UnsafeXMLError`. Parsed files are cached in memory, keyed by path and content.
    """
    path = Path(path)
    image_id = path.stem
    try:
        size = path.stat().st_size
        if size > MAX_XML_BYTES:
            raise AnnotationParseError(
                f"{path}: {size} bytes is too large for an annotation file (limit "
                f"{MAX_XML_BYTES}); is it really VOC XML?", path=path, image_id=image_id)
        data = path.read_bytes()
    except FileNotFoundError:
        raise MissingFileError(f"annotation file {path} does not exist", path=path,
                               image_id=image_id) from None
    except OSError as exc:
        raise AnnotationParseError(f"{path}: cannot read the annotation ({exc})",
                                   path=path, image_id=image_id) from None
    return _parse_cached(str(path), data, tuple(label_names))


@functools.lru_cache(maxsize=4096)
def _parse_cached(path_text: str, data: bytes, label_names) -> Annotation:
    path = Path(path_text)
    image_id = path.stem

    def fail(cls, why):
        return cls(f"{path}: {why}", path=path, image_id=image_id)

    try:
        root = SafeET.fromstring(data, forbid_dtd=True)
    except defusedxml.DefusedXmlException as exc:
        raise fail(UnsafeXMLError, f"refused: the XML declares a DTD or entities ({exc!r}); "
                   "VOC annotations need neither, so nothing is expanded or fetched. "
                   "Remove the <!DOCTYPE ...> block") from None
    except (ET.ParseError, ValueError, LookupError, UnicodeError) as exc:
        raise fail(AnnotationParseError, f"not well-formed XML ({exc}); re-export it from "
                   "the annotation tool or restore it from the original dataset") from None
    if root.tag != "annotation":
        raise fail(AnnotationParseError, f"the root element is <{root.tag}>, not "
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


def read_image_size(path, image_id=None) -> tuple[int, int]:
    """(height, width) from the image header (no decoding). Raises
    :class:`MissingFileError` or :class:`ImageError`."""
    path = Path(path)
    try:
        with Image.open(path) as img:
            width, height = img.size
    except FileNotFoundError:
        raise MissingFileError(f"image file {path} does not exist", path=path,
                               image_id=image_id) from None
    except Exception as exc:     # PIL raises OSError, SyntaxError, ValueError, ...
        raise ImageError(f"{path} is not a readable image ({type(exc).__name__}: {exc}); "
                         "restore it from the original dataset", path=path,
                         image_id=image_id) from None
    return height, width


class DecodedImage(NamedTuple):
    """An image as the loader uses it, and how it got so.

    pixels: uint8, shape (H, W, 3), RGB. mode: the file's PIL mode (``"RGB"``, ``"L"``,
    ``"RGBA"``, ``"I;16"``...). bands: its number of channels. conversion: what was done
    to make it 8-bit RGB, a sentence naming the file; None for an 8-bit RGB file.
    """
    pixels: np.ndarray
    mode: str
    bands: int
    conversion: str | None


_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def _to_rgb(img: Image.Image, path: Path, image_id) -> tuple[np.ndarray, str | None]:
    """The loaded ``img`` as uint8 (H, W, 3) RGB, and the conversion made (or None)."""
    mode = img.mode
    if mode == "RGB":
        return np.asarray(img), None
    if mode in _SIXTEEN_BIT:
        values = np.asarray(img)
        low, high = (int(v) for v in img.getextrema())
        if low < 0 or high > 65535:
            raise ImageError(f"{path} is a {mode} image with values {low}..{high}, beyond 16 "
                             "bits; save it as an 8-bit RGB JPEG", path=path, image_id=image_id)
        gray = ((values.astype(np.uint32) + 128) // 257).astype(np.uint8)   # 65535 -> 255
        return (np.repeat(gray[:, :, None], 3, axis=2),
                f"{path} is 16-bit grayscale ({mode}): scaled to 8 bits (value / 257) and "
                "repeated in R, G and B")
    if img.has_transparency_data:
        rgba = img.convert("RGBA")
        alpha = np.asarray(rgba.getchannel("A"))
        transparent = int(np.count_nonzero(alpha < 255))
        if transparent:
            raise ImageError(
                f"{path} has {transparent} transparent pixel(s) (mode {mode}): the colours "
                "under them are not what a viewer shows. Flatten it onto its background and "
                "save it as an RGB JPEG", path=path, image_id=image_id)
        return (np.asarray(rgba.convert("RGB")),
                f"{path} is {mode} with every pixel opaque: alpha channel dropped")
    if mode in ("L", "P", "1", "CMYK", "YCbCr", "LAB", "HSV"):
        return (np.asarray(img.convert("RGB")),
                f"{path} is {mode} (not RGB): converted to 8-bit RGB"
                + (" (the gray value in R, G and B)" if mode in ("L", "1") else ""))
    raise ImageError(f"{path} has the pixel format {mode}, which is not read as an image "
                     "(32-bit or floating-point data?); save it as an 8-bit RGB JPEG",
                     path=path, image_id=image_id)


def decode_image(path, image_id=None, draft_size=None) -> DecodedImage:
    """Decode an image as the loader uses it (8-bit RGB): the one readability rule, shared
    by :class:`BCCDDataset` and ``validate_dataset``.

    * 8-bit RGB: as is;
    * 8-bit grayscale, palette, bilevel, CMYK, YCbCr: PIL's conversion to RGB;
    * 16-bit grayscale (PNG/TIFF): ``value / 257``, rounded (0..65535 -> 0..255, so the
      picture looks as in a viewer; not clipped to white), in R, G and B;
    * an alpha channel (RGBA, LA, a palette with transparency): dropped when every pixel
      is opaque; a transparent pixel raises :class:`ImageError`, since the colours under
      it are not what the annotator saw;
    * anything else (32-bit, floating point) and any undecodable data raise
      :class:`ImageError`; a missing file raises :class:`MissingFileError`.

    ``draft_size`` (width, height): a JPEG is decoded at the smallest scale not below it
    (the validator's thumbnails); other formats in full.
    """
    path = Path(path)
    try:
        with Image.open(path) as img:
            if draft_size is not None:
                img.draft("RGB", draft_size)
            img.load()
            pixels, conversion = _to_rgb(img, path, image_id)
            return DecodedImage(pixels, img.mode, len(img.getbands()), conversion)
    except FileNotFoundError:
        raise MissingFileError(f"image file {path} does not exist", path=path,
                               image_id=image_id) from None
    except MedaidetError:
        raise
    except Exception as exc:     # PIL: OSError (truncated), SyntaxError, ValueError, ...
        raise ImageError(f"{path} cannot be decoded ({type(exc).__name__}: {exc}); "
                         "restore it from the original dataset", path=path,
                         image_id=image_id) from None


# --------------------------------------------------------------------------- checks

class Finding(NamedTuple):
    """One defect :func:`check_annotation` found and what the loader does with it."""
    index: int | None        # object index (0-based, order in the file); None: the whole file
    kind: str                # unknown_label, size_mismatch, bad_coordinates, zero_area, ...
    detail: str
    action: str              # "raise" | "drop" | "clip"


class CheckedAnnotation(NamedTuple):
    """The boxes the loader keeps, in ChainerCV's convention, and the findings.

    bbox: float32 (R, 4) ``(y_min, x_min, y_max, x_max)``, 0-based. label: int32 (R,).
    difficult: bool (R,). index: int64 (R,), the object index of each kept box.
    """
    bbox: np.ndarray
    label: np.ndarray
    difficult: np.ndarray
    index: np.ndarray
    findings: tuple[Finding, ...]


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _iou(box, others):
    """IoU of ``box`` (4,) with each of ``others`` (N, 4), both
    ``(y_min, x_min, y_max, x_max)``: shape (N,); 0 for empty unions."""
    tl = np.maximum(box[:2], others[:, :2])
    br = np.minimum(box[2:], others[:, 2:])
    inter = np.prod(np.clip(br - tl, 0, None), axis=1)
    union = np.prod(box[2:] - box[:2]) + np.prod(others[:, 2:] - others[:, :2], axis=1) - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def _duplicates(bbox, labels, threshold):
    """Yield ``(j, k, exact, iou)`` for each box ``j`` (in order) that repeats an earlier
    kept box ``k`` of its class: the first with the same coordinates (``exact``), else
    the first with IoU >= ``threshold``. A box yielded is not kept.

    ``bbox``: float32 (R, 4) ``(y_min, x_min, y_max, x_max)``, no empty box; ``labels``:
    int (R,). Memory is O(R), whatever R (an all-pairs IoU matrix of 10,000 boxes takes
    GBs). Only boxes whose ``y_min`` lie within a band are compared: for IoU >= t > 0,
    the intersection is at most ``(h - d) * w`` of the upper box (height ``h``, width
    ``w``, ``d`` the difference of the ``y_min``), so ``d <= (1 - t) * h``.
    """
    boxes = bbox.astype(np.float64)
    keep = np.ones(len(boxes), dtype=bool)
    if len(boxes) < 2:
        return
    band = ((1 - threshold) * float(np.max(boxes[:, 2] - boxes[:, 0])) + 1e-6
            if threshold > 0 else np.inf)
    order = np.argsort(boxes[:, 0], kind="stable")
    tops = boxes[order, 0]
    for j in range(1, len(boxes)):
        lo = np.searchsorted(tops, boxes[j, 0] - band, side="left")
        hi = np.searchsorted(tops, boxes[j, 0] + band, side="right")
        near_by = np.sort(order[lo:hi])
        near_by = near_by[near_by < j]
        earlier = near_by[keep[near_by] & (labels[near_by] == labels[j])]
        if not len(earlier):
            continue
        iou = _iou(boxes[j], boxes[earlier])
        exact = np.flatnonzero(np.all(bbox[earlier] == bbox[j], axis=1))
        near = np.flatnonzero(iou >= threshold)
        if len(exact) or len(near):
            first = exact[0] if len(exact) else near[0]
            keep[j] = False
            yield j, int(earlier[first]), bool(len(exact)), float(iou[first])


def check_annotation(annotation: Annotation, image_size, label_names=BCCD_LABEL_NAMES,
                     tolerance: float = BOUNDS_TOLERANCE,
                     near_duplicate_iou: float = NEAR_DUPLICATE_IOU) -> CheckedAnnotation:
    """Judge every object of ``annotation`` against the real ``image_size`` (height, width).

    Rules, in order, on the VOC coordinates as written (1-based inclusive):
    unknown or missing name -> ``unknown_label`` (raise); missing/non-numeric coordinate ->
    ``bad_coordinates`` (drop); ``xmax < xmin`` or ``ymax < ymin`` -> ``bad_coordinates``
    (drop); ``xmax == xmin`` or ``ymax == ymin`` -> ``zero_area`` (drop); outside
    ``1..W`` x ``1..H`` by more than ``tolerance`` px -> ``out_of_bounds`` (drop), by at
    most ``tolerance`` -> ``out_of_bounds`` (clip); the same class and coordinates as an
    earlier kept box -> ``duplicate_box`` (drop), IoU >= ``near_duplicate_iou`` with one ->
    ``near_duplicate_box`` (drop). ``<size>`` disagreeing with ``image_size`` ->
    ``size_mismatch`` (raise).
    """
    height, width = image_size
    findings = []
    if annotation.size is not None and annotation.size != (height, width):
        findings.append(Finding(None, "size_mismatch",
                                f"<size> says {annotation.size[1]}x{annotation.size[0]} but "
                                f"the image is {width}x{height}: the boxes were drawn for "
                                "another image (resized copy?)", "raise"))
    names = ", ".join(label_names)
    candidates = []            # (index, label, box 0-based, difficult)
    for obj in annotation.objects:
        i = obj.index
        if obj.label is None:
            why = ("has no <name>" if obj.name is None else
                   f"is named {obj.name!r}, not one of {names} (case-insensitive)")
            findings.append(Finding(i, "unknown_label", f"object {i} {why}", "raise"))
            continue
        if obj.bndbox is None:
            findings.append(Finding(i, "bad_coordinates", f"object {i} ({obj.name.strip()}): "
                                    f"{obj.problem}", "drop"))
            continue
        xmin, ymin, xmax, ymax = obj.bndbox
        where = f"object {i} ({obj.name.strip()}, x {_fmt(xmin)}..{_fmt(xmax)}, " \
                f"y {_fmt(ymin)}..{_fmt(ymax)})"
        if xmax < xmin or ymax < ymin:
            axis = "xmax < xmin" if xmax < xmin else "ymax < ymin"
            findings.append(Finding(i, "bad_coordinates", f"{where}: reversed ({axis})", "drop"))
            continue
        if xmax == xmin or ymax == ymin:
            which = ("width and height" if xmax == xmin and ymax == ymin else
                     "width" if xmax == xmin else "height")
            findings.append(Finding(i, "zero_area", f"{where}: zero {which}", "drop"))
            continue
        over = max(1 - xmin, 1 - ymin, xmax - width, ymax - height)
        if over > tolerance:
            findings.append(Finding(i, "out_of_bounds", f"{where}: {_fmt(over)} px outside the "
                                    f"{width}x{height} image (VOC pixels are 1..{width}, "
                                    f"1..{height})", "drop"))
            continue
        if over > 0:
            xmin, ymin = max(xmin, 1), max(ymin, 1)
            xmax, ymax = min(xmax, width), min(ymax, height)
            if xmax <= xmin or ymax <= ymin:
                findings.append(Finding(i, "out_of_bounds", f"{where}: outside the {width}x"
                                        f"{height} image (nothing left after clipping)", "drop"))
                continue
            findings.append(Finding(i, "out_of_bounds", f"{where}: {_fmt(over)} px outside the "
                                    f"{width}x{height} image (within {tolerance} px: clipped)",
                                    "clip"))
        candidates.append((i, obj.label, (ymin - 1, xmin - 1, ymax - 1, xmax - 1),
                           obj.difficult))

    bbox = np.array([c[2] for c in candidates], dtype=np.float32).reshape(-1, 4)
    labels = np.array([c[1] for c in candidates], dtype=np.int32)
    keep = np.ones(len(candidates), dtype=bool)
    for j, k, exact, iou in _duplicates(bbox, labels, near_duplicate_iou):
        name = annotation.objects[candidates[j][0]].name.strip()
        if exact:
            detail = (f"object {candidates[j][0]} ({name}) repeats object "
                      f"{candidates[k][0]}: same class and coordinates")
            kind = "duplicate_box"
        else:
            detail = (f"object {candidates[j][0]} ({name}) overlaps object "
                      f"{candidates[k][0]} ({name}) with IoU {iou:.2f}: the same "
                      "cell boxed twice")
            kind = "near_duplicate_box"
        findings.append(Finding(candidates[j][0], kind, detail, "drop"))
        keep[j] = False
    return CheckedAnnotation(
        bbox=bbox[keep], label=labels[keep],
        difficult=np.array([c[3] for c in candidates], dtype=bool).reshape(-1)[keep],
        index=np.array([c[0] for c in candidates], dtype=np.int64).reshape(-1)[keep],
        findings=tuple(findings))


# --------------------------------------------------------------------------- dataset

class ObjectIssue(NamedTuple):
    """An object the loader dropped or clipped."""
    image_id: str
    index: int               # 0-based position among the file's <object> elements
    kind: str
    detail: str


_RAISES = {"unknown_label": UnknownLabelError, "size_mismatch": ImageSizeError}


class BCCDDataset(GetterDataset):
    """BCCD (or any dataset in its VOC layout) for ChainerCV: ``(img, bbox, label)``.

    Args:
        root: dataset root, a str or ``os.PathLike`` (else
            :class:`medaidet.arguments.ArgumentValueError`); None: ``$MEDAIDET_DATA``,
            else the cache directory (:func:`medaidet.data.download.resolve_root`).
        split: ``'train'`` (205), ``'val'`` (87), ``'trainval'`` (292) or ``'test'`` (72).
        strict: raise :class:`InvalidObjectError` instead of dropping/clipping objects.
        use_difficult: keep objects marked difficult (ChainerCV's default: skip them;
            BCCD marks none).
        return_difficult: also return ``difficult`` (bool, (R,)).

    Keys: ``img`` (float32 (3, H, W) RGB 0-255), ``bbox`` (float32 (R, 4)
    ``(y_min, x_min, y_max, x_max)``, 0-based), ``label`` (int32 (R,), index into
    :data:`BCCD_LABEL_NAMES`) and, with ``return_difficult``, ``difficult``. Supports
    ChainerCV's ``dataset.slice[:, ('img', 'bbox')]``.

    Every annotation of the split is parsed and checked at construction (well under a
    second for BCCD) and the boxes kept in memory; images are decoded on access.
    Construction raises on file-level defects (see the module docstring); dropped and
    clipped objects are listed in :attr:`dropped` / :attr:`clipped` and announced by one
    :class:`AnnotationWarning`.
    """

    def __init__(self, root=None, split: str = "train", strict: bool = False,
                 use_difficult: bool = False, return_difficult: bool = False):
        super().__init__()
        if root is not None and not is_path(root):
            raise ArgumentValueError(
                f"root: {root!r} is not a folder path; expected a str or os.PathLike naming "
                "the dataset root (the folder with Annotations/), or None for $MEDAIDET_DATA, "
                "else the cache directory")
        self.root = resolve_root(root)
        self.split = split
        self.strict = strict
        self.label_names = BCCD_LABEL_NAMES
        self.ids = read_split(self.root, split)
        self.dropped: list[ObjectIssue] = []
        self.clipped: list[ObjectIssue] = []
        self._image_paths, self._sizes, self._boxes = [], [], []
        for image_id in self.ids:
            xml_path = annotation_path(self.root, image_id)
            img_path = image_path(self.root, image_id)
            for path, what in ((xml_path, "annotation"), (img_path, "image")):
                if not path.is_file():
                    raise MissingFileError(
                        f"{split_path(self.root, split)} lists {image_id}, but its {what} "
                        f"{path} does not exist: restore the file or remove the id",
                        path=path, image_id=image_id)
            annotation = parse_annotation(xml_path)
            size = read_image_size(img_path, image_id)
            checked = check_annotation(annotation, size)
            for finding in checked.findings:
                if finding.action == "raise" or strict:
                    raise self._error(finding, xml_path, image_id, annotation)
                record = ObjectIssue(image_id, finding.index, finding.kind, finding.detail)
                (self.dropped if finding.action == "drop" else self.clipped).append(record)
            keep = slice(None) if use_difficult else ~checked.difficult
            self._image_paths.append(img_path)
            self._sizes.append(size)
            self._boxes.append((checked.bbox[keep], checked.label[keep],
                                checked.difficult[keep]))
        if self.dropped or self.clipped:
            shown = "; ".join(f"{d.image_id}: {d.detail}"
                              for d in (self.dropped + self.clipped)[:3])
            more = len(self.dropped) + len(self.clipped) - 3
            message = (
                f"BCCD {split} ({self.root}): dropped {len(self.dropped)} and clipped "
                f"{len(self.clipped)} object(s): {shown}{f'; and {more} more' if more > 0 else ''}"
                ". See dataset.dropped / dataset.clipped; strict=True raises instead")
            if message not in _REPORTED:
                _REPORTED.add(message)
                warnings.warn(AnnotationWarning(message), stacklevel=2)

        self.add_getter("img", self._get_image)
        self.add_getter(("bbox", "label", "difficult"), self._get_annotations)
        if not return_difficult:
            self.keys = ("img", "bbox", "label")

    @staticmethod
    def _error(finding: Finding, path, image_id, annotation) -> AnnotationError:
        message = f"{path}: {finding.detail}"
        if finding.kind == "unknown_label":
            name = annotation.objects[finding.index].name
            return UnknownLabelError(message + "; fix the name in the XML",
                                     path, image_id, finding.index, name)
        if finding.kind == "size_mismatch":
            return ImageSizeError(message, path, image_id)
        default = "clips" if finding.action == "clip" else "drops"
        return InvalidObjectError(f"{message} (strict mode; the default {default} it)",
                                  path, image_id, finding.index, finding.kind)

    def __len__(self):
        return len(self.ids)

    def _get_image(self, i):
        path = self._image_paths[i]
        # PIL, not cv2: PIL raises on a truncated file, cv2 only warns and returns the
        # missing part grey.
        img = decode_image(path, self.ids[i]).pixels.transpose(2, 0, 1).astype(np.float32)
        if img.shape[1:] != self._sizes[i]:
            raise ImageError(f"{path} changed size since the dataset was built: "
                             f"{img.shape[1:]} != {self._sizes[i]}", path, self.ids[i])
        return img

    def _get_annotations(self, i):
        bbox, label, difficult = self._boxes[i]
        return bbox.copy(), label.copy(), difficult.copy()
