"""medaidet.ssd.loss: ChainerCV's numbers, masks and gradients on valid inputs, and named
errors instead of crashes on invalid ones."""
import numpy as np
import pytest

import chainer
from chainercv.links.model.ssd import multibox_loss as cv_multibox_loss
from chainercv.links.model.ssd.multibox_loss import (
    _elementwise_softmax_cross_entropy as cv_softmax_cross_entropy,
    _hard_negative as cv_hard_negative,
)

from stubs import FakeComm

import medaidet.ssd.loss as loss_module
from medaidet.errors import DivergedError, InvalidTargetsError
from medaidet.ssd.loss import hard_negative, multibox_loss

N_PRIOR_SSD300 = 8732
N_CLASS_BCCD = 4    # background + RBC, WBC, Platelets


def make_inputs(rng, n_batch, n_prior, n_class=N_CLASS_BCCD, positive_rate=0.01,
                ties=False, confident_background=False):
    """Random (mb_locs, mb_confs, gt_mb_locs, gt_mb_labels). ``ties``: logits in {-1, 0, 1};
    ``confident_background``: most negatives have loss exactly 0, tying the positives' key."""
    if ties:
        confs = rng.randint(-1, 2, (n_batch, n_prior, n_class)).astype(np.float32)
    else:
        confs = (rng.randn(n_batch, n_prior, n_class) * 2).astype(np.float32)
    labels = np.where(rng.rand(n_batch, n_prior) < positive_rate,
                      rng.randint(1, n_class, (n_batch, n_prior)), 0).astype(np.int32)
    if confident_background:
        sure = (labels == 0) & (rng.rand(n_batch, n_prior) < 0.9)
        confs[sure, 0] = 50
    locs = rng.randn(n_batch, n_prior, 4).astype(np.float32)
    gt_locs = rng.randn(n_batch, n_prior, 4).astype(np.float32)
    return locs, confs, gt_locs, labels


def mask(confs, labels, k, mine=hard_negative):
    """The hard negatives ``mine`` chooses: ours, or ChainerCV's (or a sort's) less positives."""
    positive = labels > 0
    chosen = mine(cv_softmax_cross_entropy(confs, labels).array, positive, k)
    return chosen if mine is hard_negative else chosen & ~positive


def stable_sort(ce, positive, k):
    """What a single *stable* sort would choose."""
    order = (ce * (positive - 1)).argsort(axis=1, kind="stable")
    rank = np.empty_like(order)
    rank[np.arange(len(order))[:, None], order] = np.arange(order.shape[1])
    return rank < (positive.sum(axis=1) * k)[:, None]


def both_losses(inputs, k, comm=None, variables=True):
    """Forward and backward through ChainerCV's loss and ours on the same inputs."""
    locs, confs, gt_locs, labels = inputs
    results = []
    for fn in (cv_multibox_loss, multibox_loss):
        if variables:
            mb_locs, mb_confs = chainer.Variable(locs.copy()), chainer.Variable(confs.copy())
        else:
            mb_locs, mb_confs = locs, confs
        loc_loss, conf_loss = fn(mb_locs, mb_confs, gt_locs, labels, k, comm=comm)
        if variables and loc_loss.creator is not None:
            (loc_loss + conf_loss).backward()
        grads = (mb_locs.grad, mb_confs.grad) if variables else (None, None)
        results.append((loc_loss, conf_loss) + grads)
    return results


def assert_same_as_chainercv(inputs, k, comm=None, variables=True):
    theirs, ours = both_losses(inputs, k, comm=comm, variables=variables)
    for name, a, b in zip(("loc_loss", "conf_loss"), theirs[:2], ours[:2]):
        assert isinstance(b, chainer.Variable)
        assert b.dtype == a.dtype and b.shape == a.shape == (), name
        assert np.array_equal(a.array, b.array), f"{name}: chainercv {a.array}, ours {b.array}"
    for name, a, b in zip(("mb_locs.grad", "mb_confs.grad"), theirs[2:], ours[2:]):
        assert (a is None) == (b is None), name
        if a is not None:
            assert np.array_equal(a, b), f"{name} differs at {np.argwhere(a != b)[:5]}"
    _, confs, _, labels = inputs
    assert np.array_equal(mask(confs, labels, k), mask(confs, labels, k, cv_hard_negative))
    return ours


@pytest.mark.parametrize("variables", [True, False], ids=["variables", "arrays"])
def test_random_small_inputs_equal_chainercv(variables):
    for seed in range(120):
        rng = np.random.RandomState(seed)
        n_batch = rng.randint(1, 5)
        n_prior = int(rng.choice([1, 2, 5, 17, 64, 300]))
        n_class = int(rng.choice([2, 3, 4, 6, 9, 21]))
        k = [0, 1, 3, 2.5][seed % 4]
        inputs = make_inputs(rng, n_batch, n_prior, n_class,
                             positive_rate=float(rng.choice([0.01, 0.1, 0.5, 0.9])),
                             ties=seed % 3 == 0, confident_background=seed % 5 == 0)
        assert_same_as_chainercv(inputs, k, variables=variables)


@pytest.mark.parametrize("k", [0, 1, 3])
@pytest.mark.parametrize("n_batch", [1, 2, 3, 4])
def test_ssd300_sized_inputs_equal_chainercv(n_batch, k):
    for seed in range(3):
        rng = np.random.RandomState(100 * n_batch + 10 * k + seed)
        inputs = make_inputs(rng, n_batch, N_PRIOR_SSD300, N_CLASS_BCCD,
                             positive_rate=[0.01, 0.05, 0.3][seed], ties=seed == 1)
        assert_same_as_chainercv(inputs, k)


def test_ties_choose_chainercvs_negatives_not_a_stable_sorts():
    differs_from_stable = 0
    for seed in range(12):
        rng = np.random.RandomState(seed)
        inputs = make_inputs(rng, 4, N_PRIOR_SSD300, N_CLASS_BCCD, positive_rate=0.02, ties=True)
        assert_same_as_chainercv(inputs, 3)
        _, confs, _, labels = inputs
        differs_from_stable += not np.array_equal(mask(confs, labels, 3, stable_sort),
                                                  mask(confs, labels, 3, cv_hard_negative))
    if differs_from_stable == 0:
        pytest.skip("this NumPy's default argsort kept every tie in order: nothing to tell apart")


def tied_zero_losses(rng):
    """Many positives: k * n_positive reaches into the 0-loss negatives tied with them."""
    inputs = make_inputs(rng, 3, N_PRIOR_SSD300, positive_rate=0.08, confident_background=True)
    assert (cv_softmax_cross_entropy(inputs[1], inputs[3]).array[inputs[3] == 0] == 0).sum() \
        > 1000
    return inputs


def non_contiguous_scores(rng):
    locs, confs, gt_locs, labels = make_inputs(rng, 2, 300, positive_rate=0.1)
    confs = np.ascontiguousarray(confs.transpose(2, 0, 1)).transpose(1, 2, 0)
    assert not confs.flags.c_contiguous
    return locs, confs, gt_locs, labels


def as_dtype(dtype):
    return lambda rng: tuple(a.astype(dtype) if a.dtype.kind == "f" else a
                             for a in make_inputs(rng, 2, 300, positive_rate=0.1))


EDGE_INPUTS = [
    # (id, inputs from a RandomState, its seeds, k, as Variables (with gradients) or arrays)
    ("tied-zero-losses", tied_zero_losses, range(8), 3, True),
    *[(f"no-positives-{b}", lambda rng, b=b: make_inputs(rng, b, 50, positive_rate=0), [1], 3,
       True) for b in (1, 3)],
    *[(f"all-positive-{n}", lambda rng, n=n: make_inputs(rng, 2, n, positive_rate=1.0), [2], 3,
       True) for n in (1, 40, N_PRIOR_SSD300)],
    ("float64", as_dtype(np.float64), [3], 3, True),
    ("float16", as_dtype(np.float16), [3], 3, True),
    ("non-contiguous-scores", non_contiguous_scores, [3], 3, False),
    # ChainerCV documents k as a float: ints, floats, NumPy scalars and fractions stay valid
    *[(f"k-{type(k).__name__}-{k}", lambda rng: make_inputs(rng, 3, 300, positive_rate=0.3),
       [7], k, True) for k in (3, 3.0, np.int64(3), np.float32(2.5), 0)],
]


@pytest.mark.parametrize("make, seeds, k, variables", [case[1:] for case in EDGE_INPUTS],
                         ids=[case[0] for case in EDGE_INPUTS])
def test_edge_inputs_equal_chainercv(make, seeds, k, variables):
    for seed in seeds:
        inputs = make(np.random.RandomState(seed))
        ours = assert_same_as_chainercv(inputs, k, variables=variables)
        _, confs, _, labels = inputs
        if not (labels > 0).any():                 # float32 zeros, like ChainerCV's
            assert all(b.dtype == np.float32 and float(b.array) == 0 for b in ours[:2])
        if (labels > 0).all():                     # no negative to mine
            assert not mask(confs, labels, k).any()


@pytest.mark.parametrize("positive_rate, others", [(0.05, 7), (0.05, 0), (0.0, 5), (0.0, 0)])
def test_comm_averages_positives_like_chainercv(positive_rate, others):
    inputs = make_inputs(np.random.RandomState(5), 2, 500, positive_rate=positive_rate)
    comm = FakeComm(4, others)
    assert_same_as_chainercv(inputs, 3, comm=comm)
    theirs, ours = comm.received        # one call each: ChainerCV's, then ours
    assert type(ours) is type(theirs) and ours == theirs == (inputs[3] > 0).sum()


def micro_batch_losses(inputs, k, n_micro, n_positive):
    """Loss and gradients of each of ``n_micro`` equal slices, divided by ``n_positive``."""
    locs, confs, gt_locs, labels = inputs
    size = len(locs) // n_micro
    out = []
    for start in range(0, len(locs), size):
        part = slice(start, start + size)
        mb_locs = chainer.Variable(locs[part].copy())
        mb_confs = chainer.Variable(confs[part].copy())
        loc_loss, conf_loss = multibox_loss(mb_locs, mb_confs, gt_locs[part], labels[part], k,
                                            n_positive=n_positive)
        if loc_loss.creator is not None:
            (loc_loss + conf_loss).backward()
        out.append((loc_loss, conf_loss, mb_locs.grad, mb_confs.grad))
    return out


@pytest.mark.parametrize("n_micro", [1, 2, 4])
def test_micro_batches_with_the_batch_normaliser_add_up_to_the_batch(n_micro):
    """Mining is per image: only the normaliser couples images (1: the own count changes
    nothing, bit for bit); each micro-batch's own count (the naive way) does not add up."""
    inputs = make_inputs(np.random.RandomState(9), 4, N_PRIOR_SSD300, positive_rate=0.02,
                         ties=n_micro == 1)
    labels = inputs[3]
    labels[0, :4000] = 0                       # micro-batches with different counts
    _, whole = both_losses(inputs, 3)
    parts = micro_batch_losses(inputs, 3, n_micro, (labels > 0).sum())
    if n_micro == 1:
        assert all(np.array_equal(getattr(a, "array", a), getattr(b, "array", b))
                   for a, b in zip(whole, parts[0]))
        return
    for i in range(2):
        assert sum(float(p[i].array) for p in parts) == pytest.approx(
            float(whole[i].array), rel=1e-6)
    for i in (2, 3):
        np.testing.assert_allclose(np.concatenate([p[i] for p in parts]), whole[i],
                                   rtol=1e-5, atol=1e-9)
    size = 4 // n_micro
    naive = [multibox_loss(*(a[j:j + size] for a in inputs), 3) for j in range(0, 4, size)]
    naive_total = sum(float(loc.array + conf.array) for loc, conf in naive) / n_micro
    assert naive_total != pytest.approx(float((whole[0] + whole[1]).array), rel=1e-3)


def test_n_positive_skips_comm_and_zero_gives_zeros():
    rng = np.random.RandomState(10)
    locs, confs, gt_locs, labels = make_inputs(rng, 2, 300, positive_rate=0.1)
    comm = FakeComm(4, 7)
    given = multibox_loss(locs, confs, gt_locs, labels, 3, comm=comm,
                          n_positive=((labels > 0).sum() + 7) / 4)
    assert comm.received == []
    expected = multibox_loss(locs, confs, gt_locs, labels, 3, comm=FakeComm(4, 7))
    for a, b in zip(expected, given):
        assert float(b.array) == pytest.approx(float(a.array), rel=1e-6)
    for zero in (0, 0.0, np.int64(0), np.zeros((), np.int64)):
        loc_loss, conf_loss = multibox_loss(locs, confs, gt_locs, labels, 3, n_positive=zero)
        assert float(loc_loss.array) == float(conf_loss.array) == 0
        assert loc_loss.dtype == np.float32
    # a 0-d array (as the GPU path counts) divides like the number
    scalar = multibox_loss(locs, confs, gt_locs, labels, 3, n_positive=(labels > 0).sum())
    array = multibox_loss(locs, confs, gt_locs, labels, 3,
                          n_positive=np.asarray((labels > 0).sum()))
    for a, b in zip(scalar, array):
        assert float(a.array) == pytest.approx(float(b.array), rel=1e-6)


def test_hard_negative_by_hand():
    loss = np.array([[0.5, 2.0, 0.1, 3.0, 1.0, 0.7]], dtype=np.float32)
    positive = np.array([[False, False, False, True, False, False]])
    # one positive, k = 2: the two negatives with the largest loss (2.0, 1.0)
    assert hard_negative(loss, positive, 2).tolist() == [[False, True, False, False, True, False]]
    assert not hard_negative(loss, positive, 0).any()
    # k * n_positive > n_negative: every negative, never the positive
    assert hard_negative(loss, positive, 10).tolist() == [[True, True, True, False, True, True]]
    assert not hard_negative(loss, np.zeros_like(positive), 3).any()


def test_hard_negative_count_is_min_of_k_positives_and_negatives():
    rng = np.random.RandomState(6)
    for _ in range(50):
        n_prior = rng.randint(1, 60)
        loss = (rng.rand(3, n_prior) + 0.01).astype(np.float32)    # distinct, > 0
        positive = rng.rand(3, n_prior) < rng.rand()
        k = rng.choice([0, 1, 3, 2.5])
        mask = hard_negative(loss, positive, k)
        assert not (mask & positive).any()
        n_pos, n_neg = positive.sum(axis=1), (~positive).sum(axis=1)
        expected = np.minimum(np.ceil(k * n_pos), n_neg)
        assert mask.sum(axis=1).tolist() == expected.tolist()
        for b in range(3):
            if 0 < mask[b].sum() < n_neg[b]:
                assert loss[b][mask[b]].min() >= loss[b][~mask[b] & ~positive[b]].max()


def valid(seed=7, n_batch=3, n_prior=20):
    return make_inputs(np.random.RandomState(seed), n_batch, n_prior, positive_rate=0.3)


ARGUMENT_NAMES = ("mb_locs", "mb_confs", "gt_mb_locs", "gt_mb_labels")
BAD = object()      # as a field: the error's value is the bad argument itself


def labels_set(b, i, bad):
    def change(labels):
        labels = labels.copy()
        labels[b, i] = labels[2, 3] = bad
        return labels
    return change


def row(name, argument, bad, unchecked=False, **fields):
    """``bad``: from the valid value; ``unchecked``: raised with ``check=False`` too."""
    return pytest.param(argument, bad, unchecked, fields, id=name)


INVALID = [
    *[row(f"n_positive={bad!r}", "n_positive", lambda _, bad=bad: bad, True, value=BAD)
      for bad in (-1, np.nan, np.inf, np.array([3, 4]), "7")],
    *[row(f"k={bad!r}", "k", lambda _, bad=bad: bad, True, value=BAD,
          allowed="a finite number >= 0")
      for bad in ("3", None, True, np.bool_(True), -1, -0.5, np.nan, np.inf,
                  np.float32(np.nan), np.array([3]), [3])],
    *[row(f"{name}-list", name, lambda a: a.tolist(), True, value=BAD)
      for name in ARGUMENT_NAMES],
    # ChainerCV: a raw IndexError for n_class (a GPU fault), and -1 silently ignored
    *[row(f"label-{case}", "gt_mb_labels", labels_set(b, i, bad), batch_index=b, prior_index=i,
          value=bad, count=2, allowed="[0, 4)")
      for case, b, i, bad in [("n_class", 1, 7, 4), ("negative", 0, 11, -1), ("beyond", 2, 0, 9)]],
    row("labels-float32", "gt_mb_labels", lambda a: a.astype(np.float32),
        allowed="an integer dtype"),
    row("labels-uint64", "gt_mb_labels", lambda a: a.astype(np.uint64),
        allowed="int8, int16, int32, int64, uint8, uint16 or uint32"),
    row("gt_mb_locs-float64", "gt_mb_locs", lambda a: a.astype(np.float64), allowed=None),
    *[row(f"{name}-shape-{shape}", name, lambda a, shape=shape: np.zeros(shape, a.dtype))
      for name, shape in [("mb_confs", (3, 19, 4)), ("mb_locs", (3, 20, 5)),
                          ("gt_mb_locs", (2, 20, 4)), ("gt_mb_labels", (3, 20, 1)),
                          ("mb_confs", (3, 20))]],
]


@pytest.mark.parametrize("argument, bad, unchecked, fields", INVALID)
def test_invalid_arguments_are_named(argument, bad, unchecked, fields):
    args = dict(zip(ARGUMENT_NAMES, valid()), k=3)
    args[argument] = bad = bad(args.get(argument))
    for check in (True, False) if unchecked else (True,):
        with pytest.raises(InvalidTargetsError) as info:
            multibox_loss(check=check, **args)
        assert info.value.argument == argument
        for name, want in fields.items():
            got = getattr(info.value, name)
            assert got is bad if want is BAD else got == want, name
    if argument == "k":
        with pytest.raises(InvalidTargetsError) as info:
            hard_negative(np.zeros((3, 20), np.float32), args["gt_mb_labels"] > 0, bad)
        assert info.value.argument == "k"


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64,
                                   np.uint8, np.uint16, np.uint32, chainer.Variable])
def test_every_accepted_label_dtype_and_variable_targets_give_the_same_loss(dtype):
    locs, confs, gt_locs, labels = valid()
    results = []
    targets = (gt_locs, labels.astype(dtype)) if dtype is not chainer.Variable else (
        chainer.Variable(gt_locs), chainer.Variable(labels))
    for gt in ((gt_locs, labels), targets):
        mb_locs, mb_confs = chainer.Variable(locs.copy()), chainer.Variable(confs.copy())
        loc_loss, conf_loss = multibox_loss(mb_locs, mb_confs, *gt, 3)
        (loc_loss + conf_loss).backward()
        results.append([loc_loss.array, conf_loss.array, mb_locs.grad, mb_confs.grad])
    for a, b in zip(*results):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("argument", ["mb_confs", "mb_locs"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_predictions_raise_diverged(argument, bad):
    args = dict(zip(ARGUMENT_NAMES, valid()))
    args[argument][2, 5, 1] = bad
    args[argument][2, 9, 0] = np.nan
    args[argument] = chainer.Variable(args[argument])
    with pytest.raises(DivergedError) as info:
        multibox_loss(k=3, **args)
    err = info.value
    assert (err.kind, err.argument, err.batch_index, err.prior_index, err.count) == \
        ("predictions", argument, 2, 5, 2)
    assert np.isnan(err.value[1]) if np.isnan(bad) else err.value[1] == bad


def test_non_finite_gt_location_at_a_positive_prior_is_named():
    locs, confs, gt_locs, labels = valid()
    b, i = np.argwhere(labels > 0)[3]
    gt_locs[b, i, 3] = -np.inf      # log(0): a zero-width box
    with pytest.raises(InvalidTargetsError) as info:
        multibox_loss(locs, confs, gt_locs, labels, 3)
    err = info.value
    assert (err.argument, err.batch_index, err.prior_index, err.count) == ("gt_mb_locs", b, i, 1)
    assert err.value[3] == -np.inf


def test_non_finite_gt_location_at_negative_priors_is_ignored():
    # encode writes offsets at every prior, so a degenerate box leaves nan/-inf at negatives
    locs, confs, gt_locs, labels = valid()
    bad = gt_locs.copy()
    negatives = np.argwhere(labels == 0)[:4]
    bad[negatives[0][0], negatives[0][1]] = [np.nan, -np.inf, np.inf, np.nan]
    bad[negatives[1][0], negatives[1][1], 2] = -np.inf
    finite = bad.copy()
    finite[~np.isfinite(finite)] = 0
    mb_locs = chainer.Variable(locs.copy())
    ours = multibox_loss(mb_locs, confs, bad, labels, 3)
    sum(ours).backward()
    assert np.isfinite(mb_locs.grad).all()
    # ChainerCV gives nan there (inf * 0); with the same entries made finite it agrees.
    with np.errstate(invalid="ignore"):
        assert np.isnan(cv_multibox_loss(locs, confs, bad, labels, 3)[0].array)
    expected = assert_same_as_chainercv((locs, confs, finite, labels), 3)
    assert np.array_equal(ours[0].array, expected[0].array)
    assert np.array_equal(mb_locs.grad, expected[2])


def test_target_errors_come_before_divergence_and_check_false_skips_both():
    locs, confs, gt_locs, labels = valid()
    confs[0, 0, 0] = np.nan
    loc_loss, conf_loss = multibox_loss(locs, confs, gt_locs, labels, 3, check=False)
    assert np.isnan(conf_loss.array)
    labels[1, 1] = 4
    with pytest.raises(InvalidTargetsError):
        multibox_loss(locs, confs, gt_locs, labels, 3)
    locs, confs, gt_locs, labels = valid()
    b, i = np.argwhere(labels > 0)[0]
    gt_locs[b, i, 2] = -np.inf
    loc_loss, conf_loss = multibox_loss(locs, confs, gt_locs, labels, 3, check=False)
    assert np.isinf(loc_loss.array)


@pytest.mark.parametrize("check", [True, False])
def test_one_host_transfer_on_the_success_path(monkeypatch, check):
    calls = []
    real = loss_module.to_host
    monkeypatch.setattr(loss_module, "to_host", lambda a: calls.append(a) or real(a))
    multibox_loss(*valid(n_prior=N_PRIOR_SSD300), 3, check=check)
    assert len(calls) == int(check)     # the check's one transfer; ChainerCV's loss syncs itself
    assert all(c.size <= 8 for c in calls)


@pytest.mark.gpu
@pytest.mark.skipif(not chainer.backends.cuda.available, reason="needs CuPy and a GPU")
def test_targets_left_on_the_host_are_named():
    import cupy
    locs, confs, gt_locs, labels = valid()
    with pytest.raises(InvalidTargetsError) as info:
        multibox_loss(cupy.asarray(locs), cupy.asarray(confs), cupy.asarray(gt_locs),
                      labels, 3)
    assert (info.value.argument, info.value.value) == ("gt_mb_labels", "@numpy")
    assert info.value.allowed == "arrays on @cupy:0"
    loc_loss, conf_loss = multibox_loss(cupy.asarray(locs), cupy.asarray(confs),
                                        cupy.asarray(gt_locs), cupy.asarray(labels), 3)
    expected = multibox_loss(locs, confs, gt_locs, labels, 3)
    assert float(conf_loss.array) == pytest.approx(float(expected[1].array), rel=1e-5)
