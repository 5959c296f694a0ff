"""What a training run depends on (notebook 03): :class:`TrainConfig`, its profiles, its checks.
Defaults: ChainerCV's ``examples/ssd/train.py``; a bad value is one :class:`ConfigError` naming
the field, the value and what is expected. No chainer import (the command line's parser uses it).
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from medaidet.arguments import check_number, is_path
from medaidet.errors import ConfigError, DeviceError
from medaidet.data import LABELS, OTHER_SOURCES
from medaidet.device import DEFAULT_DEVICE, parse_device
from medaidet.tables import Table
from medaidet.ssd import MODEL_NAMES, PRECISIONS, PRETRAINED, WITH_PRETRAINED

__all__ = ["TrainConfig", "ConfigError", "PROFILES", "OPTIMIZERS", "PRECISIONS", "WEIGHTS_NAME"]

#: Named settings on top of the recipe (``'full'`` is the recipe itself).
PROFILES = {
    # a few iterations on a few images from random weights: the code runs, nothing is learnt
    "smoke": dict(pretrained=None, subset=4, batch_size=2, iterations=4, eval_interval=None,
                  eval_subset=2, eval_batch_size=2, log_interval=1, snapshot_interval=None,
                  n_processes=0, device="cpu", seed=0, out="outputs/train-smoke"),
    # the small SSD from random weights, trained on a CPU in minutes; augmentation and batch
    # chosen on val (docs/cpu-detector.md)
    "cpu": dict(model="ssd_small", pretrained=None, optimizer="adam", lr=2e-3, batch_size=4,
                epochs=39, lr_steps=(30,), max_expand_ratio=1, color_distortion=False,
                eval_interval=3, log_interval=5, snapshot_interval=1, device="cpu", seed=0,
                out="outputs/train-cpu"),
    # ChainerCV's SSD300 recipe, as the original course ran it (a GPU)
    "full": {},
}
# the cpu profile three times as long, with colour distortion and a 2x zoom-out (the lighter
# augmentation gained nothing there: docs/cpu-detector.md, "The longer profile")
PROFILES["cpu-long"] = {**PROFILES["cpu"], "epochs": 117, "lr_steps": (90,), "eval_interval": 9,
                        "snapshot_interval": 3, "max_expand_ratio": 2, "color_distortion": True,
                        "out": "outputs/train-cpu-long"}
OPTIMIZERS = ("momentum_sgd", "adam")
WEIGHTS_NAME = "model.npz"


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on (defaults: the recipe). It stops after ``iterations``
    if given, else ``epochs``; ``lr_steps``, ``eval_interval`` and ``snapshot_interval`` are epochs
    (None: only at the end, where both always happen), ``log_interval`` iterations."""

    model: str = "ssd300"
    pretrained: str | None = "imagenet"   # None, 'imagenet', 'voc0712' or an .npz path
    batch_size: int = 32
    optimizer: str = "momentum_sgd"      # or 'adam' (lr is then Adam's alpha)
    lr: float = 1e-3
    momentum: float = 0.9                # momentum_sgd only
    weight_decay: float = 5e-4
    bias_grad_scale: float = 2.0
    epochs: float = 300
    iterations: int | None = None
    lr_steps: tuple = (200, 250)
    lr_gamma: float = 0.1
    k: int = 3
    alpha: float = 1.0
    eval_interval: float | None = 1
    eval_subset: int | None = None       # first N validation images; None: all
    eval_batch_size: int = 8
    log_interval: int = 10
    snapshot_interval: float | None = 1
    train_split: str = "train"
    val_split: str = "val"
    subset: int | None = None            # first N training images; None: all
    n_processes: int | None = None       # None: min(4, cpus), 0 if deterministic
    seed: int | None = None
    deterministic: bool = False          # bitwise reproducible where possible (needs seed)
    augment: bool = True                 # False: resize + encode only (no random augmentation)
    max_expand_ratio: float = 4          # zoom-out canvas up to N x the image (1: none)
    color_distortion: bool = True        # random brightness, contrast, saturation and hue
    accumulate: int = 1                  # micro-batches per batch (raised on a GPU to fit)
    memory_limit: float | None = None    # GiB the run may hold (None: what the GPU has free)
    precision: str = "float32"           # 'float32' or 'tf32' (a GPU's TF32 tensor cores)
    communicator: str | None = None      # ChainerMN: 'naive' (CPU/GPU), 'pure_nccl' (GPUs), ...
    device: str | int = DEFAULT_DEVICE   # 'cpu', 'gpu' (= GPU 0), an int, or 'auto'
    root: str | None = None              # BCCD root; None: $MEDAIDET_DATA / the cache
    labels: str = "bccd"                 # or 'txl-pbc' (TXL-PBC's re-annotation of BCCD)
    other_sources: tuple = ()            # TXL-PBC train images of 'PBC', 'Raabin-WBC'
    out: str = "outputs/train"

    def __post_init__(self):
        # the one check of a config (immutable, so it stays valid): ConfigError at the first
        # bad field; numeric text (YAML's ``1e-3``) made numbers, paths text, names lower-case
        values = dataclasses.asdict(self)
        _normalise_numbers(values)
        _normalise_names(values)
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @classmethod
    def profile(cls, name: str, **overrides) -> "TrainConfig":
        """The settings of :data:`PROFILES` ``name``, then ``overrides``."""
        if name not in PROFILES:
            raise ConfigError(f"unknown profile {name!r}: use one of {', '.join(PROFILES)}")
        return cls.from_dict({**PROFILES[name], **overrides})

    @classmethod
    def from_dict(cls, values: dict, base: "TrainConfig | None" = None) -> "TrainConfig":
        """A config from ``values`` on top of ``base`` (default: the recipe)."""
        if not isinstance(values, dict):
            raise ConfigError(f"a training config must be a mapping, got {type(values).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(f"unknown training option(s) {', '.join(unknown)}; known: "
                              f"{', '.join(sorted(names))}")
        try:
            return cls(**{**(dataclasses.asdict(base) if base is not None else {}), **values})
        except TypeError as exc:
            raise ConfigError(f"bad training config: {exc}") from None

    @classmethod
    def from_file(cls, path, base: "TrainConfig | None" = None) -> "TrainConfig":
        """Read a JSON file (always) or a YAML file (``.yaml``/``.yml``; needs PyYAML)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read the config file {path}: {exc}") from None
        if path.suffix.lower() in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise ConfigError(f"{path} is YAML but PyYAML is not installed: "
                                  "pip install pyyaml, or write the config as JSON") from None
            language, parse, invalid = "YAML", yaml.safe_load, yaml.YAMLError
        else:
            language, parse, invalid = "JSON", json.loads, json.JSONDecodeError
        try:
            values = parse(text)
        except invalid as exc:
            raise ConfigError(f"{path} is not valid {language}: {exc}") from None
        try:
            return cls.from_dict(values if values is not None else {}, base)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None

    def replace(self, **changes) -> "TrainConfig":
        return self.from_dict(changes, base=self)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "lr_steps": list(self.lr_steps),
                "other_sources": list(self.other_sources)}

    def table(self, fields=None) -> Table:
        """``fields`` (default: all) and their values, one row each."""
        names = list(fields) if fields is not None else [f.name for f in dataclasses.fields(self)]
        return Table(["setting", "value"], [[f"`{n}`", repr(getattr(self, n))] for n in names])


def _normalise_numbers(v: dict) -> None:
    """Check the numeric and true/false fields of ``v`` in place: numeric text made numbers,
    whole ones ints."""

    def number(name, rule="positive", integer=False, optional=False):
        value = v[name]
        if value is None and optional:
            return
        try:
            checked = check_number(value, name, rule, integer)
        except ConfigError as exc:
            raise ConfigError(f"{exc}{' or null' if optional else ''}") from None
        if integer or isinstance(value, str):
            v[name] = checked

    for names, rule, integer, optional in (   # names, then how each is checked
            ("batch_size k log_interval eval_batch_size accumulate", "positive", True, False),
            ("subset eval_subset iterations", "positive", True, True),
            ("epochs lr max_expand_ratio", "positive", False, False),
            ("memory_limit eval_interval snapshot_interval", "positive", False, True),
            ("momentum weight_decay bias_grad_scale alpha lr_gamma", "non-negative", False, False),
            ("n_processes seed", "non-negative", True, True)):
        for name in names.split():
            number(name, rule, integer, optional)
    if v["max_expand_ratio"] < 1:
        raise ConfigError(f"max_expand_ratio: {v['max_expand_ratio']!r} is below 1; expected "
                          "the zoom-out canvas as a multiple of the image, 1 or more (1: none)")
    if not isinstance(v["lr_steps"], (list, tuple)):
        raise ConfigError(f"lr_steps: {v['lr_steps']!r} is not a list; expected a list of epochs")
    v["lr_steps"] = tuple(check_number(step, f"lr_steps[{i}]", "non-negative")
                          for i, step in enumerate(v["lr_steps"]))
    for name in ("deterministic", "augment", "color_distortion"):
        if not isinstance(v[name], bool):
            raise ConfigError(f"{name}: {v[name]!r} is not true or false; expected true or false")


def _normalise_names(v: dict) -> None:
    """Check the other fields of ``v`` in place: paths made text, names lower-case."""
    for name, allowed in (("model", MODEL_NAMES), ("precision", PRECISIONS),
                          ("optimizer", OPTIMIZERS)):
        value = v[name].lower() if isinstance(v[name], str) and name != "precision" else v[name]
        if value not in allowed:
            raise ConfigError(f"{name}: {v[name]!r} is not one of {', '.join(allowed)}")
        v[name] = value
    pretrained = v["pretrained"]
    if isinstance(pretrained, str) and pretrained.strip().lower() == "none":
        pretrained = None        # as the command line's --pretrained none
    if pretrained is not None and not is_path(pretrained):
        raise ConfigError(f"pretrained: {pretrained!r} is not a weights name or file; expected "
                          f"null, {', '.join(map(repr, PRETRAINED))} or a model-only .npz")
    v["pretrained"] = pretrained = None if pretrained is None else os.fspath(pretrained)
    if pretrained in PRETRAINED and v["model"] not in WITH_PRETRAINED:
        raise ConfigError(f"pretrained: {v['model']} has no {pretrained!r} weights (only "
                          f"{', '.join(WITH_PRETRAINED)}); expected null or a model-only .npz")
    sources = (v["other_sources"],) if isinstance(v["other_sources"], str) else v["other_sources"]
    if not isinstance(sources, (list, tuple)) or any(s not in OTHER_SOURCES for s in sources):
        raise ConfigError(f"other_sources: {v['other_sources']!r}: expected a list of "
                          f"{', '.join(OTHER_SOURCES)} (TXL-PBC's other laboratories), or none")
    v["other_sources"] = tuple(sources)
    if v["labels"] not in LABELS:
        raise ConfigError(f"labels: {v['labels']!r} is not one of {', '.join(LABELS)}")
    for name in ("train_split", "val_split"):
        if not isinstance(v[name], str) or not v[name].strip():
            raise ConfigError(f"{name}: {v[name]!r} is not a split name such as 'train'")
    for name, expected in (("out", "a folder to write the results in"),
                           ("root", "null ($MEDAIDET_DATA or the cache) or the BCCD root")):
        if (name == "out" or v[name] is not None) and not is_path(v[name]):
            raise ConfigError(f"{name}: {v[name]!r} is not a folder path; expected {expected}")
    v["out"] = os.path.expanduser(os.fspath(v["out"]))
    v["root"] = None if v["root"] is None else os.fspath(v["root"])
    if v["batch_size"] % v["accumulate"]:
        raise ConfigError(f"batch_size {v['batch_size']} is not divisible by accumulate "
                          f"{v['accumulate']}: use a batch size that is a multiple of it")
    communicator = v["communicator"]
    if communicator is not None and (not isinstance(communicator, str) or not communicator):
        raise ConfigError(f"communicator: {communicator!r} is not a ChainerMN communicator name "
                          "(naive, pure_nccl, ...) or null")
    if v["deterministic"] and v["seed"] is None:
        raise ConfigError("deterministic=True needs a seed: set seed (--seed S) too")
    try:
        parse_device(v["device"], "device")
    except DeviceError as exc:
        raise ConfigError(str(exc)) from None
