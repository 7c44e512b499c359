#!/usr/bin/env bash
# Run on the GPU machine (no package index): install offline, then
#   tests  - the demo and the CUDA tier of the test suite (KERNELHUB_TEST_TIER=cuda: the tests marked `cuda`, those
#            a GPU can change; KERNELHUB_TEST_TIER=fast or full for the whole fast or full tier), spread over
#            PYTEST_WORKERS (default 14) pytest-xdist workers where xdist is installed (the tests that need most of the
#            GPU's memory share one worker: xdist_group "gpu_memory"). With SPLIT="tests" the tests are shared out
#            between the two GPUs (KERNELHUB_TEST_SHARD=0/2 and 1/2), and on a machine of two GPUs or more the
#            ddp step (both GPUs) runs after them, unless DDP=0 (the ddp step takes minutes: up to 4 a dtype)
#   bench  - benchmarks/kernels.py: every kernel backend against eager and compiled torch_ref
#   tune   - kernelhub tune (benchmark shapes, every backend), kernelhub list, kernelhub bench --plot
#   examples - examples/ptycho_tv.py and examples/phase_2d.py (EXAMPLES narrows) at their --benchmark sizes (PNGs and JSON under $OUT)
#   nn     - benchmarks/nd_semiconv.py: kernelhub.nn.SemiConv against pytorch_nd_semiconv (wheels in .whl/nd; under
#            the numpy in .whl/numpy, if any), recorded as $OUT/<card>_nn.json for docs/results/; and benchmarks/tvloss3d.py
#            (what kernelhub.nn.TVLoss3d costs over the bare op)
#   host   - benchmarks/host_overhead.py: per-call wall time of the hub against minimal glue (HOST_ARGS narrows it),
#            recorded as $OUT/<card>_host.json (HOST_RECORD: another file) for docs/results/; and
#            benchmarks/cuda_graph_step.py (a small hub step eager against a CUDA graph replay of it)
#   cases  - benchmarks/semiconv_cases.py: triton and cuda_ext on semiconv's kinds of call, recorded as
#            $OUT/<card>_cases.json for docs/results/
#   report - scripts/bench_report.py record: kernelhub bench of every op at its benchmark shapes, recorded as
#            $OUT/<card>.json for docs/results/ (REPORT_OPS narrows it)
#   compiled - compiled steps calling the hub against the compiled reference, default and reduce-overhead
#            (benchmarks/host_overhead.py --compiled-steps; COMPILED_FAMILIES, default tv), as $OUT/compiled_*.json
#   toolchain - benchmarks/toolchain.py: compile time of a two-op step; the K-Planes tomography step eager,
#            compiled and under CUDA graphs against its GPU time, as $OUT/toolchain.json
#   defaults - benchmarks/defaults.py --control: the untuned hub against cuda_ext and triton forced (and a second
#            hub handle, the A/A control) at every op's benchmark samples, host sizes and the sizes around the shipped
#            size ranges (DEFAULTS_ARGS narrows; DEFAULTS_CONTROL=0 leaves the control out, a quarter shorter),
#            recorded as $OUT/<card>_defaults.json for docs/results/ (scripts/bench_report.py record-defaults)
#   tunes  - kernelhub tune --quick three times, each into a winners file of its own, recorded as $OUT/<card>_tune.json for
#            docs/results/ (scripts/bench_report.py record-tune)
#   profile - Nsight Compute on the kernels of PROFILE="OP:BACKEND:DTYPE:KERNEL-REGEX[:SAMPLE] ..."
#            (scripts/profile_op.py: the op's first benchmark sample, or the first whose name contains SAMPLE, forward +
#            backward), the sections that say what binds, as $OUT/profile.txt
#   candidates - kernel changes not yet landed (docs/lab/candidates/*.patch), each against the tree as sent, in one
#            call: benchmarks/kernels.py (BENCH_ARGS) on the tree, then for each patch in CANDIDATES: `git apply`
#            (cuda_ext reinstalled where the patch touches it), the GPU tests that CANDIDATE_K (a -k expression)
#            selects, benchmarks/kernels.py again, and the patch taken back out; $OUT/candidate_*.txt.
#            CANDIDATE_ARGS, where set, takes BENCH_ARGS' place for these runs (so that bench can sweep beside them)
#   ddp    - two GPUs: examples/ddp_step.py under torchrun (NCCL) and the second-GPU tests (with SPLIT: after the
#            two halves, on both GPUs)
#   all    - tests and bench (the default)
# Several steps in one call: scripts/gpu_check.sh tests host examples
# CUDA_EXT=0 leaves cuda_ext (and its build) out; INSTALL=0 skips the install. SPLIT="steps" (two GPUs): after the
# install, this call's steps run on GPU 0 and SPLIT's on GPU 1, side by side, each on half of the cores (taskset),
# logs and records under $OUT/gpu0 and $OUT/gpu1; host-bound timings then share the host with the other list.
# SPLIT_PYTEST_ARGS: GPU 1's PYTEST_ARGS (two halves of the test files on two GPUs). PACK=1 leaves $OUT as one file,
# all.tgz. E.g. SPLIT="tests" KERNELHUB_TEST_TIER=fast PACK=1 bash scripts/gpu_check.sh defaults tunes.
# PYTEST_ARGS (default: tests), PYTEST_K (a -k expression) and BENCH_ARGS narrow the steps; PYTEST_TIMEOUT
# (seconds) stops pytest itself, so its log is complete up to there even when the device call's limit is near;
# PYTEST_END (seconds after this script started, the install included, which takes minutes on a fresh machine)
# stops it at that time instead. A stopped run lists the selected tests that did not finish in
# $OUT/not_finished.txt (scripts/unfinished_tests.py); with that file in the tree sent, PYTEST_ARGS=@FILE
# (pytest >= 8.2 reads arguments from it, ids with spaces whole) runs them next.
# Prints a short summary last and exits non-zero if a step failed. Logs go under $OUT if set.
# The records (steps report, host) name the commit git reads here, and the tree of the files that ran: where this
# machine's .git is older than the tree sent, name the commit with KERNELHUB_RECORD_COMMIT=<its hash>; tests/test_docs.py
# checks that the recorded tree is that commit's.
set -uo pipefail
steps=" ${*:-all} "  # one or more steps, run in the order below
has() { [[ "$steps" == *" $1 "* ]]; }
OUT="${OUT:-/tmp/kernelhub-gpu}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# the CUDA tier unless the caller asks for another (KERNELHUB_TEST_TIER=fast or full)
export KERNELHUB_TEST_TIER="${KERNELHUB_TEST_TIER:-cuda}"
if ! python3 -c "import pytest" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
if ! python3 -c "import matplotlib" 2>/dev/null && ls .whl/plot/*.whl >/dev/null 2>&1; then  # kernelhub bench --plot
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/plot/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! python3 -c "import pytorch_nd_semiconv" 2>/dev/null && ls .whl/nd/*.whl >/dev/null 2>&1; then  # step nn, and
  # tests/test_nd_semiconv_parity.py against the package (pure Python; numba-cuda is on that machine)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/nd/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ "${INSTALL:-1}" != 0 ] && ! python3 -m pip install -q --no-deps --no-build-isolation -e . -e ./backends/torch_ref \
    -e ./backends/triton $([ "${CUDA_EXT:-1}" = 0 ] || echo -e ./backends/cuda_ext) > "$OUT/install.txt" 2>&1; then
  grep -v "^WARNING" "$OUT/install.txt" | tail -40
  echo "gpu_check: the install failed (log: $OUT/install.txt); nothing was run" >&2
  exit 1
fi
echo "install (CUDA_EXT=${CUDA_EXT:-1}: with cuda_ext's ahead-of-time build): ${SECONDS} s"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
# the records are named after the card: h200_*.json, h100_*.json (docs/results/ keeps one file per device)
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE "[a-z][0-9]{3}" | head -1 | tr A-Z a-z)
card=${card:-gpu}
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
(git rev-parse --short HEAD 2>/dev/null; git status --short | head -5) | tee -a "$OUT/device.txt"
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
# the tests on a machine of two GPUs (not in a SPLIT half, which sees one): the ddp step too
if has tests && [ "$gpus" -ge 2 ] && [ -z "${CUDA_VISIBLE_DEVICES:-}" ] && [ "${DDP:-1}" != 0 ]; then
  steps="$steps ddp "
fi
if [ -n "${SPLIT:-}" ]; then  # two step lists side by side, one per GPU and half of the cores each
  half=$(( $(nproc) / 2 )); rc=0
  [ -n "${PYTEST_END:-}" ] && export PYTEST_END=$(( PYTEST_END - SECONDS ))  # the children's clocks start now
  shard0="" shard1=""  # tests on both lists, no other PYTEST_ARGS for GPU 1: each GPU runs half of the selection
  if has tests && [[ " $SPLIT " == *" tests "* ]] && [ -z "${SPLIT_PYTEST_ARGS:-}" ]; then shard0=0/2 shard1=1/2; fi
  after=""  # ddp needs both GPUs: it runs after the halves
  if has ddp || [[ " $SPLIT " == *" ddp "* ]]; then after=ddp; fi
  list0=$(echo ${steps//ddp/}) list1=$(echo ${SPLIT//ddp/})
  [ -z "$list1" ] || (CUDA_VISIBLE_DEVICES=1 INSTALL=0 SPLIT="" PACK="" OUT="$OUT/gpu1" \
    PYTEST_ARGS="${SPLIT_PYTEST_ARGS:-${PYTEST_ARGS:-}}" KERNELHUB_TEST_SHARD="$shard1" \
    taskset -c "$half-$(( 2 * half - 1 ))" bash "$0" $list1 > "$OUT/gpu1.log" 2>&1) &
  [ -z "$list0" ] || CUDA_VISIBLE_DEVICES=0 INSTALL=0 SPLIT="" PACK="" OUT="$OUT/gpu0" KERNELHUB_TEST_SHARD="$shard0" \
    taskset -c "0-$(( half - 1 ))" bash "$0" $list0 > "$OUT/gpu0.log" 2>&1 || rc=1
  wait $! || rc=1
  for g in 0 1; do [ -f "$OUT/gpu$g.log" ] && echo "== GPU $g: $(grep -v '^ ' "$OUT/gpu$g.log" | tail -12)"; done
  if [ -n "$after" ]; then
    INSTALL=0 SPLIT="" PACK="" OUT="$OUT/both" bash "$0" ddp > "$OUT/both.log" 2>&1 || rc=1
    echo "== both GPUs (ddp): $(grep -v '^ ' "$OUT/both.log" | tail -8)"
  fi
else
rc=0
if has report; then
  timeout -s INT -k 30 "${REPORT_TIMEOUT:-0}" python3 scripts/bench_report.py record --out "$OUT/$card.json" \
    ${REPORT_OPS:+--ops $REPORT_OPS} 2> "$OUT/report.log" || rc=1
  tail -3 "$OUT/report.log"
fi
if has tests || has all; then
  kernelhub list 2>&1 | tee "$OUT/list.txt" | head -8
  python3 -c "from kernelhub_cuda_ext import _lib; print('cuda_ext:', _lib.load() or 'loaded', 'from', _lib.loaded_from(), '| CUDA kernels:', _lib.cuda_reason() or 'yes')" 2>&1 | tee -a "$OUT/list.txt"
  python3 examples/demo.py 2>&1 | tee "$OUT/demo.txt" | tail -3
  workers=""
  if [ "${PYTEST_WORKERS:-8}" != 0 ] && python3 -c "import xdist" 2>/dev/null; then
    workers="-n ${PYTEST_WORKERS:-14} --dist loadgroup"
    # one thread and no compile-worker pool per pytest worker: 16 cores, not 16 threads times the workers
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TORCHINDUCTOR_COMPILE_THREADS="${TORCHINDUCTOR_COMPILE_THREADS:-1}"
  fi
  echo "pytest: tier $KERNELHUB_TEST_TIER${KERNELHUB_TEST_SHARD:+, shard $KERNELHUB_TEST_SHARD}, ${workers:-one process}"
  rm -f "$OUT/pytest_cuda.xml" "$OUT/not_finished.txt"
  limit="${PYTEST_TIMEOUT:-0}"
  if [ -n "${PYTEST_END:-}" ]; then
    left=$(( PYTEST_END - SECONDS )); [ "$left" -lt 30 ] && left=30
    { [ "$limit" = 0 ] || [ "$left" -lt "$limit" ]; } && limit=$left
  fi
  echo "pytest stops after ${limit} s (0: never)"
  selection=(${PYTEST_ARGS:-tests} ${PYTEST_K:+-k "$PYTEST_K"})  # the run's, and the unfinished tests' collection
  timeout -s INT -k 30 "$limit" python3 -m pytest -q -p no:cacheprovider -rfE --tb=short --durations=15 \
    --junitxml "$OUT/pytest_cuda.xml" $workers "${selection[@]}" 2>&1 \
    | tee "$OUT/pytest_cuda.txt" | grep -E "FAILED|ERROR|passed|failed" | tail -30
  rc=${PIPESTATUS[0]}  # a stop by the limit: 124; by an interrupt: pytest's 2, with its banner in the log
  if [ "$rc" = 124 ] || grep -q "^!!*  *KeyboardInterrupt  *!!*$" "$OUT/pytest_cuda.txt"; then
    python3 scripts/unfinished_tests.py --xml "$OUT/pytest_cuda.xml" --out "$OUT/not_finished.txt" -- "${selection[@]}"
  fi
fi
if has bench || has all; then
  python3 benchmarks/run.py kernels ${BENCH_ARGS:-} --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt" | grep -v "^sweep" \
    || rc=1
  grep "^sweep" "$OUT/bench.txt"
fi
if has candidates; then  # the tree as sent first, then each patch on it; cuda_ext is rebuilt for a patch that touches
  # it, and for the sent sources again only where something after that patch uses it (list such a patch last)
  python3 benchmarks/run.py kernels ${CANDIDATE_ARGS:-${BENCH_ARGS:-}} --json "$OUT/candidate_sent.json" \
    > "$OUT/candidate_sent.txt" 2>&1 || rc=1
  runs="sent"
  stale=0  # 1: cuda_ext's library was built from a patch since taken back out (rebuilt only when something uses it)
  reinstall() { python3 -m pip install -q --no-deps --no-build-isolation -e ./backends/cuda_ext \
    >> "$OUT/candidate_${name}_install.txt" 2>&1; }
  for patch in ${CANDIDATES:-}; do
    name=$(basename "$patch" .patch)
    if ! git apply "$patch"; then echo "candidate $name: does not apply to the tree sent"; rc=1; continue; fi
    cuda=$(git apply --numstat "$patch" | grep -c "backends/cuda_ext" || true)
    if { [ "$cuda" = 0 ] && [ "$stale" = 0 ]; } || reinstall; then
      stale=$([ "$cuda" = 0 ] && echo 0 || echo 1)
      python3 -m pytest -q -p no:cacheprovider -rfE -n "${PYTEST_WORKERS:-14}" tests ${CANDIDATE_K:+-k "$CANDIDATE_K"} \
        > "$OUT/candidate_${name}_tests.txt" 2>&1 || rc=1
      echo "candidate $name, GPU tests: $(tail -1 "$OUT/candidate_${name}_tests.txt")"
      python3 benchmarks/run.py kernels ${CANDIDATE_ARGS:-${BENCH_ARGS:-}} --json "$OUT/candidate_$name.json" \
        > "$OUT/candidate_$name.txt" 2>&1 || rc=1
      runs="$runs $name"
    else
      echo "candidate $name: cuda_ext did not build ($OUT/candidate_${name}_install.txt)"; rc=1; stale=1
    fi
    git apply -R "$patch" || rc=1
  done
  if [ "$stale" = 1 ] && [ "$(echo $steps)" != candidates ]; then reinstall || rc=1; fi  # later steps: the sent tree
  # graphed ms of each kernel row, the tree sent and each candidate side by side
  python3 - "$OUT" $runs <<'PY'
import json, os, sys
out, runs = sys.argv[1], sys.argv[2:]
rows = {r: {(x["op"], x["shape"], x["mode"], x["impl"]): x["graph_ms"] for x in json.load(open(
    os.path.join(out, f"candidate_{r}.json"))) if "shape" in x} for r in runs if os.path.exists(os.path.join(out, f"candidate_{r}.json"))}
print("graphed ms: " + " | ".join(rows))
for key in rows.get("sent", {}):
    if key[3] not in ("eager", "compiled"):
        print(" ".join(key[:2]), key[2], key[3], " ".join(f"{rows[r].get(key, float('nan')):.4f}" for r in rows))
PY
fi
if has host; then  # recorded for docs/results/ (a record already at $HOST_RECORD gains this run's rows)
  timeout -k 10 "${HOST_TIMEOUT:-420}" python3 scripts/bench_report.py record-host --out "${HOST_RECORD:-$OUT/${card}_host.json}" \
    -- ${HOST_ARGS:-} 2>&1 | tee "$OUT/host_overhead.txt" || rc=1
  timeout -k 10 120 python3 benchmarks/run.py host-graph 2>&1 | tee "$OUT/cuda_graph_step.txt" || rc=1
fi
if has compiled; then
  for mode in default reduce-overhead; do
    timeout -k 10 "${COMPILED_TIMEOUT:-300}" python3 benchmarks/run.py host --device cuda --compiled-steps \
      --compile-mode $mode --families ${COMPILED_FAMILIES:-tv} --repeat 7 ${COMPILED_ARGS:-} --json "$OUT/compiled_$mode.json" 2>&1 \
      | grep -v "^W[0-9]" | tee "$OUT/compiled_$mode.txt" || rc=1
  done
fi
if has toolchain; then
  timeout -k 10 "${TOOLCHAIN_TIMEOUT:-300}" python3 benchmarks/run.py compile --device cuda --json "$OUT/toolchain.json" \
    2>&1 | tee "$OUT/toolchain.txt" || rc=1
fi
if has defaults; then
  timeout -k 10 "${DEFAULTS_TIMEOUT:-480}" python3 scripts/bench_report.py record-defaults --out "$OUT/${card}_defaults.json" \
    -- --device cuda $([ "${DEFAULTS_CONTROL:-1}" = 0 ] || echo --control) ${DEFAULTS_ARGS:-} 2>&1 | grep -v "^W[0-9]" | tee "$OUT/defaults.txt" || rc=1
fi
if has tunes; then
  timeout -k 10 "${TUNES_TIMEOUT:-300}" python3 scripts/bench_report.py record-tune --out "$OUT/${card}_tune.json" \
    -- --quick --device cuda 2>&1 | tee "$OUT/tunes.txt" || rc=1
fi
if has ddp; then
  for dtype in float64 float32; do  # float32: atomics in the K-Planes backward, so a looser default --utol
    timeout -k 10 240 torchrun --standalone --nproc_per_node 2 examples/ddp_step.py --dtype $dtype \
      --cache "$OUT/ddp_tuning.json" --json "$OUT/ddp_$dtype.json" 2>&1 \
      | grep --line-buffered -v "^W[0-9]\|OMP_NUM\|^\*" | tee "$OUT/ddp_$dtype.txt" || rc=1
  done
  python3 -m pytest -q -p no:cacheprovider -rfE tests/test_cuda_safety.py -k "second_gpu and not inductor" 2>&1 | tee "$OUT/pytest_2gpu.txt" \
    | tail -3
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
if has nn; then  # recorded for docs/results/ as $OUT/<card>_nn.json (pytorch_nd_semiconv's Numba path calls
  # np.row_stack, gone from numpy 2.4: the run takes the numpy in .whl/numpy where there is one)
  np_path=""
  if ls .whl/numpy/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/np .whl/numpy/*.whl && np_path=/tmp/np
  fi
  PYTHONPATH=$np_path${PYTHONPATH:+:$PYTHONPATH} timeout -k 10 "${NN_TIMEOUT:-300}" python3 scripts/bench_report.py \
    record-nn --out "$OUT/${card}_nn.json" 2>&1 | tee "$OUT/nd_semiconv.txt" | grep -v "^  \|^Traceback\|^$" || rc=1
  python3 benchmarks/tvloss3d.py --json "$OUT/tvloss3d.json" 2>&1 | tee "$OUT/tvloss3d.txt" || rc=1
fi
if has cases; then  # recorded for docs/results/ as $OUT/<card>_cases.json
  timeout -k 10 "${CASES_TIMEOUT:-240}" python3 scripts/bench_report.py record-cases --out "$OUT/${card}_cases.json" 2>&1 \
    | tee "$OUT/semiconv_cases.txt" || rc=1
fi
if has profile; then  # Nsight Compute: PROFILE="OP:BACKEND:DTYPE:KERNEL-REGEX[:SAMPLE] ...", two launches of each kernel matching
  # the regex after the first six (scripts/profile_op.py's warm-up), into $OUT/profile.txt
  for p in ${PROFILE:-tikhonov_inverse_2xn:cuda_ext:float32:tikhonov}; do
    IFS=: read -r op backend dtype regex sample <<< "$p"
    timeout -k 10 "${PROFILE_TIMEOUT:-120}" ncu --clock-control none --launch-skip 6 --launch-count 2 -k "regex:$regex" \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
      --section MemoryWorkloadAnalysis python3 scripts/profile_op.py "$op" "$backend" "$dtype" $sample >> "$OUT/profile.txt" \
      2>&1 || rc=1
  done
  grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Waves Per" \
    "$OUT/profile.txt" | head -80
fi
if has examples; then
  for ex in ${EXAMPLES:-ptycho_tv phase_2d}; do
    timeout -k 10 "${EXAMPLE_TIMEOUT:-240}" python3 examples/$ex.py --benchmark --out "$OUT/${ex}_gpu.png" \
      --json "$OUT/$ex.json" 2>&1 | tee "$OUT/$ex.txt" || rc=1
  done
fi
if has tune; then
  ops="${TUNE_OPS:-tv_loss_l1_3d tv_loss_sq_3d tv_loss_iso_3d trilinear_interp tikhonov_inverse_2xn}"
  export KERNELHUB_CONFIG="$OUT/kernelhub.toml"
  printf '[tune]\ncache = "%s"\n' "$OUT/tuning.json" > "$KERNELHUB_CONFIG"
  start=$SECONDS
  kernelhub tune $ops --json > "$OUT/tune.json" || rc=1
  echo "kernelhub tune $ops: $((SECONDS - start)) s"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(f\"tuned {e['op'][:20]:20s} {e['call'][:40]:40s} winner {e['winner']}: \" + ', '.join(f\"{n} {c['step_ms']:.4f}\" if c['error'] is None else f\"{n} FAILED {c['error'][:60]}\" for n, c in sorted(e['candidates'].items()))) for e in d['tuned']]" "$OUT/tune.json"
  COLUMNS=200 kernelhub explain tv_loss_l1_3d --shape 1,512,512,512 --device cuda 2>&1
  kernelhub bench $ops --json --plot "$OUT/bench.png" > "$OUT/kbench.json" 2> /dev/null || rc=1
  rm -f "$OUT/tuning.json.lock"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['device'], round(d['copy_GBps']), 'GB/s'); [print(f\"{r['op'][:20]:20s} {r['shape'][:14]:14s} {r['pass']:7s} {r['impl']:9s} {r['ms']:9.4f} ms {r['x_floor']:6.2f}x floor {r['vs_torch_ref']:7.1f}x ref {r['vs_compiled']:5.2f}x compiled\") for r in d['rows']]" "$OUT/kbench.json"
fi
echo "== summary =="
cat "$OUT/device.txt"
[ -f "$OUT/pytest_cuda.txt" ] && grep -E "passed|failed|error" "$OUT/pytest_cuda.txt" | tail -1
[ -s "$OUT/not_finished.txt" ] \
  && echo "stopped: $(wc -l < "$OUT/not_finished.txt") selected tests did not finish ($OUT/not_finished.txt)"
fi
if [ -n "${PACK:-}" ]; then  # everything under $OUT as one file (the device tool brings back at most 8)
  tar czf /tmp/kernelhub-gpu.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/kernelhub-gpu.tgz "$OUT/all.tgz"
fi
exit "$rc"
