"""Chainer against onnxruntime on this CPU: the same detector, the same test images, one run.

Exports the weights (default: the small SSD that ships with medaidet) with ``medaidet.extras.deploy``
and predicts ``--images`` test images one at a time with each runtime: chainer through
:func:`medaidet.ssd.predict.predict` (ChainerCV's SSD, the course's caps), onnxruntime through
:class:`medaidet.extras.deploy.OnnxDetector` (resize, graph, NumPy decoding). Both in the
'evaluate' preset, both after ``--warmup`` images. Prints images per second of each and their
ratio, and onnxruntime with one thread.

    python benchmarks/bench_onnx.py [--weights model.npz] [--images 24] [--warmup 2]
"""
import argparse
import tempfile
import time
from pathlib import Path


def images_per_second(predict, images, warmup):
    for image in images[:warmup]:
        predict([image])
    start = time.perf_counter()
    for image in images[warmup:]:
        predict([image])
    return (len(images) - warmup) / (time.perf_counter() - start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", help="a model-only .npz (default: the shipped small SSD)")
    parser.add_argument("--images", type=int, default=24, help="test images (default: 24)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed first images (default: 2)")
    parser.add_argument("--root", help="BCCD (default: $MEDAIDET_DATA, else the cache)")
    args = parser.parse_args(argv)

    import medaidet  # noqa: F401  (runtime settings first)
    from medaidet.data.bccd import BCCDDataset, quiet_annotation_warnings
    from medaidet.extras.deploy import OnnxDetector
    from medaidet.extras.deploy import export_onnx
    from medaidet.evaluation.evaluate import load_model
    from medaidet.ssd.predict import predict
    from medaidet.ssd.weights import shipped_weights

    quiet_annotation_warnings()
    weights = args.weights or shipped_weights("ssd_small")
    test = BCCDDataset(args.root, "test")
    images = [test[i][0] for i in range(min(args.images + args.warmup, len(test)))]
    model = load_model(weights)
    model.use_preset("evaluate")
    with tempfile.TemporaryDirectory() as tmp:
        exported = export_onnx(weights, Path(tmp) / "model.onnx")
        speeds = {
            "chainer": images_per_second(lambda x: predict(model, x), images, args.warmup),
            "onnxruntime": images_per_second(OnnxDetector(exported.path).predict, images,
                                             args.warmup),
            "onnxruntime, 1 thread": images_per_second(
                OnnxDetector(exported.path, threads=1).predict, images, args.warmup),
        }
    print(f"{exported.model}, {len(images) - args.warmup} test images one at a time "
          f"(after {args.warmup}), the 'evaluate' preset, this CPU:")
    for name, speed in speeds.items():
        print(f"  {name:22s} {speed:7.1f} images/s  ({speed / speeds['chainer']:.2f}x chainer)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
