"""What medaidet's target check costs on top of ChainerCV's multibox loss, in one run.

SSD300 on BCCD: B = 32 images, K = 8732 default boxes, 3 + 1 classes, k = 3,
random predictions and ~1% positive priors (what the coder gives for a few
dozen cells per image). Forward alone and forward + backward; medaidet's loss
(ChainerCV's behind the check) with the check on (the default) and off. The
runs are interleaved (each round times every variant once, after a warm-up
round) and the best of N rounds is kept, so drift in the machine's speed hits
all variants alike.

    python benchmarks/bench_loss.py [--repeat 20] [--batch 32] [--gpu]
"""
import argparse
import platform
import time

import numpy as np

import chainer
from chainer.backends import cuda
from chainercv.links.model.ssd import multibox_loss as chainercv_loss

from medaidet.ssd.loss import multibox_loss as medaidet_loss

N_PRIOR = 8732      # SSD300
N_CLASS = 4         # background + RBC, WBC, Platelets
K = 3


def make_inputs(n_batch, xp, seed=0):
    rng = np.random.RandomState(seed)
    locs = rng.randn(n_batch, N_PRIOR, 4).astype(np.float32)
    confs = rng.randn(n_batch, N_PRIOR, N_CLASS).astype(np.float32)
    gt_locs = rng.randn(n_batch, N_PRIOR, 4).astype(np.float32)
    labels = np.where(rng.rand(n_batch, N_PRIOR) < 0.01,
                      rng.randint(1, N_CLASS, (n_batch, N_PRIOR)), 0).astype(np.int32)
    return tuple(xp.asarray(a) for a in (locs, confs, gt_locs, labels))


def variants(inputs):
    locs, confs, gt_locs, labels = inputs

    def forward(fn, **kw):
        def run():
            loc_loss, conf_loss = fn(locs, confs, gt_locs, labels, K, **kw)
            return loc_loss.array + conf_loss.array
        return run

    def forward_backward(fn, **kw):
        def run():
            mb_locs, mb_confs = chainer.Variable(locs), chainer.Variable(confs)
            loc_loss, conf_loss = fn(mb_locs, mb_confs, gt_locs, labels, K, **kw)
            (loc_loss + conf_loss).backward()
            return mb_confs.grad
        return run

    return {
        ("forward", "chainercv"): forward(chainercv_loss),
        ("forward", "ours"): forward(medaidet_loss),
        ("forward", "ours, check=False"): forward(medaidet_loss, check=False),
        ("forward+backward", "chainercv"): forward_backward(chainercv_loss),
        ("forward+backward", "ours"): forward_backward(medaidet_loss),
        ("forward+backward", "ours, check=False"): forward_backward(medaidet_loss, check=False),
    }


def timed(run, xp):
    start = time.perf_counter()
    out = run()
    if xp is not np:
        cuda.get_device_from_array(out).synchronize()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="rounds; the best is kept")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--gpu", action="store_true", help="run on the current CUDA device")
    args = parser.parse_args()

    xp = cuda.cupy if args.gpu else np
    inputs = make_inputs(args.batch, xp)
    runs = variants(inputs)

    # the same numbers first: a faster wrong loss is no use
    theirs = chainercv_loss(*inputs, K)
    ours = medaidet_loss(*inputs, K)
    for a, b in zip(theirs, ours):
        assert float(a.array) == float(b.array), (a.array, b.array)

    for run in runs.values():        # warm-up (and CuPy's kernel compilation)
        run()
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(args.repeat):
        for name, run in runs.items():
            best[name] = min(best[name], timed(run, xp))

    where = "GPU " + cuda.cupy.cuda.runtime.getDeviceProperties(0)["name"].decode() \
        if args.gpu else "CPU " + (platform.processor() or platform.machine())
    print(f"multibox loss, B={args.batch}, K={N_PRIOR}, {N_CLASS - 1}+1 classes, k={K}, "
          f"~1% positives; {where}; numpy {np.__version__}, chainer {chainer.__version__}; "
          f"best of {args.repeat}")
    print(f"{'pass':<17} {'variant':<18} {'ms':>8} {'ours/chainercv':>15}")
    for (stage, variant), seconds in best.items():
        ratio = seconds / best[(stage, "chainercv")]
        shown = "" if variant == "chainercv" else f"{ratio:.2f}"
        print(f"{stage:<17} {variant:<18} {seconds * 1e3:>8.2f} {shown:>15}")


if __name__ == "__main__":
    main()
