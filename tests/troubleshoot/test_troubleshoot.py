"""medaidet.extras.troubleshoot: the OpenCV fork check (notebook 07 runs the bad-sample finder on
real BCCD; the out-of-memory demo is tested in tests/scaling/test_batch_size.py)."""
from medaidet.extras.troubleshoot import opencv_fork_check


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

