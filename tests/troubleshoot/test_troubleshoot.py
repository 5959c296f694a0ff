"""medaidet.extras.troubleshoot: the bad-sample finder on real BCCD, the OpenCV fork check (the
out-of-memory demo is tested in tests/scaling/test_batch_size.py)."""
from medaidet.data.bccd import BCCDDataset
from medaidet.extras.troubleshoot import find_invalid_samples, opencv_fork_check


class OneBased:
    """A common mistake: labels shifted by +1 'for the background' before the transform."""

    def __init__(self, dataset, shift_index):
        self.dataset, self.shift_index = dataset, shift_index
        self.ids = dataset.ids

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        img, bbox, label = self.dataset[i]
        if i == self.shift_index:
            label = label + 1
        return img, bbox, label


def test_finds_the_sample_and_names_its_file(bccd_root):
    dataset = BCCDDataset(bccd_root, "val").slice[:6]
    assert find_invalid_samples(dataset) == []
    base = BCCDDataset(bccd_root, "val")
    # a sample with a platelet (label 2): shifted, it becomes 3 = n_fg_class
    index = next(i for i in range(len(base)) if 2 in base[i][2])
    found = find_invalid_samples(OneBased(base, index))
    assert [f.index for f in found] == [index]
    assert found[0].image_id == base.ids[index]
    assert "add 1 for background" in found[0].message
    assert str(found[0]).startswith(f"sample {index} ({base.ids[index]}): ")


def test_opencv_fork_check_finishes_or_reports_a_hang():
    result = opencv_fork_check(threads=0, timeout=60)
    assert not result.hung and "resizes done" in result.output
    assert result.parallel_framework
    assert "cv2.setNumThreads(0)" in result.summary()


def test_a_hang_is_reported_and_its_workers_are_killed(monkeypatch, tmp_path):
    """A child whose forked workers never finish: reported as hung, the whole process
    group killed (no orphaned workers left behind)."""
    import os
    import time

    import medaidet.extras.troubleshoot as ts

    pids = tmp_path / "pids"
    (tmp_path / "hanging_child.py").write_text(f"""
import multiprocessing, os, time
def work(i):
    open({str(pids)!r}, "a").write(f"{{os.getpid()}}\\n")
    time.sleep(120)
if __name__ == "__main__":
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(work, range(2))
""")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p))
    result = ts.opencv_fork_check(threads=0, timeout=3, program="hanging_child")
    assert result.hung and "HUNG" in result.summary()
    time.sleep(0.5)
    workers = [int(p) for p in pids.read_text().split()]
    assert workers
    for pid in workers:
        try:
            os.kill(pid, 0)
            alive = not open(f"/proc/{pid}/stat").read().split()[2] == "Z"
        except (ProcessLookupError, FileNotFoundError):
            alive = False
        assert not alive, f"worker {pid} survived"

