"""The installed stack: imports without removed APIs, SSD on CPU, CuPy choice, the installer."""
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, fake_distribution, run_python
from medaidet_tools.stack import cuda, sources, status
from medaidet_tools.stack.errors import StackError

BLOCK_REMOVED_MODULES = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('pkg_resources', 'distutils') or name == 'numpy.distutils':
            raise ImportError('blocked by the test: ' + name)
sys.meta_path.insert(0, Block())
"""


def test_installed_stack_is_our_build():
    report = status()
    assert report.ok, str(report)
    assert report.chainer == sources.CHAINER.wheel_version
    assert report.chainercv == sources.CHAINERCV.wheel_version


def test_imports_and_with_requires_need_no_pkg_resources_nor_distutils():
    code = BLOCK_REMOVED_MODULES + """
import warnings
warnings.simplefilter('error')
warnings.filterwarnings('ignore', 'Overriding method', DeprecationWarning)
import chainer, chainer.testing, chainercv, chainercv.utils, chainercv.links, chainercv.datasets
from chainercv.links.model.ssd import multibox_loss, random_crop_with_bbox_constraints
import chainermn, unittest
@chainer.testing.with_requires('numpy>=1.0')
class A(unittest.TestCase):
    def test(self): pass
@chainer.testing.with_requires('numpy<1.0')
class B(unittest.TestCase):
    def test(self): pass
print(chainercv.__version__, getattr(A, '__unittest_skip__', False), B.__unittest_skip__)
"""
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [sources.CHAINERCV.wheel_version, "False", "True"]


def _direct_convolution(x, W, stride, pad, dilate, out_hw):
    """Convolution as a sum over kernel offsets (no im2col, no matrix product)."""
    n, _, _, _ = x.shape
    out_c, _, kh, kw = W.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad + stride), (pad, pad + stride)))
    out_h, out_w = out_hw
    y = np.zeros((n, out_c, out_h, out_w))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * dilate:i * dilate + stride * out_h:stride,
                       j * dilate:j * dilate + stride * out_w:stride]
            y += np.einsum("nchw,oc->nohw", patch, W[:, :, i, j])
    return y


@pytest.mark.parametrize("stride, pad, dilate, cover_all", [
    (1, 1, 1, False), (2, 1, 1, False), (1, 0, 1, False), (2, 0, 1, True), (1, 2, 2, False)])
def test_cpu_convolution_agrees_with_a_direct_sum(stride, pad, dilate, cover_all):
    # our build computes the CPU convolution with numpy.matmul instead of numpy.tensordot
    import chainer.functions as F
    from chainer import gradient_check

    rng = np.random.RandomState(0)
    x = rng.randn(3, 5, 13, 11)
    W = rng.randn(7, 5, 3, 3)
    b = rng.randn(7)

    def conv(x, W, b):
        return F.convolution_2d(x, W, b, stride=stride, pad=pad, dilate=dilate,
                                cover_all=cover_all)

    y = conv(x, W, b).array
    expected = _direct_convolution(x, W, stride, pad, dilate, y.shape[2:]) + b[:, None, None]
    np.testing.assert_allclose(y, expected, rtol=1e-10, atol=1e-10)
    gy = rng.randn(*y.shape)
    gradient_check.check_backward(conv, (x, W, b), gy, dtype=np.float64, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arg, numpy_version, smi, expected", [
    ("none", "2.3.0", "CUDA Version: 12.4", None),
    ("auto", "2.3.0", None, None),
    ("auto", "2.3.0", "| NVIDIA-SMI 550.54  Driver Version: 550.54  CUDA Version: 12.4 |",
     "cupy-cuda12x>=14,<15"),
    ("auto", "1.26.4", "CUDA Version: 12.2", "cupy-cuda12x>=13.6,<14"),
    ("auto", "2.5.0", "CUDA Version: 13.0", "cupy-cuda13x>=14,<15"),
    ("12", "1.26.4", None, "cupy-cuda12x>=13.6,<14"),
    ("13", "2.1.0", None, "cupy-cuda13x>=14,<15"),
])
def test_cupy_choice(arg, numpy_version, smi, expected):
    choice = cuda.choose_cupy(arg, numpy_version, smi)
    assert choice.requirement == expected
    assert choice.reason


def test_cupy_choice_refuses_old_driver_and_unknown_output():
    with pytest.raises(StackError, match="CUDA 11 only"):
        cuda.choose_cupy("auto", "2.0.0", "CUDA Version: 11.4")
    with pytest.raises(StackError, match="--cuda 12"):
        cuda.choose_cupy("auto", "2.0.0", "NVIDIA-SMI has failed")


def test_install_again_is_a_no_op():
    cmd = [sys.executable, "-m", "medaidet", "stack", "install", "--cuda", "none"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "already installed" in done.stdout and "pip install" not in done.stdout


@pytest.mark.parametrize("name, version, refused", [("cupy-cuda11x", "12.3.0", True),
                                                     ("cupy-cuda12x", "14.1.0", False)])
def test_install_keeps_a_fitting_cupy_and_refuses_a_second_one(site_dir, name, version,
                                                               refused):
    fake_distribution(site_dir, name, version)
    code = ("from medaidet_tools.stack.install import _install_cupy\n"
            "from medaidet_tools.stack.cuda import choose_cupy\n"
            "_install_cupy(choose_cupy('12', '2.2.0', None), None, print)\n")
    done = run_python(code, extra_path=[site_dir])
    assert (done.returncode != 0) is refused, done.stderr
    assert (f"{name}=={version}" in done.stderr if refused else
            f"keeping {name} {version}" in done.stdout)


def test_install_never_replaces_a_newer_numpy_by_an_older_one(site_dir, tmp_path):
    """A NumPy past the supported range, as a newer Colab image would have."""
    fake_distribution(site_dir, "numpy", "2.6.0")
    cache = tmp_path / "cache"
    code = ("from medaidet_tools.stack.install import install\n"
            f"install(cuda='none', cache_dir={str(cache)!r})\n")
    done = run_python(code, extra_path=[site_dir])
    assert done.returncode != 0 and "StackError" in done.stderr
    assert "NumPy 2.6.0" in done.stderr.strip().splitlines()[-1]
    assert "pip install" not in done.stdout and not cache.exists()


@pytest.mark.parametrize("version, newer", [
    ("2.5.5", False), ("1.26.4", False), ("2.6.0", True), ("2.10.0", True), ("3.0.0rc1", True),
    ("1.24.4", False), (None, False)])
def test_numpy_newer_than_supported(version, newer):
    from medaidet.compat import numpy_newer_than_supported
    assert numpy_newer_than_supported(version) is newer


def test_cli_works_before_chainer_is_installed():
    block = ("import importlib.abc, sys\n"
             "class Block(importlib.abc.MetaPathFinder):\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name.split('.')[0] in ('chainer', 'chainercv', 'cupy'):\n"
             "            raise ImportError('not installed (blocked by the test): ' + name)\n"
             "sys.meta_path.insert(0, Block())\n"
             "from medaidet.cli import main\n")
    done = run_python(block + "raise SystemExit(main(['stack', 'status', '--json']))")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["chainer_ours"]  # read from metadata, not imported
    done = run_python(block + "raise SystemExit(main(['--help']))")
    assert done.returncode == 0 and "train" in done.stdout, done.stderr
    for argv in (['train', '--profile', 'smoke'], ['count', 'w.npz', '--device', 'gpu']):
        done = run_python(block + f"raise SystemExit(main({argv!r}))")
        assert done.returncode == 2 and "medaidet stack install" in done.stderr, argv
