"""Write the small PyTorch files tests/ssd/test_vgg_weights.py reads (needs PyTorch).

    python tools/make_torch_fixtures.py tests/ssd/data

Both formats ``torch.save`` writes (zip and, with ``_use_new_zipfile_serialization=False``,
legacy), holding the kinds of tensors a state dict can: float32/16/64, bfloat16, int64, bool,
a 0-d tensor, a slice sharing another entry's storage and a transposed (non-contiguous) one;
and ``torch_state_expected.npz``, the same values as NumPy saves them. The committed files
were written with PyTorch 1.12.1 (the legacy format is what torchvision's 2017 files use).
"""
import argparse
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np


def state(torch):
    base = torch.arange(20, dtype=torch.float32) * 0.25 - 2
    sd = OrderedDict()
    sd["features.0.weight"] = torch.linspace(-1, 1, 108).reshape(4, 3, 3, 3)
    sd["features.0.bias"] = torch.tensor([0.5, -0.5, 1e-3, 3.0])
    sd["shared.full"] = base
    sd["shared.tail"] = base[5:15]                    # storage offset 5
    sd["transposed"] = torch.arange(15, dtype=torch.float32).reshape(3, 5).t()
    sd["half"] = torch.tensor([1.5, -2.25, 65504.0], dtype=torch.float16)
    sd["double"] = torch.tensor([[1 / 3, 2 / 3]], dtype=torch.float64)
    sd["bf16"] = torch.tensor([1.0, -0.5, 3.140625], dtype=torch.bfloat16)
    sd["count"] = torch.tensor(7, dtype=torch.int64)   # 0-d, as num_batches_tracked
    sd["mask"] = torch.tensor([True, False, True])
    return sd


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the folder to write (tests/ssd/data)")
    out = parser.parse_args(argv).out
    try:
        import torch
    except ImportError:
        sys.exit("this script needs PyTorch (pip install torch): it writes files as PyTorch "
                 "itself saves them")
    out.mkdir(parents=True, exist_ok=True)
    sd = state(torch)
    torch.save(sd, out / "torch_state_zip.pth")
    torch.save(sd, out / "torch_state_legacy.pth", _use_new_zipfile_serialization=False)
    np.savez(out / "torch_state_expected.npz",
             **{k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for k, v in sd.items()})
    print(f"PyTorch {torch.__version__}: wrote 3 files to {out}")


if __name__ == "__main__":
    main()
