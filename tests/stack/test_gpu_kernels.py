"""Chainer's GPU im2col/col2im kernels' index arithmetic, compiled as C++ with -fwrapv on the
CPU: a 32-bit index wraps past 2**31 elements (SSD300's conv1_2 at batch 64 has 3.3e9 columns)."""
import inspect
import os
import re
import shutil
import subprocess

import pytest

from chainer.utils import conv

CXX = shutil.which("c++") or shutil.which("g++")
pytestmark = pytest.mark.skipif(CXX is None and os.environ.get("CI_REQUIRE_CXX") != "1",
                                reason="needs a C++ compiler (CI installs one)")

HARNESS = r"""
#include <climits>
#include <cstddef>
#include <cstdio>
typedef float T;
struct Recording {  // a raw array that records the lowest and highest index read
    long long lo = LLONG_MAX, hi = LLONG_MIN;
    T operator[](long long j) { if (j < lo) lo = j; if (j > hi) hi = j; return 0; }
};
int main() {
    const int h = %(h)d, w = %(w)d, out_h = %(out_h)d, out_w = %(out_w)d, kh = %(kh)d,
              kw = %(kw)d, sy = 1, sx = 1, ph = 1, pw = 1, dy = 1, dx = 1;
    Recording %(raw)s;
    const long long ranges[2][2] = {{0, 2000}, {%(size)dLL - 2000, %(size)dLL}};
    for (const auto& r : ranges)
        for (ptrdiff_t i = r[0]; i < r[1]; ++i) {
            T %(out)s;
            %(body)s
        }
    std::printf("%%lld %%lld\n", %(raw)s.lo, %(raw)s.hi);
}
"""


def kernel_body(function):
    """The CUDA source of the elementwise kernel inside ``function`` (as installed)."""
    return re.search(r"'''(.*?)'''", inspect.getsource(function), re.S).group(1)


def indices_read(tmp_path, function, raw, out, size, shape):
    """Lowest and highest index read from ``raw`` over the first and last 2000 of ``size``."""
    source = tmp_path / f"{function.__name__}.cpp"
    source.write_text(HARNESS % dict(shape, raw=raw, out=out, size=size,
                                     body=kernel_body(function)))
    exe = tmp_path / function.__name__
    subprocess.run([CXX, "-O1", "-fwrapv", "-w", "-o", str(exe), str(source)], check=True,
                   capture_output=True, text=True)
    lo, hi = subprocess.run([str(exe)], check=True, capture_output=True, text=True
                            ).stdout.split()
    return int(lo), int(hi)


# SSD300's conv1_2 (64 channels, 3x3, pad 1, 300x300); batches 64 and 400 pass 2**31 elements
CONV1_2 = dict(h=300, w=300, out_h=300, out_w=300, kh=3, kw=3)


@pytest.mark.parametrize("function, raw, out, batch", [
    (conv.col2im_gpu, "col", "img", 8), (conv.col2im_gpu, "col", "img", 64),
    (conv.im2col_gpu, "img", "col", 8), (conv.im2col_gpu, "img", "col", 400)],
    ids=["col2im-8", "col2im-64", "im2col-8", "im2col-400"])
def test_kernels_read_inside_their_input_array(tmp_path, function, raw, out, batch):
    n_c = batch * 64
    pixels, columns = n_c * 300 * 300, n_c * 9 * 300 * 300
    size, inside = (pixels, columns) if raw == "col" else (columns, pixels)
    lo, hi = indices_read(tmp_path, function, raw, out, size, CONV1_2)
    assert 0 <= lo and hi < inside, (lo, hi, inside)
    assert hi > inside - 300 * 300     # the last image's values are reached
