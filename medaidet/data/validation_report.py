"""What the validator found: :class:`ValidationReport`, its :class:`Issue` list and the
kinds of issue (notebook 01, section 6).

The report reads as a summary (``str``), as tables in a notebook (``_repr_html_``) and as
JSON (``to_json``)::

    {"root", "images", "objects_raw", "objects_kept", "per_class": {name: n},
     "splits": {split: n},
     "issues": [{"image", "object", "kind", "severity", "detail", "action"}]}

``images``: ids in the split lists (all annotation/image ids when there are no lists);
``objects_raw``: ``<object>`` elements in their annotations; ``objects_kept`` and
``per_class``: the boxes :class:`~medaidet.data.bccd.BCCDDataset` yields (default mode,
difficult objects included); ``splits``: ids per list. ``image`` is an id, or null for a
dataset-level issue; ``object`` is the 0-based position of the ``<object>`` in its XML, or
null. Severity: **error** -- the loader refuses or drops it; **warning** -- loaded, but
probably wrong (check it); **info** -- worth knowing, no effect on loading.

Kinds and their rules (per-object and per-file rules are
:func:`medaidet.data.bccd.check_annotation`'s, so report and loader agree):

* ``parse_error``: not well-formed XML, DTD/entities (refused unexpanded), no ``<annotation>``.
* ``missing_file``: a listed id without ``Annotations/<id>.xml`` or ``JPEGImages/<id>.jpg``.
* ``bad_image``: the image does not decode as 8-bit RGB (not an image, truncated data,
  transparent pixels, 32-bit or floating-point pixels; the rule is
  :func:`medaidet.data.image.decode_image`'s, which loader and validator call).
* ``unknown_label``: ``<name>`` missing or not rbc/wbc/platelets (case-insensitive, stripped).
* ``size_mismatch``: ``<size>`` disagrees with the image's real size.
* ``bad_coordinates``: missing ``<bndbox>``/coordinate, non-numeric, reversed (max < min).
* ``zero_area``: zero width or height.
* ``out_of_bounds``: outside VOC's ``1..W`` x ``1..H``; more than
  :data:`~medaidet.data.bccd.BOUNDS_TOLERANCE` px: dropped (error), else clipped (warning).
* ``near_duplicate_box``: same class, IoU >= 0.9 with an earlier box (one cell boxed
  twice; an exact copy has IoU 1).
* ``class_size_outlier``: box size ``s = sqrt(w * h)`` far from its class's own
  distribution: robust z-score ``z = 0.6745 (ln s - median) / MAD`` over the class's boxes
  that do not touch the image border (cut cells are legitimately small; MAD floored at
  0.05, i.e. 5 % in size; skipped below 10 loadable images or 20 such boxes); flagged when
  ``z > 3.5``, or ``z < -3.5`` for a box not touching the border. **warning** when
  ``|z| >= 5`` (implausible: a likely mislabel; the detail names the class whose size fits
  better), else **info** (unusual).
* ``missing_class``: an image without any box of a class that at least 90 % of the
  (at least 10) loadable images have: a likely unlabeled cell.
* ``metadata_mismatch``: ``<filename>``, ``<path>``, ``<folder>`` or ``<depth>`` disagree
  with the real file, or ``<size>`` is missing.
* ``foreign_annotation``: a file written unlike the rest (at least two of: root attributes,
  indentation, ``<folder>``, ``<path>`` directory differ from a value at least 80 % of
  the files share): another annotator or tool.
* ``near_duplicate_image``: the same field of view photographed twice, found by content:
  phase correlation of 40x30 thumbnails proposes each image's 3 best partners and
  shift; a pair is kept when the normalized correlation of the overlapping part of the
  80x60 thumbnails is >= 0.85 with >= 25 % overlap (on BCCD same-field pairs score >= 0.89,
  the best other pair < 0.7). **warning** when the pair crosses splits (leaks), else info.

Severity and what the loader does, per kind: :data:`KINDS`. The report checks the defects
BCCD has and what the loader refuses; a bad split list is the loader's own DataError
(``split``), a file against the pinned release is :func:`~medaidet.data.download.verify_dataset`'s.
"""
from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from typing import NamedTuple

from medaidet.data.same_field import ImagePair

__all__ = ["ValidationReport", "Issue", "KINDS", "SEVERITIES", "sorted_issues"]

SEVERITIES = ("error", "warning", "info")


#: kind -> (usual severity, what the loader does). Some issues override both (see above).
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
    "bad_coordinates": ("error", "dropped with a warning (strict=True: DataError)"),
    "zero_area": ("error", "dropped with a warning (strict=True: DataError)"),
    "out_of_bounds": ("error", "dropped with a warning (strict=True: DataError)"),
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
    image: str | None        # image id; None for a dataset-level issue
    object: int | None       # 0-based position of the <object> in the XML; None: the file
    kind: str
    severity: str            # "error" | "warning" | "info"
    detail: str
    action: str              # what the loader does with it


@dataclass(repr=False)
class ValidationReport:
    """What :func:`validate_dataset` found. ``to_dict()`` / ``to_json()`` give the JSON
    shape in the module docstring; the other attributes are for notebooks."""
    root: str
    images: int
    objects_raw: int
    objects_kept: int
    per_class: dict[str, int]
    splits: dict[str, int]
    issues: list[Issue]
    image_pairs: list[ImagePair] = field(default_factory=list)
    seconds: float = 0.0

    # ---- data
    def to_dict(self) -> dict:
        return {
            "root": self.root, "images": self.images, "objects_raw": self.objects_raw,
            "objects_kept": self.objects_kept, "per_class": dict(self.per_class),
            "splits": dict(self.splits),
            "issues": [{"image": i.image, "object": i.object, "kind": i.kind,
                        "severity": i.severity, "detail": i.detail, "action": i.action}
                       for i in self.issues],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def counts(self) -> dict[str, dict[str, int]]:
        """``{kind: {severity: n}}`` for the kinds found, in the order of :data:`KINDS`."""
        table: dict[str, dict[str, int]] = {}
        for issue in self.issues:
            row = table.setdefault(issue.kind, dict.fromkeys(SEVERITIES, 0))
            row[issue.severity] += 1
        return dict(sorted(table.items(), key=lambda kv: _ORDER.get(kv[0], len(_ORDER))))

    def by_kind(self, kind: str) -> list[Issue]:
        return [issue for issue in self.issues if issue.kind == kind]

    @property
    def ok(self) -> bool:
        """No issue of severity error."""
        return not any(issue.severity == "error" for issue in self.issues)

    # ---- rendering
    def _summary_lines(self) -> list[str]:
        splits = ", ".join(f"{name} {n}" for name, n in self.splits.items())
        classes = ", ".join(f"{name} {n}" for name, n in self.per_class.items())
        return [
            f"{self.images} images ({splits})",
            f"{self.objects_raw} objects in the annotations, {self.objects_kept} kept by the "
            f"loader ({classes})",
            f"validated in {self.seconds:.1f} s",
        ]

    def __str__(self) -> str:
        lines = [f"Dataset validation: {self.root}"]
        lines += [f"  {line}" for line in self._summary_lines()]
        counts = self.counts()
        if not counts:
            lines.append("No issues found.")
            return "\n".join(lines)
        width = max(len(kind) for kind in counts)
        lines += ["", f"  {'kind':<{width}}  " + "  ".join(f"{s:>7}" for s in SEVERITIES)]
        for kind, row in counts.items():
            lines.append(f"  {kind:<{width}}  " + "  ".join(f"{row[s]:>7}" for s in SEVERITIES))
        totals = {s: sum(row[s] for row in counts.values()) for s in SEVERITIES}
        lines.append(f"  {'total':<{width}}  " + "  ".join(f"{totals[s]:>7}" for s in SEVERITIES))
        shown = 3
        for kind in counts:
            issues = self.by_kind(kind)
            actions = {issue.action for issue in issues}
            mixed = len(actions) > 1
            header = KINDS.get(kind, ("", ""))[1] if mixed else next(iter(actions))
            lines += ["", f"{kind} ({len(issues)}): {header}"]
            for issue in issues[:shown]:
                where = issue.image or "(dataset)"
                if issue.object is not None:
                    where += f" object {issue.object}"
                lines.append(f"  [{issue.severity}] {where}: {issue.detail}")
                if mixed:
                    lines.append(f"      -> {issue.action}")
            if len(issues) > shown:
                lines.append(f"  ... and {len(issues) - shown} more (to_json() lists all)")
        return "\n".join(lines)

    def __repr__(self):      # the text view, also what a notebook stores beside the HTML
        return str(self)

    def _repr_html_(self) -> str:
        e = html.escape
        out = [f"<h4>Dataset validation: <code>{e(self.root)}</code></h4><ul>"]
        out += [f"<li>{e(line)}</li>" for line in self._summary_lines()]
        out.append("</ul>")
        counts = self.counts()
        if not counts:
            return "".join(out) + "<p>No issues found.</p>"
        out.append("<table><thead><tr><th>kind</th>" + "".join(f"<th>{s}</th>" for s in SEVERITIES)
                   + "<th>what the loader does</th></tr></thead><tbody>")
        for kind, row in counts.items():
            action = e(KINDS.get(kind, ("", ""))[1])
            out.append(f"<tr><td><code>{e(kind)}</code></td>"
                       + "".join(f"<td>{row[s]}</td>" for s in SEVERITIES)
                       + f"<td style='text-align:left'>{action}</td></tr>")
        out.append("</tbody></table>")
        out.append("<div style='max-height:28em;overflow:auto'><table><thead><tr>"
                   + "".join(f"<th>{h}</th>" for h in ("image", "object", "kind", "severity",
                                                       "detail", "action"))
                   + "</tr></thead><tbody>")
        for i in self.issues:
            out.append("<tr>" + "".join(
                f"<td style='text-align:left'>{e('' if v is None else str(v))}</td>"
                for v in (i.image, i.object, i.kind, i.severity, i.detail, i.action)) + "</tr>")
        out.append("</tbody></table></div>")
        return "".join(out)



def sorted_issues(issues) -> list:
    """``issues`` in the report's order: by kind (as in :data:`KINDS`), image, object."""
    return sorted(issues, key=lambda i: (_ORDER.get(i.kind, len(_ORDER)), i.image or "",
                                         -1 if i.object is None else i.object))

