"""The GitHub workflows and the Azure ML job run the course with the same runner as `make run`
and .ci/run, and the GPU workflow can never be started by a pull request."""
import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[1]
CI = REPO / ".github" / "workflows" / "ci.yml"
GPU = REPO / ".github" / "workflows" / "gpu.yml"
AZUREML_JOB = REPO / "azureml" / "course-job.yml"
AZUREML_ENV = REPO / "azureml" / "environment.yml"
ALL_FILES = [CI, GPU, AZUREML_JOB, AZUREML_ENV, REPO / "azureml" / "README.md"]

# The course runner, as README and the Makefile's `run` target call it.
RUNNER = "medaidet course run"

# Package-registry hosts that none of these files may name (they rely on the tools' defaults).
REGISTRY_HOSTS = [
    "pypi.org",
    "pypi.python.org",
    "files.pythonhosted.org",
    "test.pypi.org",
    "conda.anaconda.org",
    "repo.anaconda.com",
    "anaconda.org",
    "repo.continuum.io",
    "registry.npmjs.org",
    "npmjs.com",
    "proxy.golang.org",
    "crates.io",
    "rubygems.org",
    "download.pytorch.org",
    "pypi.ngc.nvidia.com",
]


def _load(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def _triggers(workflow) -> dict:
    # YAML 1.1 reads the bare key `on` as the boolean True.
    on = workflow.get("on", workflow.get(True))
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return {name: None for name in on}
    assert isinstance(on, dict), f"unexpected `on:` {on!r}"
    return on


def _steps(workflow):
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def _run_lines(workflow):
    return [line.strip() for step in _steps(workflow) for line in step.get("run", "").splitlines()
            if line.strip()]


def _uses(workflow, action):
    return [step for step in _steps(workflow) if step.get("uses", "").split("@")[0] == action]


def _runner_lines(lines):
    return [line for line in lines if RUNNER in line]


@pytest.fixture(scope="module")
def ci():
    return _load(CI)


@pytest.fixture(scope="module")
def gpu():
    return _load(GPU)


@pytest.fixture(scope="module")
def azureml_job():
    return _load(AZUREML_JOB)


def test_files_exist_and_parse():
    for path in ALL_FILES:
        assert path.is_file(), f"{path.relative_to(REPO)} is missing"
    for path in (CI, GPU, AZUREML_JOB, AZUREML_ENV):
        assert isinstance(_load(path), dict), path


def test_makefile_and_readme_use_the_runner():
    """The reference the workflows are compared with: `make run` calls the course runner."""
    makefile = (REPO / "Makefile").read_text()
    run_target = makefile.split("\nrun:", 1)[1].split("\n\n", 1)[0]
    assert f'-m {RUNNER} --profile "$(PROFILE)"' in run_target
    assert "make test" in (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    assert "make run" in readme and RUNNER in readme


# --- ci.yml: CPU, pull requests -------------------------------------------------------------

def test_ci_runs_on_pull_requests_and_main(ci):
    triggers = _triggers(ci)
    assert "pull_request" in triggers
    assert "pull_request_target" not in triggers, "pull_request_target runs fork code with secrets"
    assert "main" in (triggers.get("push") or {}).get("branches", [])


def test_ci_sets_up_python_311_and_312(ci):
    setups = _uses(ci, "actions/setup-python")
    assert setups, "ci.yml must use actions/setup-python"
    versions = {str(v) for step in setups
                for v in str(step.get("with", {}).get("python-version", "")).split()}
    assert {"3.11", "3.12"} <= versions, versions


def test_ci_calls_make_test_and_the_smoke_course(ci):
    lines = _run_lines(ci)
    assert any(re.fullmatch(r"make test\b.*", line) for line in lines), lines
    course = [line for line in lines if re.match(r"make run\b", line)]
    assert course, f"ci.yml must run the course with `make run` (the README/.ci runner): {lines}"
    assert all("PROFILE=smoke" in line for line in course), course
    # `make test` before the course
    assert lines.index(next(l for l in lines if l.startswith("make test"))) < lines.index(course[0])


def test_ci_downloads_bccd_and_points_medaidet_data_at_it(ci):
    lines = _run_lines(ci)
    download = [line for line in lines if "medaidet data download" in line]
    assert download and "--root data/bccd" in download[0], lines
    env = {k: v for job in ci["jobs"].values() for k, v in (job.get("env") or {}).items()}
    assert env.get("MEDAIDET_DATA", "").endswith("data/bccd"), env


def test_ci_and_the_ci_runner_require_the_mpi_tests_without_a_system_mpi(ci):
    """The 2-rank ChainerMN tests skip without MPI unless CI_REQUIRE_MPI=1: both CI entry
    points set it, and neither installs MPI from the system (it comes from PyPI with
    '.[test]', as on a user's fresh machine)."""
    lines = _run_lines(ci)
    assert not [line for line in lines if "apt-get" in line or "openmpi-bin" in line], lines
    env = {k: v for job in ci["jobs"].values() for k, v in (job.get("env") or {}).items()}
    assert env.get("CI_REQUIRE_MPI") == "1", env
    runner = (REPO / ".ci" / "run").read_text()
    apt = [line for line in runner.splitlines() if "apt-get" in line]
    assert all("install -y -q chromium" in line or "install -y -q g++" in line
               or "apt-get update" in line for line in apt), \
        f"the CI runner installs only test tools from apt (the browser, a C++ compiler): {apt}"
    assert "export CI_REQUIRE_MPI=1" in runner
    assert runner.index("CI_REQUIRE_MPI=1") < runner.index("make test")


def test_the_ci_runner_installs_and_requires_the_browser():
    """The web page's test runs in a real Chromium: .ci/run installs it from apt before the
    tests and sets CI_REQUIRE_BROWSER=1, so a missing browser fails instead of skipping."""
    runner = (REPO / ".ci" / "run").read_text()
    for needle in ("apt-get install -y -q chromium", "export CI_REQUIRE_BROWSER=1",
                   "export MEDAIDET_SCREENSHOTS="):
        assert needle in runner and runner.index(needle) < runner.index("make test"), needle


def test_ci_caches_pip_and_the_medaidet_cache(ci):
    assert any(step.get("with", {}).get("cache") == "pip"
               for step in _uses(ci, "actions/setup-python")), "setup-python: cache: pip"
    cached = " ".join(str(step.get("with", {}).get("path", "")) for step in _uses(ci, "actions/cache"))
    assert "~/.cache/medaidet" in cached, cached


def test_ci_uploads_outputs(ci):
    uploads = _uses(ci, "actions/upload-artifact")
    assert uploads and any("outputs" in str(step["with"]["path"]) for step in uploads)
    assert all(step.get("if") == "always()" for step in uploads)


# --- gpu.yml: self-hosted GPU runner, never pull requests -----------------------------------

def test_gpu_never_runs_on_pull_requests(gpu):
    triggers = _triggers(gpu)
    forbidden = {"pull_request", "pull_request_target", "pull_request_review",
                 "pull_request_review_comment", "issue_comment"}
    assert not forbidden & set(triggers), f"gpu.yml must not run on PR events: {set(triggers)}"
    code = "\n".join(line.split("#", 1)[0] for line in GPU.read_text().splitlines())
    assert "pull_request" not in code, "gpu.yml: no pull_request trigger anywhere"


def test_gpu_triggers(gpu):
    triggers = _triggers(gpu)
    assert "main" in (triggers.get("push") or {}).get("branches", [])
    assert "workflow_dispatch" in triggers
    crons = [entry["cron"] for entry in triggers.get("schedule") or []]
    assert crons and all(len(cron.split()) == 5 for cron in crons), crons


def test_gpu_runs_on_self_hosted_gpu_runner_with_concurrency(gpu):
    assert gpu.get("concurrency"), "gpu.yml: one full course at a time (concurrency group)"
    for name, job in gpu["jobs"].items():
        labels = job["runs-on"]
        labels = [labels] if isinstance(labels, str) else labels
        assert {"self-hosted", "gpu"} <= set(labels), (name, labels)
        assert job.get("timeout-minutes", 0) >= 180, f"{name}: give the full course time"


def test_gpu_installs_checks_and_runs_the_full_course(gpu):
    lines = _run_lines(gpu)
    order = ["pip install -e '.[mpi,export]'", "medaidet stack install --cuda auto",
             "medaidet doctor --gpu-smoke", "medaidet data download", f"{RUNNER} --profile full"]
    found = []
    for needle in order:
        where = [i for i, line in enumerate(lines) if needle in line]
        assert where, f"gpu.yml does not run `{needle}`: {lines}"
        found.append(where[0])
    assert found == sorted(found), f"gpu.yml steps out of order: {lines}"
    course = _runner_lines(lines)
    assert all("--out outputs" in line for line in course), course


def test_gpu_uploads_outputs_always(gpu):
    uploads = _uses(gpu, "actions/upload-artifact")
    assert uploads, "gpu.yml must upload the executed notebooks"
    for step in uploads:
        assert step.get("if") == "always()", step
        assert "outputs" in str(step["with"]["path"]), step


def test_workflows_have_read_only_token(ci, gpu):
    for workflow in (ci, gpu):
        assert workflow.get("permissions") == {"contents": "read"}


# --- Azure ML command job -----------------------------------------------------------------

def test_azureml_job_is_a_command_job(azureml_job):
    assert azureml_job["$schema"].endswith("/commandJob.schema.json")
    assert azureml_job["type"] == "command"
    assert (AZUREML_JOB.parent / azureml_job["code"]).resolve() == REPO
    assert azureml_job["compute"].startswith("azureml:")
    assert "course" in azureml_job["outputs"]
    assert azureml_job["outputs"]["course"]["type"] == "uri_folder"


def test_azureml_job_runs_the_full_course(azureml_job):
    command = azureml_job["command"]
    for needle in ("pip install -e '.[export]'", "medaidet stack install --cuda auto",
                   "medaidet data download"):
        assert needle in command, command
    assert f"{RUNNER} --profile full --out ${{{{outputs.course}}}}" in command, command
    assert command.index("stack install") < command.index(RUNNER)


def test_azureml_environment(azureml_job):
    env = azureml_job["environment"]
    assert isinstance(env, dict) and env.get("image"), env
    assert "cuda12" in env["image"], "a CUDA 12 base image"
    conda_file = AZUREML_JOB.parent / env["conda_file"]
    assert conda_file.is_file(), conda_file
    conda = _load(conda_file)
    deps = [d for d in conda["dependencies"] if isinstance(d, str)]
    assert any(d.startswith("python=") for d in deps) and "pip" in deps, deps
    assert not any(d.split("=")[0].split("<")[0].split(">")[0] in {"chainer", "chainercv", "cupy"}
                   for d in deps), "the stack comes from `medaidet stack install`"


def test_azureml_readme_documents_job_create():
    text = (REPO / "azureml" / "README.md").read_text()
    assert "az ml job create -f azureml/course-job.yml" in text
    assert "gpu-cluster" in text


# --- all files ------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ALL_FILES, ids=[str(p.relative_to(REPO)) for p in ALL_FILES])
def test_no_registry_hosts(path):
    text = path.read_text().lower()
    named = [host for host in REGISTRY_HOSTS if host in text]
    assert not named, f"{path.relative_to(REPO)} names package registries: {named}"
