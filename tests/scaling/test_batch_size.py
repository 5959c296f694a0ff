"""The batch-size finder: a stub chain here, and SSD300 in a subprocess limited by RLIMIT_AS."""
import json

import chainer
import chainer.functions as F
import numpy as np
import pytest

from medaidet.errors import ConfigError, DeviceError
from medaidet.extras.scaling import (BatchSizeReport, BatchSizeTry, find_batch_size,
                                         measure_batch_sizes)
from medaidet.extras.scaling import plot_memory
from medaidet.training.memory import is_out_of_memory


class HungryChain(chainer.Chain):
    """Above ``fits`` images, NumPy raises its real MemoryError (asks for 2**60 bytes)."""

    def __init__(self, fits):
        super().__init__()
        with self.init_scope():
            self.w = chainer.Parameter(np.ones(3, np.float32))
        self.fits = fits
        self.seen = []

    def forward(self, imgs, gt_mb_locs, gt_mb_labels):
        self.seen.append(len(imgs))
        if len(imgs) > self.fits:
            np.empty(2**60, np.uint8)
        work = chainer.Variable(np.ones((len(imgs), 1 << 16), np.float32))
        return F.sum(work * F.sum(self.w)) + F.sum(imgs)


def stub_samples(n):
    """``n`` examples ``(img, gt_mb_locs, gt_mb_labels)`` of 12 priors for HungryChain."""
    return [(np.full((3, 4, 4), 1 + i / 3, np.float32), np.zeros((12, 4), np.float32),
             np.zeros(12, np.int32)) for i in range(n)]


def test_finder_halves_until_it_fits_and_reports_every_try():
    chain, lines = HungryChain(fits=3), []
    report = find_batch_size(chain, stub_samples(4), start=32, log=lines.append)
    assert chain.seen == [t.batch_size for t in report.tries] == [32, 16, 8, 4, 2]
    assert [t.ok for t in report.tries] == [False] * 4 + [True]
    assert all(t.error.startswith("MemoryError") for t in report.tries[:4])
    assert report.best_batch_size == 2
    assert report.tries[-1].peak_bytes >= 2 * 4 * (1 << 16)        # the (2, 65536) array
    assert report.tries[-1].images_per_second > 0
    assert len(lines) == 5 and "out of memory" in lines[0] and "fits" in lines[-1]
    assert report.accumulate == 16 and report.micro_batch_size == 2
    assert "--batch-size 32 --accumulate 16" in report.suggestion
    assert "largest batch size that fit: 2" in str(report)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["best_batch_size"] == 2 and len(data["tries"]) == 5
    assert data["tries"][-1]["images_per_second"] > 0
    assert chain.w.grad is None


def test_finder_min_batch_size_target_and_a_fit_at_once():
    report = find_batch_size(HungryChain(fits=5), stub_samples(2), start=12,
                             min_batch_size=5, target_batch_size=30, log=None)
    assert [t.batch_size for t in report.tries] == [12, 6, 5]
    assert report.micro_batch_size == 5 and report.accumulate == 6
    report = find_batch_size(HungryChain(fits=64), stub_samples(2), start=8, log=None)
    assert [t.ok for t in report.tries] == [True]
    assert "no accumulation needed" in report.suggestion and report.accumulate == 1


def test_no_batch_size_fits_is_named():
    with pytest.raises(DeviceError) as info:
        find_batch_size(HungryChain(fits=0), stub_samples(2), start=4, log=None)
    assert info.value.kind == "memory"
    assert [(t.batch_size, t.ok) for t in info.value.report.tries] == [
        (4, False), (2, False), (1, False)]


def test_other_errors_propagate():
    class Broken(HungryChain):
        def forward(self, *args):
            raise KeyError("not a memory problem")

    with pytest.raises(KeyError):
        find_batch_size(Broken(fits=1), stub_samples(2), start=2, log=None)
    assert not is_out_of_memory(KeyError("x"))
    assert is_out_of_memory(MemoryError())


def test_measure_batch_sizes_tries_every_size_and_records_the_ones_that_fail():
    chain, lines = HungryChain(fits=3), []
    report = measure_batch_sizes(chain, stub_samples(4), sizes=(4, 1, 2, 8), log=lines.append)
    assert chain.seen == [1, 2, 4, 8]
    assert [t.ok for t in report.tries] == [True, True, False, False]
    one, two = report.tries[:2]
    assert two.peak_bytes > one.peak_bytes >= 4 * (1 << 16)
    assert report.best_batch_size == 2 and report.target_batch_size == 8
    assert len(lines) == 4 and chain.w.grad is None
    back = BatchSizeReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert back.tries == report.tries and back.device == report.device
    with pytest.raises(ValueError, match=r"^sizes: \[0, 2\] holds 0, not a batch size"):
        measure_batch_sizes(chain, stub_samples(2), sizes=(0, 2), log=None)


def test_plot_memory():
    report = BatchSizeReport("@numpy", "tracemalloc", 8, [
        BatchSizeTry(8, False, "MemoryError: x", seconds=0.1),
        BatchSizeTry(4, False, "MemoryError: x", seconds=0.1),
        BatchSizeTry(2, True, peak_bytes=3 << 30, seconds=4.0)])
    fig = plot_memory(report)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "batch size" and ax.get_ylabel() == "peak memory (MiB)"
    assert ax.get_title() == "Memory per batch size on the CPU\n(peak: tracemalloc)"
    fits, failed = ax.lines[:2]
    assert (fits.get_label(), failed.get_label()) == ("fits (peak)",
                                                      "out of memory (needed more)")
    # the largest size is called a fit only when a larger one failed
    assert "largest that fit: 2" in [line.get_label() for line in ax.lines]
    # a failed try has no peak: marked above the highest one, not at 0 MiB
    assert list(failed.get_xdata()) == [4, 8]
    assert min(failed.get_ydata()) > 3 * 1024 and ax.get_ylim()[1] >= max(failed.get_ydata())
    fig.savefig(__import__("io").BytesIO(), format="png")
    ax = plot_memory(report, limit_bytes=4 << 30, limit_label="room").axes[0]
    limit, = [line for line in ax.lines if line.get_label() == "room: 4,096 MiB"]
    failed, = [line for line in ax.lines if line.get_label().startswith("out of memory")]
    assert failed.get_label() == "out of memory (needed more than the limit)"
    assert list(failed.get_ydata()) == [4096, 4096] and list(limit.get_ydata()) == [4096, 4096]
    assert all(line.get_color() in ("black", "0.4", "0.6") for line in ax.lines)
    report.device = "@cupy:1"
    assert plot_memory(report).axes[0].get_title().startswith("Memory per batch size on GPU 1\n")
    all_fit = BatchSizeReport("@numpy", "tracemalloc", 8, [
        BatchSizeTry(2, True, peak_bytes=1 << 30, seconds=1.0),
        BatchSizeTry(4, True, peak_bytes=2 << 30, seconds=2.0)])
    ax = plot_memory(all_fit).axes[0]
    assert "largest tried (all fit): 4" in [line.get_label() for line in ax.lines]


# Limit: held + 1.5 x one image's forward + backward, so batch 1 fits and batch 2 (~3x:
# im2col's columns) does not; with 0.05 x nothing fits. Two BLAS threads, as a learner's run.
@pytest.fixture(scope="module")
def oom_run(bccd_root):
    from medaidet.extras.troubleshoot import out_of_memory_demo

    with pytest.MonkeyPatch.context() as mp:
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            mp.setenv(name, "2")
        return out_of_memory_demo(bccd_root, start=8, headroom=1.5)


@pytest.mark.slow(seconds=25)
def test_finder_survives_a_real_out_of_memory_on_the_cpu(oom_run):
    report = oom_run.report
    sizes = [t.batch_size for t in report.tries]
    assert sizes[0] == 8 and sizes == [8 >> i for i in range(len(sizes))]
    *failed, fit = report.tries
    assert len(failed) >= 2 and fit.ok and oom_run.error is None
    for t in failed:
        assert not t.ok and t.error.startswith("MemoryError"), t
        assert t.peak_bytes is None
    assert fit.peak_bytes > 100 * 2**20 and fit.seconds > 0     # SSD300: ~500 MiB
    assert report.best_batch_size == fit.batch_size <= 2
    assert report.accumulate == 8 // fit.batch_size
    assert f"--accumulate {report.accumulate}" in report.suggestion
    assert len(oom_run.lines) == len(sizes) and "out of memory" in oom_run.lines[0]
    assert oom_run.limit_bytes > oom_run.one_image_bytes > 100 * 2**20
    text = oom_run.summary()
    assert "out of memory" in text and "tracemalloc" in text and "1.5x one image" in text


@pytest.mark.slow(seconds=10)
def test_no_batch_size_fits_on_the_cpu(bccd_root):
    from medaidet.extras.troubleshoot import out_of_memory_demo

    demo = out_of_memory_demo(bccd_root, start=2, headroom=0.05)
    assert demo.error is not None, demo.lines
    assert "tried 2 -> 1" in demo.error and "MemoryError" in demo.error
    assert [t.ok for t in demo.report.tries] == [False, False]
    assert "DeviceError" in demo.summary()


@pytest.mark.slow(seconds=14)
def test_batch_size_on_real_bccd(bccd_root, tmp_path):
    from medaidet.extras.scaling import batch_size_on_bccd

    out = tmp_path / "finder"
    report = batch_size_on_bccd("cpu", sizes=[2, 1], target_batch_size=32, root=bccd_root,
                                out=out, log=None)
    data = report.to_dict()
    assert [t["batch_size"] for t in data["tries"]] == [1, 2]
    one, two = data["tries"]
    assert one["ok"] and two["ok"] and two["peak_bytes"] > one["peak_bytes"] > 100 * 2**20
    assert data["target_batch_size"] == 32 and data["accumulate"] == 16
    assert json.loads((out / "batch_size.json").read_text()) == data
    assert (out / "memory.png").read_bytes().startswith(b"\x89PNG")
    one = batch_size_on_bccd("cpu", start=1, root=bccd_root, log=None)
    assert one.best_batch_size == 1 and "no accumulation needed" in str(one)


@pytest.fixture
def no_model(monkeypatch):
    """Every check must come before SSD is built."""
    def refuse(*args, **kwargs):
        raise AssertionError("the model was built before the arguments were checked")
    monkeypatch.setattr("medaidet.training.train.Recipe.model", refuse)


def test_batch_size_api_names_its_arguments(bccd_root, tmp_path, no_model):
    from medaidet.extras.scaling import batch_size_on_bccd

    with pytest.raises(ConfigError, match="^min_batch_size: 8 .*start 4"):   # both values
        batch_size_on_bccd("cpu", start=4, min_batch_size=8, root=bccd_root)
    with pytest.raises(ConfigError, match="^start: 0 "):
        batch_size_on_bccd("cpu", start=0, root=bccd_root)
    with pytest.raises(ConfigError, match=r"^sizes: \[2, 0\] "):
        batch_size_on_bccd("cpu", sizes=[2, 0], root=bccd_root)
    file = tmp_path / "results"
    file.write_text("mine")
    with pytest.raises(ConfigError) as info:
        batch_size_on_bccd("cpu", start=1, root=bccd_root, out=file)
    assert (info.value.kind, info.value.path) == ("not_a_folder", file)
    data = tmp_path / "bccd"
    (data / "Annotations").mkdir(parents=True)
    with pytest.raises(ConfigError) as info:
        batch_size_on_bccd("cpu", root=data, out=data / "finder")
    assert (info.value.kind, info.value.path) == ("input", data / "finder")
    assert not (data / "finder").exists() and file.read_text() == "mine"
    with pytest.raises(ConfigError, match="^min_batch_size: 3 .*start 2"):
        find_batch_size(HungryChain(fits=1), stub_samples(2), start=2, min_batch_size=3,
                        log=None)
    with pytest.raises(ConfigError, match="^start: 1.5 "):
        find_batch_size(HungryChain(fits=1), stub_samples(2), start=1.5, log=None)
