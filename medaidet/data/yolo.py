"""A YOLO label file (TXL-PBC's format), read into the same :class:`Annotation` a VOC file
gives, so that one rule (:func:`~medaidet.data.annotation_checks.check_annotation`) judges
both.

Each line is ``<class> <x_center> <y_center> <width> <height>``: the class an index into the
dataset's ``classes.txt``, the four numbers fractions of the image's width and height. A box
``[x0, x1]`` in pixels (``x0 = (x_center - width / 2) * W``) covers the VOC pixels
``x0 + 1 .. x1``, so a box over the whole image is exactly VOC's ``1 .. W``.

What :func:`parse_yolo_labels` does with a defect, the way BCCD's loader does:

* the whole file raises a ``"yolo"`` DataError: unreadable, larger than
  :data:`MAX_LABEL_BYTES`, empty (every smear has cells: an empty file is a lost export), a
  class that is not an index of ``class_names``;
* one line becomes an object without a box (dropped by ``check_annotation``, with the line
  number): not five fields, a coordinate that is not a finite number, a width or height
  under one pixel. Boxes out of the image are judged by ``check_annotation`` (clipped
  within :data:`~medaidet.data.annotation_checks.BOUNDS_TOLERANCE` px, else dropped).

In the :class:`Annotation`, an object's ``index`` is its line number (1-based) and its
``name`` the class's name.
"""
from __future__ import annotations

import math
from pathlib import Path

from medaidet.arguments import checked_path, checked_size
from medaidet.data import BCCD_LABEL_NAMES
from medaidet.data.annotation import AnnotatedObject, Annotation
from medaidet.errors import DataError
from medaidet.files import not_a_regular_file

__all__ = ["parse_yolo_labels", "TXL_CLASSES", "MAX_LABEL_BYTES"]

#: TXL-PBC's classes (its labels/classes.txt: WBC, RBC, Platelet), in its id order, as the
#: course names them.
TXL_CLASSES = ("wbc", "rbc", "platelets")
MAX_LABEL_BYTES = 1 << 20      # TXL-PBC's largest label file is under 4 kB


def _read_text(path: Path) -> str:
    why = not_a_regular_file(path)
    if why:
        raise DataError(f"{path} is {why}, not a YOLO label file", "yolo", path=path,
                        image_id=path.stem)
    try:
        size = path.stat().st_size
        if size > MAX_LABEL_BYTES:
            raise DataError(f"{path}: {size} bytes is too large for a YOLO label file "
                            f"(limit {MAX_LABEL_BYTES})",
                            "yolo", path=path, image_id=path.stem)
        return path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise DataError(f"label file {path} does not exist",
                        "yolo", path=path, image_id=path.stem) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read it as UTF-8 text ({exc})", "yolo",
                        path=path, image_id=path.stem) from None


def _box(fields, size):
    """``(xmin, ymin, xmax, ymax)`` in VOC pixels, or ``(None, why)``."""
    height, width = size
    try:
        xc, yc, w, h = (float(f) for f in fields)
    except ValueError:
        return None, f"coordinates {' '.join(fields)!r} are not all numbers"
    if not all(math.isfinite(v) for v in (xc, yc, w, h)):
        return None, f"coordinates {' '.join(fields)!r} are not all finite numbers"
    if w * width < 1 or h * height < 1:
        return None, (f"the box is {w * width:g} x {h * height:g} px (width x height): "
                      "under one pixel")
    x0, y0 = (xc - w / 2) * width, (yc - h / 2) * height
    # to 0.01 px: six-digit fractions carry ~0.0006 px of rounding, which would otherwise
    # put a box drawn to the frame a hair outside it
    return tuple(round(v, 2) for v in (x0 + 1, y0 + 1, x0 + w * width, y0 + h * height)), None


def parse_yolo_labels(path, image_size, class_names=TXL_CLASSES,
                      label_names=BCCD_LABEL_NAMES) -> Annotation:
    """Read a YOLO label file for an image of ``image_size`` (height, width).

    ``class_names[c]`` names class ``c`` of the file; each is looked up in ``label_names``
    (the course's order) for the object's ``label``. Raises a ``"yolo"`` DataError (see
    the module docstring); judges no box (``check_annotation(..., item="line")`` does).
    """
    path = checked_path(path, "path", "a YOLO label file")
    image_size = checked_size(image_size, "image_size")
    text = _read_text(path)
    index_of = {name.lower(): i for i, name in enumerate(label_names)}
    classes = ", ".join(f"{i} ({name})" for i, name in enumerate(class_names))
    objects = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        token = fields[0]
        if not (token.isascii() and token.isdigit() and int(token) < len(class_names)):
            raise DataError(
                f"{path} line {number}: class {token!r} is not one of {classes}; "
                "fix the line or the class list",
                "yolo", path=path, image_id=path.stem, line=number)
        name = class_names[int(token)]
        if len(fields) != 5:
            bndbox, problem = None, (f"has {len(fields)} fields, not 5 (<class> <x_center> "
                                     "<y_center> <width> <height>)")
        else:
            bndbox, problem = _box(fields[1:], image_size)
        objects.append(AnnotatedObject(number, name, index_of.get(name.lower()), bndbox,
                                       problem, False, False))
    if not objects:
        raise DataError(f"{path} is empty: it lists no box, and every smear of the "
                        "dataset has cells; restore the file from the dataset", "yolo",
                        path=path, image_id=path.stem)
    return Annotation(path=path, objects=tuple(objects), size=None, size_text=None,
                      depth=None, filename=None, folder=None, image_path=None,
                      attributes=(), indent="")
