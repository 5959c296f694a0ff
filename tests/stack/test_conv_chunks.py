"""Chainer's im2col convolution patched to go through the batch in pieces (the stack's
chainer/utils/conv_chunks.py overlay), against chainer's unpatched code on odd shapes."""
import tracemalloc

import numpy as np
import pytest

import chainer
import chainer.functions as F
from chainer.utils import conv, conv_chunks

# (batch, in_c, h, w, out_c, kh, kw, stride, pad, dilate, cover_all)
SHAPES = [
    (5, 3, 11, 9, 4, 3, 3, (2, 1), (1, 2), 1, False),
    (1, 2, 7, 8, 3, 3, 2, 1, 0, 1, False),
    (4, 3, 10, 10, 2, 3, 3, 1, 2, 2, False),
    (3, 4, 9, 12, 5, 2, 3, (3, 2), (0, 1), (1, 2), True),
    (7, 1, 6, 6, 2, 1, 1, 1, 0, 1, False),
]
IDS = ["stride-pad", "batch1", "dilate", "cover_all", "1x1-batch7"]


def _pair(v):
    return v if isinstance(v, tuple) else (v, v)


def unpatched(x, W, b, gy, stride, pad, dilate, cover_all):
    """y, gW and gx as chainer 7.8.1's own CPU code computes them, on the whole batch."""
    (sy, sx), (ph, pw), (dy, dx) = _pair(stride), _pair(pad), _pair(dilate)
    kh, kw = W.shape[2:]
    col = conv.im2col_cpu(x, kh, kw, sy, sx, ph, pw, cover_all=cover_all, dy=dy, dx=dx)
    y = np.tensordot(col, W, ((1, 2, 3), (1, 2, 3))).astype(x.dtype, copy=False) + b
    y = np.rollaxis(y, 3, 1)
    gW = np.tensordot(gy, col, ((0, 2, 3), (0, 4, 5))).astype(W.dtype, copy=False)
    gcol = np.rollaxis(np.tensordot(W, gy, (0, 1)).astype(x.dtype, copy=False), 3)
    gx = conv.col2im_cpu(gcol, sy, sx, ph, pw, x.shape[2], x.shape[3], dy=dy, dx=dx)
    return y, gW, gx


def patched(x, W, b, gy, stride, pad, dilate, cover_all):
    """y, gW, gx through chainer.functions.convolution_2d and its backward."""
    xv, Wv, bv = chainer.Variable(x), chainer.Variable(W), chainer.Variable(b)
    y = F.convolution_2d(xv, Wv, bv, stride=stride, pad=pad, dilate=dilate,
                         cover_all=cover_all)
    y.grad = gy
    y.backward()
    return y.array, Wv.grad, xv.grad


def _case(shape, dtype=np.float32, seed=0):
    n, c, h, w, out_c, kh, kw, stride, pad, dilate, cover_all = shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    W = rng.standard_normal((out_c, c, kh, kw)).astype(dtype)
    b = rng.standard_normal(out_c).astype(dtype)
    (sy, sx), (ph, pw), (dy, dx) = _pair(stride), _pair(pad), _pair(dilate)
    out_h = conv.get_conv_outsize(h, kh, sy, ph, cover_all, dy)
    out_w = conv.get_conv_outsize(w, kw, sx, pw, cover_all, dx)
    gy = rng.standard_normal((n, out_c, out_h, out_w)).astype(dtype)
    return (x, W, b, gy, stride, pad, dilate, cover_all)


def _column_bytes(x, W, gy):
    """One image's column array, in bytes."""
    return W.shape[1] * W.shape[2] * W.shape[3] * gy.shape[2] * gy.shape[3] * x.itemsize


@pytest.fixture
def bound(monkeypatch):
    def set_bound(value):
        monkeypatch.setattr(conv_chunks, "MAX_COLUMN_BYTES", value)
    return set_bound


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
@pytest.mark.parametrize("images_per_piece", [0.2, 0.5, 1, 2, None])
def test_matches_chainers_unpatched_convolution(shape, images_per_piece, bound):
    """Pieces of several images, of one, and of a band of rows (a group of channels) of one."""
    case = _case(shape, np.float64)
    x, W, _, gy = case[:4]
    bound(int(_column_bytes(x, W, gy) * (images_per_piece or len(x))))
    for got, want, name in zip(patched(*case), unpatched(*case), ("y", "gW", "gx")):
        assert got.shape == want.shape and got.dtype == want.dtype, name
        # C order, as chainer's own y and gW (ChainerMN's gradient packing relies on it)
        assert got.flags.c_contiguous, name
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_forward_and_input_gradient_are_the_same_bits_whatever_the_piece(shape, bound):
    """The weight gradient sums the pieces in another order: equal up to float rounding."""
    case = _case(shape, np.float32, seed=1)
    x, W, _, gy = case[:4]
    results = []
    for images in (0.1, 0.3, 1, 2, 3, len(x)):
        bound(int(_column_bytes(x, W, gy) * images))
        results.append(patched(*case))
    (y, gW, gx), want = results[-1], unpatched(*case)
    np.testing.assert_allclose(y, want[0], rtol=1e-5, atol=1e-5)
    for other in results[:-1]:
        np.testing.assert_array_equal(other[0], y)
        np.testing.assert_array_equal(other[2], gx)
        np.testing.assert_allclose(other[1], gW, rtol=1e-5, atol=1e-5)


def test_deconvolution_matches_chainers_unpatched_code(bound):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4, 5, 6))
    W = rng.standard_normal((4, 3, 3, 2))
    b = rng.standard_normal(3)
    bound(3 * 3 * 2 * 5 * 6 * 8 * 2)
    y = F.deconvolution_2d(x, W, b, stride=2, pad=1, outsize=(10, 11)).array
    gcol = np.rollaxis(np.tensordot(W, x, (0, 1)), 3)
    want = conv.col2im_cpu(gcol, 2, 2, 1, 1, 10, 11) + b.reshape(1, 3, 1, 1)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n, parts, per_image, limit, sizes", [
    (8, 10, 100, 250, [(2, 10)] * 4),
    (7, 10, 100, 300, [(3, 10), (3, 10), (1, 10)]),
    (2, 10, 500, 100, [(1, 2)] * 10),            # an image over the bound: 2 parts a piece
    (1, 7, 700, 300, [(1, 3), (1, 3), (1, 1)]),
    (2, 1, 500, 100, [(1, 1)] * 2),              # one part over the bound: one a piece
    (1, 10, 1000, 10, [(1, 1)] * 10),
    (4, 3, 1, 1000, [(4, 3)]),
])
def test_pieces_cover_the_batch_under_the_bound(n, parts, per_image, limit, sizes, bound):
    bound(limit)
    pieces = conv_chunks.pieces(n, parts, per_image)
    assert [(s.stop - s.start, p.stop - p.start) for s, p in pieces] == sizes
    covered = [(i, j) for s, p in pieces for i in range(s.start, s.stop)
               for j in range(p.start, p.stop)]
    assert sorted(covered) == [(i, j) for i in range(n) for j in range(parts)]


def _peak_bytes(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("fraction", [1, 1 / 8], ids=["an image", "an eighth of one"])
def test_the_column_array_is_bounded(bound, fraction):
    """Peak memory of forward + backward on 8 images: about one piece's column array, not 8."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 16, 64, 64)).astype(np.float32)
    W = rng.standard_normal((8, 16, 3, 3)).astype(np.float32)
    per_image = 16 * 9 * 64 * 64 * 4                # 2.4 MB; the batch's 18.9 MB

    def step():
        xv, Wv = chainer.Variable(x), chainer.Variable(W)
        y = F.convolution_2d(xv, Wv, pad=1)
        F.sum(y).backward()

    bound(int(per_image * fraction))
    chunked = _peak_bytes(step)
    bound(8 * per_image)
    whole = _peak_bytes(step)
    assert whole > 8 * per_image                    # the batch's column array was there
    assert chunked < whole - (8 - 2 * fraction) * per_image, (chunked, whole)


@pytest.mark.parametrize("a_shape", [(4, 6), (3, 4, 6)], ids=["shared", "per-image"])
def test_one_product_per_image_equals_the_batched_product(a_shape):
    """The GPU's way (CuPy honours TF32 and float16 only in 2-D products), here on NumPy."""
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal(a_shape), rng.standard_normal((3, 6, 5))
    np.testing.assert_array_equal(conv_chunks.products(a, b, one_by_one=True),
                                  conv_chunks.products(a, b, one_by_one=False))
