"""medaidet.device: reading device specs, and naming them for people."""
import pytest

from medaidet.device import device_name


@pytest.mark.parametrize("spec, name", [
    ("@numpy", "the CPU"), ("cpu", "the CPU"), (-1, "the CPU"), ("@cupy:1", "GPU 1"),
    (0, "GPU 0"), ("gpu", "a GPU"), ("auto", "auto"), ("tpu", "tpu"),
])
def test_device_names_read_as_words(spec, name):
    assert device_name(spec) == name
