"""medaidet.env.doctor: the real environment, simulated broken ones, hand-built facts (no GPU)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from medaidet.env import doctor
from medaidet.env import facts as env_facts
from medaidet.env.doctor import GIB, Check, DoctorReport, run_doctor
from medaidet.env.facts import Facts
from medaidet_tools.stack import sources
from conftest import fake_distribution

ROOT = Path(__file__).resolve().parents[2]
OURS_CHAINER = sources.CHAINER.wheel_version
OURS_CHAINERCV = sources.CHAINERCV.wheel_version
GPU_LINES = ("cuda_available", "cudnn", "gpu")
ALL_NAMES = ("python", "numpy", "chainer", "chainercv", "cupy", "cuda_available", "cudnn",
             "gpu", "opencv", "compat")


def cpu_facts(**over) -> Facts:
    """A healthy CPU-only machine; keyword arguments break it."""
    base = dict(python="3.12.1", numpy="2.5.5", chainer=OURS_CHAINER,
                chainercv=OURS_CHAINERCV, cuda_available=False, cv2="4.12.0", cv2_threads=0,
                resolution_error="ModuleNotFoundError: No module named 'cupy'",
                gpu_error="no CuPy installed: chainer runs on the CPU")
    base.update(over)
    return Facts(**base)


def gpu_facts(cupy=("cupy-cuda12x", "14.0.0"), **over) -> Facts:
    """A machine with one working GPU."""
    gpu = {"name": "NVIDIA T4", "count": 1, "cc": "7.5", "driver": "12.4", "runtime": "12.8",
           "free": 14 * GIB, "total": 15 * GIB}
    base = dict(cupy=[cupy], nvidia_driver=True, cuda_available=True, resolution_error="",
                gpu=gpu, gpu_error="", chainer_cudnn_env="0")
    base.update(over)
    return cpu_facts(**base)


def test_cli_prints_every_check_and_exits_0():
    done = subprocess.run([sys.executable, "-m", "medaidet", "doctor"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    *rows, summary = done.stdout.splitlines()
    assert [row.split()[0] for row in rows if not row.startswith(" ")] == list(ALL_NAMES)
    assert summary.split(", ")[2] == "0 fail"


def doctor_in(tmp_path, files=(), dists=()):
    """(exit code, {name: check dict}) of the doctor in a child Python with fake packages."""
    site = tmp_path / "site"
    for rel, text in dict(files).items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    for name, version in dists:
        fake_distribution(site, name, version)
    paths = [str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    env.pop("CHAINER_CUDNN", None)
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    checks = {c["name"]: c for c in json.loads(done.stdout.splitlines()[-1])}
    return done.returncode, checks


CHILD = """import dataclasses, json, sys
from medaidet.env.doctor import run_doctor
report = run_doctor()
print(json.dumps([dataclasses.asdict(c) for c in report.checks]))
sys.exit(1 if report.failed else 0)"""


BROKEN_CUPY = 'raise ImportError("libcudart.so.12: cannot open shared object file (fake)")\n'


def test_cupy_that_does_not_import_is_a_silent_cpu_fallback(tmp_path):
    rc, checks = doctor_in(tmp_path, {"cupy/__init__.py": BROKEN_CUPY},
                           [("cupy-cuda12x", "14.0.0")])
    assert rc == 1 and checks["cupy"]["status"] == "ok"
    line = checks["cuda_available"]
    assert line["status"] == "fail" and "falls back to the CPU" in line["found"]
    assert "libcudart.so.12: cannot open shared object file" in line["found"]
    assert "python -m medaidet stack install --cuda auto" in line["fix"]
    assert "pip uninstall -y cupy-cuda12x" in line["fix"]
    for name in ("cudnn", "gpu"):
        assert checks[name]["status"] == "skip" and "CuPy does not import" in checks[name]["found"]
    assert "CHAINER_CUDNN: set to 0" in checks["compat"]["found"]


def test_two_cupy_packages_fail_naming_both(tmp_path):
    rc, checks = doctor_in(tmp_path, {"cupy/__init__.py": BROKEN_CUPY},
                           [("cupy-cuda12x", "14.0.0"), ("cupy-cuda11x", "13.6.0")])
    line = checks["cupy"]
    assert rc == 1 and line["status"] == "fail"
    assert "cupy-cuda11x==13.6.0" in line["found"] and "cupy-cuda12x==14.0.0" in line["found"]
    assert line["fix"] == ("pip uninstall -y cupy-cuda11x cupy-cuda12x && "
                           "python -m medaidet stack install")


def test_chainercv_that_does_not_import_fails(tmp_path):
    fake = 'raise ImportError("longintrepr.h missing (fake chainercv)")\n'
    rc, checks = doctor_in(tmp_path, {"chainercv/__init__.py": fake})
    line = checks["chainercv"]
    assert rc == 1 and checks["chainer"]["status"] == "ok" and line["status"] == "fail"
    assert "longintrepr.h missing (fake chainercv)" in line["found"]
    assert "python -m medaidet stack install" in line["fix"]


def test_healthy_cpu_facts_have_no_fail():
    report = run_doctor(facts=cpu_facts())
    assert not report.failed, str(report)


@pytest.mark.parametrize("version", ["2.7.0", "1.24.0", "2.6.0"])
def test_unsupported_numpy_fails(version):
    line = run_doctor(facts=cpu_facts(numpy=version)).by_name("numpy")
    assert line.status == "fail" and version in line.found and ">=1.26,<2.6" in line.found
    assert 'pip install "numpy>=1.26,<2.6"' in line.fix
    assert "python -m medaidet stack install" in line.fix


def _gpu(**gpu) -> Facts:
    facts = gpu_facts()
    facts.gpu.update(gpu)
    return facts


CUPY13 = ("cupy-cuda12x", "13.6.0")
INSTALL = "python -m medaidet stack install"
NO_CUDNN_8 = dict(cudnn_enabled=False, chainer_cudnn_env=None, libcudnn8=False,
                  resolution_error="ImportError: libcudnn.so.8")


@pytest.mark.parametrize("check, facts, status, found, fix", [
    ("numpy", cpu_facts(numpy=None), "fail", "not installed", ""),
    ("numpy", cpu_facts(numpy="1.26.4", cupy=[("cupy-cuda12x", "14.0.1")]), "fail",
     "CuPy 14 needs NumPy 2", "pip uninstall -y cupy-cuda12x && "),
    ("numpy", cpu_facts(numpy="1.26.4", cupy=[CUPY13]), "ok", "", ""),
    ("python", cpu_facts(python="3.9.18"), "fail", "", ""),
    ("python", cpu_facts(python="3.10.0"), "ok", "", ""),
    ("python", cpu_facts(python="3.13.2"), "ok", "", ""),
    ("python", cpu_facts(python="3.14.0"), "fail", "", ""),
    ("chainer", cpu_facts(chainer="7.8.1"), "warn", "upstream/other build", INSTALL),
    ("chainer", cpu_facts(chainer=None, chainer_error="ModuleNotFoundError: x"), "fail", "",
     INSTALL),
    ("chainercv", cpu_facts(chainercv=None, chainercv_error="ModuleNotFoundError"), "fail", "",
     INSTALL),
    ("cupy", cpu_facts(nvidia_driver=True), "warn", "", INSTALL + " --cuda auto"),
    ("cuda_available", gpu_facts(gpu=None, gpu_error="no usable CUDA device (CUDARuntimeError: x)"),
     "warn", "no usable CUDA device", "pip uninstall -y cupy-cuda12x"),
    ("gpu", _gpu(cc="3.7"), "fail", "", ""),                               # Kepler
    ("gpu", _gpu(cc="8.0", free=GIB // 2), "warn", "", "nvidia-smi"),      # full
    ("cudnn", gpu_facts(chainer_cudnn_env=None), "warn", "", "CHAINER_CUDNN=0"),
    ("cudnn", gpu_facts(CUPY13, cudnn_enabled=True, cudnn_version=8907, chainer_cudnn_env=None),
     "ok", "8907", ""),
    ("cudnn", gpu_facts(CUPY13, **NO_CUDNN_8), "warn", "libcudnn.so.8 does not load",
     "python -m cupyx.tools.install_library --library cudnn --cuda 12.x"),
    ("opencv", cpu_facts(cv2=None), "fail", "not installed", "medaidet stack install"),
    ("opencv", cpu_facts(cv2="4.12.0", cv2_threads=0), "ok", "", ""),
    ("opencv", cpu_facts(cv2="4.12.0", cv2_threads=1), "ok", "", ""),
    ("opencv", cpu_facts(cv2="4.12.0", cv2_threads=8), "warn", "", ""),
])
def test_one_check(check, facts, status, found, fix):
    """A fix for each line that is not ok."""
    line = getattr(doctor, f"check_{check}")(facts)
    assert line.status == status and found in line.found, line
    assert (line.fix == "") == (status == "ok") and fix in line.fix, line


def test_no_gpu_lines_skip_with_reasons():
    report = run_doctor(gpu_smoke=True, facts=cpu_facts())
    assert report.by_name("cupy").found == "no CuPy: CPU only"
    for name in GPU_LINES + ("gpu_smoke",):
        line = report.by_name(name)
        assert line.status == "skip" and line.fix == ""
        assert "CPU" in line.found, line


def test_healthy_gpu_facts_are_all_ok():
    report = run_doctor(facts=gpu_facts())
    assert {c.name: c.status for c in report.checks} == dict.fromkeys(ALL_NAMES, "ok"), report


def test_gpu_smoke_results():
    ok = {"ok": True, "alloc_ms": 1.0, "argsort_ms": 0.5, "ssd_first_ms": 900.0, "ssd_ms": 8.0}
    line = run_doctor(gpu_smoke=True, facts=gpu_facts(smoke=ok)).by_name("gpu_smoke")
    assert line.status == "ok" and "matches numpy" in line.found
    bad = {"ok": False, "error": "CUDARuntimeError: cudaErrorIllegalAddress"}
    line = run_doctor(gpu_smoke=True, facts=gpu_facts(smoke=bad)).by_name("gpu_smoke")
    assert line.status == "fail" and "cudaErrorIllegalAddress" in line.found
    assert "restart the runtime" in line.fix and "CUDA_LAUNCH_BLOCKING=1" in line.fix
    assert "gpu_smoke" not in [c.name for c in run_doctor(facts=gpu_facts()).checks]


@pytest.mark.slow(seconds=11)
def test_gpu_smoke_script_runs_on_cpu():
    # The same script the GPU smoke runs, with NumPy standing in for CuPy.
    result = env_facts.run_gpu_smoke(device="cpu", timeout=120)
    assert result["ok"], result.get("error")
    assert result["ssd_ms"] > 0 and result["argsort_ms"] >= 0


def test_a_crashing_check_or_gather_becomes_a_fail(monkeypatch):
    report = run_doctor(facts=cpu_facts(python="not-a-version"))
    line = report.by_name("python")
    assert line.status == "fail" and "the check itself failed" in line.found

    def broken(facts):
        raise OSError("cv2 exploded")
    monkeypatch.setattr(env_facts, "_gather_opencv", broken)
    facts = env_facts.gather_facts()
    assert facts.gather_errors == ["opencv: OSError: cv2 exploded"]
    assert run_doctor(facts=facts).by_name("doctor").status == "fail"


def test_views_name_every_check():
    report = run_doctor(gpu_smoke=True, facts=cpu_facts(numpy="2.7.0"))
    text = str(report)
    assert repr(report) == text     # a notebook shows the text view
    assert [row.split()[0] for row in text.splitlines()[:-1] if not row.startswith(" ")] == \
        [check.name for check in report.checks]
    assert all(check.fix in text for check in report.checks)      # and what to do
    assert report.failed and text.splitlines()[-1].split(", ")[2] == "1 fail"
    with pytest.raises(KeyError):
        report.by_name("nope")
    assert DoctorReport([Check("x", "ok", "y")]).summary() == "1 ok, 0 warn, 0 fail, 0 skip"
