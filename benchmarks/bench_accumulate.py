"""Seconds and peak memory of one SSD300 training update, large batch vs gradient accumulation.

One batch of ``--batch`` BCCD training images (deterministic: resized and encoded by
``EncodeTransform``), SSD300 with random weights (seeded), MomentumSGD. For each
``--accumulate`` N the same batch is fed as N micro-batches by
:class:`medaidet.training.accumulation.AccumulatingUpdater` (N = 1: ``StandardUpdater``'s
code), from the same initial weights. Printed per N: the best of ``--repeat`` timed updates
(after one untimed warm-up update, which also allocates the optimizer state), the peak
memory of an update (:class:`medaidet.training.memory.PeakMemory`: tracemalloc on the
CPU, CuPy's memory pool on a GPU), and the largest relative L2 difference of any
parameter's gradient from N = 1.
Expected: peak memory falls roughly as 1/N, time per update grows a little (smaller
GEMMs), gradients agree to float32 rounding (~1e-4).

    python benchmarks/bench_accumulate.py [--batch 4] [--accumulate 1 2 4] [--repeat 1] [--gpu]
"""
import argparse
import copy
import os
import time
import warnings

import chainer
import numpy as np

import medaidet  # noqa: F401  (runtime compat settings)
from medaidet.data.bccd import BCCDDataset
from medaidet.training.accumulation import AccumulatingUpdater
from medaidet.training.memory import PeakMemory
from medaidet.ssd.model import build_ssd
from medaidet.ssd.weights import materialize
from medaidet.ssd.loss import MultiboxTrainChain
from medaidet.ssd.transforms import EncodeTransform


def run(model, samples, accumulate, device, repeat):
    chain = MultiboxTrainChain(copy.deepcopy(model))
    chain.to_device(device)
    optimizer = chainer.optimizers.MomentumSGD(lr=1e-3, momentum=0.9)
    optimizer.setup(chain)
    iterator = chainer.iterators.SerialIterator(samples, len(samples), shuffle=False)
    updater = AccumulatingUpdater(iterator, optimizer, accumulate=accumulate, device=device)
    updater.update()                     # warm-up: optimizer state, cuDNN autotune
    grads = {name: chainer.backends.cuda.to_cpu(p.grad) for name, p in chain.namedparams()}
    seconds, peak = [], 0
    for _ in range(repeat):
        with PeakMemory(device) as memory:
            start = time.perf_counter()
            updater.update()
            if device.xp is not np:
                device.device.synchronize()
            seconds.append(time.perf_counter() - start)
        peak = max(peak, memory.bytes)
    return min(seconds), peak, memory.measure, grads


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--accumulate", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--data", default=os.environ.get("MEDAIDET_DATA"))
    args = parser.parse_args()

    device = chainer.get_device("@cupy:0" if args.gpu else "@numpy")
    device.use()
    np.random.seed(args.seed)
    model = materialize(build_ssd("ssd300", None, n_fg_class=3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = BCCDDataset(args.data, "train")
    transform = EncodeTransform.for_model(model)
    samples = [transform(dataset[i]) for i in range(args.batch)]
    positives = [int((label > 0).sum()) for _, _, label in samples]
    print(f"SSD300, random init (seed {args.seed}), {device}, batch {args.batch} "
          f"(positive priors per image: {positives}), best of {args.repeat}")

    reference = None
    print(f"{'accumulate':>10}  {'micro':>5}  {'s/update':>9}  {'peak MiB':>9}  grad rel. L2")
    for n in args.accumulate:
        seconds, peak, measure, grads = run(model, samples, n, device, args.repeat)
        if reference is None:
            reference, diff = grads, "-"
        else:
            diff = max(np.linalg.norm(grads[k] - g) / np.linalg.norm(g)
                       for k, g in reference.items() if g.any())
            diff = f"{diff:.1e}"
        print(f"{n:>10}  {args.batch // n:>5}  {seconds:>9.2f}  {peak / 2**20:>9.1f}  {diff}")
    print(f"peak memory: {measure}; the first row is the reference for the gradients")


if __name__ == "__main__":
    main()
