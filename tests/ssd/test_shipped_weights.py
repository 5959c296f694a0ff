"""The small SSD's shipped weights: the file its record names, and a working detector whose
fresh evaluation on BCCD's test split gives the AP the record states."""
import json

import numpy as np
import pytest

from medaidet.files import sha256_file
from medaidet.evaluation.evaluate import evaluate_weights
from medaidet.evaluation.evaluate import course_weights
from medaidet.ssd.weights import SHIPPED_WEIGHTS, shipped_weights
from medaidet.errors import WeightsError
from medaidet.ssd.small import SIZES
from medaidet.training.config import TrainConfig

PATH = SHIPPED_WEIGHTS["ssd_small", "bccd"]


def _record() -> dict:
    return json.loads(PATH.with_suffix(".json").read_text())


@pytest.mark.parametrize("labels", ["bccd", "txl-pbc"])
def test_a_shipped_file_is_small_half_precision_and_matches_its_record(labels):
    path = SHIPPED_WEIGHTS["ssd_small", labels]
    record = json.loads(path.with_suffix(".json").read_text())
    assert shipped_weights("ssd_small", labels) == path
    assert path.stat().st_size <= 5 * 2**20 and sha256_file(path) == record["sha256"]
    assert (path.parent / (path.name + ".sha256")).read_text().split()[0] == record["sha256"]
    with np.load(path) as npz:
        assert npz["extractor/0/0/conv/W"].dtype == np.float16
    # trained with today's default boxes and profile: the record's command reproduces them
    assert record["default_box_sizes"] == list(SIZES)
    option = {} if labels == "bccd" else {"labels": labels}
    assert record["command"] == " ".join(
        ["python -m medaidet train --profile cpu --seed", str(record["seed"])]
        + [f"--{k} {v}" for k, v in option.items()])
    profile = TrainConfig.profile("cpu", seed=record["seed"], **option).to_dict()
    assert record["config"] == {k: v for k, v in profile.items() if k not in ("out", "root")}
    assert record["trained"]["train_seconds"] < 15 * 60      # the CPU budget


def test_no_shipped_weights_for_other_models_is_a_named_error():
    for args, asked in ((("ssd300",), "'ssd300'"), (("ssd_small", "voc"), "'voc'")):
        with pytest.raises(WeightsError) as info:
            shipped_weights(*args)
        assert info.value.kind == "missing" and asked in str(info.value)


@pytest.mark.parametrize("change", ["a byte", "no sidecar"])
def test_a_shipped_file_that_is_not_the_recorded_one_is_refused(tmp_path, monkeypatch, change):
    import medaidet.ssd.weights as weights

    copy = tmp_path / PATH.name
    for suffix in ("", ".sha256"):
        (tmp_path / (PATH.name + suffix)).write_bytes(
            (PATH.parent / (PATH.name + suffix)).read_bytes())
    copy.with_suffix(".json").write_bytes(PATH.with_suffix(".json").read_bytes())
    monkeypatch.setitem(weights.SHIPPED_WEIGHTS, ("ssd_small", "bccd"), copy)
    assert shipped_weights("ssd_small") == copy
    if change == "a byte":
        data = bytearray(copy.read_bytes())
        data[-100] ^= 1
        copy.write_bytes(bytes(data))
    else:
        (tmp_path / (PATH.name + ".sha256")).unlink()
    with pytest.raises(WeightsError) as info:
        shipped_weights("ssd_small")
    assert info.value.kind == "checksum" and info.value.path == copy
    assert info.value.expected == _record()["sha256"]


@pytest.mark.slow(seconds=10)
def test_the_shipped_detector_scores_on_the_test_split_what_its_record_says(bccd_root):
    record = _record()["test"]
    result = evaluate_weights(PATH, split="test", root=bccd_root, device="cpu", progress=False)
    ap = result["evaluate"]
    assert result.n_images == record["n_images"] == 72
    assert ap.map_voc == pytest.approx(record["map_voc"], abs=1e-3)
    for name, value in zip(result.label_names, ap.ap_voc):
        assert value == pytest.approx(record["ap_voc"][name], abs=1e-3), name
    assert ap.map_voc > 0.7        # a working detector, not an untrained one (mAP ~0.002)
    course = result["course"]
    assert course.score_thresh == record["course_protocol"]["score_thresh"] == 0.6
    assert course.map_voc == pytest.approx(record["course_protocol"]["map_voc"], abs=1e-3)


@pytest.mark.slow(seconds=18)
def test_the_recorded_count_errors_are_what_counting_at_the_val_thresholds_gives(bccd_root):
    from medaidet.evaluation.analysis import images_missing_class
    from medaidet.evaluation.count import count_cells
    from medaidet.evaluation.count import threshold_sweep
    from medaidet.evaluation.evaluate import predict_weights

    counts = _record()["counts"]
    chosen = counts["thresholds_chosen_on_val"]
    val = predict_weights(PATH, "val", root=bccd_root, device="cpu", progress=False)
    assert threshold_sweep(val).best_threshold == chosen       # chosen on val, not on test
    test = predict_weights(PATH, "test", root=bccd_root, device="cpu", progress=False)
    flagged = images_missing_class(test.ids, root=bccd_root, brief=True)
    assert flagged == counts["set_aside"]
    for l, (name, t) in enumerate(chosen.items()):
        result = count_cells(test, t, set_aside=flagged)
        assert result.relative_error[l] == pytest.approx(
            counts["test_relative_error"][name], abs=1e-3), name
        assert result.without_set_aside().relative_error[l] == pytest.approx(
            counts["test_relative_error_without_set_aside"][name], abs=1e-3), name


def test_course_weights_per_profile(tmp_path):
    """Notebook 03's model where it trained one, else the shipped weights; never the smoke run's."""
    runs = tmp_path / "runs"
    for profile in ("cpu", "full"):
        path, why = course_weights(profile, runs)
        assert path == PATH and "has not trained" in why and str(runs / profile) in why
    for profile in ("smoke", "cpu", "full"):
        (runs / profile).mkdir(parents=True)
        (runs / profile / "model.npz").write_bytes(b"")
    assert course_weights("smoke", runs) == (PATH, "the small SSD's weights shipped with "
                                             "medaidet: the smoke run's model is untrained")
    for profile in ("cpu", "full"):
        assert course_weights(profile, runs) == (
            runs / profile / "model.npz", f"trained by notebook 03 in the {profile} profile")


TXL = SHIPPED_WEIGHTS["ssd_small", "txl-pbc"]


def test_the_trusted_label_detector_ships_beside_judged_on_four_annotations():
    record = json.loads(TXL.with_suffix(".json").read_text())
    assert TXL != PATH
    # thresholds chosen on val, figures on test, against both annotations and elsewhere
    assert set(record["judged"]) == {"txl-pbc", "bccd", "PBC", "Raabin-WBC"}
    for figures in record["judged"].values():
        assert set(figures["thresholds"]) == {"rbc", "wbc", "platelets"}


@pytest.mark.slow(seconds=10)
def test_the_trusted_label_detector_scores_against_the_re_annotation_what_its_record_says(
        bccd_root, txl_root):
    from medaidet.data.bccd import BCCDDataset
    from medaidet.evaluation.count import count_errors
    from medaidet.evaluation.count import threshold_sweep
    from medaidet.evaluation.evaluate import evaluate
    from medaidet.evaluation.evaluate import load_model, predict_split
    judged = json.loads(TXL.with_suffix(".json").read_text())["judged"]["txl-pbc"]
    model = load_model(TXL)
    split = {s: BCCDDataset(bccd_root, s, labels="txl-pbc", txl_root=txl_root)
             for s in ("val", "test")}
    val, test = (predict_split(model, split[s], progress=False) for s in ("val", "test"))
    assert len(test.ids) == 40 and len(val.ids) == 57
    chosen = threshold_sweep(val).best_threshold
    assert chosen == judged["thresholds"]
    for protocol, p in evaluate(test).protocols.items():
        assert p.map_voc == pytest.approx(judged["map"][protocol], abs=1e-3)
    assert count_errors(test, chosen) == pytest.approx(judged["count_error"], abs=1e-3)
    assert judged["map"]["evaluate"] > 0.9     # a working detector on the fuller labels
