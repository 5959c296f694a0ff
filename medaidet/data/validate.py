"""Validate a dataset in BCCD's VOC layout: every defect, where it is, what the loader does.

``validate_dataset(root)`` returns a :class:`~medaidet.data.validation_report.ValidationReport`
(:mod:`medaidet.data.validation_report` lists every kind of issue with its rule, and the
JSON shape). Per-object and per-file rules are
:func:`medaidet.data.annotation_checks.check_annotation`'s, so report and loader agree; two
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
from medaidet.data.annotation import parse_annotation
from medaidet.errors import DataError
from medaidet.data.annotation_checks import check_annotation
from medaidet.data.image import decode_image, read_image_size
from medaidet.data.voc import annotation_path, image_path, scan_split_file, split_path
from medaidet.data.pinned import BCCD, load_manifest, resolve_root, verify_dataset
from medaidet.data.dataset_statistics import (check_class_sizes, check_foreign_annotations,
                                             check_missing_classes, kept_boxes)
from medaidet.data.same_field import THUMB, ImagePair, same_field_pairs
from medaidet.data.validation_report import (KINDS, Issue, ValidationReport,
                                             sorted_issues)

__all__ = ["validate_dataset"]


# --------------------------------------------------------------------------- the checks

class _Image:
    """What the validator learns about one id."""

    def __init__(self, image_id):
        self.id = image_id
        self.annotation = None
        self.size = None             # (height, width) of the real image
        self.bands = None
        self.checked = None          # CheckedAnnotation
        self.refused = False         # the loader raises for it


def _unkept(records) -> str:
    """Why ``records`` (read, with no box kept) have no box, for a detail."""
    raw = sum(len(r.annotation.objects) for r in records)
    if not raw:
        return "no <object> in the annotation" + ("s" if len(records) > 1 else "")
    difficult = sum(int(r.checked.difficult.sum()) for r in records)
    dropped = raw - sum(len(r.checked.label) for r in records)
    why = [f"{n} {what}" for n, what in ((dropped, "dropped (see their findings)"),
                                         (difficult, "marked difficult (skipped by default)"))
           if n]
    return f"{raw} <object> element(s), none kept: {', '.join(why)}"


class _Validation:
    def __init__(self, root: Path):
        self.root = root
        self.issues: list[Issue] = []

    def add(self, image, obj, kind, detail, severity=None, action=None):
        default_severity, default_action = KINDS[kind]
        self.issues.append(Issue(image, obj, kind, severity or default_severity, detail,
                                 action or default_action))

    # ---- split lists
    def read_splits(self):
        self.split_ids: dict[str, list[str]] = {}
        for split in SPLITS:
            ids, problems = scan_split_file(split_path(self.root, split))
            self.split_ids[split] = ids
            for problem in problems:
                self.add(problem.image_id, None, "split_error", problem.detail,
                         severity="warning" if problem.kind == "missing" else "error",
                         action=f"BCCDDataset(split={split!r}) raises DataError (split)")
        self.splits_of: dict[str, list[str]] = defaultdict(list)
        for split in ("train", "val", "test"):
            for image_id in self.split_ids[split]:
                self.splits_of[image_id].append(split)
        for image_id in self.split_ids["trainval"]:
            if not set(self.splits_of[image_id]) & {"train", "val"}:
                self.splits_of[image_id].append("trainval")

        train, val, trainval = (set(self.split_ids[s]) for s in ("train", "val", "trainval"))
        listed_files = [split_path(self.root, s).is_file() for s in ("train", "val", "trainval")]
        if all(listed_files) and trainval != train | val:
            action = "loaded as listed: trainval is not train + val"
            for image_id in sorted(trainval - train - val):
                self.add(image_id, None, "split_error", "listed in trainval but in neither "
                         "train nor val", severity="warning", action=action)
            for image_id in sorted((train | val) - trainval):
                self.add(image_id, None, "split_error", "listed in "
                         f"{'train' if image_id in train else 'val'} but not in trainval",
                         severity="warning", action=action)
        for image_id, splits in sorted(self.splits_of.items()):
            if len(splits) > 1:
                self.add(image_id, None, "split_overlap", f"listed in {' and '.join(splits)}")

    # ---- files, annotations, per-object checks
    def read_files(self):
        listed = set(self.splits_of)
        xml_ids = {p.stem for p in (self.root / "Annotations").glob("*.xml")}
        jpg_dir = self.root / "JPEGImages"
        jpg_ids = {p.stem for p in jpg_dir.glob("*.jpg")} if jpg_dir.is_dir() else set()
        # Without any split list every file is in scope; with lists, unlisted files are orphans.
        self.population = sorted(listed) if listed else sorted(xml_ids | jpg_ids)
        for image_id in sorted((xml_ids | jpg_ids) - set(self.population)):
            files = [f"{d}/{image_id}.{x}" for d, x, ids in
                     (("Annotations", "xml", xml_ids), ("JPEGImages", "jpg", jpg_ids))
                     if image_id in ids]
            self.add(image_id, None, "orphan_file", f"{' and '.join(files)} in no split list")
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

    # ---- what the loader keeps: images and splits without any box
    def check_objects(self):
        for record in self.loadable():
            if not kept_boxes(record):
                where = ", ".join(self.splits_of.get(record.id, [])) or "no split"
                self.add(record.id, None, "image_without_objects",
                         f"{_unkept([record])}; listed in {where}")
        for split, ids in self.split_ids.items():
            records = [self.images[i] for i in ids if self.images[i].checked is not None]
            if not records or any(kept_boxes(r) for r in records):
                continue      # nothing read (the errors above say why), or something to learn
            listed = split_path(self.root, split).relative_to(self.root)
            images = (f"its {len(ids)} image(s)" if len(records) == len(ids) else
                      f"the {len(records)} of its {len(ids)} images whose annotation was read")
            self.add(None, None, "split_without_objects",
                     f"split {split} has no objects: none of {images} has a box the loader "
                     f"keeps ({_unkept(records)}); check Annotations/<id>.xml of the ids in "
                     f"{listed}")

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
            if image.conversion:
                self.add(record.id, None, "image_converted", image.conversion)
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

    # ---- checksums
    def check_checksums(self) -> str:
        manifest = load_manifest()
        present = [rel for rel in manifest if (self.root / rel).is_file()]
        if not any(rel.startswith(("Annotations/", "JPEGImages/")) for rel in present):
            # Another dataset in the same layout (synthetic data): its split lists share
            # BCCD's names but nothing else.
            return "skipped: no annotation or image of the pinned BCCD under this root"
        problems = verify_dataset(self.root)
        complete = len(present) >= 0.9 * len(manifest)
        reported = 0
        for problem in problems:
            parts = problem.path.split("/")
            image_id = (Path(parts[-1]).stem if parts[0] in ("Annotations", "JPEGImages")
                        else None)
            if problem.kind == "mismatch":
                detail = (f"{problem.path}: sha256 {problem.actual[:12]}... differs from the "
                          f"pinned BCCD's {problem.expected[:12]}...")
            elif complete:
                detail = f"{problem.path} of the pinned BCCD is missing"
            else:
                continue
            self.add(image_id, None, "checksum_mismatch", detail)
            reported += 1
        release = f"BCCD at {BCCD.commit[:8]}"
        if reported:
            return f"{reported} file(s) differ from {release} (see checksum_mismatch)"
        if complete:
            return f"all {len(manifest)} files of {release} match its sha256 manifest"
        return (f"the {len(present)} files of {release} present match its sha256 manifest "
                "(a partial copy)")

    # ---- the report
    def report(self, checksums: str, seconds: float) -> ValidationReport:
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
            issues=issues, checksums=checksums, image_pairs=self.pairs, seconds=seconds)


def validate_dataset(root=None, check_checksums: bool = True) -> ValidationReport:
    """Check a dataset in BCCD's VOC layout; see the module docstring for every rule.

    ``root``: the dataset root; None: ``$MEDAIDET_DATA``, else the cache directory
    (:func:`medaidet.data.pinned.resolve_root`, which raises a ``"not_found"`` DataError with
    instructions when there is no dataset). Never raises for defects in the data: each is
    an issue in the report.
    """
    start = time.perf_counter()
    validation = _Validation(resolve_root(root))
    validation.read_splits()
    validation.read_files()
    validation.check_images()
    validation.check_objects()
    check_class_sizes(validation.loadable(), validation.add)
    check_missing_classes(validation.loadable(), validation.add)
    validation.check_metadata()
    check_foreign_annotations(list(validation.images.values()), validation.add)
    checksums = validation.check_checksums() if check_checksums else "not checked"
    return validation.report(checksums, time.perf_counter() - start)
