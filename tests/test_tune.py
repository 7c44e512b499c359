"""Auto-tuning: winners by measured time among backends that pass parity, persisted safely, used by the
selector, invalidated by what changed, and never tuned while tracing or capturing."""

import importlib
import json
import math
import os
import re
import stat
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import harness
import pytest
import torch

import kernelhub
from kernelhub import bench, cli, testing, tune, winners
from kernelhub.args import bucket
from kernelhub.winners import WinnerCache

# Test backends with known costs for tv_loss_sq_3d on the CPU: "aslow" sleeps 20 ms per pass, "bfast"
# 4 ms, "awrong" is instant and 1% off; "cl1" serves tv_loss_l1_3d only. Alphabetically (the priority of
# unlisted backends) aslow comes first.
PLUGIN = '''
import time
import torch
from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl
from kernelhub_torch_ref import tv
from kernelhub_torch_ref.plugin import vjp_backward


CALLS = {}  # backend name -> forward calls


def make(name, op, delay, scale):
    ref = getattr(tv, op)
    ref_backward = vjp_backward(ref, (0,))

    def forward(volume):
        CALLS[name] = CALLS.get(name, 0) + 1
        time.sleep(delay)
        return ref(volume) * scale

    def backward(grad, volume, needs):
        time.sleep(delay)
        return ref_backward(grad, volume, needs=needs)
    return forward, backward


@hookimpl
def kernelhub_register_impls(registry):
    for name, op, delay, scale in (("aslow", "tv_loss_sq_3d", 0.02, 1.0), ("bfast", "tv_loss_sq_3d", 0.004, 1.0),
                                   ("awrong", "tv_loss_sq_3d", 0.0, 1.01), ("cl1", "tv_loss_l1_3d", 0.0, 1.0)):
        registry.add_backend(Backend(name, "1.0"))
        f, b = make(name, op, delay, scale)
        registry.add_impl(Impl(op=op, backend=name, forward=f, backward=b, dtypes=(torch.float32,), devices=("cpu",)))
'''


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The hub with the test backends (cuda_ext and inductor disabled: real backends would compete), tuning
    cache in tmp."""
    (tmp_path / "khtune_plugin.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("KERNELHUB_DISABLE", "cuda_ext,inductor")
    sys.modules.pop("khtune_plugin", None)
    module = importlib.import_module("khtune_plugin")

    def load(text=""):
        (tmp_path / "kernelhub.toml").write_text(textwrap.dedent(text))
        return kernelhub.reload(extra_plugins=[("khtune", module)])
    yield load
    sys.modules.pop("khtune_plugin", None)


VOLUME = torch.randn(1, 8, 8, 8, generator=torch.Generator().manual_seed(0))


def _tune_cli(*argv) -> dict:
    """`kernelhub tune ... --device cpu` (the test backends serve the CPU; on a GPU machine the default is cuda)."""
    data = cli.cmd_tune(cli.build_parser().parse_args(["tune", *argv, "--device", "cpu"]))
    json.dumps(data)  # what --json prints
    return data


def test_the_tuner_ranks_by_measured_time(hub):
    h = hub()
    args = h.registry.spec("tv_loss_sq_3d").normalize(VOLUME)
    entry = h.selector.tuning.tune("tv_loss_sq_3d", args, ["aslow", "bfast"], save=False)
    c = entry["candidates"]
    assert entry["winner"] == "bfast" and c["aslow"]["step_ms"] > 2 * c["bfast"]["step_ms"] > 2 * 4.0


def test_the_tuner_times_the_eager_path_a_training_step_takes(hub):
    """Each candidate is timed through the hub's handle with its backend forced (the eager fast path), not
    through the operators, whose dispatch on a small call costs several times the glue and dilutes the gap."""
    h = hub()
    assert not h.selector.remembered
    args = h.registry.spec("tv_loss_sq_3d").normalize(VOLUME)
    entry = h.selector.tuning.tune("tv_loss_sq_3d", args, ["aslow", "bfast"], quick=True, save=False)
    assert entry["winner"] == "bfast"
    forced = {key[1] for key in h.selector.remembered if key[0] == "tv_loss_sq_3d"}
    assert forced == {"aslow", "bfast"}  # the handles' memo: their calls took the fast path


def test_a_candidate_that_raises_while_timed_is_no_winner_and_the_others_are_timed(hub, monkeypatch):
    """Timing runs every candidate in interleaved rounds; one that raises there (an out-of-memory at the size
    tuned, say) gets the error, is timed no further, and the others keep their rounds."""
    from kernelhub import tune
    h = hub()
    real, seen = tune.rounds, []

    def flaky(fns, device, repeat, budget_ms):
        seen.append(sorted(fns))

        def boom():
            raise RuntimeError("out of memory, say")
        return real({n: boom if n == "aslow" else f for n, f in fns.items()}, device, repeat, budget_ms)
    monkeypatch.setattr(tune, "rounds", flaky)
    args = h.registry.spec("tv_loss_sq_3d").normalize(VOLUME)
    entry = h.selector.tuning.tune("tv_loss_sq_3d", args, ["aslow", "bfast"], quick=True, save=False)
    c = entry["candidates"]
    assert c["aslow"]["error"] == "raised RuntimeError: out of memory, say" and "forward_ms" not in c["aslow"]
    assert entry["winner"] == "bfast" and len(c["bfast"]["step_rounds"]) == tune.ROUNDS[True]
    assert seen[-1] == ["bfast"]  # the step's rounds leave out the one whose forward raised


def test_a_compiled_step_runs_the_tuned_winner_without_recompiling(hub):
    """Tuned winners reach compiled code as they reach eager calls: the graph holds the op's operator, which
    selects when it runs (docs/user-guide.md, "torch.compile, torch.export, CUDA graphs")."""
    hub()
    calls = sys.modules["khtune_plugin"].CALLS
    torch._dynamo.reset()
    step = torch.compile(lambda v: kernelhub.op("tv_loss_sq_3d")(v) * 2, fullgraph=True, backend="aot_eager")
    want = kernelhub.op("tv_loss_sq_3d", backend="torch_ref")(VOLUME) * 2
    torch.testing.assert_close(step(VOLUME), want)
    assert calls.get("aslow") == 1  # the priority's first
    _tune_cli("tv_loss_sq_3d", "--shape", "1,8,8,8", "--quick")  # records the winner, drops cached decisions
    winner = kernelhub.explain("tv_loss_sq_3d", VOLUME)
    assert winner.chosen != "aslow" and "tuned winner" in str(winner), str(winner)
    before = dict(calls)
    torch.testing.assert_close(step(VOLUME), want)
    assert calls.get("aslow") == before.get("aslow")  # the same compiled function, now the winner's call


def test_winner_overrides_priority_and_a_wrong_backend_is_never_chosen(hub):
    hub()
    assert kernelhub.explain("tv_loss_sq_3d", VOLUME).chosen == "aslow"  # priority: alphabetical, before torch_ref
    data = _tune_cli("tv_loss_sq_3d", "--shape", "1,8,8,8", "--quick")
    entry = data["tuned"][0]
    assert set(entry["candidates"]) == {"aslow", "awrong", "bfast", "torch_ref"}
    assert "failed parity" in entry["candidates"]["awrong"]["error"]
    assert entry["winner"] == "torch_ref"  # no sleep at all
    decision = kernelhub.explain("tv_loss_sq_3d", VOLUME)
    by = {c.backend: c for c in decision.candidates}
    assert decision.chosen == "torch_ref" and "tuned winner" in by["torch_ref"].reasons[0]
    assert by["bfast"].status == "lost" and "lost on time" in by["bfast"].reasons[0]
    assert by["awrong"].status == "rejected" and "failed parity" in by["awrong"].reasons[0]
    # the order below the winner is by time too: bfast before aslow
    assert [i.backend for i in decision.eligible] == ["torch_ref", "bfast", "aslow"]
    # the winners persist: a new process (here, a reloaded hub) reads them; the table lists them
    hub()
    assert kernelhub.explain("tv_loss_sq_3d", VOLUME).chosen == "torch_ref"
    listed = cli.cmd_list(cli.build_parser().parse_args(["list"]))["winners"]["devices"]
    rows = [r for rows in listed.values() for r in rows]
    assert rows[0]["op"] == "tv_loss_sq_3d" and rows[0]["winner"] == "torch_ref" and "awrong" in rows[0]["failed"]
    # mode "off" ignores them
    hub("[tune]\nmode = 'off'\n")
    assert kernelhub.explain("tv_loss_sq_3d", VOLUME).chosen == "aslow"


def test_a_gap_within_the_noise_records_no_winner():
    from kernelhub.tune import NOISE_FLOOR, within_noise

    def cands(*rounds):
        return {f"b{i}": {"error": None, "step_ms": sorted(r)[len(r) // 2], "step_rounds": list(r)}
                for i, r in enumerate(rounds)}
    tie = 1 + NOISE_FLOOR / 2
    assert within_noise(cands([1.0] * 5, [tie] * 5, [2.0] * 5)) == ["b0", "b1"]  # under the floor: a tie
    # a stable 1.3x ordering wins although each candidate's own spread is wide (the machine's speed drifts)
    drift = [1.0, 1.8, 0.7, 2.5, 1.2]
    c = cands(drift, [1.3 * t for t in drift])
    assert within_noise(c) == ["b0"] and c["b1"]["vs_fastest"] == {"ratio": 1.3, "slower_in": 5, "rounds": 5,
                                                                    "t": 999.0}
    # an ordering that flips between rounds is a tie, however large the gap of the medians
    assert within_noise(cands([1.0, 1.0, 1.0, 3.0, 3.0], [1.5, 1.5, 1.5, 1.0, 1.0])) == ["b0", "b1"]
    assert within_noise(cands([1.0] * 9, [1.2] * 8 + [0.9])) == ["b0"]  # slower in 8 of 9 rounds: enough
    # slower in 7 of 9: the sign test alone says a tie, the log ratios' t-test decides: a steady 1.2x with two
    # rounds at 0.9x is slower (t 2.8); with two rounds at 0.5x, a mean log ratio below 0: a tie
    assert within_noise(cands([1.0] * 9, [1.2] * 7 + [0.9] * 2)) == ["b0"]
    assert within_noise(cands([1.0] * 9, [1.2] * 7 + [0.5] * 2)) == ["b0", "b1"]
    # a 5x gap that a busy host reversed in 3 of 9 rounds (slower in 6 of 9) is not "within noise" (`kernelhub
    # tune --quick` on the 2-core CPU, another test run beside it, once called such a gap so)
    c = cands([1.0] * 9, [5.0] * 6 + [0.9] * 3)
    assert within_noise(c) == ["b0"] and c["b1"]["vs_fastest"]["slower_in"] == 6
    # a tie with a wide spread stays one: the same host noise on both
    noise = [1.0, 1.6, 0.8, 1.3, 0.9, 1.1, 1.4, 0.7, 1.2]
    assert within_noise(cands(noise, noise[::-1])) == ["b0", "b1"]
    assert within_noise({"b0": {"error": "failed parity: ...", "step_ms": None}}) == []


def _equal_rounds(fns, device, repeat, budget_ms=0.0):
    """`kernelhub.timing.rounds` as a loaded machine might give it: every candidate the same time, each round."""
    return {name: (fn(), [1.0] * repeat)[1] for name, fn in fns.items()}


def test_tuning_within_noise_keeps_the_priority_order_and_a_changed_winner_warns(hub, monkeypatch):
    from kernelhub import tune
    hub()
    assert _tune_cli("tv_loss_sq_3d", "--shape", "1,8,8,8", "--quick")["tuned"][0]["winner"] == "torch_ref"
    # the same timings for every backend (a loaded machine's, say): no winner, and the re-run warns
    monkeypatch.setattr(tune, "rounds", _equal_rounds)
    with pytest.warns(RuntimeWarning, match="the winner is none .within noise: .* now, torch_ref when tuned"):
        entry = _tune_cli("tv_loss_sq_3d", "--shape", "1,8,8,8", "--quick")["tuned"][0]
    assert entry["winner"] is None and set(entry["within_noise"]) == {"aslow", "bfast", "torch_ref"}
    hub()
    decision = kernelhub.explain("tv_loss_sq_3d", VOLUME)
    assert decision.chosen == "aslow"  # the priority order's first, as untuned
    assert "within noise of the fastest" in decision.candidates[0].reasons[0]
    rows = [r for rows in cli.cmd_list(cli.build_parser().parse_args(["list"]))["winners"]["devices"].values()
            for r in rows]
    assert rows[0]["winner"] is None and rows[0]["within_noise"]


def test_a_changed_backend_invalidates_only_the_entries_it_was_timed_in(hub, monkeypatch):
    hub()
    _tune_cli("tv_loss_sq_3d", "--shape", "1,8,8,8", "--quick")
    _tune_cli("tv_loss_l1_3d", "--shape", "1,8,8,8", "--quick")
    h = hub()
    real = h.registry.fingerprint
    monkeypatch.setattr(h.registry, "fingerprint", lambda b: "2.0+new" if b == "bfast" else real(b))
    h.selector.forget()
    sq = kernelhub.explain("tv_loss_sq_3d", VOLUME)
    l1 = kernelhub.explain("tv_loss_l1_3d", VOLUME)
    assert sq.chosen == "aslow" and "priority order" in sq.candidates[0].reasons[0]  # stale: back to priority
    # bfast does not serve tv_loss_l1_3d: its entry still holds, a winner or, where a loaded machine timed the
    # backends within noise of each other, none (the priority order among them)
    assert _tuned(l1)
    stale = {r["op"]: r["stale"] for rows in cli.cmd_list(cli.build_parser().parse_args(["list"]))["winners"]
             ["devices"].values() for r in rows}
    assert stale == {"tv_loss_sq_3d": "bfast changed since (the fingerprint of its kernels' sources)",
                     "tv_loss_l1_3d": ""}
    assert "of bucket 1x8x8x8 set aside: bfast changed since" in sq.candidates[0].reasons[0]


def test_a_winner_set_aside_by_a_backend_installed_since_says_so(hub, capsys, monkeypatch):
    """A backend installed after its op was tuned (here bfast, which the plugin registers only the second time): the
    entry no longer orders its bucket, and `kernelhub explain` and `kernelhub list` say which winner was set aside,
    why, and what to do."""
    h = hub()
    with monkeypatch.context() as m:  # bfast not installed yet
        m.setattr(h.registry, "impls", lambda op, real=h.registry.impls: {
            n: i for n, i in real(op).items() if n != "bfast"})
        m.setattr(h.registry, "backends", {n: b for n, b in h.registry.backends.items() if n != "bfast"})
        _tune_cli("tv_loss_sq_3d", "--shape", "1,8,8,8", "--quick")
    hub()  # bfast installed
    decision = kernelhub.explain("tv_loss_sq_3d", VOLUME)
    why = decision.candidates[0].reasons[0]
    assert why.startswith("priority order")  # back to the priority order
    assert "of bucket 1x8x8x8 set aside: bfast not timed then (installed since?)" in why
    assert "`kernelhub tune` times every backend again" in why
    rows = [r for rows in cli.cmd_list(cli.build_parser().parse_args(["list"]))["winners"]["devices"].values()
            for r in rows]
    assert [r["stale"] for r in rows] == ["bfast not timed then (installed since?)"]
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out  # the note wraps in its column
    assert "set aside:" in out and "installed since?)" in out


def _tuned(decision):
    """Whether ``decision`` follows a tuning of its bucket: a winner or, where a loaded machine timed the
    backends within noise of each other, none (the priority order among them), as the stale-entry test allows."""
    return decision.candidates[0].reasons[0].startswith(("tuned winner for bucket",
                                                         "within noise of the fastest for bucket"))


FOREIGN = {"not json": "{not json", "another tool's json": json.dumps({"format": "someone-else/3", "entries": {}}),
           "a list": "[]", "nested 100k deep": "[" * 100_000 + "]" * 100_000, "not utf-8": b"\xff\xfe\x00"}


@pytest.mark.parametrize("content", list(FOREIGN.values()), ids=list(FOREIGN))
def test_a_file_that_is_not_ours_is_left_untouched_with_one_warning(hub, tmp_path, content):
    """A winners path holding anything but our file: never replaced, chmodded or given a lock beside it; one
    warning; tuning results stay in memory and serve the calls; `kernelhub tune` says so and exits 1."""
    path = tmp_path / "tuning.json"
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    path.chmod(0o664)
    before = path.read_bytes()
    hub('[tune]\nmode = "online"\n')
    with pytest.warns(RuntimeWarning, match="tuning cache .* left untouched") as caught:
        kernelhub.explain("tv_loss_sq_3d", VOLUME)
        kernelhub.op("tv_loss_sq_3d")(VOLUME)  # online: tunes the bucket, in memory
        kernelhub.op("tv_loss_sq_3d")(VOLUME)
    assert len([w for w in caught if "tuning cache" in str(w.message)]) == 1, [str(w.message) for w in caught]
    assert _tuned(kernelhub.explain("tv_loss_sq_3d", VOLUME))  # served from memory, not re-tuned
    assert len(kernelhub.get_hub().selector.tuning.tuned_here) == 1
    assert path.read_bytes() == before and path.stat().st_mode & 0o777 == 0o664
    assert not (tmp_path / "tuning.json.lock").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli.main(["tune", "tv_loss_sq_3d", "--shape", "1,8,8,8", "--quick", "--device", "cpu"]) == 1
    assert path.read_bytes() == before


@pytest.mark.parametrize("content", [json.dumps({"format": "kernelhub-tuning/0", "entries": []}),
                                     json.dumps({"format": winners.FORMAT, "entries": 3})])
def test_a_malformed_file_of_ours_is_ignored_with_one_warning_and_rewritten(hub, tmp_path, content):
    path = tmp_path / "tuning.json"
    path.write_text(content)
    hub()
    with pytest.warns(RuntimeWarning, match="tuning cache .* ignored") as caught:
        kernelhub.explain("tv_loss_sq_3d", VOLUME)
        kernelhub.explain("tv_loss_sq_3d", torch.randn(1, 4, 4, 4))
    assert len([w for w in caught if "tuning cache" in str(w.message)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _tune_cli("tv_loss_sq_3d", "--shape", "1,8,8,8", "--quick")
    data = json.loads(path.read_text())
    assert data["format"] == winners.FORMAT and len(data["entries"]) == 1


@pytest.mark.parametrize("where", ["a directory at the path", "a file above it"])
def test_an_unwritable_winners_path_warns_once_and_keeps_serving(hub, tmp_path, where):
    if where == "a directory at the path":
        path = tmp_path / "tuning.json"
        path.mkdir()
    else:
        (tmp_path / "blocker").write_text("a file where a directory should be")
        path = tmp_path / "blocker" / "tuning.json"
    hub(f'[tune]\nmode = "online"\ncache = "{path}"\n')
    with pytest.warns(RuntimeWarning, match="tuning cache") as caught:
        for _ in range(3):
            kernelhub.op("tv_loss_sq_3d")(VOLUME)
    assert len([w for w in caught if "tuning cache" in str(w.message)]) == 1, [str(w.message) for w in caught]
    assert len(kernelhub.get_hub().selector.tuning.tuned_here) == 1  # tuned once, not at every call
    assert _tuned(kernelhub.explain("tv_loss_sq_3d", VOLUME))  # from memory
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli.main(["tune", "tv_loss_sq_3d", "--shape", "1,8,8,8", "--quick", "--device", "cpu"]) == 1


def test_a_file_never_removes_the_reference_nor_bans_a_backend_that_raised_or_passes_here(hub, tmp_path):
    path = tmp_path / "tuning.json"
    hub()
    _tune_cli("tv_loss_sq_3d", "--shape", "1,8,8,8", "--quick")

    def edit(data, entry):
        for name in entry["candidates"]:
            if name != "awrong":  # awrong really fails parity
                entry["candidates"][name].update(error="raised OutOfMemoryError: CUDA out of memory", step_ms=None)
        entry["candidates"]["torch_ref"].update(error="failed parity: forward error 1 (tolerance 1e-6)")
        entry["candidates"]["bfast"].update(error="failed parity: forward error 1 (tolerance 1e-6)")
    _tamper(path, edit)
    hub()
    d = kernelhub.explain("tv_loss_sq_3d", VOLUME)
    status = {c.backend: c.status for c in d.candidates}
    # bfast passes parity here, so the file's verdict does not remove it; torch_ref is the judge; aslow raised once
    assert status["torch_ref"] != "rejected" and status["bfast"] != "rejected" and status["aslow"] != "rejected"
    assert status["awrong"] == "rejected"
    torch.testing.assert_close(kernelhub.op("tv_loss_sq_3d")(VOLUME),
                               kernelhub.op("tv_loss_sq_3d", backend="torch_ref")(VOLUME))


def _tamper(path, edit):
    data = json.loads(path.read_text())
    (entry,) = [v for k, v in data["entries"].items() if k.startswith("tv_loss_sq_3d|")]
    edit(data, entry)
    path.write_text(json.dumps(data))


def test_a_tampered_cache_chooses_only_among_registered_impls_that_pass_parity_here(hub, tmp_path, monkeypatch):
    """The winners file is data: whatever it says, a call runs a registered impl eligible for it that passes
    parity in this process; malformed entries and unknown names are ignored with a warning."""
    path = tmp_path / "tuning.json"
    hub()
    _tune_cli("tv_loss_sq_3d", "--shape", "1,8,8,8", "--quick")

    def awrong_passed(data, entry):  # the 1%-off backend recorded as passing and fastest
        entry["candidates"]["awrong"].update(error=None, step_ms=1e-6)
    _tamper(path, awrong_passed)
    hub()
    with pytest.warns(RuntimeWarning, match="'awrong' is recorded as passing parity, but here it failed parity"):
        d = kernelhub.explain("tv_loss_sq_3d", VOLUME)
    by = {c.backend: c for c in d.candidates}
    assert d.chosen == "torch_ref" and by["awrong"].status == "rejected"
    assert "but here it failed parity" in by["awrong"].reasons[0]
    torch.testing.assert_close(kernelhub.op("tv_loss_sq_3d")(VOLUME),
                               kernelhub.op("tv_loss_sq_3d", backend="torch_ref")(VOLUME))

    def bfast_fastest(data, entry):  # a correct backend made the winner: allowed, it passes here
        entry["candidates"]["bfast"]["step_ms"] = 1e-6
    _tamper(path, bfast_fastest)
    hub()
    assert "tuned winner" in str(kernelhub.explain("tv_loss_sq_3d", VOLUME))  # from memory
    hub()  # a check that cannot run (the reference out of memory) does not crash the call: the winner is not used

    def no_memory(op, args, **kwargs):
        raise RuntimeError("CUDA out of memory")
    with monkeypatch.context() as m:
        m.setattr(tune, "call_tolerance", no_memory)
        with pytest.warns(RuntimeWarning, match="'bfast' is recorded as passing parity, but here it could not be "
                          "checked: RuntimeError: CUDA out of memory"):
            d = kernelhub.explain("tv_loss_sq_3d", VOLUME)
        assert d.chosen == "torch_ref"

    def strangers(data, entry):  # an unknown backend as the fastest, an entry for an unknown op
        entry["candidates"]["evil"] = {"fingerprint": "x", "error": None, "step_ms": 1e-6}
        data["entries"]["rm_rf|cpu|float32|8"] = {"candidates": {}, "winner": None}
    _tamper(path, strangers)
    hub()
    with pytest.warns(RuntimeWarning, match="names op 'rm_rf', backend 'evil', unknown here: ignored"):
        d = kernelhub.explain("tv_loss_sq_3d", VOLUME)
    assert d.chosen == "bfast" and "evil" not in {c.backend for c in d.candidates}

    def malformed(data, entry):  # a time that is not a number: the entry is ignored, not crashed on
        entry["candidates"]["bfast"]["step_ms"] = "__import__('os').system('true')"
    _tamper(path, malformed)
    hub()
    with pytest.warns(RuntimeWarning, match="1 malformed entries ignored"):
        d = kernelhub.explain("tv_loss_sq_3d", VOLUME)
    assert d.chosen == "aslow" and "priority order" in d.candidates[0].reasons[0]

    def registered_not_names(data, entry):  # the backends registered when tuned: a list of names or nothing
        entry["candidates"]["bfast"]["step_ms"] = 1.0
        entry["registered"] = 7
    _tamper(path, registered_not_names)
    hub()
    with pytest.warns(RuntimeWarning, match="1 malformed entries ignored"):
        rows = cli.cmd_list(cli.build_parser().parse_args(["list"]))["winners"]["devices"].values()
    assert not [r for rs in rows for r in rs if r["op"] == "tv_loss_sq_3d"]


def test_nothing_on_disk_is_unpickled_or_evaluated():
    """The config is TOML and the winners file JSON; no module of kernelhub deserialises code."""
    root = Path(kernelhub.__file__).parent
    sources = {p: p.read_text() for p in root.rglob("*.py")}
    assert len(sources) > 10
    for bad in (r"\bpickle\b", r"torch\.load\b", r"\bmarshal\b", r"(?<![\w.])eval\(", r"(?<![\w.])exec\(",
                r"\byaml\b"):
        assert not [p.name for p, text in sources.items() if re.search(bad, text)], bad


WRITER = """
import sys
from kernelhub.winners import WinnerCache
cache = WinnerCache(sys.argv[1])
for i in range(40):
    cache.put({f"{sys.argv[2]}-{i}": {"candidates": {}, "winner": None}})
"""


def test_concurrent_tuners_leave_one_valid_file_with_all_entries(tmp_path):
    path = tmp_path / "shared" / "tuning.json"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), f"rank{r}"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=harness.child_env()) for r in range(3)]
    outs = [harness.wait(p, 120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    entries = WinnerCache(path).entries()
    assert len(entries) == 120 and not list(path.parent.glob(".tuning-*"))  # no temporary file left


def test_two_tuning_processes_at_once(tmp_path):
    # two real `kernelhub tune` runs (torch_ref against cuda_ext's C++ kernels; inductor, which would compile
    # for seconds, left out) sharing one cache file
    reason = kernelhub.get_hub().registry.unavailable_reason("cuda_ext")
    if reason:
        pytest.skip(f"cuda_ext is not available here: {reason}")
    config = tmp_path / "kernelhub.toml"
    config.write_text(f"[tune]\ncache = '{tmp_path / 'w.json'}'\n")
    env = {**os.environ, "KERNELHUB_CONFIG": str(config), "KERNELHUB_DISABLE": "inductor"}
    command = [sys.executable, "-m", "kernelhub.cli", "tune", "OP", "--quick", "--device", "cpu", "--json"]
    procs = [subprocess.Popen([op if a == "OP" else a for a in command], env=harness.child_env(env),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for op in ("tv_loss_sq_3d", "tv_loss_l1_3d")]
    outs = [harness.wait(p, 600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    tuned = [e for o in outs for e in json.loads(o[0])["tuned"]]
    entries = WinnerCache(tmp_path / "w.json").entries()
    assert len(tuned) == 2 and {e["op"] for e in entries.values()} == {"tv_loss_sq_3d", "tv_loss_l1_3d"}
    assert all(set(e["candidates"]) == {"cuda_ext", "torch_ref"} for e in entries.values())


def test_online_mode_tunes_a_new_bucket_on_its_first_call_but_never_while_tracing(hub, monkeypatch, tmp_path):
    hub("[tune]\nmode = 'online'\n")
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # as inside torch.compile's tracing
    assert not tune.may_tune_now((VOLUME,))
    decision = kernelhub.explain("tv_loss_sq_3d", VOLUME)
    assert decision.chosen == "aslow" and "not tuned while tracing" in decision.candidates[0].reasons[0]
    assert not (tmp_path / "tuning.json").exists()
    monkeypatch.undo()
    out = kernelhub.op("tv_loss_sq_3d")(VOLUME)  # the first real call of this bucket tunes it
    assert torch.allclose(out, kernelhub.op("tv_loss_sq_3d", backend="torch_ref")(VOLUME))
    assert kernelhub.explain("tv_loss_sq_3d", VOLUME).chosen == "torch_ref"
    assert len(WinnerCache(tmp_path / "tuning.json").entries()) == 1
    # another shape in the same bucket: no new tuning
    kernelhub.op("tv_loss_sq_3d")(torch.randn(1, 7, 8, 5))
    assert len(WinnerCache(tmp_path / "tuning.json").entries()) == 1


def test_buckets_round_shapes_up_to_powers_of_two_and_keep_non_float_arguments():
    assert bucket((torch.empty(1, 7, 8, 9), 0.5)) == "1x8x8x16"
    assert bucket(([torch.empty(3, 5)], "tropical_max", [1, 2], 2)) == "[4x8] 'tropical_max' [1, 2] 2"


def test_bench_prints_times_floor_fractions_and_speedups_and_plots(tmp_path, monkeypatch):
    out = tmp_path / "bench.png"
    parser = cli.build_parser()
    data = cli.cmd_bench(parser.parse_args(["bench", "tv_loss_sq_3d", "--quick", "--device", "cpu", "--plot",
                                            str(out)]))
    impls = {r["impl"] for r in data["rows"]}
    assert {"torch_ref", "compiled"} <= impls and data["copy_GBps"] > 0
    for r in data["rows"]:
        assert r["ms"] > 0 and r["floor_ms"] > 0 and r["x_floor"] == pytest.approx(r["ms"] / r["floor_ms"])
        assert r["pass"] in ("fwd", "fwd+bwd")
    ref = {r["pass"]: r["ms"] for r in data["rows"] if r["impl"] == "torch_ref"}
    for r in data["rows"]:
        assert r["vs_torch_ref"] == pytest.approx(ref[r["pass"]] / r["ms"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.dumps(data)
    two = {**data, "rows": data["rows"] + [{**r, "op": "semiconv"} for r in data["rows"]]}
    fig = bench.figure(two)  # one panel per op, titled with it
    assert [ax.get_title() for ax in fig.axes if ax.get_visible()] == ["tv_loss_sq_3d", "semiconv"]
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed: a clear error, exit code 2
    assert cli.main(["bench", "tv_loss_sq_3d", "--quick", "--device", "cpu", "--plot", str(out)]) == 2


def test_bench_goes_on_without_the_compiled_row_where_compiling_the_reference_fails(monkeypatch):
    from kernelhub import bench

    def fail(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(bench, "compiled_reference", fail)
    logged = []
    data = bench.run(["tv_loss_sq_3d"], ["cuda_ext"], "cpu", quick=True, log=logged.append)
    assert {r["impl"] for r in data["rows"]} == {"torch_ref", "cuda_ext"}
    assert all(math.isnan(r["vs_compiled"]) for r in data["rows"])
    assert "compiled: OutOfMemoryError" in logged[0]
    # each row is logged as it lands, so a run stopped by a time limit still shows what it measured
    assert len([m for m in logged[1:] if " cuda_ext: " in m and " ms (first call " in m]) == 2


@pytest.mark.parametrize("op", kernelhub.op_names())
def test_sample_names_are_unique_so_bench_shapes_can_pick_each(op):
    sizes = ["small", "medium", "edge"] + ["benchmark"] * (op == "semiconv")  # semiconv's two used to share one
    for size in sizes:
        names = [s.name for s in kernelhub.testing.samples(op, size, torch.float32, "cpu")]
        assert len(names) == len(set(names)), f"{op} {size}: {names}"


def test_bench_shapes_keeps_only_the_samples_named(monkeypatch):
    from kernelhub import bench

    monkeypatch.setattr(bench, "compiled_reference", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("skip")))
    names = [s.name for s in kernelhub.testing.samples("semiconv", "medium", torch.float32, "cpu")]
    assert len(names) > 1
    data = bench.run(["semiconv"], [], "cpu", quick=True, log=lambda m: None, shapes=[names[-1]])
    assert {r["shape"] for r in data["rows"]} == {names[-1]} and {r["pass"] for r in data["rows"]} == {"fwd", "fwd+bwd"}
    args = cli.build_parser().parse_args(["bench", "tv_loss_sq_3d", "--shapes", "B614400_T4", "T8"])
    assert args.shapes == ["B614400_T4", "T8"]
    # a filter that matches nothing is an error naming the samples there are, not an empty table
    with pytest.raises(ValueError, match=f"--shapes nosuch: .*their names: {names[0]}"):
        bench.run(["semiconv"], [], "cpu", quick=True, log=lambda m: None, shapes=["nosuch"])


def test_the_runtime_path_does_not_import_the_test_kit_cli_or_bench(tmp_path):
    """An op call, its selection with a tuned winner verified in-process, and explain import neither
    kernelhub.testing, kernelhub.cli nor kernelhub.bench (parity at run time is kernelhub.parity)."""
    import sys
    code = (
        "import sys, torch, kernelhub\n"
        "from kernelhub.tune import Tuning\n"
        "v = torch.randn(2, 6, 6, 6, requires_grad=True)\n"
        "kernelhub.op('tv_loss_l1_3d')(v).sum().backward()\n"
        "kernelhub.explain('semiconv', torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3), 'tropical_max')\n"
        "hub = kernelhub.get_hub()\n"
        "names = [n for n in hub.registry.impls('tv_loss_l1_3d') if n != 'inductor']\n"
        "hub.selector.tuning.verify('tv_loss_l1_3d', (v.detach(),), names[0], recorded_passing=False)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('kernelhub.testing', 'kernelhub.cli', "
        "'kernelhub.bench'))))\n")
    env = {**__import__("os").environ, "KERNELHUB_CONFIG": str(tmp_path / "none.toml")}
    (tmp_path / "none.toml").write_text("")
    out = harness.run([sys.executable, "-c", code], env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_floor_is_the_binding_resource_of_the_op_s_least_work():
    """`kernelhub.bench.floor`: each amount of the op's least work over its measured rate, the largest binds."""
    from kernelhub.spec import Work

    rates = {"dram_Bps": 1e12, "gather_Bps": 1e13, "atomics_per_s": 1e11, "flops_per_s": 1e13}
    assert bench.floor(Work(10**9), rates) == (pytest.approx(1.0), "DRAM")
    assert bench.floor(Work(10**9, 10**11), rates) == (pytest.approx(10.0), "gathers")
    assert bench.floor(Work(10**9, 10**11, 10**10, 10**10), rates) == (pytest.approx(100.0), "atomics")
    assert bench.floor(Work(10**9, flops=10**11), rates) == (pytest.approx(10.0), "FP32")
    units = {**rates, "minmax_per_s": 1e12, "special_per_s": 1e11}
    assert bench.floor(Work(10**9, flops=10**11, minmax=10**11), units) == (pytest.approx(100.0), "max/min")
    assert bench.floor(Work(10**9, minmax=10**11, special=10**11), units) == (pytest.approx(1000.0), "exp/log")
    cpu = bench.rates(torch.device("cpu"))  # on the CPU only the copy and FP32 are measured: the rest never bind
    assert cpu["dram_Bps"] > 0 and cpu["flops_per_s"] > 0
    assert all(cpu[k] is None for k in ("gather_Bps", "atomics_per_s", "minmax_per_s", "special_per_s"))
    json.dumps(cpu, allow_nan=False)  # strict JSON: `kernelhub bench --json` prints it
    assert bench.floor(Work(1, 10**15, 10**15, 0, 10**15, 10**15), cpu)[1] == "DRAM"


def test_semiconv_least_work_counts_each_semifield_s_unit_and_max_min_s_saved_winners():
    """docs/ops.md, "Least work": a max-plus tap is an add and a max; log a max, an exponential and three
    operations a tap (a logarithm an output); root two special functions a tap; linear a multiply-add. Max and
    min's backward reads the winners the forward saved, not the image again; the smooth semifields' backward
    computes each tap's share again."""
    from kernelhub.args import nbytes

    spec = kernelhub.get_hub().registry.spec("semiconv")
    img, ker = torch.zeros(2, 4, 9, 9), torch.zeros(4, 4, 3, 3)

    def work(semifield, grads_of):
        args = spec.normalize(img, ker, semifield)
        return bench.least_work(spec, args, spec.output(*args), grads_of), spec.output(*args)

    (fwd, out), (both, _) = work("tropical_max", None), work("tropical_max", (0, 1))
    taps, outs = out.numel() * 36, out.numel()
    assert (fwd.flops, fwd.minmax, fwd.special) == (taps, taps, 0)
    assert (both.flops, both.minmax) == (taps + 2 * outs, taps)
    assert both.dram_bytes == fwd.dram_bytes + 2 * outs + nbytes(out) + nbytes(img) + nbytes(ker)
    log, log_both = work("log:1", None)[0], work("log:1", (0,))[0]
    assert (log.flops, log.minmax, log.special) == (3 * taps, taps, taps + outs)
    assert (log_both.flops, log_both.special) == (5 * taps, 2 * taps + outs)
    assert work("root:2", None)[0].special == 2 * taps + 2 * outs
    assert work("linear", (0, 1))[0].flops == 6 * taps and work("linear", None)[0].minmax == 0


@pytest.mark.parametrize("op", kernelhub.op_names())
def test_each_op_s_least_work_reads_its_inputs_and_the_backward_adds_to_the_forward(op):
    """`kernelhub.bench.least_work` on the op's small and edge samples: the forward moves at least its tensors and
    output once, and forward + backward at least the forward plus each gradient written, and more of every
    resource."""
    from kernelhub.args import nbytes

    spec = kernelhub.get_hub().registry.spec(op)
    for s in testing.samples(op, "small", spec.default_dtype, "cpu", seed=0) + \
            testing.samples(op, "edge", spec.default_dtype, "cpu", seed=0):
        out = spec.output(*s.args)
        fwd = bench.least_work(spec, s.args, out, None)
        both = bench.least_work(spec, s.args, out, spec.differentiable)
        inputs = sum(nbytes(s.args[i]) for i in spec.tensor_args) + nbytes(out)
        assert fwd.dram_bytes >= inputs and fwd.atomics == 0, (s.name, fwd)
        assert both.dram_bytes >= fwd.dram_bytes + sum(nbytes(s.args[i]) for i in spec.differentiable), s.name
        assert all(getattr(both, f) >= getattr(fwd, f)
                   for f in ("gather_bytes", "atomics", "flops", "minmax", "special")), s.name


def test_k_planes_least_work_counts_every_tap_s_texels_and_the_planes_gradient_s_atomics():
    """Four texels of every channel per (point, tilt, plane, tap), gathered forward and again backward; one
    atomic add per texel channel where the planes get a gradient, none where only the points do."""
    spec = kernelhub.get_hub().registry.spec("kplanes_interp_tilted_taps")
    b, t, ch = 10, 2, 8
    args = (torch.zeros(b, 3), torch.zeros(t, 3, 3), torch.zeros(3 * t, ch, 5, 7), 0.01)
    out = spec.output(*args)
    texels = 4 * b * t * 3 * 4 * ch  # taps x points x tilts x planes x corners x channels
    assert bench.least_work(spec, args, out, None).gather_bytes == 4 * texels
    assert bench.least_work(spec, args, out, (2,)).gather_bytes == 8 * texels
    assert bench.least_work(spec, args, out, (2,)).atomics == texels
    assert bench.least_work(spec, args, out, (0,)).atomics == 0


def test_bench_prints_whole_names_in_80_columns_and_what_binds():
    """`kernelhub bench`: one small table per op and sample, whole op and backend names at 80 columns, each
    multiple of the floor with the resource that binds; the spread and first call with --wide."""
    from rich.console import Console

    row = {"op": "kplanes_interp_tilted_taps", "shape": "B614400_T4_C32_200x200", "pass": "fwd+bwd", "ms": 7.9,
           "spread": 0.01, "x_floor": 2.1, "binds": "atomics", "vs_torch_ref": 14.5, "vs_compiled": 9.9,
           "first_call_s": 0.8}
    data = {"device": "NVIDIA H200", "copy_GBps": 4300.0, "rows": [{**row, "impl": n} for n in
                                                                  ("torch_ref", "compiled", "cuda_ext", "triton")],
            "rates": {"dram_Bps": 4.3e12, "gather_Bps": 1e13, "atomics_per_s": 1e12, "flops_per_s": 5e13}}
    for wide, width in ((False, 80), (True, 400)):
        console = Console(width=width, record=True)
        cli.render_bench({**data, "wide": wide}, console)
        text = console.export_text()
        assert max(map(len, text.splitlines())) <= width and "…" not in text
        assert "kplanes_interp_tilted_taps B614400_T4_C32_200x200" in text and " 2.10x " in text
        assert "floor binds: fwd+bwd atomics" in text
        assert all(f" {n} " in text for n in ("torch_ref", "compiled", "cuda_ext", "triton"))
        assert ("first call s" in text) == wide
        assert "graph" not in text  # no row has the device's own time (the CPU's)
    graphed = {**data, "rows": [{**r, "ms": 0.5765, "graph_ms": 0.2931, "x_floor_graph": 1.25}
                                for r in data["rows"]]}
    for wide, width in ((False, 80), (True, 400)):  # a CUDA run's rows: the graph replay's multiple of the floor
        console = Console(width=width, record=True)
        cli.render_bench({**graphed, "wide": wide}, console)
        text = console.export_text()
        assert max(map(len, text.splitlines())) <= width and "…" not in text
        assert " 1.25x " in text and " 0.5765 " in text and "floor binds: fwd+bwd atomics" in text
        assert ("graph ms" in text) == wide and (" 0.2931 " in text) == wide


@harness.on_cuda()
def test_graphed_times_the_device_alone_where_a_slow_host_leaves_it_idle():
    """`kernelhub.timing.graphed`: a step whose host code costs far more than its kernels (a sleep between two
    tiny launches) takes the host's time under `timed` and the kernels' alone replayed as a CUDA graph."""
    import time

    from kernelhub import timing

    dev = torch.device("cuda")
    x = torch.randn(1024, device=dev)
    out = torch.empty_like(x)

    def step():
        torch.mul(x, 2.0, out=out)
        time.sleep(0.002)  # host time only: nothing a graph captures
        out.add_(1.0)

    slow = timing.timed(step, dev, quick=True).ms
    fast = timing.graphed(step, dev, quick=True).ms
    assert slow > 1.5 and 0 < fast < 0.5, (slow, fast)


@harness.cuda  # on the GPU where there is one
def test_the_rate_probes_compute_what_torch_does():
    """`kernelhub._probes` (the Triton kernels `kernelhub.bench.rates` times): the bags' sums and the scattered adds
    torch's embedding_bag and index_add_ give, and the max-plus and exponential chains torch's computes (Triton's
    interpreter on the CPU, the GPU's compiled kernels there)."""
    pytest.importorskip("triton")
    from kernelhub import _probes

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    table, src = torch.randn(50, 32, generator=g).to(dev), torch.randn(130, 32, generator=g).to(dev)
    idx = torch.randint(0, 50, (130,), generator=g).to(dev)
    bags = torch.empty(3, 32, device=dev)
    _probes.gather(bags, table, idx)
    offsets = torch.arange(0, 130, _probes.ROWS, device=dev)
    torch.testing.assert_close(bags, torch.nn.functional.embedding_bag(idx, table, offsets, mode="sum"))
    acc = torch.zeros(50, 32, device=dev)
    _probes.scatter(acc, src, idx)
    torch.testing.assert_close(acc, torch.zeros(50, 32, device=dev).index_add_(0, idx, src))
    chains = torch.empty(2 * _probes.CHAINS, device=dev)  # the arithmetic probes: 2 trips of UNROLL steps a chain
    x0 = torch.arange(chains.numel(), device=dev, dtype=torch.float32)
    x, y = x0 * 1e-6, 1.0 - x0 * 1e-6
    assert _probes.maxplus(chains, 0.25, 2) == chains.numel() * 2 * _probes.UNROLL
    for _ in range(2 * _probes.UNROLL):
        x = torch.maximum(x, y) + 0.25
    torch.testing.assert_close(chains, x)
    x = x0 * 1e-9
    assert _probes.exp2(chains, 2) == chains.numel() * 2 * _probes.UNROLL
    for _ in range(2 * _probes.UNROLL):
        x = torch.exp2(-x)
    torch.testing.assert_close(chains, x)


def test_graphed_needs_a_cuda_device():
    from kernelhub import timing

    with pytest.raises(ValueError, match="a CUDA device"):
        timing.graphed(lambda: None, torch.device("cpu"))


def test_timed_drops_the_gradients_it_is_given_before_each_call():
    """`kernelhub.timing.timed`'s ``grad_to_none`` (what benchmarks/kernels.py times a step with): each call's
    backward writes the gradient anew instead of adding to the last one's."""
    from kernelhub import timing

    x = torch.randn(5, requires_grad=True)
    calls = []

    def step():
        calls.append(None if x.grad is None else x.grad.clone())
        (x * 2).sum().backward()

    got = timing.timed(step, torch.device("cpu"), quick=True, grad_to_none=[x])
    assert got.ms > 0 and len(calls) > 2 and all(c is None for c in calls)
    torch.testing.assert_close(x.grad, torch.full((5,), 2.0))
    timing.timed(step, torch.device("cpu"), quick=True)  # without: the gradient adds up
    assert x.grad[0] > 2.0


def test_a_call_the_tuner_cannot_judge_is_served_and_its_candidates_recorded_with_the_reason(tmp_path, monkeypatch):
    """The tuner's fresh inputs for a root:100 semiconv overflow float32, so eager torch's own error is infinite and no
    tolerance exists (it raised OverflowError from the call, in online mode, and from `kernelhub tune`): the call is
    served, every candidate but the reference is recorded as not judged with the reason, and none wins."""
    cache = tmp_path / "w.json"
    (tmp_path / "kernelhub.toml").write_text(f'[tune]\nmode = "online"\ncache = "{cache}"\n')
    monkeypatch.setenv("KERNELHUB_CONFIG", str(tmp_path / "kernelhub.toml"))
    monkeypatch.setenv("KERNELHUB_DISABLE", "inductor")
    kernelhub.reload()
    g = torch.Generator().manual_seed(0)
    img, kernel = torch.rand(1, 2, 16, 16, generator=g), torch.rand(2, 1, 3, 3, generator=g)
    out = kernelhub.op("semiconv")(img, kernel, "root:100", 1, 1, 1, 2, "corr")
    want = kernelhub.op("semiconv", backend="torch_ref")(img, kernel, "root:100", 1, 1, 1, 2, "corr")
    torch.testing.assert_close(out, want, rtol=1e-4, atol=0)
    (entry,) = WinnerCache(cache).entries().values()
    assert entry["winner"] is None
    others = {n: c for n, c in entry["candidates"].items() if n != "torch_ref"}
    assert all(c["error"].startswith("could not be judged: ValueError: eager torch's own error against float64 is inf")
               for c in others.values()), others


def _entry(**changes):
    entry = {"op": "tv_loss_l1_3d", "device": "cpu", "dtype": "float32", "bucket": "[2, 4, 4, 4]", "call": "x",
             "torch": torch.__version__, "tuned": "2026-11-28T00:00:00", "winner": "torch_ref",
             "candidates": {"torch_ref": {"error": None, "step_ms": 1.0}, "cuda_ext": {"error": None, "step_ms": 2.0}}}
    return {**entry, **changes}


@pytest.mark.parametrize("edit, kept", [({"winner": "nope"}, False), ({"winner": "[/]"}, False), ({"op": 5}, False),
                                        ({"device": 7}, False), ({"winner": 3}, False), ({"device": "[/]"}, True),
                                        ({"candidates": {"torch_ref": {"error": "failed parity"}}}, True),
                                        ({"candidates": {"[/]": {"error": None, "step_ms": 1.0}}, "winner": "[/]"},
                                         True)])
def test_kernelhub_list_reads_a_hand_edited_winners_file(edit, kept, tmp_path):
    """An entry edited to a winner that is not one of its candidates, or a number where text belongs, is ignored with
    one warning naming it (`kernelhub list` ended in a KeyError or TypeError); text from the file is printed as it
    is, never read as rich markup, dict keys included (a MarkupError)."""
    cache = tmp_path / "w.json"
    cache.write_text(json.dumps({"format": winners.FORMAT, "entries": {"good": _entry(), "edited": _entry(**edit)}}))
    (tmp_path / "kernelhub.toml").write_text(f'[tune]\ncache = "{cache}"\n')
    env = dict(os.environ, KERNELHUB_CONFIG=str(tmp_path / "kernelhub.toml"), COLUMNS="200")
    ran = harness.run([sys.executable, "-m", "kernelhub.cli", "list"], timeout=300, env=env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ("malformed entries ignored ('edited')" in ran.stderr) != kept, ran.stderr
    if kept and "device" in edit:
        assert "tuned winners on [/]" in ran.stdout
    assert "tuned winners on cpu" in ran.stdout


def test_stale_entries_are_named_with_the_fix_and_pruned(tmp_path):
    """After a plugin is removed, every process warned that the winners file names its backend, with no hint: the
    warning names `kernelhub tune --prune`, whose --dry-run lists what it would remove and changes nothing, and which
    then removes the unknown op's entry and the unknown backend's candidates (its winner too); the warning is gone."""
    cache = tmp_path / "w.json"
    numpyish = _entry(winner="numpyish", candidates={"torch_ref": {"error": None, "step_ms": 2.0},
                                                     "numpyish": {"error": None, "step_ms": 1.0}})
    content = json.dumps({"format": winners.FORMAT, "entries": {
        "tv_loss_l1_3d|cpu|float32|[2, 4, 4, 4]": numpyish, "gone_op|cpu|float32|[4]": _entry(op="gone_op")}})
    cache.write_text(content)
    (tmp_path / "kernelhub.toml").write_text(f'[tune]\ncache = "{cache}"\n')
    env = dict(os.environ, KERNELHUB_CONFIG=str(tmp_path / "kernelhub.toml"), COLUMNS="200")

    def cli_run(*args):
        ran = harness.run([sys.executable, "-m", "kernelhub.cli", *args], timeout=300, env=env, cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr[-3000:]
        return ran

    listed = cli_run("list")
    assert "backend 'numpyish', unknown here" in listed.stderr and "kernelhub tune --prune" in listed.stderr
    dry = cli_run("tune", "--prune", "--dry-run")
    assert "would remove 2 stale item(s)" in dry.stdout and "gone_op" in dry.stdout and "numpyish" in dry.stdout
    assert cache.read_text() == content
    cli_run("tune", "--prune")
    entries = json.loads(cache.read_text())["entries"]
    assert list(entries) == ["tv_loss_l1_3d|cpu|float32|[2, 4, 4, 4]"]
    (entry,) = entries.values()
    assert set(entry["candidates"]) == {"torch_ref"} and entry["winner"] is None
    assert "unknown here" not in cli_run("list").stderr


def test_tune_and_explain_say_what_their_figures_are(hub, capsys):
    """"1.59x, slower in 9/9 rounds, t 4.1" beside two medians: the table that prints such figures says under it
    what each is (the median of per-round ratios, the rounds, Student's t), as a user at 80 columns reads it."""
    hub()
    assert cli.main(["tune", "tv_loss_sq_3d", "--shape", "1,8,8,8", "--quick", "--device", "cpu"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "slower in" in out and "the median over the timed rounds" in out and "Student's t" in out
    assert cli.main(["explain", "tv_loss_sq_3d", "--shape", "1,8,8,8", "--device", "cpu"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "rounds" in out and "the median over the timed rounds" in out


def test_a_hub_built_directly_checks_parity_through_its_own_operators(tv_backend_hub):
    """The tuner of a `Hub(...)` built directly times candidates on that hub's handles and checks their parity
    through that hub's operators (its key), not the global hub's: a backend only that hub has passes parity and can
    win there; the global hub, which lacks it, is never asked to run it."""
    ref = kernelhub.get_hub().registry.impls("tv_loss_l1_3d")["torch_ref"]
    hub = tv_backend_hub("its_own", ref.forward, ref.backward)
    assert "its_own" not in kernelhub.get_hub().registry.backends
    spec = hub.registry.spec("tv_loss_l1_3d")
    args = spec.normalize(torch.randn(2, 5, 6, 7, dtype=torch.float64))
    entry = hub.selector.tuning.tune("tv_loss_l1_3d", args, ["its_own", "torch_ref"], save=False)
    assert entry["candidates"]["its_own"]["error"] is None, entry["candidates"]["its_own"]
    assert hub.selector.tuning.verify("tv_loss_l1_3d", args, "its_own") is None


def _tune_quick(tmp_path, cache: str):
    (tmp_path / "kernelhub.toml").write_text(f'[tune]\ncache = "{cache}"\n')
    kernelhub.reload()
    return cli.main(["tune", "tv_loss_sq_3d", "--quick", "--shape", "1,8,8,8", "--json"])



@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlinked_winners_file_is_written_through_the_link(tmp_path, dangling, capsys):
    shared = tmp_path / "shared" / "tuning.json"
    shared.parent.mkdir()
    if not dangling:
        shared.write_text(json.dumps({"format": "kernelhub-tuning/1", "entries": {}}))
    link = tmp_path / "link.json"
    link.symlink_to(shared)
    _tune_quick(tmp_path, str(link))
    assert link.is_symlink() and os.readlink(link) == str(shared)
    assert shared.is_file() and json.loads(shared.read_text())["entries"], "the shared file got no entry"



def test_a_read_only_winners_file_is_left_untouched(tmp_path, capsys):
    path = tmp_path / "tuning.json"
    text = json.dumps({"format": "kernelhub-tuning/1", "entries": {}})
    path.write_text(text)
    path.chmod(0o444)
    with pytest.warns(RuntimeWarning, match="read-only"):
        rc = _tune_quick(tmp_path, str(path))
    assert rc == 1
    assert path.read_text() == text and stat.S_IMODE(path.stat().st_mode) == 0o444



@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "/dev/null"])
def test_a_winners_path_that_is_not_a_regular_file_is_not_ours_and_never_blocks(tmp_path, special):
    if special == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)
    else:
        path = special
    (tmp_path / "kernelhub.toml").write_text(f'[tune]\ncache = "{path}"\nmode = "cached"\n')
    result = []
    def call():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kernelhub.reload()
            result.append((kernelhub.op("tv_loss_sq_3d")(torch.randn(2, 3, 4)),
                           [str(w.message) for w in caught]))
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the call blocked on the winners path"
    assert result and any("not a regular file" in m for m in result[0][1]), result



@pytest.mark.parametrize("candidate", [{"step_ms": 1.0}, {"error": None, "step_ms": 1.0, "step_spread": "wide"},
                                       {"error": None, "step_ms": 1.0, "forward_ms": "x"}])
@pytest.mark.parametrize("within", [None, "torch_ref", [1, 2]])
def test_a_malformed_winners_entry_is_dropped_with_a_warning_naming_the_file(tmp_path, candidate, within):
    from kernelhub.winners import entry_key

    v = torch.randn(1, 8, 8, 8)
    key = entry_key("tv_loss_sq_3d", (v,))
    entry = {"candidates": {"torch_ref": candidate, "cuda_ext": {"error": None, "step_ms": 0.5}}}
    if within is not None:
        entry["within_noise"] = within
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"format": "kernelhub-tuning/1", "entries": {key: entry}}))
    (tmp_path / "kernelhub.toml").write_text(f'[tune]\ncache = "{path}"\n')
    kernelhub.reload()
    with pytest.warns(RuntimeWarning, match=f"tuning cache {path}: 1 malformed entr"):
        out = kernelhub.op("tv_loss_sq_3d")(v)
    torch.testing.assert_close(out, kernelhub.op("tv_loss_sq_3d", backend="torch_ref")(v))
    assert cli.main(["list", "--json"]) == 0



@pytest.mark.parametrize("mode", ["online", "cached"])
def test_expanded_inputs_tune_and_keep_their_bucket_for_contiguous_calls(tmp_path, mode, monkeypatch):
    """A stride-0 (expanded) input: online tuning times it (fresh inputs of its layout, not written into its
    overlapping memory), and a cached winner checked on such a call still serves the bucket's contiguous ones."""
    monkeypatch.setenv("KERNELHUB_DISABLE", "inductor")
    (tmp_path / "kernelhub.toml").write_text(f'[tune]\nmode = "{mode}"\ncache = "{tmp_path / "t.json"}"\n')
    kernelhub.reload()
    expanded = torch.randn(1, 1, 1, 64).expand(2, 8, 8, 64)
    if mode == "cached":
        assert cli.main(["tune", "tv_loss_sq_3d", "--quick", "--shape", "2,8,8,64"]) in (0, 1)
        kernelhub.reload()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(kernelhub.op("tv_loss_sq_3d")(expanded),
                                   kernelhub.op("tv_loss_sq_3d", backend="torch_ref")(expanded))
        dense = expanded.contiguous()
        decision = kernelhub.explain("tv_loss_sq_3d", dense)
    assert not any("parity" in r for c in decision.candidates for r in c.reasons), str(decision)
