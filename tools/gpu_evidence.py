"""GPU evidence helpers for ../shared/gpu-checklist.md (run by tools/gpu_evidence.sh).

    python tools/gpu_evidence.py loss [--device gpu|cpu]   item 2: the safe loss on CuPy
    python tools/gpu_evidence.py compare RUN_A RUN_B       item 4: two runs' weights and losses

Each prints one JSON object. Not a test: CI has no GPU; docs/gpu.md records the output.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

#: ChainerCV's own loss on an out-of-range label, run in a child: on a GPU it may fault
#: asynchronously and leave the CUDA context unusable, so it never runs in this process.
CHILD = """\
import sys
import numpy as np
import medaidet
import chainer
from chainercv.links.model.ssd import multibox_loss
xp = np if sys.argv[1] == "cpu" else __import__("cupy")
rng = np.random.RandomState(0)
locs = chainer.Variable(xp.asarray(rng.randn(2, 8732, 4).astype(np.float32)))
confs = chainer.Variable(xp.asarray(rng.randn(2, 8732, 4).astype(np.float32)))
labels = xp.zeros((2, 8732), np.int32)
labels[:, 100] = 1
labels[1, 300] = 4
loc_loss, conf_loss = multibox_loss(locs, confs, xp.zeros_like(locs.array), labels, 3)
(loc_loss + conf_loss).backward()
if xp is not np:
    xp.cuda.Device().synchronize()
print("no error; loss", float((loc_loss + conf_loss).array))
"""


def _inputs(xp, seed=0, n_prior=8732, n_class=4, batch=4):
    rng = np.random.RandomState(seed)
    locs = rng.randn(batch, n_prior, 4).astype(np.float32)
    confs = rng.randn(batch, n_prior, n_class).astype(np.float32)
    gt_locs = rng.randn(batch, n_prior, 4).astype(np.float32)
    labels = np.zeros((batch, n_prior), np.int32)
    for b in range(batch):
        idx = rng.choice(n_prior, 20, replace=False)
        labels[b, idx] = rng.randint(1, n_class, 20)
    return [xp.asarray(a) for a in (locs, confs, gt_locs, labels)]


def _loss_and_grads(loss_fn, xp, arrays):
    import chainer
    from chainer.backends.cuda import to_cpu
    locs, confs = chainer.Variable(arrays[0].copy()), chainer.Variable(arrays[1].copy())
    loc_loss, conf_loss = loss_fn(locs, confs, arrays[2], arrays[3], 3)
    (loc_loss + conf_loss).backward()
    return [float(loc_loss.array), float(conf_loss.array), to_cpu(locs.grad), to_cpu(confs.grad)]


def loss_check(device: str) -> dict:
    import medaidet  # noqa: F401  (runtime settings before chainer)
    from chainer.backends.cuda import to_cpu
    from chainercv.links.model.ssd import multibox_loss as chainercv_loss

    from medaidet.errors import InvalidTargetsError
    from medaidet.ssd.loss import multibox_loss
    xp = np if device == "cpu" else __import__("cupy")
    out = {"device": device}
    arrays = _inputs(xp)
    ours = _loss_and_grads(multibox_loss, xp, arrays)
    theirs = _loss_and_grads(chainercv_loss, xp, arrays)
    on_host = _loss_and_grads(multibox_loss, np, [to_cpu(a) for a in arrays])
    out["loss_medaidet"] = ours[:2]
    out["loss_chainercv"] = theirs[:2]
    out["loss_numpy"] = on_host[:2]
    out["max_abs_diff_vs_chainercv"] = max(
        [abs(a - b) for a, b in zip(ours[:2], theirs[:2])] +
        [float(np.abs(a - b).max()) for a, b in zip(ours[2:], theirs[2:])])
    out["max_abs_diff_vs_numpy"] = max(
        [abs(a - b) for a, b in zip(ours[:2], on_host[:2])] +
        [float(np.abs(a - b).max()) for a, b in zip(ours[2:], on_host[2:])])
    bad = [a.copy() for a in arrays]
    bad[3][1, 300] = 4                       # 4 classes: labels 0..3 only
    try:
        multibox_loss(*bad, 3)
        out["invalid_label"] = "no error (a defect)"
    except InvalidTargetsError as exc:
        out["invalid_label"] = f"{type(exc).__name__}: {exc}"
    if xp is not np:   # the context is still healthy: nothing faulted on the device
        xp.cuda.Device().synchronize()
        out["context_after_error"] = float(xp.ones(10).sum())
    for blocking in ("0", "1"):
        env = {"CUDA_LAUNCH_BLOCKING": blocking}
        child = subprocess.run([sys.executable, "-c", CHILD, device], capture_output=True,
                               text=True, timeout=300, env={**os.environ, **env})
        lines = (child.stdout + child.stderr).strip().splitlines()
        out[f"chainercv_invalid_label_blocking{blocking}"] = {
            "returncode": child.returncode, "last_lines": lines[-6:]}
    return out


def compare(a: str, b: str) -> dict:
    """Two runs' weights (medaidet.ssd.weights.compare_weights) and logged losses."""
    from pathlib import Path

    from medaidet.ssd.weights import compare_weights
    weights = compare_weights(Path(a) / "model.npz", Path(b) / "model.npz")
    logs = [json.loads((Path(d) / "metrics.json").read_text())["log"] for d in (a, b)]
    la, lb = ([e.get("main/loss") for e in log] for log in logs)
    return {"identical": weights.identical, "weights": weights.summary(),
            "losses_a": la, "losses_b": lb,
            "largest_loss_diff": max((abs(x - y) for x, y in zip(la, lb)
                                      if x is not None and y is not None), default=None)}


def main(argv=None):
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("loss")
    p.add_argument("--device", default="gpu")
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b")
    args = parser.parse_args(argv)
    result = loss_check(args.device) if args.what == "loss" else compare(args.a, args.b)
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
