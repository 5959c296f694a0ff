"""Convolution by im2col and matrix products, a chunk of the batch at a time (medaidet).

Chainer's im2col convolution builds one column array for the whole batch, of shape
(n, c, kh, kw, out_h, out_w): 207 MB per image for SSD300's conv1_2 in float32, and
``tensordot`` then copied it once more into its own order. Here the batch goes through in
chunks whose column array stays under :data:`MAX_COLUMN_BYTES` (one image at least), and
each image is one matrix product on im2col's own layout, so nothing is copied. An image's
product does not depend on the chunk it is in: forward outputs and input gradients are the
same for every chunk size; the weight gradient adds the chunks' sums (float rounding only).

NumPy and CuPy alike (CuPy 14 has no cuDNN, so every GPU convolution comes here); the
grouped, iDeep and cuDNN paths stay chainer's own. Called by the patched
``convolution_2d.py`` and ``deconvolution_2d.py`` (medaidet_tools.stack.patches).
"""
import numpy

from chainer import backend
from chainer.utils import conv

#: The most bytes one chunk's column array may take; a single image may take more.
MAX_COLUMN_BYTES = 256 * 2 ** 20


def batch_chunks(n, bytes_per_image):
    """Slices of a batch of ``n`` whose column arrays each stay under the bound."""
    step = max(1, min(n, MAX_COLUMN_BYTES // max(1, bytes_per_image)))
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def _im2col(f, x, kh, kw):
    im2col = conv.im2col_cpu if isinstance(x, numpy.ndarray) else conv.im2col_gpu
    return im2col(x, kh, kw, f.sy, f.sx, f.ph, f.pw, cover_all=f.cover_all, dy=f.dy,
                  dx=f.dx)


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
    for s in batch_chunks(n, W.shape[1] * out_h * out_w * x.itemsize):
        col = _im2col(f, x[s], kh, kw)
        col = col.reshape(len(col), W.shape[1], out_h * out_w)
        y[s] = xp.matmul(W, col).reshape(len(col), out_c, out_h, out_w)
    if b is not None:
        y += b.reshape(1, out_c, 1, 1)
    return y,


def grad_w(f, x, gy):
    """The weight gradient of ``conv(x, W)``: x (n, c, h, w), gy (n, out_c, out_h, out_w);
    (out_c, c, kh, kw) in ``f.W_dtype``. ``f``: the Convolution2DGradW."""
    xp = backend.get_array_module(x)
    n, c, _, _ = x.shape
    _, out_c, out_h, out_w = gy.shape
    k = c * f.kh * f.kw
    gW = 0
    for s in batch_chunks(n, k * out_h * out_w * x.itemsize):
        col = _im2col(f, x[s], f.kh, f.kw).reshape(-1, k, out_h * out_w)
        g = xp.ascontiguousarray(gy[s]).reshape(-1, out_c, out_h * out_w)
        gW = gW + xp.matmul(g, col.transpose(0, 2, 1)).sum(axis=0)
    return gW.reshape(out_c, c, f.kh, f.kw).astype(f.W_dtype, copy=False),


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
    for s in batch_chunks(n, W.shape[0] * h * w * x.itemsize):
        xs = xp.ascontiguousarray(x[s]).reshape(-1, in_c, h * w)
        col = xp.matmul(W, xs).astype(x.dtype, copy=False).reshape(-1, out_c, kh, kw, h, w)
        y[s] = col2im(col, f.sy, f.sx, f.ph, f.pw, f.outh, f.outw, dy=f.dy, dx=f.dx)
    if b is not None:
        y += b.reshape(1, out_c, 1, 1)
    return y,
