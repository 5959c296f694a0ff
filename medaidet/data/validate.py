"""Validate a dataset in BCCD's VOC layout: every defect, where it is, what the loader does
(notebook 01, section 6). :func:`validate_dataset` returns a :class:`ValidationReport`: a
summary (``str``, what a notebook shows) or JSON (``to_json``)::

    {"root", "images", "objects_raw", "objects_kept", "per_class": {name: n},
     "splits": {split: n},
     "issues": [{"image", "object", "kind", "severity", "detail", "action"}]}

``objects_kept``, ``per_class``: the boxes :class:`~medaidet.data.bccd.BCCDDataset` yields
(difficult ones included). ``image``: an id, or null for the dataset; ``object``: the 0-based
position of the ``<object>`` in its XML, or null. Severity: **error** (the loader refuses or
drops it), **warning** (loaded, probably wrong), **info** (no effect); per kind: :data:`KINDS`.

Rules shared with the loader: :func:`~medaidet.data.bccd.check_annotation`, images
:func:`~medaidet.data.image.decode_image` (at 1/8 scale), same-field pairs
:mod:`~medaidet.data.same_field`; the ``check_*`` functions below are the validator's own.
"""
from __future__ import annotations

import json
import math
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
from PIL import Image

from medaidet.data import BCCD_LABEL_NAMES, SPLITS
from medaidet.data.bccd import (annotation_path, check_annotation, image_path, parse_annotation,
                                scan_split_file, split_path)
from medaidet.data.download import resolve_root
from medaidet.data.image import decode_image, read_image_size
from medaidet.data.same_field import THUMB, ImagePair, same_field_pairs
from medaidet.errors import DataError

__all__ = ["validate_dataset", "ValidationReport", "Issue", "KINDS", "SEVERITIES",
           "check_class_sizes", "check_missing_classes", "check_foreign_annotations"]


# ---------------------------------------------------------------------------------- the report
SEVERITIES = ("error", "warning", "info")
#: kind -> (usual severity, what the loader does); some issues override both.
KINDS: dict[str, tuple[str, str]] = {
    "parse_error": ("error", "BCCDDataset raises DataError (kind xml; unsafe_xml for "
                    "DTD/entities, never expanded) for any split listing this image"),
    "missing_file": ("error", "BCCDDataset raises DataError (missing_file) for any split listing "
                     "this id"),
    "bad_image": ("error", "BCCDDataset raises DataError (image; at construction if the header is "
                  "unreadable, when the image is read if its data is broken or not 8-bit "
                  "RGB as the detail says)"),
    "unknown_label": ("error", "BCCDDataset raises DataError (label) for any split listing "
                      "this image (both modes)"),
    "size_mismatch": ("error", "BCCDDataset raises DataError (image_size) for any split listing "
                      "this image (both modes): the boxes belong to an image of another size"),
    **dict.fromkeys(("bad_coordinates", "zero_area", "out_of_bounds"),
                    ("error", "dropped with a warning (strict=True: DataError)")),
    "near_duplicate_box": ("error", "the later box dropped with a warning, the first kept "
                           "(strict=True: DataError)"),
    "class_size_outlier": ("warning", "loaded as is: check the label (and the box)"),
    "missing_class": ("warning", "loaded as is: unboxed cells are trained as background"),
    "metadata_mismatch": ("info", "ignored: files are found by the split-list id and the "
                          "image's own size is used"),
    "foreign_annotation": ("info", "parsed like the others: review its labels (annotators "
                           "and tools differ in what they box)"),
    "near_duplicate_image": ("warning", "both loaded as is: keep the two in one split "
                             "(across splits they leak one into the other)"),
}
_ORDER = {kind: i for i, kind in enumerate(KINDS)}


class Issue(NamedTuple):
    image: str | None
    object: int | None
    kind: str
    severity: str
    detail: str
    action: str


@dataclass(repr=False)
class ValidationReport:
    """What :func:`validate_dataset` found; ``to_json()`` gives the module docstring's JSON."""
    root: str
    images: int
    objects_raw: int
    objects_kept: int
    per_class: dict[str, int]
    splits: dict[str, int]
    issues: list[Issue]
    image_pairs: list[ImagePair] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"root": self.root, "images": self.images, "objects_raw": self.objects_raw,
                "objects_kept": self.objects_kept, "per_class": dict(self.per_class),
                "splits": dict(self.splits), "issues": [i._asdict() for i in self.issues]}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def counts(self) -> dict[str, dict[str, int]]:
        """``{kind: {severity: n}}`` for the kinds found, in the order of :data:`KINDS`."""
        table: dict[str, dict[str, int]] = {}
        for issue in self.issues:
            table.setdefault(issue.kind, dict.fromkeys(SEVERITIES, 0))[issue.severity] += 1
        return dict(sorted(table.items(), key=lambda kv: _ORDER.get(kv[0], len(_ORDER))))

    def by_kind(self, kind: str) -> list[Issue]:
        return [issue for issue in self.issues if issue.kind == kind]

    @property
    def ok(self) -> bool:
        """No issue of severity error."""
        return not any(issue.severity == "error" for issue in self.issues)

    def __str__(self) -> str:
        splits = ", ".join(f"{name} {n}" for name, n in self.splits.items())
        classes = ", ".join(f"{name} {n}" for name, n in self.per_class.items())
        lines = [f"Dataset validation: {self.root}", f"  {self.images} images ({splits})",
                 f"  {self.objects_raw} objects in the annotations, {self.objects_kept} kept by "
                 f"the loader ({classes})", f"  validated in {self.seconds:.1f} s"]
        if not (counts := self.counts()):
            return "\n".join(lines + ["No issues found."])
        width = max(len(kind) for kind in counts)
        totals = {s: sum(row[s] for row in counts.values()) for s in SEVERITIES}
        lines += [""] + [f"  {kind:<{width}}  " + "  ".join(f"{row[s]:>7}" for s in SEVERITIES)
                         for kind, row in [("kind", dict(zip(SEVERITIES, SEVERITIES))),
                                           *counts.items(), ("total", totals)]]
        for kind in counts:
            issues = self.by_kind(kind)
            actions = {issue.action for issue in issues}
            mixed = len(actions) > 1
            header = KINDS.get(kind, ("", ""))[1] if mixed else next(iter(actions))
            lines += ["", f"{kind} ({len(issues)}): {header}"]
            for issue in issues[:3]:
                where = issue.image or "(dataset)"
                where += "" if issue.object is None else f" object {issue.object}"
                lines.append(f"  [{issue.severity}] {where}: {issue.detail}")
                lines += [f"      -> {issue.action}"] if mixed else []
            if len(issues) > 3:
                lines.append(f"  ... and {len(issues) - 3} more (to_json() lists all)")
        return "\n".join(lines)

    __repr__ = __str__       # a notebook shows the text view


# ------------------------------------------------------------- findings from the whole dataset
# Each check takes the validator's image records and its add(image, object, kind, detail, ...).
SIZE_Z, SIZE_Z_IMPLAUSIBLE, SIZE_MIN_BOXES, SIZE_MAD_FLOOR = 3.5, 5.0, 20, 0.05
CLASS_PRESENCE, CLASS_MIN_IMAGES = 0.9, 10
FOREIGN_MAJORITY, FOREIGN_MIN_FILES = 0.8, 10


def check_class_sizes(records, add):
    """``class_size_outlier``: z = 0.6745 (ln s - median) / MAD of the size s = sqrt(w * h)
    over the class's boxes off the border (cut cells are small); flagged above ``SIZE_Z``
    (below ``-SIZE_Z`` off the border), a warning from ``SIZE_Z_IMPLAUSIBLE``, else info."""
    records = [r for r in records if len(r.checked.bbox)]
    if len(records) < CLASS_MIN_IMAGES:     # too few images to know a class's sizes
        return
    bbox = np.concatenate([r.checked.bbox for r in records])
    labels = np.concatenate([r.checked.label for r in records])
    inner = np.concatenate([(r.checked.bbox[:, :2] > 0).all(axis=1)
                            & (r.checked.bbox[:, 2:] < np.subtract(r.size, 1)).all(axis=1)
                            for r in records])
    where = [(r.id, int(i)) for r in records for i in r.checked.index]
    h, w = bbox[:, 2] - bbox[:, 0], bbox[:, 3] - bbox[:, 1]
    sizes = np.sqrt(h.astype(np.float64) * w)
    logs = np.log(sizes)
    medians, z = {}, {}         # per class with enough boxes: its median, every box's z
    for c in range(len(BCCD_LABEL_NAMES)):
        ref = logs[(labels == c) & inner]
        if len(ref) >= SIZE_MIN_BOXES:
            medians[c] = median = float(np.median(ref))
            mad = max(float(np.median(np.abs(ref - median))), SIZE_MAD_FLOOR)
            z[c] = 0.6745 * (logs - median) / mad
    for c, median in medians.items():
        for k in np.flatnonzero((labels == c) & ((z[c] > SIZE_Z) | ((z[c] < -SIZE_Z) & inner))):
            name, implausible = BCCD_LABEL_NAMES[c], abs(z[c][k]) >= SIZE_Z_IMPLAUSIBLE
            detail = (f"{name} box {int(w[k])}x{int(h[k])} px: size {sizes[k]:.0f} px vs the "
                      f"{name} median {math.exp(median):.0f} px (robust z {z[c][k]:+.1f}: "
                      f"{'implausible' if implausible else 'unusual'} for {name})")
            if fits := [(abs(z[o][k]), o) for o in z if abs(z[o][k]) < SIZE_Z]:   # never c
                other = min(fits)[1]
                detail += (f"; the size fits {BCCD_LABEL_NAMES[other]} (median "
                           f"{math.exp(medians[other]):.0f} px)"
                           + (": mislabel?" if implausible else ""))
            add(*where[k], "class_size_outlier", detail,
                severity="warning" if implausible else "info")


def check_missing_classes(records, add):
    """``missing_class``: an image with boxes but none of a class nearly every image has."""
    if len(records) < CLASS_MIN_IMAGES:
        return
    has = np.array([[c in r.checked.label for c in range(len(BCCD_LABEL_NAMES))] for r in records])
    share = has.mean(axis=0)
    for c, name in enumerate(BCCD_LABEL_NAMES):
        for record, present in zip(records, has[:, c]):
            # an image without a box misses no class
            if share[c] >= CLASS_PRESENCE and not present and (~record.checked.difficult).any():
                boxes = Counter(BCCD_LABEL_NAMES[x] for x in record.checked.label)
                add(record.id, None, "missing_class", f"no {name} box, while {share[c]:.0%} of "
                    f"images ({int(has[:, c].sum())} of {len(records)}) have one; its boxes: "
                    + ", ".join(f"{n} {k}" for n, k in boxes.items()))


def check_foreign_annotations(records, add):
    """``foreign_annotation``: a file with two features unlike ``FOREIGN_MAJORITY`` of the
    files' (another annotator or tool)."""
    records = [r for r in records if r.annotation is not None]
    if len(records) < FOREIGN_MIN_FILES:
        return
    features = {
        "root attributes": lambda a: " ".join(f'{k}="{v}"' for k, v in a.attributes) or "none",
        "indentation": lambda a: {"\t": "a tab", "": "none"}.get(
            a.indent, f"{len(a.indent)} spaces" if set(a.indent) == {" "} else repr(a.indent)),
        "<folder>": lambda a: repr(a.folder),
        "<path> directory": lambda a: repr(
            "/".join(re.split(r"[\\/]+", a.image_path or "")[:-1]) or None),
    }
    values = {name: [f(r.annotation) for r in records] for name, f in features.items()}
    majority = {name: value for name, column in values.items()
                for value, count in [Counter(column).most_common(1)[0]]
                if count >= FOREIGN_MAJORITY * len(records)}
    for k, record in enumerate(records):
        differs = [f"{name} {values[name][k]} instead of {value}"
                   for name, value in majority.items() if values[name][k] != value]
        if len(differs) >= 2:
            boxes = Counter(o.name.strip() if o.name else "?" for o in record.annotation.objects)
            what = ", ".join(f"{n} {c}" for n, c in boxes.items()) or "none"
            add(record.id, None, "foreign_annotation",
                f"written unlike the other files ({'; '.join(differs)}): another "
                f"annotator or tool; its boxes: {what}")


# ---------------------------------------------------------------------------------- the checks
class _Validation:
    def __init__(self, root: Path):
        """Read the split lists (ids only: a bad list is the loader's DataError) and the files
        of their ids (else of every file): a record per id of its annotation, the real image's
        (height, width) and bands, the CheckedAnnotation, and whether the loader refuses it."""
        self.root, self.issues = root, []
        self.split_ids = {split: scan_split_file(split_path(root, split))[0] for split in SPLITS}
        self.splits_of: dict[str, list[str]] = defaultdict(list)
        for split in ("train", "val", "test", "trainval"):    # in trainval alone: loaded too
            for image_id in self.split_ids[split]:
                if split != "trainval" or not set(self.splits_of[image_id]) & {"train", "val"}:
                    self.splits_of[image_id].append(split)
        xml_ids = {p.stem for p in (self.root / "Annotations").glob("*.xml")}
        jpg_dir = self.root / "JPEGImages"
        jpg_ids = {p.stem for p in jpg_dir.glob("*.jpg")} if jpg_dir.is_dir() else set()
        self.images = {image_id: SimpleNamespace(id=image_id, annotation=None, size=None,
                                                 bands=None, checked=None, refused=False)
                       for image_id in sorted(self.splits_of or xml_ids | jpg_ids)}
        for image_id, record in self.images.items():
            self._read_one(record, image_id in xml_ids, image_id in jpg_ids)

    def add(self, image, obj, kind, detail, severity=None, action=None):
        self.issues.append(Issue(image, obj, kind, severity or KINDS[kind][0], detail,
                                 action or KINDS[kind][1]))

    def _read_one(self, record, has_xml: bool, has_jpg: bool):
        image_id = record.id
        xml, jpg = annotation_path(self.root, image_id), image_path(self.root, image_id)
        where = ", ".join(self.splits_of.get(image_id, [])) or "the dataset"
        for present, path in ((has_xml, xml), (has_jpg, jpg)):
            if not present:
                self.add(image_id, None, "missing_file", f"{path.relative_to(self.root)} does not "
                         f"exist ({image_id} is listed in {where})")
                record.refused = True
        try:
            record.size = read_image_size(jpg, image_id) if has_jpg else None
        except DataError as exc:                       # "image" or "missing_file"
            self.add(image_id, None, "bad_image", str(exc))
            record.refused = True
        try:
            record.annotation = parse_annotation(xml) if has_xml else None
        except DataError as exc:                       # "xml", "unsafe_xml", "missing_file"
            self.add(image_id, None, "parse_error", str(exc))
            record.refused = True
        if record.annotation is None:
            return
        # Without a readable image, judge the boxes against the XML's <size> (if any).
        size = record.size or record.annotation.size or (math.inf, math.inf)
        record.checked = check_annotation(record.annotation, size)
        for finding in record.checked.findings:
            record.refused |= finding.action == "raise"
            if finding.kind == "size_mismatch" and record.size is None:
                continue
            clip = finding.action == "clip"
            self.add(image_id, finding.index, finding.kind, finding.detail,
                     severity="warning" if clip else None, action="clipped to the image with "
                     "a warning (strict=True: DataError)" if clip else None)

    def loadable(self):
        return [r for r in self.images.values() if not r.refused and r.checked is not None]

    def check_metadata(self):
        folder_names = {"JPEGImages", self.root.name}
        for record in self.images.values():
            if (a := record.annotation) is None:
                continue
            expected, problems = f"{record.id}.jpg", []
            if a.filename is not None and a.filename != expected:
                problems.append(f"<filename> is {a.filename!r}")
            parts = re.split(r"[\\/]+", a.image_path or "")
            if a.image_path and parts[-1] != expected:
                problems.append(f"<path> {a.image_path!r} names another file")
            elif a.image_path and len(parts) > 1 and parts[-2] not in folder_names:
                problems.append(f"<path> {a.image_path!r} is not under JPEGImages")
            if a.folder is not None and a.folder not in folder_names:
                problems.append(f"<folder> is {a.folder!r}")
            if a.size is None and record.size is not None:
                problems.append("<size> is missing" if a.size_text is None else
                                f"<size> {a.size_text} is not a size")
            if a.depth is not None and record.bands is not None and a.depth != record.bands:
                problems.append(f"<depth> is {a.depth} but the image has {record.bands} channel(s)")
            if problems:
                self.add(record.id, None, "metadata_mismatch",
                         "; ".join(problems) + f" (the file is JPEGImages/{expected})")

    def check_images(self):
        decoded, thumbs, self.pairs = [], [], []
        for record in self.images.values():
            if record.size is None:
                continue
            try:
                image = decode_image(image_path(self.root, record.id), record.id, draft_size=THUMB)
            except DataError as exc:                   # "image" or "missing_file"
                self.add(record.id, None, "bad_image", str(exc),
                         action="BCCDDataset raises DataError when the image is read "
                         "(construction works: its header is readable)")
                record.refused = True
                continue
            record.bands = image.bands
            gray = Image.fromarray(image.pixels).convert("L").resize(THUMB, Image.BILINEAR)
            thumbs.append(np.asarray(gray, dtype=np.float32))
            decoded.append(record)
        if len(decoded) < 2:
            return
        for i, j, dy, dx, overlap, corr in same_field_pairs(np.stack(thumbs)):
            a, b = decoded[i], decoded[j]
            in_a, in_b = (tuple(self.splits_of.get(r.id, ())) for r in (a, b))
            pair = ImagePair(a.id, b.id, in_a, in_b, round(dx * (a.size[1] / THUMB[0])),
                             round(dy * (a.size[0] / THUMB[1])), overlap, corr)
            self.pairs.append(pair)
            crosses = bool(in_a and in_b and set(in_a) != set(in_b))
            self.add(a.id, None, "near_duplicate_image",
                     f"same field of view as {b.id} (shifted {pair.dx:+d} px in x, {pair.dy:+d} "
                     f"px in y; {overlap:.0%} of the frame in common, correlation {corr:.2f}); "
                     f"{a.id} is in {'/'.join(in_a) or 'no split'}, {b.id} in "
                     f"{'/'.join(in_b) or 'no split'}" + (": crosses splits" if crosses else ""),
                     severity="warning" if crosses else "info",
                     action=KINDS["near_duplicate_image"][1] if crosses else
                     "both loaded as is: near-identical training views")

    def report(self, seconds: float) -> ValidationReport:
        kept = Counter(BCCD_LABEL_NAMES[c] for r in self.loadable() for c in r.checked.label)
        per_class = {name: kept[name] for name in BCCD_LABEL_NAMES}
        return ValidationReport(
            str(self.root), len(self.images),
            sum(len(r.annotation.objects) for r in self.images.values() if r.annotation),
            sum(per_class.values()), per_class,
            {split: len(ids) for split, ids in self.split_ids.items()},
            sorted(self.issues, key=lambda i: (_ORDER[i.kind], i.image or "",
                                               -1 if i.object is None else i.object)),
            self.pairs, seconds)


def validate_dataset(root=None) -> ValidationReport:
    """Check a dataset in BCCD's VOC layout (``root``: as for ``resolve_root``, which raises
    ``"not_found"``). Defects in the data never raise: each is an issue in the report."""
    start, validation = time.perf_counter(), _Validation(resolve_root(root))
    validation.check_images()
    check_class_sizes(validation.loadable(), validation.add)
    check_missing_classes(validation.loadable(), validation.add)
    validation.check_metadata()
    check_foreign_annotations(list(validation.images.values()), validation.add)
    return validation.report(time.perf_counter() - start)
