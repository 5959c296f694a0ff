"""Where a training step of the ``cpu`` profile goes on this CPU, measured in one run.

The ``cpu`` profile trains the small SSD on BCCD train in mini-batches (its ``batch_size``).
A step is the augmentation of a batch (ChainerCV's transform and the multibox encoding) and
the model's forward, backward and update. This script measures, on the real data:

* ``augment``: the 16 examples of a batch made in this process (no worker processes);
* ``compute``: forward + backward + update on one fixed, already augmented batch;
* ``step``: whole updater steps as training runs them, for each combination of worker
  processes (0, 1, 2) and BLAS threads (1, 2): every combination runs in its own process
  (the thread count is fixed when NumPy loads), after ``--warmup`` steps.

It prints seconds per step and images per second, and each combination's speed as a ratio
to the profile's default (2 workers, BLAS threads as the machine gives them). Then, with the
profile's defaults, the earlier profiles' settings against the profile's, in the same run:
the batch size (16 before batch 4) in seconds per step, images/s, updates per second and
their ratios, and SSD's augmentation (colour distortion on, zoom-out to 2x, before both were
left out) in seconds per step and images/s.

    python benchmarks/bench_cpu_step.py [--steps 8] [--warmup 2] [--only-previous]
"""
import argparse
import json
import os
import subprocess
import sys
import time

COMBINATIONS = [(workers, threads) for workers in (0, 1, 2) for threads in (1, 2)]
PREVIOUS_BATCH_SIZE = 16
PREVIOUS_AUGMENTATION = {"color_distortion": True, "max_expand_ratio": 2}


def build(n_processes, overrides):
    """The profile's training pieces (the course's ``Recipe``), with ``overrides``."""
    from medaidet.training.config import TrainConfig
    from medaidet.training.train import Recipe

    config = TrainConfig.profile("cpu", n_processes=n_processes, out="/tmp/bench-cpu-step",
                                 **overrides)
    built = Recipe(config).build(log=lambda *a: None, progress=False)
    return (config, built.train_chain, built.data, built.iterators, built.optimizer,
            built.updater)


def child(n_processes, steps, warmup, overrides):
    """Run in a subprocess: seconds per updater step (and, without workers, the split)."""
    import numpy as np
    from chainer.dataset import concat_examples

    config, chain, data, iterators, optimizer, updater = build(n_processes, overrides)
    for _ in range(warmup):
        updater.update()
    start = time.perf_counter()
    for _ in range(steps):
        updater.update()
    result = {"step": (time.perf_counter() - start) / steps, "batch_size": config.batch_size}
    if n_processes == 0:
        rng = np.random.RandomState(0)
        index = rng.permutation(len(data.train))[:config.batch_size]
        start = time.perf_counter()
        for _ in range(steps):
            batch = [data.train[int(i)] for i in index]
        result["augment"] = (time.perf_counter() - start) / steps
        arrays = concat_examples(batch)
        start = time.perf_counter()
        for _ in range(steps):
            optimizer.update(chain, *arrays)
        result["compute"] = (time.perf_counter() - start) / steps
    if hasattr(iterators.train, "finalize"):
        iterators.train.finalize()
    print(json.dumps(result))


def run_child(workers, threads, steps, warmup, overrides=None) -> dict:
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.pop(name, None)
        if threads is not None:
            env[name] = str(threads)
    command = [sys.executable, __file__, "--child", str(workers), "--steps", str(steps),
               "--warmup", str(warmup), "--overrides", json.dumps(overrides or {})]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--only-previous", action="store_true",
                        help="only the earlier profiles' settings against the profile's")
    parser.add_argument("--child", nargs=1, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--overrides", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.steps, args.warmup, json.loads(args.overrides))
        return
    from medaidet.training.config import TrainConfig

    batch = TrainConfig.profile("cpu").batch_size
    print(f"{os.cpu_count()} CPUs; batch {batch} of the cpu profile; {args.steps} steps after "
          f"{args.warmup} warm-up steps per combination")
    if not args.only_previous:
        results = {}
        for workers, threads in COMBINATIONS + [(2, None)]:
            r = results[workers, threads] = run_child(workers, threads, args.steps,
                                                      args.warmup)
            split = (f"  (augment {r['augment']:.2f} s, compute {r['compute']:.2f} s)"
                     if "augment" in r else "")
            print(f"workers {workers}, BLAS threads {threads or 'default'}: {r['step']:.2f} s "
                  f"per step, {batch / r['step']:.2f} images/s{split}", flush=True)
        base = results[2, None]["step"]
        print("speed against the default (2 workers, default threads):")
        for (workers, threads), r in results.items():
            print(f"  workers {workers}, threads {threads or 'default'}: "
                  f"{base / r['step']:.2f}x")
    print(f"the previous batch size ({PREVIOUS_BATCH_SIZE}) against the profile's "
          f"({batch}), 2 workers, default threads:")
    rates = {}
    for size in dict.fromkeys((PREVIOUS_BATCH_SIZE, batch)):
        r = run_child(2, None, args.steps * PREVIOUS_BATCH_SIZE // size, args.warmup,
                      {"batch_size": size})
        rates[size] = (size / r["step"], 1 / r["step"])
        print(f"  batch {size}: {r['step']:.3f} s per step, {rates[size][0]:.2f} images/s, "
              f"{rates[size][1]:.2f} updates/s", flush=True)
    if len(rates) == 2:
        (old_images, old_updates), (new_images, new_updates) = rates.values()
        print(f"  batch {batch} against {PREVIOUS_BATCH_SIZE}: images/s x"
              f"{new_images / old_images:.2f}, updates/s x{new_updates / old_updates:.2f}")
    print("SSD's augmentation (colour distortion, zoom-out to 2x) against the profile's "
          "(neither), batch {batch}, 2 workers, default threads:".format(batch=batch))
    steps = args.steps * PREVIOUS_BATCH_SIZE // batch
    before = run_child(2, None, steps, args.warmup, PREVIOUS_AUGMENTATION)["step"]
    now = run_child(2, None, steps, args.warmup)["step"]
    for name, step in (("with them", before), ("without", now)):
        print(f"  {name}: {step:.3f} s per step, {batch / step:.2f} images/s", flush=True)
    print(f"  without against with: images/s x{before / now:.2f}")


if __name__ == "__main__":
    main()
