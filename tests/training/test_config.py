"""medaidet.training.config: the profiles, and the names a config is checked against."""
import pytest

from medaidet.training.config import PROFILES, ConfigError, TrainConfig


def test_every_profile_builds_a_valid_config():
    for name in PROFILES:
        assert TrainConfig.profile(name).validate() is None
    with pytest.raises(ConfigError, match="unknown profile 'gpu': use one of smoke, cpu, full"):
        TrainConfig.profile("gpu")


def test_cpu_profile_is_the_small_ssd_from_random_weights_with_adam():
    config = TrainConfig.profile("cpu")
    assert (config.model, config.pretrained, config.optimizer) == ("ssd_small", None, "adam")
    assert config.device == "cpu"


@pytest.mark.parametrize("pretrained", ["imagenet", "voc0712"])
def test_the_small_ssd_has_no_named_weights(pretrained):
    with pytest.raises(ConfigError, match=f"^pretrained: ssd_small has no '{pretrained}'"):
        TrainConfig(model="ssd_small", pretrained=pretrained)


def test_unknown_optimizer_is_named():
    with pytest.raises(ConfigError, match="^optimizer: 'rmsprop' is not an optimizer the recipe "
                                          "builds; expected one of momentum_sgd, adam"):
        TrainConfig(optimizer="rmsprop")
