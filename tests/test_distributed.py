"""Several processes: a DDP training step through kernelhub (two ranks, gloo on the CPU here; NCCL on two GPUs
through scripts/gpu_check.sh ddp) gives the single process's parameters, and the ranks tune each shape bucket
once between them."""

import json
import os
import sys
from pathlib import Path

import harness

import kernelhub

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ddp_step.py"


def test_ddp_step_matches_one_process_and_ranks_share_tuned_winners(tmp_path):
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(EXAMPLE), "--device", "cpu", "--points", "4096", "--res", "32", "--D", "16", "--C", "4",
           "--cache", str(tmp_path / "tuning.json"), "--json", str(report)]
    # online tuning would compile inductor for each of the 3 buckets on each rank (tens of seconds on a 2-core
    # machine); the sharing of winners is what is tested, and torch_ref and cuda_ext compete for it
    env = {**os.environ, "KERNELHUB_DISABLE": "inductor"}
    proc = harness.run(cmd, timeout=600, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(report.read_text())
    why = proc.stdout[-3000:] + json.dumps(data)
    assert data["world"] == 2 and max(data["diff_over_update"].values()) <= 1e-6, why
    assert min(data["update_max_abs"].values()) > 0, why  # the steps changed every parameter
    assert data["tuned_once"] and data["same_choices"], why
    if not kernelhub.get_hub().registry.unavailable_reason("cuda_ext"):  # two backends compete: something was tuned
        assert data["tuned"] >= 3, why  # the 3 buckets, split between the ranks in any way, none twice
    entries = json.loads((tmp_path / "tuning.json").read_text())["entries"]
    assert len(entries) == data["tuned"] + (1 if data["tuned"] else 0), why  # + rank 0's single-process full batch
