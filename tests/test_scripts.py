"""The scripts beside the package (benchmarks/, tools/) still run against today's package: a
renamed function they import or call fails here, not on the day someone needs the numbers."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*ROOT.glob("benchmarks/*.py"), *ROOT.glob("tools/*.py")])


def _run(*args, **env):
    return subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "OPENBLAS_NUM_THREADS": "1", **env},
                          timeout=300)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_script_imports_and_explains_itself(script):
    done = _run(script, "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


def test_the_cpu_step_benchmark_times_a_step_of_the_profile(bccd_root):
    """One step of the benchmark's child on 8 real images, no worker processes."""
    done = _run(ROOT / "benchmarks" / "bench_cpu_step.py", "--child", "0", "--steps", "1",
                "--warmup", "0", "--overrides", json.dumps({"subset": 8, "root": str(bccd_root)}))
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["batch_size"] == 4
    assert all(result[part] > 0 for part in ("step", "augment", "compute"))
