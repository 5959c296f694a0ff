"""`make lab` as a learner uses it, checked without a browser (.ci/run runs this).

    python tools/check_lab.py [--lang ja]

Starts `make lab` on a free port of 127.0.0.1 with a token, waits for JupyterLab to answer,
then asks its REST API what a learner's browser would: the course's notebooks are listed at
the root and the kernel "medaidet" is registered; a kernel of that name then runs the
notebooks' first imports. Stops the server and exits 1 with what was missing.
"""
import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base, token, path, method="GET", body=None):
    request = urllib.request.Request(
        f"{base}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read() or b"null")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lang", default="en")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds for make lab to install JupyterLab and answer")
    args = parser.parse_args(argv)
    port, token = free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    lab_args = (f"--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={token} "
                "--ServerApp.log_level=WARN")
    if os.geteuid() == 0:        # a CI container: JupyterLab refuses root without it
        lab_args += " --allow-root"
    server = subprocess.Popen(["make", "--no-print-directory", "lab", f"COURSE_LANG={args.lang}",
                               f"LAB_ARGS={lab_args}"], cwd=REPO, start_new_session=True)
    problems = []
    try:
        deadline = time.monotonic() + args.timeout
        while True:
            if server.poll() is not None:
                problems.append(f"make lab exited with {server.returncode} before answering")
                return report(problems)
            try:
                call(base, token, "/api/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    problems.append(f"JupyterLab did not answer on {base} in {args.timeout:.0f} s")
                    return report(problems)
                time.sleep(1)
        listed = {item["name"] for item in call(base, token, "/api/contents")["content"]}
        expected = {p.name for p in (REPO / "notebooks").glob("*.ipynb")}
        if not expected <= listed:
            problems.append(f"the lab's root lacks {sorted(expected - listed)}")
        specs = call(base, token, "/api/kernelspecs")["kernelspecs"]
        if "medaidet" not in specs:
            problems.append(f"no kernel 'medaidet' registered (found {sorted(specs)})")
        else:
            problems += kernel_runs_the_course(specs["medaidet"]["spec"]["argv"][0])
        if not problems:
            print(f"make lab COURSE_LANG={args.lang}: JupyterLab on {base} lists the "
                  f"{len(expected)} notebooks, and the medaidet kernel runs the course's imports")
        return report(problems)
    finally:
        try:                     # as the lab's File > Shut Down does
            call(base, token, "/api/shutdown", "POST")
            server.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)


def kernel_runs_the_course(python: str) -> list:
    """The registered kernel runs code in the course's environment: chainer, ChainerCV and
    medaidet import there (what the notebooks' first cells do)."""
    from jupyter_client.manager import start_new_kernel
    manager, client = start_new_kernel(kernel_name="medaidet")
    printed = []
    try:
        reply = client.execute_interactive(
            "import medaidet, chainer, chainercv, sys; print(sys.executable, chainer.__version__)",
            timeout=120, output_hook=lambda m: printed.append(m["content"].get("text", "")))
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    if reply["content"]["status"] != "ok":
        return [f"the medaidet kernel ({python}) cannot import the course's packages: "
                f"{reply['content'].get('ename')}: {reply['content'].get('evalue')}"]
    print("medaidet kernel:", "".join(printed).strip())
    return []


def report(problems) -> int:
    for problem in problems:
        print(f"check_lab: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
