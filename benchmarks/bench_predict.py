"""Seconds per image of SSD300 prediction, capped (medaidet) vs uncapped (ChainerCV).

The 'evaluate' preset (score 0.01, NMS 0.45) on a randomly initialized SSD300 (seeded), on
the CPU: every prior passes the score threshold, so ChainerCV's NMS loops over all 8732
boxes of each class. ``medaidet.ssd.predict.predict`` keeps the 400 best per class before NMS and
the 200 best per image after it. Both are measured in the same run on the same images:

* whole ``predict`` (preprocessing, forward pass, decoding, NMS), and
* the post-processing alone (decode + NMS of the same network outputs),

then printed as seconds per image and the capped/uncapped ratio. Images: the first BCCD test
images when ``$MEDAIDET_DATA`` points at BCCD, else random 300x300 ones.

    python benchmarks/bench_predict.py [--images 3] [--seed 0]
"""
import argparse
import os
import time

import chainer
import numpy as np
from chainercv.links import SSD300

import medaidet  # noqa: F401  (runtime compat settings)
from medaidet.ssd.predict import DEFAULT_KEEP_TOP_K, DEFAULT_TOP_K, decode_capped, predict


def load_images(n, seed):
    if os.environ.get("MEDAIDET_DATA"):
        from medaidet.data import BCCDDataset
        dataset = BCCDDataset(split="test")
        return [dataset[i][0] for i in range(n)], f"BCCD test images ({dataset.root})"
    rng = np.random.RandomState(seed + 1)
    return ([rng.uniform(0, 255, (3, 300, 300)).astype(np.float32) for _ in range(n)],
            "random 300x300 images")


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    np.random.seed(args.seed)
    model = SSD300(n_fg_class=3)
    model.use_preset("evaluate")
    imgs, source = load_images(args.images, args.seed)
    # the first forward pass also initializes the lazily shaped parameters: not timed
    with chainer.using_config("train", False), chainer.no_backprop_mode():
        model(model.xp.zeros((1, 3, 300, 300), dtype=np.float32))

    print(f"SSD300, random init (seed {args.seed}), evaluate preset (score "
          f"{model.score_thresh}, NMS {model.nms_thresh}), CPU, {len(imgs)} {source}; "
          f"caps: top_k={DEFAULT_TOP_K}, keep_top_k={DEFAULT_KEEP_TOP_K}")
    print(f"{'image':>5} {'uncapped s':>11} {'capped s':>9} {'dets unc.':>10} {'dets cap.':>10}"
          f" {'post unc. s':>12} {'post cap. s':>12}")
    rows = []
    for i, img in enumerate(imgs):
        t_unc, (_, _, s_unc) = timed(lambda: model.predict([img]))
        t_cap, (_, _, s_cap) = timed(lambda: predict(model, [img]))
        # post-processing alone, on the same network outputs
        x = model.xp.stack([model._prepare(img)])
        with chainer.using_config("train", False), chainer.no_backprop_mode():
            mb_locs, mb_confs = model(x)
        loc, conf = mb_locs.array[0], mb_confs.array[0]
        p_unc, _ = timed(lambda: model.coder.decode(loc, conf, model.nms_thresh,
                                                    model.score_thresh))
        p_cap, _ = timed(lambda: decode_capped(model.coder, loc, conf, model.nms_thresh,
                                               model.score_thresh))
        rows.append((t_unc, t_cap, p_unc, p_cap))
        print(f"{i:>5} {t_unc:>11.3f} {t_cap:>9.3f} {len(s_unc[0]):>10} {len(s_cap[0]):>10}"
              f" {p_unc:>12.3f} {p_cap:>12.4f}")

    t_unc, t_cap, p_unc, p_cap = np.mean(rows, axis=0)
    print(f"mean  {t_unc:>11.3f} {t_cap:>9.3f} {'':>10} {'':>10} {p_unc:>12.3f} {p_cap:>12.4f}")
    print(f"predict, seconds per image: uncapped {t_unc:.3f}, capped {t_cap:.3f}; "
          f"ratio capped/uncapped {t_cap / t_unc:.3f} ({t_unc / t_cap:.1f}x faster)")
    print(f"post-processing alone:      uncapped {p_unc:.3f}, capped {p_cap:.4f}; "
          f"ratio {p_cap / p_unc:.4f} ({p_unc / p_cap:.0f}x faster)")
    print(f"(forward pass, the rest of capped predict: ~{t_cap - p_cap:.3f} s per image on "
          f"{os.cpu_count()} CPU cores)")


if __name__ == "__main__":
    main()
