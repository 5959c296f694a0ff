"""``medaidet weights convert``: ImageNet VGG-16 from torchvision or timm, for ChainerCV's SSD."""
import json


def add_parser(commands) -> None:
    weights = commands.add_parser(
        "weights", help="convert ImageNet VGG-16 weights for SSD300/SSD512",
        description="Weight files for SSD's VGG-16 backbone.")
    actions = weights.add_subparsers(dest="action", required=True)
    p = actions.add_parser(
        "convert", help="torchvision's .pth or timm's safetensors -> ChainerCV's VGG16 .npz",
        description="Convert an ImageNet VGG-16 file (torchvision's vgg16-397923af.pth, read "
                    "without PyTorch, or timm's vgg16.tv_in1k model.safetensors) into the "
                    "parameters of ChainerCV's SSD VGG16 (conv1_1 ... conv5_3, conv6 and conv7 "
                    "subsampled from fc6 and fc7, norm4), written as an .npz with a .sha256 "
                    "sidecar. `build_ssd(..., pretrained='imagenet')` does this by itself; "
                    "use this command for a file you got another way.")
    p.add_argument("file", help="the .pth or .safetensors file")
    p.add_argument("--out", required=True, help="the .npz to write")
    p.add_argument("--mean", choices=("chainercv", "torchvision"), default="chainercv",
                   help="the mean the receiving SSD subtracts: ChainerCV's SSD mean (default; "
                        "conv1_1's one-pixel frame then differs by under a grey level) or "
                        "torchvision's x 255 (exact everywhere, for an SSD whose mean is set "
                        "to it)")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    p.set_defaults(func=_convert)


def _convert(args) -> int:
    from medaidet.ssd.vgg_weights import SSD_MEAN, TORCHVISION_MEAN_255, convert_file

    mean = SSD_MEAN if args.mean == "chainercv" else TORCHVISION_MEAN_255
    done = convert_file(args.file, args.out, mean=mean)
    if args.json:
        print(json.dumps({"source": str(done.source), "layout": done.layout,
                          "out": str(done.out), "sha256": done.sha256,
                          "arrays": done.n_arrays, "mean": list(done.mean)}))
    else:
        print(f"wrote {done.summary()}")
    return 0
