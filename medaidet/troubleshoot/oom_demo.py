"""``python -m medaidet.troubleshoot.oom_demo '[ROOT, START, HEADROOM]'``: a real out-of-memory
error on the CPU, in a child whose address space is limited.

Builds SSD300, measures what one BCCD image's forward + backward pass needs, limits this
process's address space (``RLIMIT_AS``, Linux) to what it holds plus ``HEADROOM`` times that,
and runs :func:`medaidet.scaling.batch_size.find_batch_size` from ``START``. Prints one JSON
line: the finder's report, its log lines, the per-image bytes and the limit
(:func:`medaidet.troubleshoot.out_of_memory_demo` reads it).
"""
import json
import resource
import sys
import warnings

import numpy as np
from chainer.dataset import concat_examples
from chainer.datasets import TransformDataset

from medaidet.data.bccd import BCCDDataset
from medaidet.scaling.batch_size import find_batch_size
from medaidet.errors import DeviceError
from medaidet.training.config import TrainConfig
from medaidet.training.recipe import Recipe


def _vm(key: str) -> int:
    """This process's ``VmSize``/``VmPeak`` in bytes (Linux)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def main(argv=None) -> int:
    root, start, headroom = json.loads((sys.argv[1:] if argv is None else argv)[0])
    np.random.seed(0)
    # the course's recipe for SSD300 from random weights, on the CPU, encoding without
    # augmentation: the same model, loss and encoded images as training
    recipe = Recipe(TrainConfig(model="ssd300", pretrained=None, augment=False, device="cpu",
                                root=root, subset=2))
    model = recipe.model()
    chain = recipe.train_chain(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = BCCDDataset(root, "train")
    dataset = TransformDataset(base.slice[:2], recipe.transform(model))
    before = _vm("VmSize")
    loss = chain(*concat_examples([dataset[0]]))
    loss.backward()
    del loss
    chain.cleargrads()
    one_image = _vm("VmPeak") - before
    limit = _vm("VmSize") + int(headroom * one_image)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    lines, error = [], None
    try:
        report = find_batch_size(chain, dataset, start=start, log=lines.append)
    except DeviceError as exc:
        report, error = exc.report, str(exc)
    print(json.dumps({"one_image": one_image, "limit": limit, "lines": lines,
                      "report": report.to_dict(), "error": error}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
