import os
import re
import sys
import textwrap
import tomllib
from pathlib import Path

import harness
import pytest
import torch

import kernelhub
from kernelhub.config import DEFAULT_PRIORITY, SHIPPED, Config, OpConfig, TuneConfig, load_config
from kernelhub.errors import ConfigError
from kernelhub.registry import declared_backend_names

KNOWN = declared_backend_names()


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_defaults_are_the_shipped_file_and_a_user_file_merges_over_it(tmp_path):
    """The shipped kernelhub/kernelhub.toml is the defaults; a user's file replaces its keys, merging [tune] key by
    key (each [ops.<op>] table too: the next test)."""
    default = load_config(KNOWN)
    assert default.source.startswith("shipped defaults") and str(SHIPPED) in default.source
    assert (default.kill_switch, default.strict, default.disabled, default.priority, default.tune.mode) == \
           (False, False, frozenset(), DEFAULT_PRIORITY, "cached")
    assert default.op("tv_loss_l1_3d").pin == "" and default.op("tv_loss_l1_3d").priority == ()
    assert default.op("kplanes_interp_tilted_taps").priority == ()
    assert default.op("kplanes_interp_tilted_taps").sizes == ((4_194_304, ("triton",)),)
    assert default.op("tv_loss_l1_3d").sizes == ((67_108_864, ("triton",)),)
    assert default.op("semiconv").priority == ("triton",)
    # K-Planes: one crossing by points x T x C (the spec's size measure) on both GPUs measured, no device's own
    # ranges; the multiscale op sums C over its scales, so its crossing is twice the others' (4,194,304 there is
    # B=16384 at T 4, C 32 on two scales: cuda_ext)
    backends = ["torch_ref", "cuda_ext", "triton"]
    for op, crossing in (("kplanes_interp_tilted", 4_194_304), ("kplanes_interp_tilted_ms", 8_388_608),
                         ("kplanes_interp_tilted_taps", 4_194_304)):
        assert not default.op(op).device_sizes, op
        for elements, first in ((2 * 1024 * 1024, "cuda_ext"), (crossing - 1, "cuda_ext"), (crossing, "triton"),
                                (16 * 1024 * 1024, "triton")):
            assert {default.priority_for(op, backends, "torch_ref", elements=elements, device=d)[0]
                    for d in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "")} == {first}, (op, elements)
    user = load_config(KNOWN, write(tmp_path / "kernelhub.toml", """
        priority = ["torch_ref"]
        [tune]
        cache = "/x/winners.json"
        """))
    assert user.priority == ("torch_ref",)
    assert user.tune.mode == "cached" and user.tune.cache == "/x/winners.json"
    assert default.compile_priority == ("inductor", "triton") and user.compile_priority == ("inductor", "triton")
    nothing = load_config(KNOWN, write(tmp_path / "kernelhub.toml", "[compile]\npriority = []\n"))
    assert nothing.compile_priority == () and nothing.as_dict()["compile"] == {"priority": []}


def test_each_shipped_per_op_preference_says_where_it_was_measured():
    """A per-op priority or size range in the shipped file is a measurement: the file's measurements block
    (generated from docs/results/ by scripts/bench_report.py; tests/test_docs.py checks it is what that renders)
    names the device, the date and the commit, and has a line for every op the file orders on its own."""
    text = SHIPPED.read_text()
    ordered = {op for op, table in tomllib.loads(text)["ops"].items()
               if table.get("priority") or table.get("sizes") or table.get("cases")}
    assert {"semiconv", "tikhonov_inverse_2xn", "tv_loss_sq_3d", "kplanes_interp_tilted"} <= ordered
    block = text[text.index("# >>> measured"):text.index("# <<< measured")]
    assert "Measured on an NVIDIA" in block and re.search(r"20\d\d-\d\d-\d\d, commit [0-9a-f]{7}", block)
    for op in ordered:
        assert re.search(rf"^#   {op}: ", block, re.M), f"{op} has no line in kernelhub.toml's measurements block"


def test_a_files_own_op_priority_replaces_the_built_in_one_and_a_pin_alone_keeps_it(tmp_path):
    write(tmp_path / "kernelhub.toml", """
        priority = ["cuda_ext", "torch_ref"]
        [ops.kplanes_interp_tilted]
        priority = ["cuda_ext"]
        [ops.kplanes_interp_tilted_ms]
        pin = "torch_ref"
    """)
    cfg = load_config(KNOWN, tmp_path / "kernelhub.toml")
    assert cfg.op("kplanes_interp_tilted").priority == ("cuda_ext",) and cfg.op("kplanes_interp_tilted").sizes == ()
    assert cfg.op("kplanes_interp_tilted_ms") == kernelhub.config.OpConfig(pin="torch_ref",
                                                                           sizes=((8_388_608, ("triton",)),))
    # the global list alone does not replace the op's size ranges
    assert cfg.priority_for("kplanes_interp_tilted_taps", ["torch_ref", "cuda_ext", "triton"], "torch_ref",
                            elements=4_194_304) == ["triton", "cuda_ext", "torch_ref"]
    assert cfg.priority_for("kplanes_interp_tilted_taps", ["torch_ref", "cuda_ext", "triton"], "torch_ref",
                            elements=4_194_303) == ["cuda_ext", "triton", "torch_ref"]


def test_a_case_priority_merges_case_by_case_and_an_op_priority_alone_drops_the_shipped_cases(tmp_path):
    """The shipped file orders semiconv's tropical_2d_depthwise case on its own. A user's [ops.semiconv] pin keeps
    it, a user's case table replaces that case's, and a user's op priority without cases drops the shipped cases:
    the user's order then holds for every call of the op."""
    shipped = load_config(KNOWN).op("semiconv")
    assert shipped.cases == {"tropical_2d_depthwise": ("cuda_ext", "triton")}
    assert load_config(KNOWN).priority_for("semiconv", ["torch_ref", "triton", "cuda_ext"], "torch_ref",
                                           "tropical_2d_depthwise") == ["cuda_ext", "triton", "torch_ref"]
    assert load_config(KNOWN).priority_for("semiconv", ["torch_ref", "triton", "cuda_ext"], "torch_ref") == \
        ["triton", "cuda_ext", "torch_ref"]
    # the small, host-bound calls go to triton first, the case's too; from 4,194,304 elements the case decides
    for elements, first in ((4096, "triton"), (4_194_303, "triton"), (4_194_304, "cuda_ext"), (33_554_432, "cuda_ext")):
        for device in ("", "NVIDIA H200", "NVIDIA H100 80GB HBM3"):
            assert load_config(KNOWN).priority_for("semiconv", ["torch_ref", "triton", "cuda_ext"], "torch_ref",
                                                   "tropical_2d_depthwise", elements, device)[0] == first
    pinned = load_config(KNOWN, write(tmp_path / "a.toml", "[ops.semiconv]\npin = 'torch_ref'\n")).op("semiconv")
    assert pinned.cases == shipped.cases and pinned.priority == ("triton",)
    case = load_config(KNOWN, write(tmp_path / "b.toml", """
        [ops.semiconv.cases.tropical_2d_depthwise]
        priority = ["torch_ref"]
        """)).op("semiconv")
    assert case.cases == {"tropical_2d_depthwise": ("torch_ref",)} and case.priority == ("triton",)
    own = load_config(KNOWN, write(tmp_path / "c.toml", "[ops.semiconv]\npriority = ['cuda_ext']\n")).op("semiconv")
    assert own.cases == {} and own.sizes == () and own.priority == ("cuda_ext",)


def test_size_ranges_order_calls_by_their_elements_and_explain_names_the_range(tmp_path):
    """[[ops.<op>.sizes]]: the range with the largest min_elements a call reaches orders it first (an empty
    priority ends the range below); a file's own sizes replace the shipped ones whole; explain names the range."""
    path = write(tmp_path / "kernelhub.toml", """
        [[ops.tv_loss_sq_3d.sizes]]
        min_elements = 4096
        priority = ["torch_ref"]
        [[ops.tv_loss_sq_3d.sizes]]
        min_elements = 100
        priority = ["cuda_ext", "torch_ref"]
        [[ops.tv_loss_sq_3d.sizes]]
        min_elements = 10_000
        priority = []
    """)
    cfg = load_config(KNOWN, path)
    assert cfg.op("tv_loss_sq_3d").sizes == ((100, ("cuda_ext", "torch_ref")), (4096, ("torch_ref",)), (10_000, ()))
    order = lambda n: cfg.priority_for("tv_loss_sq_3d", ["torch_ref", "cuda_ext"], "torch_ref", elements=n)  # noqa
    assert [order(n) for n in (99, 100, 4095, 4096, 9999, 10_000)] == [["cuda_ext", "torch_ref"]] * 3 + [
        ["torch_ref", "cuda_ext"]] * 2 + [["cuda_ext", "torch_ref"]]
    with pytest.MonkeyPatch.context() as m:
        m.setenv("KERNELHUB_CONFIG", str(path))
        with kernelhub.scoped():
            for shape, chosen, named in (((1, 16, 16, 16), "torch_ref", "calls of >= 4,096 elements, this one 4,096"),
                                         ((1, 8, 8, 8), "cuda_ext", "calls of >= 100 elements, this one 512"),
                                         ((1, 4, 4, 4), "cuda_ext", None)):
                decision = kernelhub.explain("tv_loss_sq_3d", torch.randn(shape))
                reason = decision.candidates[0].reasons[0]
                assert decision.chosen == chosen and ((named in reason) if named else "elements" not in reason)
    path.write_text("[[ops.tv_loss_sq_3d.sizes]]\nmin_elements = 1\npriority = [\"torch_ref\"]\n")
    with pytest.MonkeyPatch.context() as m:  # a range from the smallest call: no ">= 1 elements"
        m.setenv("KERNELHUB_CONFIG", str(path))
        with kernelhub.scoped():
            reason = kernelhub.explain("tv_loss_sq_3d", torch.randn(2, 3, 4)).candidates[0].reasons[0]
            assert "tv_loss_sq_3d calls from the smallest size, this one 24 elements" in reason, reason


def test_a_spec_s_size_measure_places_its_calls_in_the_size_ranges(tmp_path):
    """An op whose spec measures its calls (`OpSpec.size`; the K-Planes ops: points x T x C, docs/ops.md) is placed
    in its size ranges by that number, not by its first tensor's elements; explain prints it."""
    spec = kernelhub.get_hub().registry.spec("kplanes_interp_tilted_ms")
    pts, rot = torch.rand(10, 3) * 2 - 1, torch.eye(3).expand(2, 3, 3).contiguous()
    planes = [torch.rand(6, 4, 8, 8), torch.rand(6, 8, 4, 4)]
    assert spec.size_of((pts, rot, planes)) == 10 * 2 * (4 + 8)  # not the points' 30 elements
    assert kernelhub.get_hub().registry.spec("tv_loss_l1_3d").size_of((torch.rand(2, 3, 4, 5),)) == 120
    path = write(tmp_path / "kernelhub.toml", """
        [[ops.kplanes_interp_tilted_ms.sizes]]
        min_elements = 200
        priority = ["torch_ref"]
    """)
    with pytest.MonkeyPatch.context() as m:
        m.setenv("KERNELHUB_CONFIG", str(path))
        with kernelhub.scoped():
            decision = kernelhub.explain("kplanes_interp_tilted_ms", pts, rot, planes)
            assert decision.chosen == "torch_ref", str(decision)
            assert "calls of >= 200 elements, this one 240" in decision.candidates[0].reasons[0], str(decision)
            decision = kernelhub.explain("kplanes_interp_tilted_ms", pts[:8], rot, planes)  # 192: below the range
            assert "elements" not in decision.candidates[0].reasons[0], str(decision)


def test_a_size_range_naming_a_device_serves_only_there_and_replaces_the_op_s_other_ranges(tmp_path):
    """``device = "..."``: the op's ranges naming a text the device's name contains serve its calls instead of the
    ranges naming none; on any other device those serve. explain names the device's range."""
    text = "cpu"  # part of every CPU's name here (kernelhub.timing.device_model): "cpu <model> (N threads)"
    path = write(tmp_path / "kernelhub.toml", f"""
        [[ops.tv_loss_sq_3d.sizes]]
        min_elements = 100
        priority = ["torch_ref"]
        [[ops.tv_loss_sq_3d.sizes]]
        min_elements = 4096
        priority = ["torch_ref"]
        device = "{text}"
        [[ops.tv_loss_sq_3d.sizes]]
        min_elements = 100
        priority = ["cuda_ext"]
        device = "H100"
    """)
    cfg = load_config(KNOWN, path)
    table = cfg.op("tv_loss_sq_3d")
    assert table.sizes == ((100, ("torch_ref",)),)
    assert dict(table.device_sizes) == {text: ((4096, ("torch_ref",)),), "H100": ((100, ("cuda_ext",)),)}
    order = lambda n, device: cfg.priority_for("tv_loss_sq_3d", ["torch_ref", "cuda_ext"], "torch_ref",  # noqa
                                               elements=n, device=device)
    assert order(512, "cpu Intel Xeon (2 threads)") == ["cuda_ext", "torch_ref"]  # under its own range's 4096
    assert order(4096, "cpu Intel Xeon (2 threads)") == ["torch_ref", "cuda_ext"]
    assert order(512, "NVIDIA H100 80GB HBM3") == ["cuda_ext", "torch_ref"]
    assert order(512, "NVIDIA H200") == ["torch_ref", "cuda_ext"]  # no range names it: those naming none
    assert [r for r in cfg.as_dict()["ops"]["tv_loss_sq_3d"]["sizes"] if r.get("device") == "H100"] == [
        {"min_elements": 100, "priority": ["cuda_ext"], "device": "H100"}]
    with pytest.MonkeyPatch.context() as m:
        m.setenv("KERNELHUB_CONFIG", str(path))
        with kernelhub.scoped():
            small = kernelhub.explain("tv_loss_sq_3d", torch.randn(1, 8, 8, 8))  # 512: the CPU's range starts at 4096
            assert small.chosen == "cuda_ext" and "elements" not in small.candidates[0].reasons[0]
            large = kernelhub.explain("tv_loss_sq_3d", torch.randn(1, 16, 16, 16))
            assert large.chosen == "torch_ref"
            assert f"calls of >= 4,096 elements on {text} (cpu " in large.candidates[0].reasons[0]


@pytest.mark.parametrize("sizes, message", [
    ("min_elements = 0\npriority = ['triton']", "min_elements: expected a whole number >= 1, got 0"),
    ("min_elements = true\npriority = ['triton']", "min_elements: expected a whole number >= 1, got True"),
    ("priority = ['triton']", "min_elements: expected a whole number >= 1, got None"),
    ("min_elements = 5\npriority = ['tritonn']", "unknown backend 'tritonn'"),
    ("min_elements = 5\nprio = []", "unknown key 'prio'; allowed keys: \\['device', 'min_elements', 'priority'\\]"),
    ("min_elements = 5\n[[ops.tv_loss_l1_3d.sizes]]\nmin_elements = 5", "5 is given twice"),
    ("min_elements = 5\ndevice = 'H100'\n[[ops.tv_loss_l1_3d.sizes]]\nmin_elements = 5\ndevice = 'H100'",
     "5 is given twice for device 'H100'"),
    ("min_elements = 5\ndevice = ' '", "device: expected part of a device's name"),
    ("min_elements = 5\ndevice = 100", "device: expected str"),
])
def test_a_bad_size_range_is_an_error_naming_the_file_op_and_key(tmp_path, sizes, message):
    path = write(tmp_path / "kernelhub.toml", "[[ops.tv_loss_l1_3d.sizes]]\n" + sizes + "\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: [[ops.tv_loss_l1_3d.sizes]] #") + ".*" + message):
        load_config(KNOWN, path)


def test_an_unknown_case_is_an_error_naming_the_op_and_its_cases(tmp_path):
    write(tmp_path / "kernelhub.toml", "[ops.semiconv.cases.depthwise]\npriority = ['cuda_ext']\n")
    with pytest.raises(ConfigError, match=r"\[ops.semiconv.cases.depthwise\]: unknown case; the cases of semiconv: "
                                          r"\['tropical_2d_depthwise'\]"):
        kernelhub.reload()
    write(tmp_path / "kernelhub.toml", "[ops.tv_loss_l1_3d.cases.small]\npriority = ['cuda_ext']\n")
    with pytest.raises(ConfigError, match=r"\[ops.tv_loss_l1_3d.cases.small\]: unknown case; the cases of "
                                          r"tv_loss_l1_3d: \[\]"):
        kernelhub.reload()


def test_lookup_order(tmp_path, monkeypatch):
    user = write(tmp_path / "xdg" / "kernelhub" / "kernelhub.toml", "strict = true\n")
    assert load_config(KNOWN).source == str(user)
    local = write(tmp_path / "kernelhub.toml", "kill_switch = true\n")
    assert load_config(KNOWN).source == str(local)
    env = write(tmp_path / "elsewhere.toml", "disabled = ['triton']\n")
    monkeypatch.setenv("KERNELHUB_CONFIG", str(env))
    cfg = load_config(KNOWN)
    assert cfg.source == str(env) and cfg.disabled == {"triton"}
    monkeypatch.setenv("KERNELHUB_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="KERNELHUB_CONFIG=.*no such file"):
        load_config(KNOWN)


@pytest.mark.parametrize("text, message", [
    ("priorty = []", "unknown key 'priorty'; allowed keys: \\['compile', 'disabled', 'kill_switch', 'lock', 'ops', "
                     "'priority', 'strict', 'tune'\\]"),
    ("[compile]\npriority = ['trition']", "\\[compile\\].priority: unknown backend 'trition'"),
    ("[compile]\norder = []", "\\[compile\\]: unknown key 'order'; allowed keys: \\['priority'\\]"),
    ("[tune]\nmode = 'always'", "\\[tune\\].mode: 'always'; allowed: \\['off', 'cached', 'online'\\]"),
    ("[tune]\ncache = 3", "\\[tune\\].cache: expected str"),
    ("strict = 'yes'", "strict: expected bool, got str"),
    ("priority = ['trition']", "priority: unknown backend 'trition'; allowed: \\["),
    ("disabled = 'triton'", "disabled: expected list"),
    ("[ops.tv_loss_l1_3d]\npin = 'nope'", "\\[ops.tv_loss_l1_3d\\].pin: unknown backend 'nope'"),
    ("[ops.tv_loss_l1_3d]\npinned = 'triton'",
     "unknown key 'pinned'; allowed keys: \\['cases', 'pin', 'priority', 'sizes'\\]"),
    ("kill_switch = ", "not valid TOML"),
    ("ops = 3", "kernelhub.toml: ops: expected a table, got int 3"),  # not "kernelhub.toml.ops"
    ("priority = ['triton', 'torch_ref', 'triton']", "priority: backend 'triton' is listed twice"),
    ("[ops.semiconv]\npriority = ['cuda_ext', 'cuda_ext']", "priority: backend 'cuda_ext' is listed twice"),
    ("[ops.semiconv.cases.tropical_2d_depthwise]\npriority = ['cuda']",
     "\\[ops.semiconv.cases.tropical_2d_depthwise\\].priority: unknown backend 'cuda'"),
    ("[ops.semiconv.cases.tropical_2d_depthwise]\npin = 'cuda_ext'",
     "\\[ops.semiconv.cases.tropical_2d_depthwise\\]: unknown key 'pin'; allowed keys: \\['priority'\\]"),
    ("[ops.semiconv]\ncases = 3", "\\[ops.semiconv\\].cases: expected a table, got int 3"),
    ("[ops.semiconv.cases]\ntropical_2d_depthwise = 3",
     "\\[ops.semiconv.cases.tropical_2d_depthwise\\]: expected a table with keys \\['priority'\\]"),
])
def test_schema_errors_name_file_key_and_allowed_values(tmp_path, text, message):
    path = write(tmp_path / "kernelhub.toml", text + "\n")
    with pytest.raises(ConfigError, match=message) as info:
        load_config(KNOWN)
    assert str(path) in str(info.value)


def test_unknown_op_in_config(tmp_path):
    write(tmp_path / "kernelhub.toml", "[ops.tv_loss_l2]\npin = 'torch_ref'\n")
    with pytest.raises(ConfigError, match=r"\[ops.tv_loss_l2\]: unknown op"):
        kernelhub.reload()


def test_uninstalled_first_party_backend_may_be_named(tmp_path, monkeypatch):
    from kernelhub import registry
    installed = registry._entry_points
    monkeypatch.setattr(registry, "_entry_points", lambda: [e for e in installed() if e.name != "cuda_ext"])
    write(tmp_path / "kernelhub.toml", "priority = ['cuda_ext', 'torch_ref']\n[ops.semiconv]\npin = 'cuda_ext'\n")
    hub = kernelhub.reload()
    assert hub.config.priority == ("cuda_ext", "torch_ref")
    assert hub.registry.unavailable_reason("cuda_ext") == "not installed"


def test_tuning_cache_default_location_and_override(tmp_path, monkeypatch):
    from conftest import DEFAULT_CACHE_PATH
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert DEFAULT_CACHE_PATH(load_config(KNOWN).tune) == tmp_path / "cache" / "kernelhub" / "tuning.json"
    write(tmp_path / "kernelhub.toml", "[tune]\nmode = 'online'\ncache = '~/winners.json'\n")
    cfg = load_config(KNOWN)
    assert cfg.tune.mode == "online" and cfg.tune.cache_path() == Path("~/winners.json").expanduser()


def test_a_file_that_is_not_utf8_is_a_config_error_naming_it(tmp_path):
    path = tmp_path / "kernelhub.toml"
    path.write_bytes(b"strict = true\n# \xff\xfe\n")
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load_config(KNOWN)
    assert str(path) in str(info.value)


def test_a_scoped_hub_lasts_for_its_block_and_the_hub_before_it_comes_back(tmp_path):
    """`kernelhub.scoped`: handles of `kernelhub.op` run on the block's own hub (its config), a `reload` inside the
    block lasts until its end, and after it the global hub of before is back, the same object, with its config;
    compiled graphs are told (the generation) where the configs differ."""
    from kernelhub import _state

    handle = kernelhub.op("tv_loss_l1_3d")
    before = kernelhub.get_hub()
    token = _state.GENERATION.token
    pinned = kernelhub.config.parse_config({"ops": {"tv_loss_l1_3d": {"pin": "torch_ref"}}}, "test",
                                           kernelhub.registry.declared_backend_names())
    v = torch.randn(2, 5, 6, 7)
    with kernelhub.scoped(config=pinned) as hub:
        assert kernelhub.get_hub() is hub is not before
        assert _state.GENERATION.token != token  # another config: graphs recompile
        assert kernelhub.explain("tv_loss_l1_3d", v).chosen == "torch_ref"
        torch.testing.assert_close(handle(v), kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(v))
        kernelhub.reload()
        assert kernelhub.get_hub() is not hub
    assert kernelhub.get_hub() is before and before.key == 0
    assert before.config.op("tv_loss_l1_3d").pin == ""
    with kernelhub.scoped() as same:  # the same config and plugins: no recompile
        token = _state.GENERATION.token
    assert same is not before and _state.GENERATION.token == token


@pytest.mark.parametrize("variable, value", [("KERNELHUB_EAGER_FAST_PATH", "maybe"), ("KERNELHUB_EAGER_FAST_PATH", "2"),
                                             ("KERNELHUB_KILL_SWITCH", "maybe"), ("KERNELHUB_DISABLE", "nope"),
                                             ("KERNELHUB_CONFIG", "/nonexistent/kernelhub.toml")])
def test_a_bad_environment_value_is_a_usage_error_of_every_command(variable, value, tmp_path):
    """A configuration error exits 2 with its message on stderr and no traceback, whatever its source: a variable read
    at import (the fast path's switch) too, which once ended every command in a traceback, exit 1."""
    env = dict(os.environ, **{variable: value})
    for command in (["list"], ["doctor"], ["explain", "tv_loss_l1_3d", "--shape", "2,4,4,4"]):
        ran = harness.run([sys.executable, "-m", "kernelhub.cli", *command], timeout=300, env=env, cwd=tmp_path)
        assert ran.returncode == 2 and variable in ran.stderr and "Traceback" not in ran.stderr, (command, ran.stderr)


@pytest.mark.parametrize("make, says", [
    (lambda: Config(ops=[]), r"ops: expected a mapping of op name -> OpConfig, got list \[\]"),
    (lambda: Config(ops={"tv_loss_l1_3d": OpConfig(cases=[])}), r"ops\['tv_loss_l1_3d'\].cases: expected a mapping"),
    (lambda: Config(disabled=None), "disabled: expected a tuple of backend names .* got NoneType None"),
    (lambda: Config(priority=None), "priority: expected a tuple of backend names"),
    (lambda: Config(disabled="cuda_ext"), "disabled: expected a tuple of backend names .* got str 'cuda_ext'"),
    (lambda: Config(priority="cuda_ext"), "priority: expected a tuple of backend names .* got str 'cuda_ext'"),
    (lambda: Config(compile_priority="inductor"), "compile_priority: expected a tuple of backend names"),
    (lambda: Config(ops={"tv_loss_l1_3d": OpConfig(priority="torch_ref")}),
     r"ops\['tv_loss_l1_3d'\].priority: expected a tuple of backend names .* got str 'torch_ref'"),
    (lambda: Config(ops={"tv_loss_l1_3d": OpConfig(sizes=((10, "torch_ref"),))}),
     r"ops\['tv_loss_l1_3d'\].sizes\[10\]: expected a tuple of backend names .* got str 'torch_ref'"),
    (lambda: Config(ops={"tv_loss_l1_3d": OpConfig(sizes=(10,))}),
     r"\.sizes: expected \(min_elements >= 1, backends\)"),
    (lambda: Config(ops={"tv_loss_l1_3d": OpConfig(pin=3)}), r"\.pin: expected a backend name .* got 3")])
def test_a_config_built_in_code_is_checked_as_a_files_keys_are(make, says):
    """`kernelhub.reload(config=...)` and `Hub(config=...)`: a ConfigError naming the field, the type expected and the
    allowed values, where they raised AttributeError, TypeError, or "unknown backend 'c'" for a string's letters."""
    from kernelhub.hub import Hub

    config = make()
    with pytest.raises(ConfigError, match=says):
        kernelhub.reload(config=config)
    with pytest.raises(ConfigError, match=says):
        Hub(config=config)


def test_scoped_blocks_of_two_threads_cannot_overlap():
    """The global hub is the process's: thread A in a block, B entering one, A leaving, then B left B's kill switch on
    for good. Now B's entry raises, naming the fix (A here: this test's own block, tests/conftest.py's fresh_hub), and
    blocks of one thread nest, each restoring the hub of before it."""
    import threading

    from kernelhub.config import Config as Cfg

    with kernelhub.scoped(config=Cfg(strict=True)) as a:
        seen = []

        def b():
            try:
                with kernelhub.scoped(config=Cfg(kill_switch=True)):
                    seen.append("entered")
            except RuntimeError as exc:
                seen.append(str(exc))

        thread = threading.Thread(target=b)
        thread.start()
        thread.join(60)
        assert len(seen) == 1 and "another thread has a scoped block open" in seen[0] and "Hub(" in seen[0], seen
        assert kernelhub.get_hub() is a and not a.config.kill_switch
        with kernelhub.scoped(config=Cfg(kill_switch=True)) as inner:
            assert kernelhub.get_hub() is inner
        assert kernelhub.get_hub() is a


TWO_BACKENDS = '''
import torch
from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl
from kernelhub_torch_ref import plugin, tv

BACKWARD = plugin.vjp_backward(tv.tv_loss_l1_3d, (0,))

@hookimpl
def kernelhub_register_impls(registry):
    for name in ("{name}_ref", "{name}_fast"):
        registry.add_backend(Backend(name, "1.0"))
        registry.add_impl(Impl(op="tv_loss_l1_3d", backend=name, forward=tv.tv_loss_l1_3d, backward=BACKWARD,
                               dtypes=(torch.float32, torch.float64), devices=("cpu",), can={{"traceable"}}))
'''


def test_settings_name_each_backend_a_plugin_registers(install, tmp_path, monkeypatch):
    """One entry point, `tv2d`, registering backends `tv2d_ref` and `tv2d_fast`: every setting takes the backends'
    names (they were refused: "unknown backend 'tv2d_fast'; allowed: [..., 'tv2d']"), and naming the plugin instead
    is an error that lists its backends (`disabled = ["tv2d"]` was accepted and did nothing)."""
    install("tv2d", TWO_BACKENDS.replace("{{", "{").replace("}}", "}"))
    monkeypatch.setenv("KERNELHUB_CONFIG", str(tmp_path / "kernelhub.toml"))
    monkeypatch.setenv("KERNELHUB_DISABLE", "cuda_ext")
    v = torch.randn(2, 5, 6, 7)
    (tmp_path / "kernelhub.toml").write_text(textwrap.dedent("""
        priority = ["tv2d_fast", "torch_ref"]
        [compile]
        priority = ["tv2d_ref"]
        [ops.tv_loss_l1_3d]
        pin = "tv2d_ref"
        """))
    hub = kernelhub.reload()
    assert {"tv2d_ref", "tv2d_fast"} <= set(hub.registry.backends)
    assert kernelhub.explain("tv_loss_l1_3d", v).chosen == "tv2d_ref"  # the pin
    (tmp_path / "kernelhub.toml").write_text('priority = ["tv2d_fast", "tv2d_ref", "torch_ref"]\n')
    assert kernelhub.reload().explain("tv_loss_l1_3d", v).chosen == "tv2d_fast"
    monkeypatch.setenv("KERNELHUB_DISABLE", "cuda_ext,tv2d_fast")
    assert kernelhub.reload().explain("tv_loss_l1_3d", v).chosen == "tv2d_ref"
    monkeypatch.setenv("KERNELHUB_DISABLE", "cuda_ext")
    (tmp_path / "kernelhub.toml").write_text('disabled = ["tv2d"]\n')
    with pytest.raises(ConfigError, match=r"disabled: unknown backend 'tv2d' \('tv2d' is a plugin; settings name its "
                                          r"backends: tv2d_ref, tv2d_fast\)"):
        kernelhub.reload()


def test_config_objects_are_validated_like_files():
    with pytest.raises(ConfigError, match="kill_switch"):
        kernelhub.reload(config=Config(kill_switch="no"))
    with pytest.raises(ConfigError, match="mode"):
        kernelhub.reload(config=Config(tune=TuneConfig(mode="bogus")))
    with pytest.raises(ConfigError, match="nope"):
        kernelhub.reload(config=Config(priority=("nope",)))
    from kernelhub.config import OpConfig
    for device_sizes, says in (({"": ((5, ("triton",)),)}, "device_sizes: expected device text"),
                               ({"H100": ((5, ("nope",)),)}, r"device_sizes\['H100'\]\[5\].*nope"),
                               ({"H100": ((9, ()), (5, ()))}, r"device_sizes\['H100'\]: expected .* ascending")):
        with pytest.raises(ConfigError, match=says):
            kernelhub.reload(config=Config(ops={"tv_loss_l1_3d": OpConfig(device_sizes=device_sizes)}))



def test_a_deeply_nested_toml_and_a_nul_byte_are_config_errors(tmp_path):
    (tmp_path / "kernelhub.toml").write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError, match="kernelhub.toml"):
        kernelhub.reload()
    (tmp_path / "kernelhub.toml").write_text('[tune]\ncache = "a\\u0000b"\n')
    with pytest.raises(ConfigError, match="cache"):
        kernelhub.reload()
