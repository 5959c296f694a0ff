"""Memory per image of a training step's forward + backward, with the convolution's column
array bounded (the stack's patch set 4: chainer/utils/conv_chunks.py) and without (the
whole batch's column array at once, as chainer and patch set 3 built it), in one run.

For SSD300 and the small SSD on real BCCD training images (the recipe's transform and loss,
random initial weights: memory does not depend on their values), at batch 1, 2 and 8, each
measured by the course's batch-size finder
(:func:`medaidet.extras.scaling.batch_size_on_bccd`): on the CPU the tracemalloc peak of
NumPy's arrays, on a GPU the bytes CuPy's memory pool held (parameters and optimizer state not counted). Prints the peak per
image, the extra memory per extra image (from batch 1 to 8), and the ratio without/with.
Measured on a 2-core CPU (2026-11-28, one BLAS thread): SSD300 at batch 8, 415.4 MiB per
image with the whole batch's column array, 212.0 with the bound (ratio 1.96); the small SSD
18.7 and 18.3 (its column arrays are small).

    python benchmarks/bench_conv_memory.py [--device cpu|gpu] [--models ssd300 ssd_small]
"""
import argparse
import warnings

from chainer.utils import conv_chunks

from medaidet.extras.scaling import batch_size_on_bccd

SIZES = (1, 2, 8)
MIB = 2 ** 20


def peaks(model, device, bound):
    """{batch size: peak bytes} with the column array bounded by ``bound`` bytes."""
    conv_chunks.MAX_COLUMN_BYTES = bound
    report = batch_size_on_bccd(device=device, model=model, sizes=SIZES, log=None)
    return {t.batch_size: t.peak_bytes for t in report.tries}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", nargs="+", default=["ssd300", "ssd_small"])
    args = parser.parse_args()
    default = conv_chunks.MAX_COLUMN_BYTES
    # batch 1 through the small SSD's batch normalisation: chainer warns, as it should
    warnings.filterwarnings("ignore", "A batch with no more than one sample")
    print(f"device {args.device}; bound {default / MIB:.0f} MiB of columns per piece; "
          f"MiB per image = peak / batch; extra = (peak at 8 - peak at 1) / 7")
    print(f"{'model':10} {'columns':>9} " + " ".join(f"{'batch ' + str(b):>9}" for b in SIZES)
          + f" {'extra':>8}")
    for model in args.models:
        measured = {}
        for name, bound in (("whole", 2 ** 62), ("chunked", default)):
            measured[name] = peak = peaks(model, args.device, bound)
            extra = (peak[8] - peak[1]) / 7
            print(f"{model:10} {name:>9} " + " ".join(f"{peak[b] / b / MIB:9.1f}" for b in SIZES)
                  + f" {extra / MIB:8.1f}")
        ratios = [measured["whole"][b] / measured["chunked"][b] for b in SIZES]
        print(f"{model:10} {'ratio':>9} " + " ".join(f"{r:9.2f}" for r in ratios))
    conv_chunks.MAX_COLUMN_BYTES = default


if __name__ == "__main__":
    main()
