"""medaidet.training.config: the profiles, and the names a config is checked against."""
import dataclasses

import pytest

from conftest import split_ids
from medaidet.training.config import PROFILES, TrainConfig
from medaidet.errors import ConfigError


def test_every_profile_builds_a_valid_config():
    for name in PROFILES:
        config = TrainConfig.profile(name)
        assert TrainConfig.from_dict(config.to_dict()) == config   # constructed: checked, normal
    with pytest.raises(ConfigError) as info:
        TrainConfig.profile("gpu")
    assert "'gpu'" in str(info.value)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_no_profile_validates_or_tests_on_images_it_trains_on(name, bccd_root):
    """Val's mAP, curves and thresholds are measured on images the model never trained on."""
    config = TrainConfig.profile(name)
    train, val, test = (set(split_ids(bccd_root, split))
                        for split in (config.train_split, config.val_split, "test"))
    assert train and val
    assert not train & val, f"{name}: {len(train & val)} val images are training images"
    assert not (train | val) & test


def test_cpu_profile_is_the_small_ssd_from_random_weights_with_adam():
    config = TrainConfig.profile("cpu")
    assert (config.model, config.pretrained, config.optimizer) == ("ssd_small", None, "adam")
    assert config.device == "cpu"
    long = TrainConfig.profile("cpu-long")
    assert long.epochs == 3 * config.epochs and long.lr_steps[0] > config.lr_steps[0]
    differ = {k for k, v in long.to_dict().items() if config.to_dict()[k] != v}
    assert differ == {"epochs", "lr_steps", "eval_interval", "snapshot_interval", "out",
                      "max_expand_ratio", "color_distortion"}
    assert (long.max_expand_ratio, long.color_distortion) == (2, True)    # measured so


@pytest.mark.parametrize("pretrained", ["imagenet", "voc0712"])
def test_the_small_ssd_has_no_named_weights(pretrained):
    with pytest.raises(ConfigError, match=f"^pretrained: ssd_small has no '{pretrained}'"):
        TrainConfig(model="ssd_small", pretrained=pretrained)


def test_construction_normalises_once():
    config = TrainConfig(model="SSD_small", pretrained="None", lr="1e-3", lr_steps=[1, 2])
    assert (config.model, config.pretrained, config.lr, config.lr_steps) == \
        ("ssd_small", None, 1e-3, (1.0, 2.0))
    assert TrainConfig.from_dict(config.to_dict()) == config
    with pytest.raises(dataclasses.FrozenInstanceError):   # immutable: it stays valid
        config.batch_size = 0
    assert config.replace(batch_size=8).batch_size == 8 and config.batch_size == 32


def test_unknown_optimizer_is_named():
    with pytest.raises(ConfigError, match="^optimizer: 'rmsprop'"):
        TrainConfig(optimizer="rmsprop")


def test_a_config_shows_its_settings_as_a_table():
    table = TrainConfig.profile("cpu").table(["model", "batch_size", "lr_steps"])
    assert table.rows == [["`model`", "'ssd_small'"], ["`batch_size`", "4"],
                          ["`lr_steps`", "(30.0,)"]]
    assert table.to_markdown().startswith("| setting | value |\n|---|---|")
