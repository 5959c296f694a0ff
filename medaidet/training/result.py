"""What a training run leaves: :class:`TrainResult` and the numbers of ``metrics.json``."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import chainer
import numpy as np

from medaidet.data import BCCD_LABEL_NAMES
from medaidet.numbers import finite_or_none
from medaidet.tables import Table

__all__ = ["TrainResult", "run_metrics"]


@dataclass
class TrainResult:
    """What :func:`medaidet.training.run.train` produced. ``metrics`` is what
    ``metrics.json`` holds (:func:`run_metrics`)."""

    out: Path
    weights: Path
    sha256: str
    snapshot: Path | None          # None: a multi-process run (no trainer snapshot)
    metrics: dict
    model: object = field(repr=False, default=None)

    def to_dict(self) -> dict:
        return dict(self.metrics)

    def validation_table(self) -> Table:
        """Every validation of the run: iteration, epoch, val mAP and AP per class (the
        split is the config's ``val_split``)."""
        m = self.metrics
        names = list(m["val_ap"])
        table = Table(["iteration", "epoch", f"{m['config']['val_split']} mAP", *names])
        for entry in m["log"]:
            if "validation/main/map" in entry:
                table.append([entry["iteration"], entry["epoch"], entry["validation/main/map"],
                              *(entry.get(f"validation/main/ap/{n}") for n in names)])
        return table

    def summary(self) -> str:
        m = self.metrics
        best = m.get("best_val_map")
        best = "n/a" if best is None else f"{best:.3f} (iteration {m['best_val_iteration']})"
        loss = "n/a" if m.get("last_loss") is None else f"{m['last_loss']:.3f}"
        return (f"trained {m['iterations']} iterations ({m['iterations_this_run']} in this run, "
                f"{m['seconds']:.0f} s, {m['images_per_second']:.2f} images/s); last loss "
                f"{loss}; best val mAP {best}\nweights: {self.weights} "
                f"(sha256 {self.sha256[:12]}...)" +
                (f"\nsnapshot: {self.snapshot}" if self.snapshot is not None else ""))


def _clean_log(log):
    """LogReport's entries with nan/inf as None (JSON has no nan)."""
    return [{k: (finite_or_none(v) if isinstance(v, (float, np.floating)) else v)
             for k, v in entry.items()} for entry in log]


def run_metrics(config, recipe, data, iterators, updater, extensions, *, start_iteration,
                seconds, resume, weights, sha256, snapshot, plots) -> dict:
    """The numbers of a finished run (what ``metrics.json`` holds): how long, how fast,
    the last loss, the best and the last validation AP, what the data and the processes
    were, where the files are, the config and the versions."""
    iterations_run = updater.iteration - start_iteration
    eval_seconds = extensions.evaluator.seconds
    train_seconds = max(seconds - eval_seconds, 1e-9)
    entries = _clean_log(extensions.log_report.log)
    evals = [e for e in entries if e.get("validation/main/map") is not None]
    best = max(evals, key=lambda e: e["validation/main/map"], default=None)
    last_eval = [e for e in entries if "validation/main/map" in e]
    last_eval = last_eval[-1] if last_eval else {}
    counted = iterators.n_processes == 0      # worker processes keep their own counts
    return {
        "iterations": int(updater.iteration),
        "iterations_this_run": int(iterations_run),
        "epochs": float(updater.epoch_detail),
        "resumed_from": None if resume is None else str(resume),
        "seconds": seconds,
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "images_per_second": iterations_run * config.batch_size / train_seconds,
        "seconds_per_epoch": (train_seconds / (iterations_run * config.batch_size)
                              * len(data.images)) if iterations_run else None,
        "last_loss": finite_or_none(extensions.monitor.last_loss),
        "best_val_map": None if best is None else best["validation/main/map"],
        "best_val_iteration": None if best is None else best["iteration"],
        "val_map": last_eval.get("validation/main/map"),
        "val_ap": {c: last_eval.get(f"validation/main/ap/{c}") for c in BCCD_LABEL_NAMES},
        "val_images": len(data.val),
        "train_images": len(data.images),
        "transform_stats": data.transform.stats.to_dict() if counted else None,
        **({} if counted else {"transform_stats_note": (
            "not counted: the transform ran in worker processes; use n_processes=0 to "
            "count drops")}),
        "n_processes": iterators.n_processes,
        "accumulate": config.accumulate,
        "communicator": config.communicator,
        "ranks": 1 if recipe.comm is None else recipe.comm.size,
        "batch_per_rank": recipe.batch_size,
        "rank_digests": None,      # a multi-process run: medaidet.extras.mpi.train's check
        "device": str(recipe.device),
        "weights": str(weights),
        "sha256": sha256,
        "snapshot": None if snapshot is None else str(snapshot),
        "plots": plots,
        "config": config.to_dict(),
        "versions": {"chainer": chainer.__version__, "numpy": np.__version__},
        "log": entries,
    }
