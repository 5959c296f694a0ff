"""What we change in the upstream sources, and why (see shared stack notes).

Three kinds of change:

* :class:`Replace` — an exact text substitution that must match exactly
  ``count`` times (the sdists are pinned, so a mismatch is a bug here);
* :class:`RegexReplace` — a substitution over every ``.py`` file of a
  package, for aliases removed from NumPy that appear at many sites;
* :class:`Overlay` — a file of ours (``overlay/`` beside this module) added
  to or replacing one in the tree.
"""
import re
from dataclasses import dataclass
from pathlib import Path

from medaidet_tools.stack.errors import StackError

OVERLAY_DIR = Path(__file__).parent / "overlay"


@dataclass(frozen=True)
class Replace:
    path: str
    old: str
    new: str
    why: str
    count: int = 1

    def apply(self, root: Path) -> str:
        file = root / self.path
        text = file.read_text(encoding="utf-8")
        found = text.count(self.old)
        if found != self.count:
            raise StackError(f"patch for {self.path} expected {self.count} match(es) of "
                             f"{self.old!r}, found {found}: the source is not the pinned one")
        file.write_text(text.replace(self.old, self.new), encoding="utf-8")
        return f"{self.path}: {self.why}"


@dataclass(frozen=True)
class RegexReplace:
    package: str
    pattern: str
    repl: str
    why: str
    min_count: int = 1

    def apply(self, root: Path) -> str:
        regex = re.compile(self.pattern)
        total = 0
        for file in sorted((root / self.package).rglob("*.py")):
            text = file.read_text(encoding="utf-8")
            new, n = regex.subn(self.repl, text)
            if n:
                file.write_text(new, encoding="utf-8")
                total += n
        if total < self.min_count:
            raise StackError(f"patch over {self.package}/ expected at least {self.min_count} "
                             f"match(es) of {self.pattern!r}, found {total}")
        return f"{self.package}/**.py ({total} sites): {self.why}"


@dataclass(frozen=True)
class Overlay:
    path: str
    why: str

    def apply(self, root: Path) -> str:
        source = OVERLAY_DIR / self.path
        (root / self.path).parent.mkdir(parents=True, exist_ok=True)
        (root / self.path).write_bytes(source.read_bytes())
        return f"{self.path}: {self.why}"


_HELPER_REQUIRE_SKIP = """    ws = pkg_resources.WorkingSet()
    try:
        ws.require(*requirements)
        skip = {}
    except pkg_resources.ResolutionError:
        skip = {}
"""

# Chainer's im2col convolution builds one column array, (n, c, kh, kw, out_h, out_w), for the
# whole batch, and tensordot copies it again into (n * out_h * out_w, c * kh * kw) order: for
# SSD300's conv1_2 that is 207 MB per image, twice, most of a training step's memory (on a GPU
# with CuPy 14, which has no cuDNN, too). chainer/utils/conv_chunks.py (overlay) goes through
# the batch in chunks whose column array stays under a bound, one matrix product per image on
# im2col's own layout (no copy): SSD300's forward + backward on a CPU takes about half the
# memory per image (benchmarks/bench_conv_memory.py), and the small SSD's training step on a
# 2-core CPU is about 1.4x faster than with tensordot (benchmarks/bench_cpu_step.py). The
# forward, the weight gradient and the input gradient (the deconvolution's forward), on NumPy
# and CuPy; the grouped, iDeep and cuDNN paths stay chainer's. tests/stack/test_conv_chunks.py
# checks them against chainer's unpatched code.
_CONV_FORWARD_CPU = """        kh, kw = W.shape[2:]
        col = conv.im2col_cpu(
            x, kh, kw, self.sy, self.sx, self.ph, self.pw,
            cover_all=self.cover_all, dy=self.dy, dx=self.dx)
        y = numpy.tensordot(
            col, W, ((1, 2, 3), (1, 2, 3))).astype(x.dtype, copy=False)
        if b is not None:
            y += b
        y = numpy.rollaxis(y, 3, 1)
        return y,
"""
_CONV_FORWARD_GPU = """        kh, kw = W.shape[2:]
        # Implementation using im2col
        col = conv.im2col_gpu(
            x, kh, kw, self.sy, self.sx, self.ph, self.pw,
            cover_all=self.cover_all, dy=self.dy, dx=self.dx)
        y = cuda.cupy.tensordot(
            col, W, ((1, 2, 3), (1, 2, 3))).astype(x.dtype, copy=False)
        # TODO(beam2d): Support unshared bias
        if b is not None:
            y += b
        y = cuda.cupy.rollaxis(y, 3, 1)
        return y,
"""
_CONV_GRAD_W_CPU = """        col = conv.im2col_cpu(
            x, self.kh, self.kw, self.sy, self.sx, self.ph, self.pw,
            cover_all=self.cover_all, dy=self.dy, dx=self.dx)
        gW = numpy.tensordot(gy, col, ((0, 2, 3), (0, 4, 5))
                             ).astype(self.W_dtype, copy=False)
        return gW,
"""
_CONV_GRAD_W_GPU = """        col = conv.im2col_gpu(
            x, self.kh, self.kw, self.sy, self.sx, self.ph, self.pw,
            cover_all=self.cover_all, dy=self.dy, dx=self.dx)
        gW = cuda.cupy.tensordot(gy, col, ((0, 2, 3), (0, 4, 5))
                                 ).astype(self.W_dtype, copy=False)
        return gW,
"""
_DECONV_FORWARD_CPU = """        gcol = numpy.tensordot(W, x, (0, 1)).astype(x.dtype, copy=False)
        gcol = numpy.rollaxis(gcol, 3)
        y = conv.col2im_cpu(
            gcol, self.sy, self.sx, self.ph, self.pw, self.outh, self.outw,
            dy=self.dy, dx=self.dx)
        # b, k, h, w
        if b is not None:
            y += b.reshape((1, b.size, 1, 1))
        return y,
"""
_DECONV_FORWARD_GPU = """        # Implementation using col2im
        gcol = cuda.cupy.tensordot(W, x, (0, 1)).astype(x.dtype,
                                                        copy=False)
        # - k, m, n: shape of out_channel
        # - b: number of inputs
        # - h, w: height and width of kernels
        # k, m, n, b, h, w -> b, k, m, n, h, w
        gcol = cuda.cupy.rollaxis(gcol, 3)
        y = conv.col2im_gpu(
            gcol, self.sy, self.sx, self.ph, self.pw, self.outh, self.outw,
            dy=self.dy, dx=self.dx)
        if b is not None:
            y += b.reshape(1, b.size, 1, 1)
        return y,
"""
_CONV_WHY = ("im2col convolution (CPU and GPU) a chunk of the batch at a time, one matrix "
             "product per image on im2col's layout: no batch-sized column array, no "
             "tensordot copy (chainer/utils/conv_chunks.py)")
_IMPORT_CHUNKS = ("from chainer.utils import conv\n",
                  "from chainer.utils import conv\nfrom chainer.utils import conv_chunks\n")
_CONV = "chainer/functions/connection/convolution_2d.py"
_DECONV = "chainer/functions/connection/deconvolution_2d.py"

# CuPy 14 has no cuDNN, so chainer's GPU convolution is im2col + cuBLAS, and the gradient
# for a convolution's input goes through col2im: its kernel computed the index into the
# (n, c, kh, kw, out_h, out_w) column array in 32-bit ints. SSD300's conv1_2 at batch 42 or
# more has over 2**31 columns: the index wrapped negative and the kernel read outside the
# array (seen on an H100: cudaErrorIllegalAddress from batch 64 up; docs/gpu.md). 64-bit
# index arithmetic in both kernels (tests/stack/test_gpu_kernels.py checks it on the CPU).
_WHY_64BIT = ("GPU im2col/col2im index the column array in 64-bit arithmetic: with no cuDNN "
              "(CuPy 14) a batch over ~41 SSD300 images wrapped a 32-bit index (illegal "
              "memory access)")

CHAINER_PATCHES = (
    Overlay("chainer/_requirements.py",
            "requirement checks with importlib.metadata instead of pkg_resources"),
    Overlay("chainer/_environment_check.py",
            "no pkg_resources / numpy.distutils at import (setuptools >= 82, Python 3.12, "
            "NumPy 2)"),
    Replace("chainer/_version.py", "'specifier': '>=7.7.0,<8.0.0',",
            "'specifier': '>=13.0.0,<15.0.0',",
            "CuPy 13/14 are the supported CuPy versions of this build"),
    Replace("chainer/_version.py", "            'cupy-cuda120',\n",
            "            'cupy-cuda13x',\n            'cupy-cuda12x',\n            'cupy-cuda120',\n",
            "know today's CuPy package names (multiple-install warning)"),
    Replace("chainer/testing/helper.py", "import pkg_resources\n",
            "from chainer import _requirements\n", "no pkg_resources"),
    Replace("chainer/testing/helper.py", _HELPER_REQUIRE_SKIP.format("False", "True"),
            "    skip = not _requirements.satisfied(*requirements)\n",
            "with_requires without pkg_resources"),
    Replace("chainer/testing/helper.py", _HELPER_REQUIRE_SKIP.format("True", "False"),
            "    skip = _requirements.satisfied(*requirements)\n",
            "without_requires without pkg_resources"),
    Replace("chainer/testing/doctest_helper.py", "import pkg_resources\n",
            "from chainer import _requirements\n", "no pkg_resources"),
    Replace("chainer/testing/doctest_helper.py",
            "    ws = pkg_resources.WorkingSet()\n    try:\n        ws.require(*requirements)\n"
            "    except pkg_resources.ResolutionError:\n        return False\n",
            "    if not _requirements.satisfied(*requirements):\n        return False\n",
            "skipif_requires_satisfied without pkg_resources"),
    Replace("chainer/functions/array/as_strided.py", "np.sctypes['int']",
            "(np.int8, np.int16, np.int32, np.int64)", "np.sctypes was removed in NumPy 2"),
    Replace("chainer/functions/array/as_strided.py", "np.sctypes['float']",
            "(np.float16, np.float32, np.float64, np.longdouble)",
            "np.sctypes was removed in NumPy 2"),
    RegexReplace("chainer/functions/array", r"\bnumpy\.float\b", "numpy.float64",
                 "numpy.float was removed in NumPy 1.24", min_count=6),
    Replace("chainermn/communicators/_memory_utility.py",
            "xp.array(v, copy=False, dtype=transfer_dtype)",
            "xp.asarray(v, dtype=transfer_dtype)",
            "copy=False raises in NumPy 2 when a copy is needed"),
    Overlay("chainer/utils/conv_chunks.py", _CONV_WHY),
    Replace(_CONV, *_IMPORT_CHUNKS, _CONV_WHY),
    Replace(_CONV, _CONV_FORWARD_CPU, "        return conv_chunks.forward(self, x, W, b)\n",
            _CONV_WHY),
    Replace(_CONV, _CONV_FORWARD_GPU, "        return conv_chunks.forward(self, x, W, b)\n",
            _CONV_WHY),
    Replace(_CONV, _CONV_GRAD_W_CPU, "        return conv_chunks.grad_w(self, x, gy)\n",
            _CONV_WHY),
    Replace(_CONV, _CONV_GRAD_W_GPU, "        return conv_chunks.grad_w(self, x, gy)\n",
            _CONV_WHY),
    Replace(_DECONV, *_IMPORT_CHUNKS, _CONV_WHY),
    Replace(_DECONV, _DECONV_FORWARD_CPU,
            "        return conv_chunks.deconv_forward(self, x, W, b)\n", _CONV_WHY),
    Replace(_DECONV, _DECONV_FORWARD_GPU,
            "        return conv_chunks.deconv_forward(self, x, W, b)\n", _CONV_WHY),
    Replace("chainer/utils/conv.py",
            "int k = out_y + out_h * (kx + kw * (ky + kh * c0));",
            "ptrdiff_t k = out_y + out_h * (kx + kw * (ky + kh * (ptrdiff_t)c0));",
            _WHY_64BIT),
    Replace("chainer/utils/conv.py", "col = img[in_x + w * (in_y + h * c0)];",
            "col = img[in_x + w * (in_y + h * (ptrdiff_t)c0)];", _WHY_64BIT),
    # CuPy 14's headers no longer define `half`: pure_nccl's gradient packing kernels did
    # not compile (NVRTC: identifier "half" is undefined; seen on an H100, docs/gpu.md)
    Replace("chainermn/communicators/_memory_utility.py", "#include <cupy/carray.cuh>\n",
            "#include <cuda_fp16.h>\n#include <cupy/carray.cuh>\n",
            "ChainerMN pure_nccl's packing kernels include cuda_fp16.h: CuPy 14's headers no "
            "longer define half (NVRTC compile error)", count=2),
)

CHAINERCV_PATCHES = (
    Replace("chainercv/__init__.py", "import pkg_resources\n", "import importlib.metadata\n",
            "no pkg_resources"),
    Replace("chainercv/__init__.py", "pkg_resources.get_distribution('chainercv').version",
            "importlib.metadata.version('chainercv')", "no pkg_resources"),
    Replace("chainercv/utils/download.py", "from distutils.util import strtobool\n",
            "def strtobool(value):\n"
            "    return value.strip().lower() in ('y', 'yes', 't', 'true', 'on', '1')\n",
            "distutils is gone from Python 3.12"),
    RegexReplace("chainercv", r"\bnp\.(bool|int|float|object)\b(?!\.)", r"\1",
                 "np.bool/np.int/np.float/np.object were removed in NumPy 1.24",
                 min_count=15),
    Overlay("chainercv/utils/bbox/_nms_gpu_post.py",
            "NumPy replacement for the compiled module (its C no longer builds)"),
)


def apply_all(root: Path, patches) -> list:
    """Apply ``patches`` to the source tree at ``root``; return one line per patch."""
    return [patch.apply(root) for patch in patches]
