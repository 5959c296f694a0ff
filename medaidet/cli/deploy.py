"""``medaidet export`` and ``medaidet count-image``: the detector outside Chainer (notebook 09)."""
import io
import json
import os
from pathlib import Path

from medaidet.arguments import prepare_output_dir
from medaidet.cli.count import count_threshold
from medaidet.errors import DeployError, OutputError
from medaidet.files import check_output, write_files
from medaidet.evaluation.protocol import COUNT_SCORE_THRESH

EXTRAS = {"onnx": "export", "onnx_chainer": "export", "onnxruntime": "deploy"}


def _missing_extra(exc: ModuleNotFoundError, command: str):
    extra = EXTRAS.get((exc.name or "").split(".")[0])
    if extra is None:
        return exc
    return DeployError(f"`medaidet {command}` needs {exc.name}, which is not installed: "
                       f"pip install 'medaidet[{extra}]' (from a checkout: "
                       f"pip install -e '.[{extra}]')", "extra")


def add_parser(commands) -> None:
    p = commands.add_parser(
        "export", help="write a trained SSD as an ONNX model (for onnxruntime, a browser, ...)",
        description="Write the SSD trained into WEIGHTS (a model-only .npz, as `medaidet "
                    "train` writes) as an ONNX model: input `image` (1, 3, S, S) RGB 0-255, "
                    "outputs `locs` and `scores`; the default boxes and class names are in its "
                    "metadata. Needs the chainer stack and `pip install 'medaidet[export]'`.")
    p.add_argument("weights", help="the trained weights (.npz)")
    p.add_argument("--out", required=True,
                   help="the .onnx file to write, or a folder (an existing one, or a name "
                        "ending in /) to write <weights name>.onnx into")
    p.add_argument("--opset", type=int, default=11, choices=list(range(9, 12)),
                   help="ONNX opset, 9 to 11 (default: 11)")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    p.set_defaults(func=_export)

    p = commands.add_parser(
        "count-image", help="count cells in smear images with an exported model (no chainer)",
        description="Count red cells, white cells and platelets in each IMAGE with a model "
                    "written by `medaidet export`, with onnxruntime (no chainer: `pip install "
                    "'medaidet[deploy]'`). A detection counts when it scores at least "
                    "--score-thresh. --out writes <image>.json and <image>.png (the detections "
                    "drawn) per image.")
    p.add_argument("images", nargs="+", help="image files (JPEG, PNG, ...)")
    p.add_argument("--model", required=True, help="the .onnx file `medaidet export` wrote")
    p.add_argument("--score-thresh", type=count_threshold, default=COUNT_SCORE_THRESH,
                   help=f"count detections scoring at least this (default: {COUNT_SCORE_THRESH}, "
                        "as notebook 05)")
    p.add_argument("--out", help="folder for a .json and an annotated .png per image")
    p.add_argument("--json", action="store_true", help="print the counts as JSON")
    p.set_defaults(func=_count_image)


def _results_folder(out, images) -> Path:
    """``--out``, created, once no two images would write the same result files (one stem)
    and no result would replace an image or anything but a regular file."""
    stems = {}
    for image in images:
        stems.setdefault(Path(image).stem, []).append(image)
    same = [paths for paths in stems.values() if len(paths) > 1]
    if same:
        raise OutputError(f"{' and '.join(same[0])} would both write {Path(same[0][0]).stem}.json "
                          f"and .png into {out}: count them in separate runs with separate "
                          "--out folders, or rename one (nothing was written).", "clash", path=out)
    for stem in stems:          # every result checked before any image is counted
        for suffix in (".json", ".png"):
            check_output(Path(out) / f"{stem}{suffix}", images)
    return prepare_output_dir(out, "--out")


def _export(args) -> int:
    try:
        from medaidet.deploy.export import export_onnx
        out = args.out
        if out.endswith(("/", os.sep)) or Path(out).is_dir():
            out = Path(out) / f"{Path(args.weights).stem}.onnx"
        exported = export_onnx(args.weights, out, opset=args.opset)
    except ModuleNotFoundError as exc:
        raise _missing_extra(exc, "export") from None
    if args.json:
        print(json.dumps({"path": str(exported.path), "model": exported.model,
                          "insize": exported.insize, "opset": exported.opset,
                          "default_boxes": exported.n_default_boxes}))
    else:
        print(f"wrote {exported}")
    return 0


def _count_image(args) -> int:
    try:
        from medaidet.deploy.detector import OnnxDetector, read_rgb
        detector = OnnxDetector(args.model)
    except ModuleNotFoundError as exc:
        raise _missing_extra(exc, "count-image") from None
    from medaidet.deploy.draw import draw_detections

    out = _results_folder(args.out, args.images) if args.out else None
    results = []
    for path in map(Path, args.images):
        image = read_rgb(path)
        bboxes, labels, scores = detector.predict([image])
        kept = scores[0] >= args.score_thresh
        bbox, label, score = bboxes[0][kept], labels[0][kept], scores[0][kept]
        counts = {name: int((label == i).sum()) for i, name in enumerate(detector.label_names)}
        result = {"image": str(path), "counts": counts, "score_thresh": args.score_thresh,
                  "detections": [{"class": detector.label_names[l], "score": round(float(s), 4),
                                  "box_yxyx": [round(float(v), 1) for v in b]}
                                 for b, l, s in zip(bbox, label, score)]}
        results.append(result)
        if out is not None:
            drawing = io.BytesIO()
            draw_detections(image, bbox, label, detector.label_names).save(drawing, "PNG")
            write_files({out / f"{path.stem}.json": json.dumps(result, indent=1) + "\n",
                         out / f"{path.stem}.png": drawing.getvalue()}, inputs=args.images)
    if args.json:
        print(json.dumps(results, indent=1))      # a list, for one image as for several
    else:
        names = detector.label_names
        width = max(len(r["image"]) for r in results)
        print(f"{'image':{width}s}  " + "  ".join(f"{n:>9s}" for n in names))
        for r in results:
            print(f"{r['image']:{width}s}  " + "  ".join(f"{r['counts'][n]:9d}" for n in names))
    return 0
