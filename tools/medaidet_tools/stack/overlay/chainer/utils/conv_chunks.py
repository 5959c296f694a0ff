"""Convolution by im2col and matrix products, a piece of the batch at a time (medaidet).

Chainer's im2col convolution builds one column array for the whole batch, of shape
(n, c, kh, kw, out_h, out_w): 207 MB per image for SSD300's conv1_2 in float32, and
``tensordot`` then copied it once more into its own order. Here the batch goes through in
pieces whose column array stays under :data:`MAX_COLUMN_BYTES`: several images where they
fit, else one image (forward), a band of one image's output rows (weight gradient) or a group
of its channels (input gradient). Each piece is one matrix product per image on im2col's own
layout, so nothing is copied. Forward outputs and input gradients are the same bits whatever
the bound; the weight gradient adds the pieces' sums (float rounding only). The forward's
column array is not split within an image: BLAS may round a band's products differently, and
the peak of a training step is in the backward pass, where the activations' gradients join.
On a GPU the products are 2-D, one per image: CuPy's batched products ignore TF32 and
multiply float16 in float32.

NumPy and CuPy alike (CuPy 14 has no cuDNN, so every GPU convolution comes here); the
grouped, iDeep and cuDNN paths stay chainer's own. Called by the patched
``convolution_2d.py`` and ``deconvolution_2d.py`` (medaidet_tools.stack.patches).
"""
import numpy

from chainer import backend
from chainer.utils import conv

#: The most bytes one piece's column array may take (one image's forward, one output row's
#: band or one channel may take more).
MAX_COLUMN_BYTES = 32 * 2 ** 20


def pieces(n, parts, bytes_per_image):
    """``(images, parts)`` slices covering a batch of ``n`` images of ``parts`` parts each
    (output rows, channels), each piece's column array under the bound: whole images
    together where one fits, else parts of one image."""
    if bytes_per_image <= MAX_COLUMN_BYTES or parts == 1:
        step = max(1, min(n, MAX_COLUMN_BYTES // max(1, bytes_per_image)))
        return [(slice(i, min(i + step, n)), slice(0, parts)) for i in range(0, n, step)]
    step = max(1, MAX_COLUMN_BYTES * parts // bytes_per_image)
    return [(slice(i, i + 1), slice(j, min(j + step, parts)))
            for i in range(n) for j in range(0, parts, step)]


def products(a, b, one_by_one):
    """``a @ b`` per image: a (p, q) or (m, p, q), b (m, q, r); (m, p, r). ``one_by_one``
    (on a GPU): one 2-D product per image, as CuPy honours TF32 (``CUPY_TF32``) and multiplies
    float16 in float16 only in its 2-D products, not in its batched ones."""
    if not one_by_one:
        return a @ b
    return backend.get_array_module(b).stack(
        [(a if a.ndim == 2 else a[i]) @ b[i] for i in range(len(b))])


def _band(f, x, rows, kh):
    """The input rows that output ``rows`` read, with the padding above and below as zeros."""
    xp = backend.get_array_module(x)
    top = rows.start * f.sy - f.ph
    bottom = (rows.stop - 1) * f.sy - f.ph + (kh - 1) * f.dy + 1
    band = xp.zeros(x.shape[:2] + (bottom - top, x.shape[3]), dtype=x.dtype)
    lo, hi = max(top, 0), min(bottom, x.shape[2])
    band[:, :, lo - top:hi - top] = x[:, :, lo:hi]
    return band


def _columns(f, x, kh, kw, rows, out_h, out_w):
    """im2col of ``x`` (m, c, h, w) for output ``rows``: (m, c * kh * kw, rows * out_w)."""
    im2col = conv.im2col_cpu if isinstance(x, numpy.ndarray) else conv.im2col_gpu
    ph, band_h = f.ph, rows.stop - rows.start
    if band_h < out_h:
        x, ph = _band(f, x, rows, kh), 0
    col = im2col(x, kh, kw, f.sy, f.sx, ph, f.pw, dy=f.dy, dx=f.dx, out_h=band_h,
                 out_w=out_w)
    return col.reshape(len(col), -1, band_h * out_w)


def forward(f, x, W, b):
    """``y = conv(x, W) + b``: x (n, c, h, w), W (out_c, c, kh, kw), b (out_c,) or None;
    y (n, out_c, out_h, out_w) in x's dtype. ``f``: the Convolution2DFunction."""
    xp = backend.get_array_module(x)
    n, c, h, w = x.shape
    out_c, _, kh, kw = W.shape
    out_h = conv.get_conv_outsize(h, kh, f.sy, f.ph, f.cover_all, f.dy)
    out_w = conv.get_conv_outsize(w, kw, f.sx, f.pw, f.cover_all, f.dx)
    W = W.reshape(out_c, c * kh * kw)
    y = xp.empty((n, out_c, out_h, out_w), dtype=x.dtype)
    rows = slice(0, out_h)   # whole images: BLAS may round a band of rows otherwise
    for s, _ in pieces(n, 1, W.shape[1] * out_h * out_w * x.itemsize):
        col = _columns(f, x[s], kh, kw, rows, out_h, out_w)
        y[s] = products(W, col, xp is not numpy).reshape(len(col), out_c, out_h, out_w)
    if b is not None:
        y += b.reshape(1, out_c, 1, 1)
    return y,


def grad_w(f, x, gy):
    """The weight gradient of ``conv(x, W)``: x (n, c, h, w), gy (n, out_c, out_h, out_w);
    (out_c, c, kh, kw) in ``f.W_dtype``. ``f``: the Convolution2DGradW."""
    xp = backend.get_array_module(x)
    n, c, _, _ = x.shape
    _, out_c, out_h, out_w = gy.shape
    gW = 0       # (c * kh * kw, out_c): the column array stays in its layout, gy is transposed
    for s, rows in pieces(n, out_h, c * f.kh * f.kw * out_h * out_w * x.itemsize):
        col = _columns(f, x[s], f.kh, f.kw, rows, out_h, out_w)
        g = xp.ascontiguousarray(gy[s, :, rows]).reshape(len(col), out_c, -1)
        gW = gW + products(col, g.transpose(0, 2, 1), xp is not numpy).sum(axis=0)
    # C order, as chainer's own: ChainerMN packs gradients assuming it
    gW = xp.ascontiguousarray(gW.T).reshape(out_c, c, f.kh, f.kw)
    return gW.astype(f.W_dtype, copy=False),


def deconv_forward(f, x, W, b):
    """``y = deconv(x, W) + b`` (a convolution's input gradient): x (n, in_c, h, w),
    W (in_c, out_c, kh, kw), b (out_c,) or None; y (n, out_c, f.outh, f.outw) in x's dtype.
    ``f``: the Deconvolution2DFunction."""
    xp = backend.get_array_module(x)
    col2im = conv.col2im_cpu if xp is numpy else conv.col2im_gpu
    n, in_c, h, w = x.shape
    _, out_c, kh, kw = W.shape
    W = W.reshape(in_c, out_c * kh * kw).T
    y = xp.empty((n, out_c, f.outh, f.outw), dtype=x.dtype)
    for s, chans in pieces(n, out_c, W.shape[0] * h * w * x.itemsize):
        xs = xp.ascontiguousarray(x[s]).reshape(-1, in_c, h * w)
        col = products(W[chans.start * kh * kw:chans.stop * kh * kw], xs, xp is not numpy)
        col = col.astype(x.dtype, copy=False).reshape(len(xs), -1, kh, kw, h, w)
        y[s, chans] = col2im(col, f.sy, f.sx, f.ph, f.pw, f.outh, f.outw, dy=f.dy, dx=f.dx)
    if b is not None:
        y += b.reshape(1, out_c, 1, 1)
    return y,
