"""medaidet.env.doctor: the real environment, simulated broken ones, hand-built facts (no GPU)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from medaidet.env import doctor
from medaidet.env import facts as env_facts
from medaidet.compat import installed_cupy
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
                chainercv=OURS_CHAINERCV, cuda_available=False,
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


@pytest.fixture(scope="module")
def real_report() -> DoctorReport:
    return run_doctor()


def test_real_run_has_no_fail(real_report):
    assert not real_report.failed, str(real_report)
    assert [c.name for c in real_report.checks] == list(ALL_NAMES)
    for check in real_report.checks:
        assert check.status in doctor.STATUSES
        assert check.found
        assert (check.fix == "") == (check.status in ("ok", "skip")), check


def test_real_run_reports_our_builds(real_report):
    assert real_report.by_name("chainer").status == "ok"
    assert OURS_CHAINER in real_report.by_name("chainer").found
    assert real_report.by_name("chainercv").status == "ok"
    assert OURS_CHAINERCV in real_report.by_name("chainercv").found


def test_real_run_skips_gpu_lines_with_a_reason(real_report):
    if installed_cupy():
        pytest.skip("CuPy is installed here")
    for name in ("cupy",) + GPU_LINES:
        check = real_report.by_name(name)
        assert check.status == "skip", check
        assert len(check.found) > 10, check


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
    assert rc == 1
    assert checks["cupy"]["status"] == "ok"
    line = checks["cuda_available"]
    assert line["status"] == "fail"
    assert "falls back to the CPU" in line["found"]
    assert "libcudart.so.12: cannot open shared object file" in line["found"]
    assert "python -m medaidet stack install --cuda auto" in line["fix"]
    assert "pip uninstall -y cupy-cuda12x" in line["fix"]
    for name in ("cudnn", "gpu"):
        assert checks[name]["status"] == "skip"
        assert "CuPy does not import" in checks[name]["found"]
    assert "CHAINER_CUDNN: set to 0" in checks["compat"]["found"]


def test_two_cupy_packages_fail_naming_both(tmp_path):
    rc, checks = doctor_in(tmp_path, {"cupy/__init__.py": BROKEN_CUPY},
                           [("cupy-cuda12x", "14.0.0"), ("cupy-cuda11x", "13.6.0")])
    assert rc == 1
    line = checks["cupy"]
    assert line["status"] == "fail"
    assert "cupy-cuda11x==13.6.0" in line["found"] and "cupy-cuda12x==14.0.0" in line["found"]
    assert line["fix"] == ("pip uninstall -y cupy-cuda11x cupy-cuda12x && "
                           "python -m medaidet stack install")


def test_chainercv_that_does_not_import_fails(tmp_path):
    fake = 'raise ImportError("longintrepr.h missing (fake chainercv)")\n'
    rc, checks = doctor_in(tmp_path, {"chainercv/__init__.py": fake})
    assert rc == 1
    assert checks["chainer"]["status"] == "ok"
    line = checks["chainercv"]
    assert line["status"] == "fail"
    assert "longintrepr.h missing (fake chainercv)" in line["found"]
    assert "python -m medaidet stack install" in line["fix"]


def test_healthy_cpu_facts_have_no_fail():
    report = run_doctor(facts=cpu_facts())
    assert not report.failed, str(report)


@pytest.mark.parametrize("version", ["2.7.0", "1.24.0", "2.6.0"])
def test_unsupported_numpy_fails(version):
    line = run_doctor(facts=cpu_facts(numpy=version)).by_name("numpy")
    assert line.status == "fail"
    assert version in line.found and ">=1.26,<2.6" in line.found
    assert 'pip install "numpy>=1.26,<2.6"' in line.fix
    assert "python -m medaidet stack install" in line.fix


def test_missing_numpy_fails():
    line = doctor.check_numpy(cpu_facts(numpy=None))
    assert (line.status, line.found) == ("fail", "not installed")


def test_cupy14_with_numpy1_fails():
    line = doctor.check_numpy(cpu_facts(numpy="1.26.4", cupy=[("cupy-cuda12x", "14.0.1")]))
    assert line.status == "fail" and "CuPy 14 needs NumPy 2" in line.found
    assert line.fix.startswith("pip uninstall -y cupy-cuda12x && ")
    ok = doctor.check_numpy(cpu_facts(numpy="1.26.4", cupy=[("cupy-cuda12x", "13.6.0")]))
    assert ok.status == "ok"


@pytest.mark.parametrize("version,status", [("3.9.18", "fail"), ("3.10.0", "ok"),
                                            ("3.13.2", "ok"), ("3.14.0", "fail")])
def test_python_range(version, status):
    line = doctor.check_python(cpu_facts(python=version))
    assert line.status == status
    assert bool(line.fix) == (status == "fail")


def test_other_chainer_build_warns_and_missing_fails():
    line = doctor.check_chainer(cpu_facts(chainer="7.8.1"))
    assert line.status == "warn" and "upstream/other build" in line.found
    assert line.fix == "python -m medaidet stack install"
    line = doctor.check_chainer(cpu_facts(chainer=None, chainer_error="ModuleNotFoundError: x"))
    assert line.status == "fail" and line.fix == "python -m medaidet stack install"
    line = doctor.check_chainercv(cpu_facts(chainercv=None, chainercv_error="ModuleNotFoundError"))
    assert line.status == "fail" and "medaidet stack install" in line.fix


def test_no_gpu_lines_skip_with_reasons():
    report = run_doctor(gpu_smoke=True, facts=cpu_facts())
    assert report.by_name("cupy").found == "no CuPy: CPU only"
    for name in GPU_LINES + ("gpu_smoke",):
        line = report.by_name(name)
        assert line.status == "skip" and line.fix == ""
        assert "CPU" in line.found, line


def test_driver_without_cupy_warns():
    line = doctor.check_cupy(cpu_facts(nvidia_driver=True))
    assert line.status == "warn" and line.fix == "python -m medaidet stack install --cuda auto"


def test_cupy_imports_but_no_device_warns():
    facts = gpu_facts(gpu=None, gpu_error="no usable CUDA device (CUDARuntimeError: x)")
    line = doctor.check_cuda_available(facts)
    assert line.status == "warn" and "no usable CUDA device" in line.found
    assert "pip uninstall -y cupy-cuda12x" in line.fix


def test_healthy_gpu_facts():
    report = run_doctor(facts=gpu_facts())
    assert not report.failed, str(report)
    assert report.by_name("cuda_available").status == "ok"
    gpu = report.by_name("gpu")
    assert gpu.status == "ok" and "NVIDIA T4" in gpu.found and "compute 7.5" in gpu.found
    assert "driver CUDA 12.4" in gpu.found and "14.0/15.0 GiB free" in gpu.found
    assert "no cuDNN in CuPy 14" in report.by_name("cudnn").found


def test_kepler_and_full_gpu():
    facts = gpu_facts()
    facts.gpu["cc"] = "3.7"
    assert doctor.check_gpu(facts).status == "fail"
    facts.gpu.update(cc="8.0", free=GIB // 2)
    line = doctor.check_gpu(facts)
    assert line.status == "warn" and "nvidia-smi" in line.fix


def test_cudnn_states():
    line = doctor.check_cudnn(gpu_facts(chainer_cudnn_env=None))
    assert line.status == "warn" and "CHAINER_CUDNN=0" in line.fix
    cupy13 = ("cupy-cuda12x", "13.6.0")
    line = doctor.check_cudnn(gpu_facts(cupy13, cudnn_enabled=True, cudnn_version=8907,
                                        chainer_cudnn_env=None))
    assert line.status == "ok" and "8907" in line.found
    line = doctor.check_cudnn(gpu_facts(cupy13, cudnn_enabled=False, chainer_cudnn_env=None,
                                        libcudnn8=False,
                                        resolution_error="ImportError: libcudnn.so.8"))
    assert line.status == "warn" and "libcudnn.so.8 does not load" in line.found
    assert line.fix.startswith("python -m cupyx.tools.install_library --library cudnn --cuda 12.x")


@pytest.mark.parametrize("threads,status", [(0, "ok"), (1, "ok"), (8, "warn")])
def test_opencv_threads(threads, status):
    line = doctor.check_opencv(cpu_facts(cv2="4.12.0", cv2_threads=threads))
    assert line.status == status
    assert doctor.check_opencv(cpu_facts()).found == "not installed: PIL is used for image I/O"


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
    assert repr(report) == text
    for check in report.checks:
        assert check.name in text
    assert "fix: pip install" in text
    assert report.failed and text.splitlines()[-1].split(", ")[2] == "1 fail"
    with pytest.raises(KeyError):
        report.by_name("nope")
    assert DoctorReport([Check("x", "ok", "y")]).summary() == "1 ok, 0 warn, 0 fail, 0 skip"
