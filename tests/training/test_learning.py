"""A short CPU run of the small SSD must find val's white cells, unlike the untrained model:
it turns red on a change that breaks learning (the loss, coder, augmentation, hooks)."""
import pytest

from medaidet.training.config import TrainConfig
from medaidet.training.train import train

# Measured on a 2-core CPU with one thread: see docs/cpu-detector.md ("the CI check").
SHORT = dict(batch_size=8, iterations=60, lr_steps=(), eval_interval=None,
             eval_subset=40, n_processes=0, log_interval=20, snapshot_interval=None)
UNTRAINED_WBC_AP = 0.10     # the untrained model scores below this
LEARNED_WBC_AP = 0.50       # the trained one above this


@pytest.mark.slow(seconds=40)
def test_a_short_cpu_run_learns_to_find_white_cells(tmp_path, bccd_root):
    config = TrainConfig.profile("cpu", root=str(bccd_root), out=str(tmp_path / "run"),
                                 **SHORT)
    untrained = train(config.replace(iterations=1, lr=1e-12, out=str(tmp_path / "untrained")),
                      progress=False)
    assert untrained.metrics["val_ap"]["wbc"] < UNTRAINED_WBC_AP, untrained.metrics["val_ap"]
    result = train(config, progress=False)
    ap = result.metrics["val_ap"]
    assert ap["wbc"] > LEARNED_WBC_AP, ap
    assert result.metrics["val_map"] > untrained.metrics["val_map"] + 0.15, ap
