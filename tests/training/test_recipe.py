"""medaidet.training.recipe: the builders, called one by one as notebook 03 calls them, train
the same weights as ``train()`` (which is those builders plus checks, snapshots and metrics)."""
import numpy as np
import pytest

from medaidet.training import recipe
from medaidet.training.config import TrainConfig
from medaidet.training.ranks import Ranks
from medaidet.training.run import train
from medaidet.training.seeding import seed_everything

TINY = dict(subset=2, batch_size=1, eval_subset=1, eval_batch_size=1, seed=0, n_processes=0,
            pretrained=None, device="cpu", iterations=3)


def _weights(model) -> dict:
    return {name: np.array(param.array) for name, param in model.namedparams()}


@pytest.mark.slow(seconds=30)
def test_the_builders_in_order_train_what_train_trains(tmp_path, bccd_root):
    by_train = train(TrainConfig.profile("smoke", root=str(bccd_root), out=str(tmp_path / "a"),
                                         **TINY), progress=False)

    config = TrainConfig.profile("smoke", root=str(bccd_root), out=str(tmp_path / "b"), **TINY)
    seed_everything(config.seed)
    ranks = Ranks.for_config(config)
    model = recipe.make_model(config)
    train_chain = recipe.make_train_chain(model, config, ranks)
    data = recipe.make_datasets(config, model, ranks)
    iterators = recipe.make_iterators(data, config, ranks)
    optimizer = recipe.make_optimizer(train_chain, config, ranks)
    updater = recipe.make_updater(iterators.train, optimizer, config, ranks)
    trainer = recipe.make_trainer(updater, config, len(data.images))
    extensions = recipe.add_extensions(trainer, model, iterators.val, config, ranks,
                                       len(data.images), progress=False)
    trainer.run()

    assert updater.iteration == 3
    assert extensions.monitor.iterations_run == 3
    assert (tmp_path / "b" / "snapshot_latest.npz").is_file()
    expected, got = _weights(by_train.model), _weights(model)
    assert expected.keys() == got.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    seed_everything(config.seed)              # and training moved them from where they began
    initial = _weights(recipe.make_model(config))
    assert any(not np.array_equal(got[name], initial[name]) for name in got)


def test_training_length_in_epochs_or_iterations():
    by_epochs = recipe.Length(TrainConfig(epochs=2.5, batch_size=4), n_images=10)
    assert by_epochs.stop == (2.5, "epoch") and by_epochs.total == 7
    by_iterations = recipe.Length(TrainConfig(iterations=5, batch_size=4), n_images=10)
    assert by_iterations.stop == (5, "iteration") and by_iterations.total == 5


def test_one_process_ranks():
    ranks = Ranks.for_config(TrainConfig.profile("smoke", device="cpu", batch_size=3))
    assert (ranks.size, ranks.rank, ranks.is_root, ranks.keeps_snapshots) == (1, 0, True, True)
    assert ranks.batch_size == 3 and ranks.seed(7) == 7
    assert ranks.describe(3) is None and ranks.agreed_digests(object()) is None
    data = [1, 2, 3]
    assert ranks.share(data, seed=0) is data
