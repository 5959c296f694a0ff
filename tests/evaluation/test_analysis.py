"""Error analysis on synthetic predictions with known answers, and one real run on BCCD."""
import math
import warnings

import numpy as np
import pytest

from medaidet.data.validate import Issue
from medaidet.errors import ConfigError
from medaidet.evaluation.analysis import (box_outcomes, detection_scores, images_missing_class,
                                          missed_by, plot_detection_scores, recall_precision,
                                          stage_counts)
from medaidet.evaluation.evaluate import Predictions, predict_weights
from medaidet.ssd.predict import Candidates

NAMES = ("rbc", "wbc", "platelets")
SIZES = [(300, 300)]    # image (H, W): sizes at the 300x300 input are the boxes' own


def box(y, x, h=20, w=20):
    return [y, x, y + h, x + w]


def preds_of(pred, gt, n_images=1):
    """Predictions of ``n_images`` copies of one image: pred = (boxes, labels, scores)."""
    pb, pl, ps = (np.asarray(a, dtype=t).reshape(s) for a, t, s in zip(
        pred, (np.float32, np.int32, np.float32), ((-1, 4), (-1,), (-1,))))
    gb = np.asarray(gt[0], dtype=np.float32).reshape(-1, 4)
    gl = np.asarray(gt[1], dtype=np.int32)
    return Predictions([f"img{i}" for i in range(n_images)], [pb] * n_images, [pl] * n_images,
                       [ps] * n_images, [gb] * n_images, [gl] * n_images, None, NAMES, 0.01)


def test_recall_and_precision_per_class_and_threshold():
    gt = ([box(0, 0), box(0, 50), box(0, 100, 60, 60), box(100, 0, 8, 8)], [0, 0, 1, 2])
    pred = ([box(0, 0), box(0, 50), box(0, 50), box(200, 200), box(0, 100, 60, 60)],
            [0, 0, 0, 0, 1], [0.9, 0.55, 0.52, 0.7, 0.95])
    rows = {(r["score_thresh"], r["class"]): r
            for r in recall_precision(preds_of(pred, gt, 2), (0.5, 0.6))}
    # at 0.5: both rbc found, the 0.52 duplicate and the far box are FPs
    assert rows[0.5, "rbc"] == {"score_thresh": 0.5, "class": "rbc", "n_gt": 4, "tp": 4,
                                "fp": 4, "missed": 0, "recall": 1.0, "precision": 0.5}
    r = rows[0.6, "rbc"]     # at 0.6 the 0.55 box is gone: one rbc missed per image
    assert (r["tp"], r["fp"], r["missed"]) == (2, 2, 2) and r["recall"] == 0.5
    assert rows[0.6, "wbc"]["recall"] == 1.0 and rows[0.6, "wbc"]["precision"] == 1.0
    p = rows[0.5, "platelets"]
    assert p["recall"] == 0.0 and math.isnan(p["precision"]) and p["missed"] == 2


def test_detection_scores_split_true_from_false_positives():
    gt = ([box(0, 0), box(0, 100, 60, 60)], [0, 1])
    pred = ([box(0, 0), box(1, 1), box(0, 100, 60, 60), box(0, 0)],
            [0, 0, 1, 2], [0.9, 0.4, 0.8, 0.3])
    s = detection_scores(preds_of(pred, gt))
    np.testing.assert_allclose(s["rbc"]["tp"], [0.9])
    np.testing.assert_allclose(s["rbc"]["fp"], [0.4], rtol=1e-6)    # the duplicate
    np.testing.assert_allclose(s["wbc"]["tp"], [0.8])
    np.testing.assert_allclose(s["platelets"]["fp"], [0.3], rtol=1e-6)   # no platelet box
    assert len(s["platelets"]["tp"]) == 0
    # above the duplicate's score it is no detection at all
    assert len(detection_scores(preds_of(pred, gt), 0.5)["rbc"]["fp"]) == 0
    fig = plot_detection_scores(s, thresholds=(0.5,), split="val")
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["rbc", "wbc", "platelets"]
    legend = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert legend == ["true positives (1)", "false positives (1)"]
    assert sum(p.get_height() for p in axes[0].containers[0]) == 1   # the TP's bar
    assert "val" in fig._suptitle.get_text() and "0.5" in fig._suptitle.get_text()


def staged_image():
    """Seven boxes, each found or lost at a known stage at t = 0.5: (preds, [cands], stages)."""
    gt_boxes = [box(0, 0),                 # 0 found
                box(0, 2),                 # 1 overlaps box 0: lost in matching
                box(100, 0),               # 2 candidate removed by the top_k cap
                box(100, 100),             # 3 candidate suppressed by NMS
                box(100, 200),             # 4 removed by keep_top_k
                box(200, 0),               # 5 covered only below 0.5
                box(200, 200, 40, 40)]     # 6 no candidate at all
    gt_labels = [0, 0, 0, 0, 0, 0, 1]
    # candidates: (box, label, score, in_top_k, after_nms, kept)
    rows = [(box(0, 0), 0, 0.9, True, True, True),
            (box(100, 0), 0, 0.8, False, False, False),
            (box(100, 100), 0, 0.7, True, False, False),
            (box(100, 200), 0, 0.6, True, True, False),
            (box(200, 0), 0, 0.3, True, True, True),
            (box(200, 200, 40, 40), 0, 0.9, True, True, True)]   # wrong class: rbc on wbc
    cand = Candidates(np.array([r[0] for r in rows], np.float32),
                      np.array([r[1] for r in rows], np.int32),
                      np.array([r[2] for r in rows], np.float32),
                      *(np.array([r[k] for r in rows], bool) for k in (3, 4, 5)))
    k = cand.kept
    preds = preds_of((cand.bbox[k], cand.label[k], cand.score[k]), (gt_boxes, gt_labels))
    expected = ["found", "matching", "top_k", "nms", "keep_top_k", "low_score",
                "no_candidate"]
    return preds, [cand], expected


def test_each_missed_box_is_lost_at_its_stage():
    preds, cands, expected = staged_image()
    out = box_outcomes(preds, cands, (0.5, 0.2), image_sizes=SIZES)
    assert list(out.stage(0.5)) == expected
    # at 0.2 the 0.3 candidate is a detection that finds box 5
    assert out.stage(0.2)[5] == "found"
    np.testing.assert_allclose(out.best["all"], [0.9, 0.9, 0.8, 0.7, 0.6, 0.3, 0.0],
                               rtol=1e-6)
    np.testing.assert_allclose(out.best["kept"], [0.9, 0.9, 0, 0, 0, 0.3, 0], rtol=1e-6)
    counts = stage_counts(out, 0.5)
    assert counts["rbc"]["n_gt"] == 6 and counts["rbc"]["found"] == 1
    assert counts["rbc"]["recall"] == pytest.approx(1 / 6)
    assert counts["wbc"] == {**{s: 0 for s in counts["wbc"] if s not in ("n_gt", "recall")},
                             "no_candidate": 1, "n_gt": 1, "recall": 0.0}
    # a threshold not computed; outcomes without candidates (found, but no stage)
    without = box_outcomes(preds, None, (0.5,), image_sizes=SIZES)
    assert without.found[0.5].sum() == 1
    for call, field in ((lambda: out.stage(0.7), "score_thresh"),
                        (lambda: without.stage(0.5), "stage")):
        with pytest.raises(ConfigError) as info:
            call()
        assert str(info.value).split()[0].rstrip(":") == field


def test_size_and_crowding():
    gt = ([box(0, 0), box(0, 10), box(0, 21), box(100, 100, 10, 40), box(0, 200, 8, 8)],
          [0, 0, 0, 0, 2])
    pred = ([box(0, 0)], [0], [0.9])
    # the image is 600 x 300 (H x W): heights halve at the 300x300 input
    out = box_outcomes(preds_of(pred, gt), None, (0.5,), image_sizes=[(600, 300)])
    np.testing.assert_allclose(out.size, [math.sqrt(10 * 20)] * 3 + [math.sqrt(5 * 40),
                                                                     math.sqrt(4 * 8)])
    # box 1 (x 10-30) overlaps boxes 0 (x 0-20) and 2 (x 21-41), which do not overlap
    assert list(out.crowding) == [1, 2, 1, 0, 0]
    # a platelet is no rbc neighbour. crowd_iou 0.3: IoU 0->1 is 0.33, 1->2 is 0.29
    strict = box_outcomes(preds_of(pred, gt), None, (0.5,), image_sizes=[(600, 300)],
                          crowd_iou=0.3)
    assert list(strict.crowding) == [1, 1, 0, 0, 0]
    table = missed_by(out, 0.5, "crowding", (0, 1, 2, np.inf))
    assert [(r["n"], r["missed"]) for r in table["rbc"]] == [(1, 1), (2, 1), (1, 1)]
    assert [r["n"] for r in table["platelets"]] == [1, 0, 0]
    assert math.isnan(table["wbc"][0]["miss_rate"])
    by_size = missed_by(out, 0.5, "size", (0, 10, 20, np.inf))
    assert [(r["n"], r["missed"]) for r in by_size["rbc"]] == [(0, 0), (4, 3), (0, 0)]


def test_images_set_aside_and_subsets():
    class Report:
        issues = [Issue("img1", None, "missing_class", "warning", "no rbc box", ""),
                  Issue("img1", None, "missing_class", "warning", "no wbc box", ""),
                  Issue("img5", None, "missing_class", "warning", "no rbc box", ""),
                  Issue("img0", 3, "zero_area", "warning", "a zero-area box", "")]

        def by_kind(self, kind):
            return [i for i in self.issues if i.kind == kind]

    flagged = images_missing_class(["img0", "img1", "img2"], report=Report())
    assert flagged == {"img1": ["no rbc box", "no wbc box"]}
    Report.issues[2] = Issue("img5", None, "missing_class", "warning",
                             "no rbc box, while 96% of images have one; check it", "")
    assert images_missing_class(report=Report(), brief=True) == {
        "img1": "no rbc box; no wbc box", "img5": "no rbc box"}
    assert set(images_missing_class(report=Report())) == {"img1", "img5"}

    preds, cands, _ = staged_image()
    three = Predictions(["img0", "img1", "img2"], *(getattr(preds, f) * 3 for f in (
        "pred_bboxes", "pred_labels", "pred_scores", "gt_bboxes", "gt_labels",
        "gt_difficults")), NAMES, 0.01)
    out = box_outcomes(three, cands * 3, (0.5,), image_sizes=SIZES * 3)
    assert len(out) == 21 and len(out.without(flagged)) == 14
    assert set(out.without(flagged).image_id) == {"img0", "img2"}


def test_real_run_on_bccd_test_images(bccd_root):
    from medaidet.ssd.weights import shipped_weights

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        preds, cands = predict_weights(shipped_weights(), "test", root=bccd_root, subset=4,
                                       device="cpu", batch_size=4, progress=False,
                                       return_candidates=True)
        plain = predict_weights(shipped_weights(), "test", root=bccd_root, subset=4,
                                device="cpu", batch_size=4, progress=False)
    assert preds.ids == plain.ids and len(cands) == 4
    for i in range(4):      # the same detections as the evaluation's
        np.testing.assert_array_equal(preds.pred_bboxes[i], plain.pred_bboxes[i])
        np.testing.assert_array_equal(preds.pred_scores[i], plain.pred_scores[i])
        c = cands[i]
        assert c.kept.sum() == len(preds.pred_scores[i])
        assert not (c.kept & ~c.after_nms).any() and not (c.after_nms & ~c.in_top_k).any()
        assert c.score.min() >= 0.01
    out = box_outcomes(preds, cands, (0.5, 0.6), root=bccd_root)
    rows = {(r["score_thresh"], r["class"]): r for r in recall_precision(preds, (0.5, 0.6))}
    for t in (0.5, 0.6):
        counts = stage_counts(out, t)
        for name, c in counts.items():
            assert sum(c[s] for s in c if s not in ("n_gt", "recall")) == c["n_gt"]
            assert c["found"] == rows[t, name]["tp"]
            assert c["n_gt"] == rows[t, name]["n_gt"]
    assert (out.best["kept"][out.found[0.5]] >= 0.5).all()
    # the stages narrow: all >= after cap >= after NMS >= kept
    assert (out.best["all"] >= out.best["top_k"]).all()
    assert (out.best["top_k"] >= out.best["nms"]).all()
    assert (out.best["nms"] >= out.best["kept"]).all()
    assert 20 < len(out) < 100 and (out.size > 5).all() and (out.size < 200).all()
