#!/usr/bin/env bash
# Run on the GPU machine (no package index): install offline, run the demo and the whole test suite
# (CPU and CUDA cases), print a short summary, exit with pytest's status. Logs go under $OUT if set.
set -uo pipefail
OUT="${OUT:-/tmp/kernelhub-gpu}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ! python3 -c "import pytest" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . -e ./backends/torch_ref 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/device.txt"
kernelhub list 2>&1 | tee "$OUT/list.txt" | tail -5
python3 examples/demo.py 2>&1 | tee "$OUT/demo.txt"
python3 -m pytest -q -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest_cuda.txt" | tail -5
rc=${PIPESTATUS[0]}
echo "== summary =="
cat "$OUT/device.txt"
grep -E "passed|failed|error" "$OUT/pytest_cuda.txt" | tail -1
exit "$rc"
