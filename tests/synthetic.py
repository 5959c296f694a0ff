"""Synthetic BCCD-like VOC datasets (BCCD's layout and XML conventions) of smear-like images.

Boxes come from the drawn shapes, so they are exact; the same seed, n and size give
byte-identical files (with the same NumPy and Pillow).
"""
from __future__ import annotations

import hashlib
import io
import math
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from medaidet.errors import MedaidetError

__all__ = ["make_synthetic", "SynthError", "DestinationNotEmptyError", "SYNTH_LABEL_NAMES",
           "README_MARKER", "MIN_IMAGES"]

SYNTH_LABEL_NAMES = ("RBC", "WBC", "Platelets")
#: First line of README.txt; ``overwrite=True`` only replaces folders that start with it.
README_MARKER = "SYNTHETIC DATA - medaidet synthetic blood-smear dataset (not real BCCD images)"

#: The fewest images: one each for train, val and test (the loader refuses an empty split).
MIN_IMAGES = 3

_ID_FORMAT = "SynthImage_{:05d}"
_JPEG_QUALITY = 90
_REF_SIZE = (480, 640)          # BCCD's (height, width); cell sizes are given for it
_MIN_SIDE = 64

_BG = np.array([234.0, 224.0, 226.0], dtype=np.float32)
# Optical density per unit stain (-ln of transmitted fraction), per channel.
_OD_RBC = np.array([0.15, 0.42, 0.38], dtype=np.float32)
_OD_CYTO = np.array([0.10, 0.15, 0.05], dtype=np.float32)
_OD_NUCLEUS = np.array([0.78, 0.95, 0.16], dtype=np.float32)
_OD_PLATELET = np.array([0.60, 0.78, 0.20], dtype=np.float32)

# Diameters in px at BCCD's scale.
_RBC_DIAM = (80.0, 116.0)       # mean diameter; with aspect <= 1.12 the box sides are 80-120
_RBC_ASPECT = 1.12
_WBC_DIAM = (150.0, 200.0)
_PLT_DIAM = (22.0, 34.0)
_RBC_PER_IMAGE = (8, 14)
_RBC_MAX_OUTSIDE = 0.15         # at most this fraction of an RBC's diameter beyond the border
_RBC_MAX_IOU = 0.3


class SynthError(MedaidetError):
    """The synthetic dataset cannot be written as asked (bad argument, bad destination)."""


class DestinationNotEmptyError(SynthError, FileExistsError):
    """The destination exists and is not empty (``overwrite=True`` replaces a synthetic one)."""


@dataclass
class _Cell:
    label: str
    box: tuple[int, int, int, int]      # xmin, ymin, xmax, ymax: 1-based inclusive, clipped


def _shape(h, w, cx, cy, rx, ry, theta, amps, phases):
    """Harmonic-modulated ellipse: (y0, x0, d) over its patch, d <= 1 inside; None if empty."""
    rmax = max(rx, ry) * (1.0 + float(np.sum(np.abs(amps)))) + 3.0
    y0, y1 = max(0, int(math.floor(cy - rmax))), min(h, int(math.ceil(cy + rmax)) + 1)
    x0, x1 = max(0, int(math.floor(cx - rmax))), min(w, int(math.ceil(cx + rmax)) + 1)
    if y0 >= y1 or x0 >= x1:
        return None
    yy = np.arange(y0, y1, dtype=np.float32)[:, None] - np.float32(cy)
    xx = np.arange(x0, x1, dtype=np.float32)[None, :] - np.float32(cx)
    c, s = np.float32(math.cos(theta)), np.float32(math.sin(theta))
    u = (xx * c + yy * s) / np.float32(rx)
    v = (-xx * s + yy * c) / np.float32(ry)
    rho = np.sqrt(u * u + v * v)
    if len(amps):
        phi = np.arctan2(v, u)
        mod = np.ones_like(rho)
        for k, (a, p) in enumerate(zip(amps, phases), start=2):
            mod += np.float32(a) * np.cos(np.float32(k) * phi + np.float32(p))
        rho = rho / mod
    return y0, x0, rho


def _box_of(y0, x0, inside):
    """1-based inclusive (xmin, ymin, xmax, ymax) of the True pixels, or None."""
    rows = np.flatnonzero(inside.any(axis=1))
    cols = np.flatnonzero(inside.any(axis=0))
    if rows.size == 0 or cols.size == 0:
        return None
    return (x0 + int(cols[0]) + 1, y0 + int(rows[0]) + 1,
            x0 + int(cols[-1]) + 1, y0 + int(rows[-1]) + 1)


def _alpha(d, radius):
    """Anti-aliased coverage: 0.5 exactly on the outline d == 1, ~1 px wide ramp."""
    return np.clip((1.0 - d) * np.float32(radius) + 0.5, 0.0, 1.0)


def _add(od, y0, x0, density, colour):
    hh, ww = density.shape
    od[y0:y0 + hh, x0:x0 + ww] += density[:, :, None] * colour[None, None, :]


def _draw_wbc(od, rng, cx, cy, diam):
    h, w = od.shape[:2]
    r = diam / 2.0
    aspect = rng.uniform(1.0, 1.1)
    got = _shape(h, w, cx, cy, r * math.sqrt(aspect), r / math.sqrt(aspect),
                 rng.uniform(0, np.pi), rng.uniform(-0.03, 0.03, size=2),
                 rng.uniform(0, 2 * np.pi, size=2))
    y0, x0, d = got
    box = _box_of(y0, x0, d <= 1.0)
    grain = rng.random(d.shape, dtype=np.float32)
    cyto = _alpha(d, r) * (0.8 + 0.5 * grain)
    _add(od, y0, x0, cyto, _OD_CYTO)
    nucleus = np.zeros_like(d)
    for _ in range(int(rng.integers(2, 5))):
        ang, off = rng.uniform(0, 2 * np.pi), rng.uniform(0.1, 0.32) * r
        lr = rng.uniform(0.26, 0.38) * r
        lobe = _shape(h, w, cx + off * math.cos(ang), cy + off * math.sin(ang),
                      lr * rng.uniform(1.0, 1.3), lr, rng.uniform(0, np.pi),
                      rng.uniform(-0.08, 0.08, size=3), rng.uniform(0, 2 * np.pi, size=3))
        ly0, lx0, ld = lobe
        sub = nucleus[ly0 - y0:ly0 - y0 + ld.shape[0], lx0 - x0:lx0 - x0 + ld.shape[1]]
        np.maximum(sub, _alpha(ld, lr)[:sub.shape[0], :sub.shape[1]], out=sub)
    nucleus *= np.clip((0.9 - d) * r, 0.0, 1.0)     # never reaches the cell's outline
    texture = 0.75 + 0.35 * rng.random(d.shape, dtype=np.float32)
    _add(od, y0, x0, nucleus * texture, _OD_NUCLEUS * rng.uniform(0.9, 1.1, 3)
         .astype(np.float32))
    return box


def _draw_platelet(od, rng, cx, cy, diam):
    h, w = od.shape[:2]
    r = diam / 2.0
    got = _shape(h, w, cx, cy, r * rng.uniform(1.0, 1.12), r, rng.uniform(0, np.pi),
                 rng.uniform(-0.09, 0.09, size=3), rng.uniform(0, 2 * np.pi, size=3))
    y0, x0, d = got
    box = _box_of(y0, x0, d <= 1.0)
    texture = 0.7 + 0.5 * rng.random(d.shape, dtype=np.float32)
    density = _alpha(d, r) * (0.75 + 0.3 * np.exp(-(d / 0.5) ** 2)) * texture
    _add(od, y0, x0, density.astype(np.float32), _OD_PLATELET * rng.uniform(0.85, 1.1, 3)
         .astype(np.float32))
    return box


def _background(rng, h, w):
    """Pale pink field: a slow brightness/tint field, vignetting; returns float32 RGB."""
    coarse = rng.normal(0.0, 1.0, size=(4, 5, 3)).astype(np.float32)
    coarse[:, :, 1:] = coarse[:, :, :1] + 0.3 * coarse[:, :, 1:]    # mostly brightness, little tint
    coarse[:, :, 0] *= 1.3
    field = np.stack([np.asarray(Image.fromarray(np.ascontiguousarray(coarse[:, :, c]))
                                 .resize((w, h), Image.BICUBIC)) for c in range(3)], axis=-1)
    yy = (np.arange(h, dtype=np.float32)[:, None] - (h - 1) / 2) / (h / 2)
    xx = (np.arange(w, dtype=np.float32)[None, :] - (w - 1) / 2) / (w / 2)
    strength = np.float32(rng.uniform(0.06, 0.14))
    vignette = 1.0 - strength * (xx * xx + yy * yy) / 2.0
    tint = _BG * rng.uniform(0.96, 1.02, 3).astype(np.float32)
    return tint[None, None, :] * vignette[:, :, None] * (1.0 + 0.025 * field)


def _place(rng, tries, sample, ok):
    for _ in range(tries):
        cand = sample()
        if ok(cand):
            return cand
    return None


def _iou(a, b):
    ix = min(a[2], b[2]) - max(a[0], b[0]) + 1
    iy = min(a[3], b[3]) - max(a[1], b[1]) + 1
    if ix <= 0 or iy <= 0:
        return 0.0
    inter = ix * iy
    area = lambda q: (q[2] - q[0] + 1) * (q[3] - q[1] + 1)  # noqa: E731
    return inter / (area(a) + area(b) - inter)


def _make_image(seed, index, size, n_wbc, n_plt):
    """Render image ``index``: returns (uint8 HxWx3 array, [_Cell])."""
    rng = np.random.default_rng([seed, 1, index])
    h, w = size
    scale = min(1.0, h / _REF_SIZE[0], w / _REF_SIZE[1])
    od = np.zeros((h, w, 3), dtype=np.float32)
    cells: list[_Cell] = []
    placed: list[tuple[str, float, float, float]] = []     # label, cx, cy, radius

    def clear_of(cx, cy, r, rules):
        for label, px, py, pr in placed:
            if math.hypot(cx - px, cy - py) < rules[label] * (r + pr):
                return False
        return True

    for _ in range(n_wbc):
        diam = rng.uniform(*_WBC_DIAM) * scale
        r = diam / 2 * 1.15 + 2       # outer radius: aspect and harmonics included
        if 2 * r >= min(h, w):
            break
        spot = _place(rng, 50, lambda: (rng.uniform(r, w - r), rng.uniform(r, h - r)),
                      lambda c: clear_of(c[0], c[1], r, {"WBC": 1.05}))
        if spot is None:
            continue
        box = _draw_wbc(od, rng, spot[0], spot[1], diam)
        cells.append(_Cell("WBC", box))
        placed.append(("WBC", spot[0], spot[1], diam / 2))

    for _ in range(n_plt):
        diam = rng.uniform(*_PLT_DIAM) * scale
        r = diam / 2 * 1.45 + 2       # outer radius: aspect and harmonics included
        spot = _place(rng, 50, lambda: (rng.uniform(r, w - r), rng.uniform(r, h - r)),
                      lambda c: clear_of(c[0], c[1], r, {"WBC": 1.05, "Platelets": 2.0}))
        if spot is None:
            continue
        box = _draw_platelet(od, rng, spot[0], spot[1], diam)
        cells.append(_Cell("Platelets", box))
        placed.append(("Platelets", spot[0], spot[1], diam / 2))

    # RBC: many; may touch or overlap each other lightly, run over the border a little.
    target = int(rng.integers(_RBC_PER_IMAGE[0], _RBC_PER_IMAGE[1] + 1))
    target = max(1, round(target * h * w / (_REF_SIZE[0] * _REF_SIZE[1]) / max(scale, 1e-6) ** 2))
    rbc_boxes: list[tuple[int, int, int, int]] = []
    rbc_rules = {"RBC": 0.85, "WBC": 0.95, "Platelets": 0.9}
    for attempt in range(40 * target):
        if len(rbc_boxes) >= target:
            break
        diam = rng.uniform(*_RBC_DIAM) * scale
        aspect = rng.uniform(1.0, _RBC_ASPECT)
        theta = rng.uniform(0, np.pi)
        r = diam / 2 * math.sqrt(aspect) * 1.06      # generous outer radius
        m = r - _RBC_MAX_OUTSIDE * 2 * r
        if m * 2 >= min(h, w):
            m = r
        cx, cy = rng.uniform(m, w - m), rng.uniform(m, h - m)
        # Every image needs an RBC: late in the search the first one may overlap other cells.
        desperate = not rbc_boxes and attempt >= 20 * target
        if not desperate and not clear_of(cx, cy, diam / 2, rbc_rules):
            continue
        amps = rng.uniform(-0.025, 0.025, size=2)
        phases = rng.uniform(0, 2 * np.pi, size=2)
        rx, ry = diam / 2 * math.sqrt(aspect), diam / 2 / math.sqrt(aspect)
        got = _shape(h, w, cx, cy, rx, ry, theta, amps, phases)
        if got is None:
            continue
        y0, x0, d = got
        box = _box_of(y0, x0, d <= 1.0)
        if box is None or any(_iou(box, b) >= _RBC_MAX_IOU for b in rbc_boxes):
            continue
        _paint_rbc(od, rng, y0, x0, d, diam / 2)
        rbc_boxes.append(box)
        cells.append(_Cell("RBC", box))
        placed.append(("RBC", cx, cy, diam / 2))

    img = _background(rng, h, w)
    img *= np.exp(-_soften(od))
    img += rng.standard_normal(size=img.shape, dtype=np.float32) * np.float32(2.5)
    np.rint(img, out=img)
    np.clip(img, 0, 255, out=img)
    return img.astype(np.uint8), cells


def _soften(a):
    """A [1, 2, 1] / 4 blur along both axes (the optics' slight softness); edges kept."""
    out = a.copy()
    out[1:-1] = (a[:-2] + 2 * a[1:-1] + a[2:]) * np.float32(0.25)
    tmp = out.copy()
    out[:, 1:-1] = (tmp[:, :-2] + 2 * tmp[:, 1:-1] + tmp[:, 2:]) * np.float32(0.25)
    return out


def _paint_rbc(od, rng, y0, x0, d, r):
    pallor = rng.uniform(0.45, 0.7)
    profile = (0.78 + 0.30 * np.exp(-((d - 0.86) / 0.10) ** 2)
               - pallor * np.exp(-(d / 0.45) ** 2))
    grain = 0.94 + 0.12 * rng.random(d.shape, dtype=np.float32)
    density = _alpha(d, r) * profile * grain * np.float32(rng.uniform(0.85, 1.15))
    _add(od, y0, x0, density.astype(np.float32),
         (_OD_RBC * rng.uniform(0.92, 1.08, 3)).astype(np.float32))


def _xml(image_id, size, cells):
    h, w = size
    parts = ["<annotation>",
             "\t<folder>JPEGImages</folder>",
             f"\t<filename>{image_id}.jpg</filename>",
             f"\t<path>JPEGImages/{image_id}.jpg</path>",
             "\t<source>",
             "\t\t<database>medaidet synthetic</database>",
             "\t</source>",
             "\t<size>",
             f"\t\t<width>{w}</width>",
             f"\t\t<height>{h}</height>",
             "\t\t<depth>3</depth>",
             "\t</size>",
             "\t<segmented>0</segmented>"]
    for cell in cells:
        xmin, ymin, xmax, ymax = cell.box
        truncated = int(xmin == 1 or ymin == 1 or xmax == w or ymax == h)
        parts += ["\t<object>",
                  f"\t\t<name>{cell.label}</name>",
                  "\t\t<pose>Unspecified</pose>",
                  f"\t\t<truncated>{truncated}</truncated>",
                  "\t\t<difficult>0</difficult>",
                  "\t\t<bndbox>",
                  f"\t\t\t<xmin>{xmin}</xmin>",
                  f"\t\t\t<ymin>{ymin}</ymin>",
                  f"\t\t\t<xmax>{xmax}</xmax>",
                  f"\t\t\t<ymax>{ymax}</ymax>",
                  "\t\t</bndbox>",
                  "\t</object>"]
    parts.append("</annotation>")
    return "\n".join(parts) + "\n"


def _schedule(rng, n, choices):
    """A third of the images get 0, the rest cycle through ``choices``, shuffled: totals stay
    predictable and no class is on almost every image."""
    zeros = round(n / 3)
    counts = [0] * zeros + [choices[i % len(choices)] for i in range(n - zeros)]
    return [int(c) for c in rng.permutation(np.array(counts, dtype=np.int64))]


def _splits(rng, ids):
    """train/val/test about 60/20/20, at least one each (``len(ids) >= MIN_IMAGES``)."""
    n = len(ids)
    n_val = n_test = max(1, round(0.2 * n))
    order = [ids[i] for i in rng.permutation(n)]
    test = sorted(order[:n_test])
    val = sorted(order[n_test:n_test + n_val])
    train = sorted(order[n_test + n_val:])
    return {"train": train, "val": val, "trainval": sorted(train + val), "test": test}


def _readme(n, seed, size, counts, splits):
    h, w = size
    lines = [
        README_MARKER,
        "",
        "Every image here was drawn by medaidet.data.synth.make_synthetic; none is a photograph",
        "and none comes from BCCD. Use it for offline demos and fast tests, never to report",
        "accuracy on blood cells.",
        "",
        f"Made with: medaidet data synth DEST --n {n} --seed {seed}   (size {w}x{h})",
        "The same seed, n and size give byte-identical files (same NumPy and Pillow).",
        "",
        "Layout and conventions are BCCD's (Pascal VOC): JPEGImages/*.jpg (RGB, JPEG quality 90),",
        "Annotations/*.xml (labels RBC, WBC, Platelets; difficult 0; bndbox 1-based inclusive",
        "pixel coordinates computed from the drawn shapes, clipped to the image),",
        "ImageSets/Main/{train,val,trainval,test}.txt (trainval = train + val).",
        "SHA256SUMS lists the sha256 of every file except itself.",
        "",
        f"Images: {n}; boxes: " + ", ".join(f"{k} {v}" for k, v in counts.items()),
        "Splits: " + ", ".join(f"{k} {len(v)}" for k, v in splits.items()),
        "",
    ]
    return "\n".join(lines)


def _write(path: Path, data: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)


def _check_args(n, seed, size):
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise SynthError(f"n must be a whole number of images, got {n!r}")
    if n < MIN_IMAGES:
        raise SynthError(f"n={n} is too few images: each of the splits train, val and test "
                         f"needs at least one, so n must be at least {MIN_IMAGES}")
    if n > 99999:
        raise SynthError(f"n={n} is too many for a synthetic demo set (at most 99999)")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise SynthError(f"seed must be a non-negative integer, got {seed!r}")
    try:
        h, w = (int(v) for v in size)
    except (TypeError, ValueError):
        raise SynthError(f"size must be (height, width), got {size!r}") from None
    if h < _MIN_SIDE or w < _MIN_SIDE:
        raise SynthError(f"size {size!r} is too small: height and width must be at least "
                         f"{_MIN_SIDE} px")
    return int(n), int(seed), (h, w)


def _prepare_dest(dest: Path, overwrite: bool) -> bool:
    """Checks ``dest``; returns whether an old synthetic dataset there will be replaced."""
    if not dest.exists() and not dest.is_symlink():
        return False
    if not dest.is_dir() or dest.is_symlink():
        raise DestinationNotEmptyError(
            f"{dest} exists and is not a folder: choose another destination")
    if not any(dest.iterdir()):
        return False
    if not overwrite:
        raise DestinationNotEmptyError(
            f"{dest} is not empty: choose a new or empty folder (from Python, "
            "make_synthetic(..., overwrite=True) replaces a synthetic dataset made earlier)")
    readme = dest / "README.txt"
    try:
        first = readme.read_text(encoding="utf-8", errors="replace").splitlines()[:1]
    except OSError:
        first = []
    if first != [README_MARKER]:
        raise DestinationNotEmptyError(
            f"{dest} is not empty and does not hold a synthetic dataset (no medaidet "
            "README.txt): overwrite=True only replaces a synthetic dataset; choose another "
            "folder or empty this one yourself")
    return True


def make_synthetic(root, n: int = 24, seed: int = 0, size=(480, 640),
                   overwrite: bool = False) -> Path:
    """Write ``n`` synthetic images to ``root`` (built beside it, then renamed in); returns it.
    ``overwrite=True`` replaces only a synthetic dataset written there earlier."""
    n, seed, size = _check_args(n, seed, size)
    root = Path(os.path.abspath(os.path.expanduser(os.fspath(root))))
    replace_old = _prepare_dest(root, overwrite)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.parent / f".{root.name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
    os.mkdir(tmp)
    old = None
    try:
        plan_rng = np.random.default_rng([seed, 0])
        ids = [_ID_FORMAT.format(i) for i in range(n)]
        n_wbc = _schedule(plan_rng, n, (1, 1, 2))
        n_plt = _schedule(plan_rng, n, (1, 2, 3, 1))
        splits = _splits(plan_rng, ids)
        counts = {name: 0 for name in SYNTH_LABEL_NAMES}
        files: dict[str, bytes] = {}
        for i, image_id in enumerate(ids):
            pixels, cells = _make_image(seed, i, size, n_wbc[i], n_plt[i])
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, format="JPEG", quality=_JPEG_QUALITY)
            files[f"JPEGImages/{image_id}.jpg"] = buf.getvalue()
            files[f"Annotations/{image_id}.xml"] = _xml(image_id, size, cells).encode("ascii")
            for cell in cells:
                counts[cell.label] += 1
        for name, members in splits.items():
            files[f"ImageSets/Main/{name}.txt"] = "".join(f"{m}\n" for m in members).encode()
        files["README.txt"] = _readme(n, seed, size, counts, splits).encode("utf-8")
        sums = "".join(f"{hashlib.sha256(data).hexdigest()}  {rel}\n"
                       for rel, data in sorted(files.items()))
        files["SHA256SUMS"] = sums.encode("ascii")
        (tmp / "ImageSets" / "Main").mkdir(parents=True)
        for rel, data in files.items():
            _write(tmp / rel, data)
        if replace_old:
            old = root.parent / f".{root.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
            os.rename(root, old)
        elif root.is_dir():
            root.rmdir()                    # empty: make room for the rename
        os.rename(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and old.exists() and not root.exists():
            os.rename(old, root)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return root
