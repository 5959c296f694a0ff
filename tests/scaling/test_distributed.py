"""medaidet.extras.mpi: real 2-rank ChainerMN runs on the CPU, named errors, mpiexec, launch().
MPI tests skip when MPI is missing, never in CI (.ci/run exports CI_REQUIRE_MPI=1)."""
import io
import json
import os
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import chainer.links as L
import numpy as np
import pytest

from medaidet.extras import mpi as dist
from medaidet.extras.mpi import (abort_on_error, param_digest, per_rank_batchsize,
                                 rank_device)
from medaidet.errors import ConfigError, DeviceError, DistributedError, WeightsError
from medaidet.training.config import TrainConfig
from medaidet.training.train import prepare_run, train
from conftest import run_python

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mpi():
    """The MPI tests' gate: skip with the reason, or fail in CI."""
    problem = dist.mpi_problem()
    if problem is not None and os.environ.get("CI_REQUIRE_MPI") == "1":
        pytest.fail(f"CI_REQUIRE_MPI=1 but MPI cannot be used: {problem} "
                    f"(Open MPI and mpi4py come with '.[test]': {dist.INSTALL_MPI})")
    if problem is not None:
        pytest.skip(f"ChainerMN cannot run here: {problem}")


def distributed_error(call, *args, **kwargs) -> DistributedError:
    """The DistributedError that ``call(*args, **kwargs)`` raises."""
    with pytest.raises(DistributedError) as info:
        call(*args, **kwargs)
    return info.value


def _env():
    """This environment, with the repository on the ranks' import path."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))


def run_ranks(tmp_path, n, body, timeout=120):
    """Run ``body`` on ``n`` ranks: (result, {rank: its result-<rank>.json}). Files, not
    stdout: mpiexec forwards the ranks' output in chunks, so long lines interleave."""
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent(body))
    done = dist.launch(n, [str(script)], timeout=timeout, env=_env(), cwd=tmp_path,
                       stream=io.StringIO())
    results = {}
    for path in tmp_path.glob("result-*.json"):
        data = json.loads(path.read_text())
        results[data["rank"]] = data
    return done, results


def test_the_environments_own_mpiexec_is_found_without_path(monkeypatch, mpi):
    """PyPI's Open MPI puts mpiexec beside the interpreter; `make`'s venvs are not activated."""
    monkeypatch.setenv("PATH", "")
    if not (dist._interpreter_bin() / "mpiexec").exists():
        pytest.skip("this environment's MPI is not from PyPI")
    assert dist.mpi_problem() is None
    assert Path(dist._find_mpiexec()).parent == dist._interpreter_bin()
    assert dist._is_open_mpi(dist._find_mpiexec())


TRAIN_2_RANKS = r'''
import json, numpy as np, chainer, chainer.links as L, chainermn
from chainercv.extensions import DetectionVOCEvaluator
from medaidet.ssd.loss import multibox_loss
from medaidet.errors import DistributedError
from medaidet.extras import mpi as mn

comm = mn.create_communicator("naive", "cpu")
out = {"rank": comm.rank, "size": comm.size, "intra_rank": comm.intra_rank}
np.random.seed(comm.rank)  # different streams; weights come from rank 0

rng = np.random.RandomState(0)
x = rng.rand(64, 4).astype(np.float32)
y = (x.sum(axis=1) > 2).astype(np.int32)
ids = np.arange(64, dtype=np.int32)
data = chainer.datasets.TupleDataset(x, y, ids) if comm.rank == 0 else None
share = chainermn.scatter_dataset(data, comm, shuffle=True, seed=0)
out["share"] = sorted(int(s[2]) for s in share)

class Net(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.fc = L.Linear(4, 2)
    def forward(self, x, y, ids):
        return chainer.functions.softmax_cross_entropy(self.fc(x), y)

model = Net()
optimizer = chainermn.create_multi_node_optimizer(chainer.optimizers.MomentumSGD(0.1), comm)
optimizer.setup(model)
batch = mn.per_rank_batchsize(16, comm.size)
it = chainer.iterators.SerialIterator(share, batch, shuffle=True)
updater = chainer.training.StandardUpdater(it, optimizer, loss_func=model)
trainer = chainer.training.Trainer(updater, (6, "iteration"), out="result")

class Detector(chainer.Chain):  # a stub predictor for ChainerCV's evaluator
    def predict(self, imgs):
        n = len(imgs)
        return ([np.array([[0, 0, 10, 10]], np.float32)] * n,
                [np.array([0], np.int32)] * n, [np.array([0.9], np.float32)] * n)

val = [(np.zeros((3, 8, 8), np.float32), np.array([[0, 0, 10, 10]], np.float32),
        np.array([0], np.int32))] * 6
val_iter = chainer.iterators.SerialIterator(val, 4, repeat=False, shuffle=False)
trainer.extend(DetectionVOCEvaluator(val_iter, Detector(), comm=comm), trigger=(6, "iteration"))
trainer.run()
out["map"] = trainer.observation.get("validation/main/map")
out["map"] = None if out["map"] is None else float(out["map"])
out["digest"] = mn._agreed_digests(comm, model)[0]

# the safe loss with comm: 1 positive on rank 0, 3 on rank 1 -> normaliser (1 + 3) / 2
n_pos = 1 + 2 * comm.rank
labels = np.zeros((1, 8), np.int32)
labels[0, :n_pos] = 1
loc, conf = multibox_loss(np.zeros((1, 8, 4), np.float32), np.zeros((1, 8, 3), np.float32),
                          np.full((1, 8, 4), 0.5, np.float32), labels, 3, comm=comm)
out["loc_loss"] = float(loc.array)

# a rank whose weights differ is named on every rank
if comm.rank == 1:
    model.fc.W.array[0, 0] += 1
try:   # rank 0 writes what every rank ended with before the error
    mn._agreed_digests(comm, model, "metrics-diverged.json", {"iterations": 6})
except DistributedError as exc:
    out["diverged"] = [exc.kind, str(exc)]
    out["diverged_digests"] = exc.digests

with open(f"result-{comm.rank}.json", "w") as f:
    json.dump(out, f)
'''


def test_two_ranks_naive_train_to_identical_parameters(mpi, tmp_path):
    done, results = run_ranks(tmp_path, 2, TRAIN_2_RANKS)
    assert sorted(results) == [0, 1], done.stdout
    r0, r1 = results[0], results[1]
    assert r0["size"] == r1["size"] == 2
    assert {r0["intra_rank"], r1["intra_rank"]} == {0, 1}
    assert len(r0["share"]) == len(r1["share"]) == 32
    assert sorted(r0["share"] + r1["share"]) == list(range(64))
    assert r0["digest"] == r1["digest"] and len(r0["digest"]) == 64
    # ChainerCV's evaluator with comm: only rank 0 reports
    assert r0["map"] == 1.0 and r1["map"] is None
    # the safe loss averages the positive count over ranks: 0.5 per positive / 2
    assert r0["loc_loss"] == pytest.approx(0.25) and r1["loc_loss"] == pytest.approx(0.75)
    for r in (r0, r1):
        assert r["diverged"][0] == "diverged" and "ranks [1]" in r["diverged"][1]
        assert r["diverged_digests"][0] == r0["digest"] != r["diverged_digests"][1]
    written = json.loads((tmp_path / "metrics-diverged.json").read_text())
    assert written == {"iterations": 6, "rank_digests": r0["diverged_digests"]}


ABORT_2_RANKS = r'''
import numpy as np
from medaidet.errors import MedaidetError
from medaidet.extras.mpi import abort_on_error, create_communicator
comm = create_communicator("naive")
with abort_on_error(comm):
    if comm.rank == 1:
        raise MedaidetError("annotation 7 of BloodImage_00001.xml is broken (test)")
    comm.allreduce(np.ones(3, np.float32))  # rank 0 would wait here forever
print("not reached", flush=True)
'''


def test_a_failing_rank_aborts_all_and_launch_reports_the_tail(mpi, tmp_path):
    # run_ranks' timeout bounds it: without abort_on_error this run never ends
    err = distributed_error(run_ranks, tmp_path, 2, ABORT_2_RANKS, timeout=60)
    assert err.kind == "launch" and err.returncode not in (0, None), err.tail
    assert "[rank 1/2] medaidet: error: annotation 7 of BloodImage_00001.xml" in err.tail
    assert "aborting all ranks" in err.tail and "not reached" not in err.output
    assert "BloodImage_00001.xml" in str(err)
    assert err.command[0].endswith(("mpiexec", "mpirun"))


def test_launch_from_a_process_that_initialised_mpi(mpi):
    # An Open MPI singleton (a kernel that called create_communicator) leaves PMIX_/OMPI_
    # variables behind; a nested mpiexec that inherits them exits 1 without a word.
    code = textwrap.dedent("""
        import os
        from mpi4py import MPI
        assert MPI.COMM_WORLD.Get_size() == 1
        from medaidet.extras import mpi as dist
        os.environ.pop("OMP_NUM_THREADS", None)   # (make test sets it for its own runs)
        program = ["-c", "import os; print('rank=' + os.environ['OMPI_COMM_WORLD_RANK'] + "
                   "' threads=' + os.environ['OMP_NUM_THREADS'])"]
        done = dist.launch(2, program, timeout=60)
        print("returncode", done.returncode)
    """)
    done = run_python(code, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    # the cores are shared between the ranks' BLAS threads
    threads = max(1, (os.cpu_count() or 1) // 2)
    assert f"rank=0 threads={threads}" in done.stdout and f"rank=1 threads={threads}" in done.stdout
    assert "returncode 0" in done.stdout


@pytest.mark.slow(seconds=7)
def test_launch_timeout_stops_the_ranks(mpi):
    start = time.perf_counter()
    program = ["-c", "import time; print('started', flush=True); time.sleep(120)"]
    err = distributed_error(dist.launch, 1, program, timeout=6, stream=io.StringIO())
    assert err.kind == "launch" and err.returncode is None
    assert "started" in err.tail and "6 s" in str(err)
    assert time.perf_counter() - start < 60  # stopped, not waited for


@pytest.mark.parametrize("name, device", [
    *((name, "cpu") for name in ("nccl", "pure-nccl", "", "NAIVE")),               # unknown
    *((name, device) for name in ("pure_nccl", "non_cuda_aware", "flat")           # GPUs only
      for device in ("cpu", "@numpy", -1))])
def test_unknown_or_gpu_only_communicator_on_the_cpu_is_named(monkeypatch, name, device):
    monkeypatch.setitem(sys.modules, "mpi4py", None)   # named before MPI is looked for
    err = distributed_error(dist.create_communicator, name, device)
    assert err.kind == "communicator" and repr(name) in str(err)


def test_nccl_communicator_without_nccl(monkeypatch):
    def refuse(name, **kwargs):   # what ChainerMN raises where CuPy has no NCCL
        raise RuntimeError("NCCL is not available: ImportError: libnccl.so.2 (fake)")
    monkeypatch.setitem(sys.modules, "mpi4py", SimpleNamespace(MPI=object()))
    monkeypatch.setattr("chainermn.create_communicator", refuse)
    for name in ("pure_nccl", "non_cuda_aware"):
        err = distributed_error(dist.create_communicator, name, "gpu")
        assert err.kind == "communicator" and "libnccl.so.2 (fake)" in str(err)


MISSING_MPI = """
from medaidet.extras import mpi as dist
from medaidet.errors import DistributedError
print("problem:", dist.mpi_problem())
try:
    dist.create_communicator("naive", "cpu")
except DistributedError as exc:
    print("error:", exc.kind, exc)
"""


@pytest.mark.parametrize("missing", ["mpi4py", "libmpi"])
def test_missing_mpi_is_named(missing):
    if missing == "mpi4py":     # as if not installed
        done = run_python('import sys; sys.modules["mpi4py"] = None\n' + MISSING_MPI,
                          timeout=120)
        problem, named = "problem: mpi4py is not installed", dist.INSTALL_MPI
    else:
        pytest.importorskip("mpi4py")
        done = run_python(MISSING_MPI, env={"MPI4PY_LIBMPI": "/nonexistent/libmpi.so"},
                          timeout=120)
        problem, named = "cannot load an MPI library", "/nonexistent/libmpi.so"
    assert done.returncode == 0, done.stderr
    assert problem in done.stdout
    error = next(line for line in done.stdout.splitlines() if line.startswith("error:"))
    assert error.startswith("error: mpi ") and named in error and dist.INSTALL_MPI in error


def test_no_mpiexec_on_path(monkeypatch, tmp_path):
    pytest.importorskip("mpi4py")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(dist, "_interpreter_bin", lambda: tmp_path)  # no mpiexec there either
    problem = dist.mpi_problem()
    if problem and "cannot load" in problem:
        pytest.skip(f"no MPI library here: {problem}")
    assert "no mpiexec (or mpirun) beside" in problem and dist.INSTALL_MPI in problem
    err = distributed_error(dist.mpiexec_command, 2, ["-m", "medaidet"])
    assert err.kind == "mpi" and dist.INSTALL_MPI in str(err)


@pytest.mark.parametrize("euid,root_flag", [(0, True), (1000, False)])
def test_open_mpi_command(monkeypatch, euid, root_flag):
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    cmd = dist.mpiexec_command(2, ["-m", "medaidet", "train", "--communicator", "naive"],
                               python="/venv/bin/python", mpiexec="/usr/bin/mpiexec",
                               open_mpi=True)
    assert cmd[0] == "/usr/bin/mpiexec"
    assert ("--allow-run-as-root" in cmd) == root_flag
    assert "--oversubscribe" in cmd   # Open MPI counts physical cores as its slots
    assert cmd[cmd.index("--bind-to") + 1] == "none"
    assert cmd[-8:] == ["-n", "2", "/venv/bin/python", "-m", "medaidet", "train",
                        "--communicator", "naive"]


def test_mpich_command_and_bad_rank_counts(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    ompi = dict(mpiexec="mpiexec", open_mpi=True, python="python")
    mpich = dist.mpiexec_command(8, "x.py", mpiexec="mpiexec", open_mpi=False, python=None)
    assert mpich == ["mpiexec", "-n", "8", "x.py"]
    for bad in (0, -1, 1.5, True, "2"):
        err = distributed_error(dist.mpiexec_command, bad, ["x.py"], **ompi)
        assert err.kind == "ranks" and repr(bad) in str(err)


def test_command_detects_the_launcher_here(mpi):
    cmd = dist.mpiexec_command(1, ["-c", "pass"])
    assert cmd[-3:] == [sys.executable, "-c", "pass"]
    if dist._is_open_mpi(cmd[0]):
        assert ("--allow-run-as-root" in cmd) == (os.geteuid() == 0)


def test_launch_env_drops_the_enclosing_launch_only():
    env = {"PATH": "/bin", "OMPI_COMM_WORLD_RANK": "1", "PMIX_RANK": "1", "PMI_SIZE": "2",
           "OMPI_MCA_ess": "singleton", "OMPI_MCA_orte_hnp_uri": "x", "OMPI_UNIVERSE_SIZE": "2",
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
    assert dist.launch_env(env) == {"PATH": "/bin", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                                    "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}


def test_launch_hints():
    assert "vader_single_copy" in dist._hint("Read -1, expected 65536, errno = 1")
    assert dist._hint("all fine") == ""


def fake_comm(rank=0, size=1, intra_rank=None, intra_size=None):
    return SimpleNamespace(rank=rank, size=size,
                           intra_rank=rank if intra_rank is None else intra_rank,
                           intra_size=size if intra_size is None else intra_size)


@pytest.mark.parametrize("total,ranks,per_rank", [(32, 4, 8), (2, 2, 1), (5, 1, 5)])
def test_per_rank_batchsize(total, ranks, per_rank):
    assert per_rank_batchsize(total, ranks) == per_rank


@pytest.mark.parametrize("total,ranks,suggest", [(30, 4, "28 or 32"), (1, 2, "2 or 4")])
def test_per_rank_batchsize_that_does_not_split(total, ranks, suggest):
    err = distributed_error(per_rank_batchsize, total, ranks)
    assert err.kind == "ranks" and suggest in str(err)


def test_rank_device(monkeypatch):
    monkeypatch.setattr("medaidet.extras.mpi.gpu_status", lambda: (0, "no CUDA"))
    comm = fake_comm(3, 4, intra_rank=1, intra_size=2)
    assert rank_device(comm, "cpu") == "cpu" and rank_device(comm, -1) == "cpu"
    assert rank_device(comm, "auto") == "cpu"
    assert rank_device(comm, "gpu") == 1  # the trainer then says CUDA is missing
    err = distributed_error(rank_device, comm, 0)
    assert err.kind == "ranks" and "--device gpu" in str(err)
    assert rank_device(fake_comm(0, 1), "@cupy:2") == 2
    monkeypatch.setattr("medaidet.extras.mpi.gpu_status", lambda: (1, ""))
    assert rank_device(fake_comm(0, 2, 0, 2), "auto") == 0
    err = distributed_error(rank_device, comm, "gpu")
    assert err.kind == "ranks" and "mpiexec -n 1" in str(err)
    with pytest.raises(DeviceError) as info:
        rank_device(comm, "tpu")
    assert (info.value.kind, info.value.spec) == ("spec", "tpu")


def test_param_digest():
    a, b = L.Linear(3, 2), L.Linear(3, 2)
    b.W.array[...] = a.W.array
    b.b.array[...] = a.b.array
    assert param_digest(a) == param_digest(b)
    b.W.array[0, 0] = np.nextafter(b.W.array[0, 0], np.float32(np.inf))
    assert param_digest(a) != param_digest(b)
    assert param_digest(L.Linear(None, 2)) != param_digest(L.Linear(3, 2))


def test_abort_on_error_without_ranks_reraises():
    with pytest.raises(ValueError):
        with abort_on_error(fake_comm(0, 1)):
            raise ValueError("x")


@pytest.mark.parametrize("module, absent", [
    ("medaidet.extras.mpi", ("chainer", "chainermn", "mpi4py.MPI")),
    ("medaidet.training.train", ("medaidet.extras.mpi",))])     # one process: no ranks
def test_an_import_leaves_the_others_out(module, absent):
    done = run_python(f"import sys, {module}\n"
                      f"print([m for m in {absent!r} if m in sys.modules])")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow(seconds=20)
def test_two_rank_training_with_augmentation_is_reproducible(mpi, tmp_path, bccd_root):
    """Each rank draws from seed + rank (the transform is made on the rank, not sent)."""
    config = dict(model="ssd_small", subset=4, batch_size=4, iterations=2, augment=True,
                  seed=0, snapshot_interval=None, n_processes=0, pretrained=None,
                  device="cpu", eval_subset=1, eval_batch_size=1, root=str(bccd_root))
    digests = []
    for run in ("a", "b"):
        cfg = tmp_path / f"{run}.json"
        cfg.write_text(json.dumps(dict(config, communicator="naive", out=str(tmp_path / run))))
        dist.launch(2, ["-m", "medaidet", "train", "--profile", "smoke", "--config", str(cfg),
                        "--no-progress"], timeout=900, env=_env(), cwd=tmp_path,
                    stream=io.StringIO())
        metrics = json.loads((tmp_path / run / "metrics.json").read_text())
        assert metrics["ranks"] == 2 and metrics["rank_digests"][0] == metrics["rank_digests"][1]
        digests.append(metrics["rank_digests"][0])
    assert digests[0] == digests[1], "two seeded 2-rank runs ended with different weights"


def test_resume_of_a_multi_process_run_is_refused(tmp_path):
    config = TrainConfig.profile("smoke", communicator="naive", out=str(tmp_path))
    with pytest.raises(WeightsError) as info:
        prepare_run(config, resume=tmp_path / "snapshot_latest.npz")
    assert info.value.kind == "snapshot"
    with pytest.raises(ConfigError):   # a ChainerMN run needs mpiexec's ranks
        train(config)
