"""The same field of view photographed twice, found by content (notebook 01, section 6).

Phase correlation of 40x30 thumbnails proposes each image's :data:`SAME_FIELD_CANDIDATES` best
partners and their shift; a pair is kept when the overlapping part of the 80x60 thumbnails
correlates at least :data:`SAME_FIELD_CORRELATION` on at least :data:`SAME_FIELD_OVERLAP` of
the frame (on BCCD same-field pairs score >= 0.89, the best other pair < 0.7)."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from medaidet.errors import ConfigError

__all__ = ["ImagePair", "same_field_pairs", "THUMB", "SAME_FIELD_CORRELATION",
           "SAME_FIELD_OVERLAP", "SAME_FIELD_CANDIDATES"]

SAME_FIELD_CORRELATION = 0.85
SAME_FIELD_OVERLAP = 0.25
SAME_FIELD_CANDIDATES = 3
#: (width, height) of the thumbnails compared: 1/8 of BCCD's 640x480
THUMB = (80, 60)


class ImagePair(NamedTuple):
    """Two photographs of the same field of view. ``dx``, ``dy``: pixels (full
    resolution) by which ``b``'s content appears moved in ``a``."""
    a: str
    b: str
    splits_a: tuple[str, ...]
    splits_b: tuple[str, ...]
    dx: int
    dy: int
    overlap: float           # share of the frame both show
    correlation: float       # normalized correlation of the overlapping part


def _tukey(n: int, alpha: float = 0.5) -> np.ndarray:
    x, edge = np.linspace(0.0, 1.0, n), alpha / 2
    d = np.minimum(x, 1 - x)                # distance to the nearer end
    return np.where(d < edge, 0.5 * (1 + np.cos(np.pi * (d / edge - 1))), 1.0)


def _overlap_correlation(a, b, dy, dx):
    """Normalized correlation of ``a[p + d]`` and ``b[p]`` over their overlap, and its share."""
    h, w = a.shape
    if abs(dy) >= h or abs(dx) >= w:
        return -1.0, 0.0
    pa = a[max(0, dy):h + min(0, dy), max(0, dx):w + min(0, dx)]
    pb = b[max(0, -dy):h + min(0, -dy), max(0, -dx):w + min(0, -dx)]
    pa, pb = pa - pa.mean(), pb - pb.mean()
    denominator = math.sqrt(float((pa * pa).sum()) * float((pb * pb).sum()))
    return (float((pa * pb).sum()) / denominator if denominator else -1.0), pa.size / (h * w)


def same_field_pairs(thumbs: np.ndarray):
    """Pairs of grey thumbnails (N, 60, 80) showing the same scene, by the rule above. Yields
    ``(i, j, dy, dx, overlap, correlation)``, shifts in thumbnail pixels."""
    if not isinstance(thumbs, np.ndarray) or thumbs.ndim != 3 or not thumbs.size:
        raise ConfigError(f"thumbs: {getattr(thumbs, 'shape', type(thumbs).__name__)}; "
                          "expected an array (N, 60, 80) of grey thumbnails")
    n, height, width = thumbs.shape
    h, w = height // 2, width // 2
    small = thumbs[:, :2 * h, :2 * w].reshape(n, h, 2, w, 2).mean(axis=(2, 4))
    window = np.outer(_tukey(h), _tukey(w))
    spectra = np.fft.rfft2((small - small.mean(axis=(1, 2), keepdims=True)) * window)
    magnitude = np.abs(spectra)
    spectra /= magnitude + 1e-3 * magnitude.max()
    peak, shift = np.full((n, n), -np.inf), np.zeros((n, n, 2), dtype=np.int64)
    for i in range(n - 1):
        surface = np.fft.irfft2(spectra[i][None] * np.conj(spectra[i + 1:]), s=(h, w))
        flat = surface.reshape(n - i - 1, -1)
        best = flat.argmax(axis=1)
        peak[i, i + 1:] = peak[i + 1:, i] = flat[np.arange(n - i - 1), best]
        dy, dx = np.unravel_index(best, (h, w))        # shift[i, j] is read for i < j only
        shift[i, i + 1:, 0], shift[i, i + 1:, 1] = (np.where(dy > h // 2, dy - h, dy),
                                                    np.where(dx > w // 2, dx - w, dx))
    partners = np.argsort(-peak, axis=1)[:, :min(SAME_FIELD_CANDIDATES, n - 1)]
    candidates = sorted({(min(i, int(j)), max(i, int(j))) for i in range(n) for j in partners[i]})
    for i, j in candidates:
        y, x = 2 * shift[i, j, 0], 2 * shift[i, j, 1]
        corr, overlap, dy, dx = max(_overlap_correlation(thumbs[i], thumbs[j], y + ey, x + ex)
                                    + (y + ey, x + ex) for ey in (-1, 0, 1) for ex in (-1, 0, 1))
        if corr >= SAME_FIELD_CORRELATION and overlap >= SAME_FIELD_OVERLAP:
            yield i, j, int(dy), int(dx), round(overlap, 3), round(corr, 3)

