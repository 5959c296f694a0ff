"""Validate a dataset in BCCD's VOC layout: every defect, where it is, what the loader does.

``validate_dataset(root)`` returns a :class:`~medaidet.data.validation_report.ValidationReport`
(:mod:`medaidet.data.validation_report` lists every kind of issue with its rule, and the
JSON shape). Per-object and per-file rules are
:func:`medaidet.data.bccd.check_annotation`'s, so report and loader agree; two
photographs of the same field of view are found by :mod:`medaidet.data.same_field`.

Each image is decoded once, by the loader's :func:`~medaidet.data.image.decode_image`, at 1/8
scale (JPEG draft mode); all of BCCD takes a few seconds.
"""
from __future__ import annotations

import math
import re
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from PIL import Image

from medaidet.data import BCCD_LABEL_NAMES, SPLITS
from medaidet.data.bccd import (annotation_path, check_annotation, image_path, parse_annotation,
                                scan_split_file, split_path)
from medaidet.data.image import decode_image, read_image_size
from medaidet.errors import DataError
from medaidet.data.download import resolve_root
from medaidet.data.dataset_statistics import (check_class_sizes, check_foreign_annotations,
                                             check_missing_classes)
from medaidet.data.same_field import THUMB, ImagePair, same_field_pairs
from medaidet.data.validation_report import (KINDS, Issue, ValidationReport,
                                             sorted_issues)

__all__ = ["validate_dataset"]


# --------------------------------------------------------------------------- the checks

class _Image:
    """What the validator learns about one id: its annotation, the real image's (height,
    width) and bands, the CheckedAnnotation, and whether the loader refuses it."""

    def __init__(self, image_id):
        self.id = image_id
        self.annotation = self.size = self.bands = self.checked = None
        self.refused = False


class _Validation:
    def __init__(self, root: Path):
        self.root = root
        self.issues: list[Issue] = []

    def add(self, image, obj, kind, detail, severity=None, action=None):
        default_severity, default_action = KINDS[kind]
        self.issues.append(Issue(image, obj, kind, severity or default_severity, detail,
                                 action or default_action))

    # ---- split lists (a bad one is the loader's DataError: only their ids are read here)
    def read_splits(self):
        self.split_ids = {split: scan_split_file(split_path(self.root, split))[0]
                          for split in SPLITS}
        self.splits_of: dict[str, list[str]] = defaultdict(list)
        for split in ("train", "val", "test"):
            for image_id in self.split_ids[split]:
                self.splits_of[image_id].append(split)
        for image_id in self.split_ids["trainval"]:    # listed in trainval alone: loaded too
            if not set(self.splits_of[image_id]) & {"train", "val"}:
                self.splits_of[image_id].append("trainval")

    # ---- files, annotations, per-object checks
    def read_files(self):
        listed = set(self.splits_of)
        xml_ids = {p.stem for p in (self.root / "Annotations").glob("*.xml")}
        jpg_dir = self.root / "JPEGImages"
        jpg_ids = {p.stem for p in jpg_dir.glob("*.jpg")} if jpg_dir.is_dir() else set()
        # Without any split list every file is in scope; with lists, the listed ids.
        self.population = sorted(listed) if listed else sorted(xml_ids | jpg_ids)
        self.images = {image_id: _Image(image_id) for image_id in self.population}
        for image_id, record in self.images.items():
            self._read_one(record, image_id in xml_ids, image_id in jpg_ids)

    def _read_one(self, record: _Image, has_xml: bool, has_jpg: bool):
        image_id = record.id
        where = ", ".join(self.splits_of.get(image_id, [])) or "the dataset"
        for present, path in ((has_xml, annotation_path(self.root, image_id)),
                              (has_jpg, image_path(self.root, image_id))):
            if not present:
                self.add(image_id, None, "missing_file",
                         f"{path.relative_to(self.root)} does not exist ({image_id} is listed "
                         f"in {where})")
                record.refused = True
        if has_jpg:
            try:
                record.size = read_image_size(image_path(self.root, image_id), image_id)
            except DataError as exc:                   # "image" or "missing_file"
                self.add(image_id, None, "bad_image", str(exc))
                record.refused = True
        if not has_xml:
            return
        try:
            record.annotation = parse_annotation(annotation_path(self.root, image_id))
        except DataError as exc:                       # "xml", "unsafe_xml", "missing_file"
            self.add(image_id, None, "parse_error", str(exc))
            record.refused = True
            return
        # Without a readable image, judge the boxes against the XML's <size> (if any).
        size = record.size or record.annotation.size or (math.inf, math.inf)
        record.checked = check_annotation(record.annotation, size)
        for finding in record.checked.findings:
            if finding.action == "raise":
                record.refused = True
            if finding.kind == "size_mismatch" and record.size is None:
                continue
            if finding.action == "clip":
                self.add(image_id, finding.index, finding.kind, finding.detail,
                         severity="warning", action="clipped to the image with a warning "
                         "(strict=True: DataError)")
            else:
                self.add(image_id, finding.index, finding.kind, finding.detail)

    def loadable(self):
        return [r for r in self.images.values() if not r.refused and r.checked is not None]

    def check_metadata(self):
        folder_names = {"JPEGImages", self.root.name}
        for record in self.images.values():
            a = record.annotation
            if a is None:
                continue
            expected = f"{record.id}.jpg"
            problems = []
            if a.filename is not None and a.filename != expected:
                problems.append(f"<filename> is {a.filename!r}")
            if a.image_path:
                parts = re.split(r"[\\/]+", a.image_path)
                if parts[-1] != expected:
                    problems.append(f"<path> {a.image_path!r} names another file")
                elif len(parts) > 1 and parts[-2] not in folder_names:
                    problems.append(f"<path> {a.image_path!r} is not under JPEGImages")
            if a.folder is not None and a.folder not in folder_names:
                problems.append(f"<folder> is {a.folder!r}")
            if a.size is None and record.size is not None:
                problems.append("<size> is missing" if a.size_text is None else
                                f"<size> {a.size_text} is not a size")
            if a.depth is not None and record.bands is not None and a.depth != record.bands:
                problems.append(f"<depth> is {a.depth} but the image has {record.bands} "
                                "channel(s)")
            if problems:
                self.add(record.id, None, "metadata_mismatch",
                         "; ".join(problems) + f" (the file is JPEGImages/{expected})")

    # ---- images: decoding and the same field of view
    def check_images(self):
        decoded, thumbs = [], []
        for record in self.images.values():
            if record.size is None:
                continue
            try:
                image = decode_image(image_path(self.root, record.id), record.id,
                                     draft_size=THUMB)
            except DataError as exc:                   # "image" or "missing_file"
                self.add(record.id, None, "bad_image", str(exc),
                         action="BCCDDataset raises DataError when the image is read "
                         "(construction works: its header is readable)")
                record.refused = True
                continue
            record.bands = image.bands
            gray = Image.fromarray(image.pixels).convert("L")
            if gray.size != THUMB:
                gray = gray.resize(THUMB, Image.BILINEAR)
            thumbs.append(np.asarray(gray, dtype=np.float32))
            decoded.append(record)
        self.pairs = []
        if len(decoded) < 2:
            return
        for i, j, dy, dx, overlap, corr in same_field_pairs(np.stack(thumbs)):
            a, b = decoded[i], decoded[j]
            scale_y, scale_x = a.size[0] / THUMB[1], a.size[1] / THUMB[0]
            pair = ImagePair(a.id, b.id, tuple(self.splits_of.get(a.id, ())),
                             tuple(self.splits_of.get(b.id, ())), round(dx * scale_x),
                             round(dy * scale_y), overlap, corr)
            self.pairs.append(pair)
            crosses = bool(pair.splits_a and pair.splits_b and
                           set(pair.splits_a) != set(pair.splits_b))
            where = (f"{a.id} is in {'/'.join(pair.splits_a) or 'no split'}, {b.id} in "
                     f"{'/'.join(pair.splits_b) or 'no split'}")
            detail = (f"same field of view as {b.id} (shifted {pair.dx:+d} px in x, "
                      f"{pair.dy:+d} px in y; {overlap:.0%} of the frame in common, "
                      f"correlation {corr:.2f}); {where}"
                      + (": crosses splits" if crosses else ""))
            self.add(a.id, None, "near_duplicate_image", detail,
                     severity="warning" if crosses else "info",
                     action=KINDS["near_duplicate_image"][1] if crosses else
                     "both loaded as is: near-identical training views")

    # ---- the report
    def report(self, seconds: float) -> ValidationReport:
        objects_raw = sum(len(r.annotation.objects) for r in self.images.values()
                          if r.annotation is not None)
        per_class = dict.fromkeys(BCCD_LABEL_NAMES, 0)
        for record in self.loadable():
            for label in record.checked.label:
                per_class[BCCD_LABEL_NAMES[label]] += 1
        splits = {split: len(ids) for split, ids in self.split_ids.items()}
        issues = sorted_issues(self.issues)
        return ValidationReport(
            root=str(self.root), images=len(self.images), objects_raw=objects_raw,
            objects_kept=sum(per_class.values()), per_class=per_class, splits=splits,
            issues=issues, image_pairs=self.pairs, seconds=seconds)


def validate_dataset(root=None) -> ValidationReport:
    """Check a dataset in BCCD's VOC layout; see the module docstring for every rule.

    ``root``: the dataset root; None: ``$MEDAIDET_DATA``, else the cache directory
    (:func:`medaidet.data.download.resolve_root`, which raises a ``"not_found"`` DataError with
    instructions when there is no dataset). Never raises for defects in the data: each is
    an issue in the report.
    """
    start = time.perf_counter()
    validation = _Validation(resolve_root(root))
    validation.read_splits()
    validation.read_files()
    validation.check_images()
    check_class_sizes(validation.loadable(), validation.add)
    check_missing_classes(validation.loadable(), validation.add)
    validation.check_metadata()
    check_foreign_annotations(list(validation.images.values()), validation.add)
    return validation.report(time.perf_counter() - start)
