"""kernelhub's modules import only downward: each module sits in a layer, and every kernelhub import in it
(at module level or inside a function) names a module of a lower layer. The runtime (everything up to the
package's own API) therefore never imports the test kit, the CLI or the benchmarks. A new module must be placed
in a layer here."""

import ast
import re
from pathlib import Path

import harness
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kernelhub"

LAYERS = [
    ["kernelhub.args"],  # a call's arguments: its tensors, the first one, its description (torch alone)
    # what everything reads: errors, declarations (a spec measures a call by its arguments), the hook contracts,
    # timing, argument checks
    ["kernelhub.errors", "kernelhub.spec", "kernelhub.hookspecs", "kernelhub.timing", "kernelhub.ops._checks"],
    ["kernelhub.config", "kernelhub.ops.tolerances", "kernelhub._glue", "kernelhub._state"],
    ["kernelhub.ops.tv", "kernelhub.ops.kplanes", "kernelhub.ops.semiconv", "kernelhub.ops.trilinear",
     "kernelhub.ops.tikhonov"],
    ["kernelhub.ops", "kernelhub.parity", "kernelhub.winners", "kernelhub.registry"],
    ["kernelhub.lock"],  # what a lock file holds, read and compared (the hub passed in, not imported)
    ["kernelhub.tune"],
    ["kernelhub.select"],
    ["kernelhub.dispatch"],  # reads the selector's generation (kernelhub.select.GENERATION) while dynamo traces
    ["kernelhub.hub"],
    ["kernelhub"],  # the package's API: op, explain, get_hub, ...; the runtime ends here
    # the conformance kit by subject, kernelhub.testing re-exporting it
    ["kernelhub.testing._core"],  # the tiers, cases, samples and runs
    ["kernelhub.testing.coverage", "kernelhub.testing.cuda"],  # what a check reached; CUDA safety
    ["kernelhub.testing.checks"],
    ["kernelhub.testing.checklist"],  # which checks a backend must pass
    ["kernelhub.nn._args"],  # the modules by subject, kernelhub.nn re-exporting them
    ["kernelhub.nn.kernels", "kernelhub.nn.semiconv"],
    ["kernelhub.nn.pnds"],
    ["kernelhub.nn", "kernelhub.testing", "kernelhub._probes"],  # _probes: Triton kernels bench times, nothing else
    ["kernelhub.bench", "kernelhub.testing.tolerances"],
    ["kernelhub.cli._common"],  # the commands by module, kernelhub.cli registering them
    ["kernelhub.cli.listing", "kernelhub.cli.explain", "kernelhub.cli.tune", "kernelhub.cli.bench",
     "kernelhub.cli.doctor", "kernelhub.cli.check", "kernelhub.cli.lock"],
    ["kernelhub.cli"],
    ["kernelhub.cli.__main__"],
]
RUNTIME_TOP = LAYERS.index(["kernelhub"])


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The kernelhub modules ``path`` imports: ``from kernelhub.x import y`` is kernelhub.x.y where that is a
    module, else kernelhub.x."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "kernelhub":
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            found |= subs
            if len(subs) < len(node.names):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "kernelhub"}
    return found


def test_every_module_has_a_layer():
    placed = [m for layer in LAYERS for m in layer]
    assert len(placed) == len(set(placed))
    assert set(_modules()) == set(placed)


@pytest.mark.parametrize("module", sorted(m for layer in LAYERS for m in layer))
def test_imports_point_downward(module):
    modules = _modules()
    rank = {m: i for i, layer in enumerate(LAYERS) for m in layer}
    upward = sorted(d for d in _imports(modules[module], set(modules)) - {module}
                    if d in rank and rank[d] >= rank[module])
    assert not upward, f"{module} (layer {rank[module]}) imports {upward}, not below it"
    if rank[module] <= RUNTIME_TOP:
        kit = [d for d in _imports(modules[module], set(modules))
               if d.startswith(("kernelhub.testing", "kernelhub.cli", "kernelhub.bench"))]
        assert not kit, f"runtime module {module} imports {kit}"


# a measurement in the source: "16.8 us", "0.3 ms", "1.25x the" (figures belong in docs/, with their device, date
# and command; the source links the section: docs/lab/benchmarks-history.md#measurements-behind-the-code)
TIMING = re.compile(r"\b\d+(\.\d+)?\s?(us|µs|ms|s)\b|\b\d+\.\d+x (the|faster|slower|of)\b")


# what a test's own code does or matches ("sleeps 20 ms per pass", an error's "timed out after 2 s", a printed
# "1.60x slower"), the pattern's own examples above, and a formula's "2 s" (2 times s)
TIMING_ALLOWED = ("sleeps 20 ms per pass", '# 4 ms, "awrong"', "timed out after 2 s", '"1.60x slower"', "16.8 us",
                  "(2 s conj(b)")


def test_the_source_quotes_no_timings():
    """What ships (kernelhub/, backends/), the tests and the examples say why they are written as they are; what
    was measured, and when, is in docs/ (benchmarks/ and scripts/ are the measuring). Format strings that print a
    measurement ("{ms:.3f} ms") are code, not a quoted figure."""
    quoted = []
    for root in (PACKAGE, PACKAGE.parent / "backends", PACKAGE.parent / "tests", PACKAGE.parent / "examples"):
        for path in sorted(root.rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if TIMING.search(line) and "{" not in line and not any(a in line for a in TIMING_ALLOWED):
                    quoted.append(f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}")
    assert quoted == []


def test_every_op_of_kernelhub_s_own_follows_the_add_an_op_checklist():
    """docs/backend-guide.md, "A new op": each spec in `kernelhub.ops.SPECS` lives in a module of kernelhub/ops/
    placed in `LAYERS`, has its contract in docs/ops.md, its reference in torch_ref's `FORWARDS`, measured
    tolerances in kernelhub/ops/measured_errors.json, and its rows in the kernel backends' `IMPLS` tables name
    only ops that exist. (Step 5, the kit, is tests/test_conformance.py, over every op and backend.)"""
    import json

    from kernelhub_cuda_ext.plugin import IMPLS as CUDA_EXT
    from kernelhub_torch_ref.plugin import FORWARDS
    from kernelhub_triton.plugin import IMPLS as TRITON

    from kernelhub.ops import SPECS

    placed = {m for layer in LAYERS for m in layer}
    contracts = (PACKAGE.parent / "docs" / "ops.md").read_text()
    measured = json.loads((PACKAGE / "ops" / "measured_errors.json").read_text())
    names = {spec.name for spec in SPECS}
    for spec in SPECS:
        module = getattr(spec.normalize, "__module__", None)
        assert module in placed and module.startswith("kernelhub.ops."), (spec.name, module)
        assert f"`{spec.name}`" in contracts, f"{spec.name}: no contract in docs/ops.md"
        assert spec.name in FORWARDS, f"{spec.name}: no reference in backends/torch_ref"
        assert spec.name in measured["errors"], f"{spec.name}: no measured tolerances"
    assert set(TRITON) <= names and set(CUDA_EXT) <= names


def test_every_op_of_kernelhub_s_own_has_the_checklist_s_test_entries_and_cuda_ext_operators():
    """docs/backend-guide.md, "A new op", steps 3 and 6: each op has a `DRAW` entry in tests/test_properties.py;
    each cuda_ext row names functions of `kernelhub_cuda_ext.ops`; each operator the C++ library defines (`m.def`
    in csrc/cpu.cpp) is registered for a device (`m.impl`) and has a fake in `_lib._register_fakes()`, but the
    saving pair, which runs on the eager path alone and is never traced."""
    import kernelhub_cuda_ext
    from kernelhub_cuda_ext import ops as cuda_ops
    from kernelhub_cuda_ext.plugin import IMPLS as CUDA_EXT
    from test_properties import DRAW

    from kernelhub.ops import SPECS

    assert set(DRAW) == {spec.name for spec in SPECS}
    for op, (forward, backward, *_) in CUDA_EXT.items():
        assert callable(getattr(cuda_ops, forward, None)) and callable(getattr(cuda_ops, backward, None)), op
    package = Path(kernelhub_cuda_ext.__file__).parent
    csrc = package / "csrc"
    defined = re.findall(r'm\.def\("(\w+)\(', (csrc / "cpu.cpp").read_text())
    registered = {name for path in csrc.glob("*.c*") for name in re.findall(r'm\.impl\("(\w+)"', path.read_text())}
    faked = set(re.findall(r'register_fake\(f"\{NAME\}::(\w+)"\)', (package / "_lib.py").read_text()))
    assert defined and set(defined) <= registered, set(defined) - registered
    assert set(defined) - faked == {"semiconv_forward_saving", "semiconv_backward_saved"}, set(defined) - faked


def test_every_built_in_backend_follows_the_backends_readme():
    """backends/README.md, "Adding a built-in backend", steps 1-3: each folder of backends/ is a distribution named
    in `FIRST_PARTY_DISTRIBUTIONS` whose entry points register backends named in `FIRST_PARTY_BACKENDS`, installed
    by both commands of the README's set-up block, and named in backends/README.md's table."""
    import tomllib

    from kernelhub.registry import FIRST_PARTY_BACKENDS, FIRST_PARTY_DISTRIBUTIONS

    root = PACKAGE.parent
    setup = root.joinpath("README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    table = root.joinpath("backends", "README.md").read_text()
    folders = sorted(p.parent for p in root.glob("backends/*/pyproject.toml"))
    assert len(folders) == len(set(FIRST_PARTY_DISTRIBUTIONS.values()))
    for folder in folders:
        project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
        assert project["name"] in FIRST_PARTY_DISTRIBUTIONS.values(), folder.name
        names = project["entry-points"]["kernelhub.backends"]
        assert {b for b, d in FIRST_PARTY_DISTRIBUTIONS.items() if d == project["name"]} >= set(names), folder.name
        assert set(names) <= set(FIRST_PARTY_BACKENDS), folder.name
        assert len(setup) == 2 and all(f"-e ./backends/{folder.name}" in line for line in setup), folder.name
        assert f"| `{folder.name}/` | `{project['name']}` |" in table, folder.name


def test_kernelhub_ships_its_types_and_the_readme_s_tests_check_them():
    """kernelhub/py.typed ships with the package (a plugin's type checker reads kernelhub's annotations), and the
    README's test command runs mypy, configured in pyproject.toml over kernelhub/ (CI runs that command)."""
    import tomllib

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    assert (PACKAGE / "py.typed").is_file() and "py.typed" in project["tool"]["setuptools"]["package-data"]["kernelhub"]
    assert project["tool"]["mypy"]["files"] == ["kernelhub"]
    test_command = (PACKAGE.parent / "README.md").read_text().split("```bash\n", 1)[1].splitlines()[1]
    assert "&& mypy &&" in test_command and "mypy==" in test_command


def test_every_benchmark_is_a_suite_of_the_one_entry_point():
    """benchmarks/run.py is the benchmarks' one entry point: every script of benchmarks/ is one of its suites and
    takes its arguments as ``main(argv)``; ``run.py`` lists the suites, refuses an unknown one, and runs one."""
    import importlib.util
    import sys

    folder = PACKAGE.parent / "benchmarks"
    spec = importlib.util.spec_from_file_location("benchmarks_run", folder / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    scripts = [script for script, _ in run.SUITES.values()]
    assert sorted(scripts) == sorted(p.stem for p in folder.glob("*.py") if p.stem != "run")
    for script in scripts:
        tree = ast.parse((folder / f"{script}.py").read_text())
        main = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "main"]
        assert main and main[0].args.args and main[0].args.args[0].arg == "argv", f"benchmarks/{script}.py: main(argv)"
    listed = harness.run([sys.executable, str(folder / "run.py")], timeout=300)
    assert listed.returncode == 0 and all(f"  {name} " in listed.stdout for name in run.SUITES), listed.stdout
    wrong = harness.run([sys.executable, str(folder / "run.py"), "nope"], timeout=300)
    assert wrong.returncode == 2 and "no suite 'nope'" in wrong.stderr
    ran = harness.run([sys.executable, str(folder / "run.py"), "host-dispatch", "--round-ms", "2", "--repeat", "2",
                          "--json"], timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert '"forward+backward"' in ran.stdout


def test_the_defaults_suite_times_its_a_a_control_in_the_same_rounds():
    """benchmarks/defaults.py --control times a second hub handle beside the hub and the forced backends: each row
    gets hub / hub again (the same code against itself), a ratio near 1 that a record reads as its rounds' noise.
    The rounds' times are set here (a loaded CI host's real ones say nothing), so the row's arithmetic is checked:
    every handle runs, and each ratio is the median of the per-round ratios."""
    import json
    import sys

    code = ("import json, sys, torch; sys.path.insert(0, 'benchmarks'); import defaults; "
            "set_times = {'hub': [1.0, 1.0, 1.0], 'hub again': [2.0, 2.0, 4.0], 'cuda_ext': [0.5, 2.0, 0.5]}; "
            "defaults.timing.rounds = lambda steps, device, repeat: "
            "{label: set_times.get(label, [9.0] * 3) for label in steps}; "
            "vol = torch.randn(1, 8, 8, 8, generator=torch.Generator().manual_seed(0)); "
            "print(json.dumps(defaults.measure('tv_loss_l1_3d', (vol,), torch.device('cpu'), 3, control=True)))")
    ran = harness.run([sys.executable, "-c", code], timeout=300,
                         cwd=PACKAGE.parent)
    assert ran.returncode == 0, ran.stderr[-2000:]
    row = json.loads(ran.stdout.strip().splitlines()[-1])
    assert {"hub", "cuda_ext", "hub again"} <= set(row["ms"]), row["ms"]  # triton too where it takes CPU tensors
    assert row["picked"] == row["fastest"] == "cuda_ext"
    assert row["hub_vs_hub_again"] == 0.5 and row["hub_vs_fastest"] == 2.0 and row["picked_vs_fastest"] == 1.0


# -- the test suite's own rules ------------------------------------------------------------------------------------
TESTS = Path(__file__).resolve().parent
_CLOCKS = {"time", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time"}


def _is_clock(node: ast.AST) -> bool:
    """A read of the wall clock, or of one of kernelhub.timing's timers (a measured time)."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        return (f.value.id == "time" and f.attr in _CLOCKS) or f.value.id == "timing"
    return isinstance(f, ast.Name) and f.id in _CLOCKS


def timing_assertions(path: Path) -> list[tuple[str, int]]:
    """(function, line) of each ``assert`` in ``path`` that reads a clock: directly, through a name assigned from
    one (``t0 = time.time()``), or through a measured time's ``ms`` / ``*_ms`` / ``*_s``."""
    found = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, ast.FunctionDef):
            continue
        timed = {t.id for node in ast.walk(fn)
                 if isinstance(node, ast.Assign) and any(map(_is_clock, ast.walk(node.value)))
                 for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(fn):
            if not isinstance(node, ast.Assert):
                continue
            parts = list(ast.walk(node.test))
            if (any(map(_is_clock, parts)) or any(isinstance(p, ast.Name) and p.id in timed for p in parts)
                    or any(isinstance(p, ast.Attribute) and p.attr == "ms" for p in parts)):
                found.append((fn.name, node.lineno))
    return found


# the tests that assert on a clock, and why each cannot flake on a loaded CI host
CLOCK_ASSERTIONS_ALLOWED = {
    ("test_cuda_ext_backend.py", "test_a_build_killed_half_way_does_not_block_the_next"):
        "a deadline, not a speed: the next build must not wait out the killed one's minute of sleep",
    ("test_cuda_ext_backend.py", "test_a_hung_compiler_times_out_with_the_reason"):
        "a deadline: a build timeout of seconds must stop a compiler that sleeps a minute",
    ("test_tune.py", "test_timed_drops_the_gradients_it_is_given_before_each_call"):
        "only that a time was measured (positive), never how long",
    ("test_tune.py", "test_graphed_times_the_device_alone_where_a_slow_host_leaves_it_idle"):
        "GPU only (the CUDA tier, never CI): milliseconds of host sleep against microseconds of kernels",
}


def test_no_test_of_the_fast_tier_asserts_on_a_wall_clock():
    """A loaded CI host makes any timing assertion flaky (one failed CI at many times its expected ratio): the tests
    check the arithmetic on set times instead. The exceptions are named above, each with why it cannot flake."""
    found = {(p.name, fn): line for p in sorted(TESTS.glob("test_*.py")) for fn, line in timing_assertions(p)}
    unexplained = sorted(f"{name}:{line} {fn}" for (name, fn), line in found.items()
                         if (name, fn) not in CLOCK_ASSERTIONS_ALLOWED)
    assert not unexplained, f"assertions on a clock: {unexplained} (check set times, or name the exception and why)"
    stale = sorted(set(CLOCK_ASSERTIONS_ALLOWED) - set(found))
    assert not stale, f"exceptions that no longer assert on a clock: {stale}"


def test_the_timing_scan_finds_what_it_should(tmp_path):
    path = tmp_path / "test_x.py"
    path.write_text("import time\nfrom kernelhub import timing\n"
                    "def test_a():\n    t0 = time.perf_counter()\n    assert time.perf_counter() - t0 < 1\n"
                    "def test_b():\n    t = timing.timed(f, d)\n    assert t.ms < 2\n"
                    "def test_c(r):\n    assert r.ms['hub'] == 1.0\n"
                    "def test_d():\n    assert len([1]) == 1\n")
    assert [fn for fn, _ in timing_assertions(path)] == ["test_a", "test_b", "test_c"]


def test_every_child_process_of_the_tests_has_a_deadline():
    """A child process is started through tests/harness.py (``run``, or ``Popen`` with ``env=harness.child_env(...)``
    and then ``harness.wait``), so a hang fails within the test's deadline and prints the child's stacks."""
    offenders = []
    for path in sorted(TESTS.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            f = node.func
            owner = f.value.id if isinstance(f.value, ast.Name) else None
            if owner in ("subprocess", "os") and f.attr in ("run", "call", "check_call", "check_output", "system",
                                                            "popen"):
                offenders.append(f"{path.name}:{node.lineno} {owner}.{f.attr}")
            elif f.attr == "communicate":
                offenders.append(f"{path.name}:{node.lineno} .communicate (harness.wait has a deadline)")
            elif owner == "subprocess" and f.attr == "Popen":
                env = next((k.value for k in node.keywords if k.arg == "env"), None)
                if not (isinstance(env, ast.Call) and ast.unparse(env.func) == "harness.child_env"):
                    offenders.append(f"{path.name}:{node.lineno} subprocess.Popen without env=harness.child_env(...)")
    assert not offenders, offenders


def test_the_built_in_backends_import_only_what_the_backend_guide_lists():
    """docs/backend-guide.md section 8 is the list of what a backend may import from kernelhub: every name the
    built-in backends' runtime code imports from a kernelhub module is in that section (for `kernelhub.ops.<family>`:
    in the module's `__all__`, which the section names), and `kernelhub.testing.__all__` holds every public check."""
    import importlib

    from kernelhub import testing
    root = PACKAGE.parent
    guide = (root / "docs" / "backend-guide.md").read_text()
    section = guide[guide.index("## 8. What a backend may import"):guide.index("## 9.")]
    missing = []
    for path in sorted(root.glob("backends/*/kernelhub_*/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and
                    (node.module == "kernelhub" or node.module.startswith("kernelhub."))):
                continue
            for alias in node.names:
                if node.module.startswith("kernelhub.ops."):
                    ok = alias.name in importlib.import_module(node.module).__all__
                else:
                    ok = f"`{alias.name}`" in section and f"`{node.module}`" in section
                if not ok:
                    missing.append(f"{path.relative_to(root)}: {node.module}.{alias.name}")
    assert missing == [], missing
    checks = [n for n in dir(testing) if n.startswith("check_") and callable(getattr(testing, n))]
    assert set(checks) <= set(testing.__all__), set(checks) - set(testing.__all__)


def test_the_kit_s_parity_case_is_not_named_like_kernelhub_case():
    """kernelhub.Case is an op's kind of call; the kit's parity case is `testing.ParityCase`. Its old name
    `testing.Case` still imports, with a DeprecationWarning, and is not in `testing.__all__`."""
    import kernelhub
    from kernelhub import testing

    assert "Case" not in testing.__all__ and "ParityCase" in testing.__all__
    with pytest.warns(DeprecationWarning, match="ParityCase"):
        assert testing.Case is testing.ParityCase is not kernelhub.Case
