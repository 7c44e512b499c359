"""Configuration: the shipped ``kernelhub/kernelhub.toml``, a user's ``kernelhub.toml`` over it, and at most four
environment overrides.

The shipped file (`SHIPPED`, installed with the package) holds every default, the per-op priorities with where
each was measured among them. A user's file is looked up in this order, first found wins:

1. ``$KERNELHUB_CONFIG`` (a path; an error if it does not exist),
2. ``./kernelhub.toml`` in the working directory,
3. ``$XDG_CONFIG_HOME/kernelhub/kernelhub.toml`` (default ``~/.config/kernelhub/kernelhub.toml``).

Its keys replace the shipped file's; ``[tune]``, ``[compile]`` and each ``[ops.<op>]`` table are merged key by key (a
user's ``[ops.semiconv] pin`` keeps the shipped priority for semiconv, a user's ``priority`` there replaces it). An op's
``cases`` (``[ops.<op>.cases.<case>] priority``: the order for the calls of one of the op's `kernelhub.spec.Case`s,
tried before the op's own) merge case by case; an op's ``sizes`` (``[[ops.<op>.sizes]]`` tables of ``min_elements``
and ``priority``: the order for the calls whose size (`kernelhub.spec.OpSpec.size_of`: the first tensor's
elements unless the op's spec measures it otherwise) is at least that many, the largest such
``min_elements`` deciding; tried before the case's and the op's; a range with ``device = "H100"`` serves only on a
device whose name contains that text, and there the op's ranges naming it replace those naming none) are replaced
whole by a user's. A user's op
``priority`` without ``cases`` (``sizes``) drops the shipped file's cases (sizes) of that op too, so the user's order
holds for every call of it.

Environment overrides, applied on top of the file:

- ``KERNELHUB_CONFIG``: the file above.
- ``KERNELHUB_KILL_SWITCH=1``: every op runs its reference backend (the spec's ``reference_backend``, torch_ref for
  the built-in ops; ``0`` forces it off).
- ``KERNELHUB_DISABLE=triton,cuda_ext``: backends added to ``disabled``.
- ``KERNELHUB_LOCK=FILE``: the lock file (``[lock].file``; a relative ``[lock].file`` is beside the file naming it).

Any error names the source (file or variable), the key, and the allowed values.
An unknown backend name anywhere is an error, never ignored.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
from collections.abc import Iterable, Mapping
from pathlib import Path

from kernelhub.errors import ConfigError

__all__ = ["Config", "OpConfig", "TuneConfig", "load_config", "check_config", "find_config_file", "make_private_dirs",
           "SHIPPED",
           "DEFAULT_PRIORITY", "TUNE_MODES"]

SHIPPED = Path(__file__).with_name("kernelhub.toml")
SHIPPED_DATA = types.MappingProxyType(tomllib.loads(SHIPPED.read_text(encoding="utf-8")))
DEFAULT_PRIORITY = tuple(SHIPPED_DATA["priority"])
TUNE_MODES = ("off", "cached", "online")


def make_private_dirs(path: Path) -> None:
    """Create ``path`` and each missing ancestor as 0700, whatever the umask: a directory kernelhub makes is one
    it may later refuse if others could write it (cuda_ext's build cache). Existing directories are left as
    they are."""
    missing = []
    for p in (path, *path.parents):
        if p.exists():
            break
        missing.append(p)
    for p in reversed(missing):
        p.mkdir(mode=0o700, exist_ok=True)
        os.chmod(p, 0o700)  # mkdir's mode goes through the umask (one of 0277 would leave it unusable)


Ranges = tuple[tuple[int, tuple[str, ...]], ...]  # an op's size ranges: (min_elements, backends), ascending


@dataclasses.dataclass(frozen=True)
class OpConfig:
    """One ``[ops.<op>]`` table: its priority, pin, each case's priority (case name -> backends), and its size
    ranges ((min_elements, backends), ascending): those naming no device (``sizes``), and per device text those
    serving only on a device whose name contains it (``device_sizes``; there they replace ``sizes``)."""

    priority: tuple[str, ...] = ()
    pin: str = ""
    cases: Mapping[str, tuple[str, ...]] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({}), hash=False)
    sizes: Ranges = ()
    device_sizes: Mapping[str, Ranges] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({}), hash=False)

    def ranges_on(self, device: str) -> tuple[str, Ranges]:
        """The size ranges serving on ``device`` (its name, `kernelhub.timing.device_model`): the first device
        text it contains and that text's ranges, else ("", the ranges naming no device)."""
        return next(((text, r) for text, r in self.device_sizes.items() if text in device), ("", self.sizes))

    def size_range(self, elements: int, device: str = "") -> tuple[int, tuple[str, ...]] | None:
        """The size range a call of size ``elements`` (`kernelhub.spec.OpSpec.size_of`) falls in on ``device``: the
        one with the largest ``min_elements`` at most ``elements`` of `ranges_on`; None where there is none."""
        return next((r for r in reversed(self.ranges_on(device)[1]) if r[0] <= elements), None)


@dataclasses.dataclass(frozen=True)
class TuneConfig:
    """``mode``: "off" (winners ignored), "cached" (winners of `kernelhub tune` used), "online" (also tune a
    new shape bucket on its first call). ``cache``: the winners file; "" = the user cache directory's."""

    mode: str = "cached"
    cache: str = ""

    def cache_path(self) -> Path:
        if self.cache:
            return Path(self.cache).expanduser()
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "kernelhub" / "tuning.json"


@dataclasses.dataclass(frozen=True)
class LockConfig:
    """``[lock]``: ``file``, a lock written by `kernelhub lock` whose winners serve the calls it names
    (`kernelhub.lock`; "" = none); ``strict``: a call the lock names that drift affects raises instead of a
    warning."""

    file: str = ""
    strict: bool = False


@dataclasses.dataclass(frozen=True)
class Config:
    """The configuration in force. ``source`` says where it came from."""

    kill_switch: bool = False
    strict: bool = False
    disabled: frozenset[str] = frozenset()
    priority: tuple[str, ...] = DEFAULT_PRIORITY
    ops: Mapping[str, OpConfig] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    tune: TuneConfig = TuneConfig()
    source: str = "shipped defaults"
    overrides: tuple[str, ...] = ()
    # [compile] priority: the backends traced into a torch.compile graph, first eligible wins
    # (`kernelhub.select.Selector.traced`); () leaves every call to the operator, which selects when it runs
    compile_priority: tuple[str, ...] = ()
    lock: LockConfig = LockConfig()

    def op(self, name: str) -> OpConfig:
        return self.ops.get(name) or OpConfig()

    def priority_for(self, op: str, backends: list[str], reference: str, case: str = "",
                     elements: int | None = None, device: str = "") -> list[str]:
        """Order ``backends``: the priority of the op's size range for a call of size ``elements``
        (`kernelhub.spec.OpSpec.size_of`) on ``device`` (`OpConfig.size_range`), then that of the call's ``case`` of
        the op (if configured), then the op's, then the global one; backends named in none go alphabetically just
        before the op's ``reference`` backend (so installing a backend puts it to use), the reference last unless a
        list places it elsewhere."""
        order: list[str] = []
        size = self.op(op).size_range(elements, device) if elements is not None else None
        for names in (size[1] if size else (), self.op(op).cases.get(case, ()), self.op(op).priority, self.priority):
            order += [b for b in names if b not in order]
        unlisted = sorted(b for b in backends if b not in order and b != reference)
        at = order.index(reference) if reference in order else len(order)
        order[at:at] = unlisted
        if reference not in order:
            order.append(reference)
        return [b for b in order if b in backends]

    def check_ops(self, known_ops: Mapping) -> None:
        """Raise ConfigError for an ``[ops.<op>]`` table of an op not in ``known_ops`` (name -> spec) or a case the
        op's spec does not define."""
        for name, table in self.ops.items():
            if name not in known_ops:
                raise ConfigError(f"{self.source}: [ops.{name}]: unknown op; known ops: {sorted(known_ops)}")
            known_cases = [c.name for c in known_ops[name].cases]
            for case in table.cases:
                if case not in known_cases:
                    raise ConfigError(f"{self.source}: [ops.{name}.cases.{case}]: unknown case; the cases of {name}: "
                                      f"{known_cases}")

    def as_dict(self) -> dict:
        return {
            "source": self.source,
            "overrides": list(self.overrides),
            "kill_switch": self.kill_switch,
            "strict": self.strict,
            "disabled": sorted(self.disabled),
            "priority": list(self.priority),
            "ops": {k: {"priority": list(v.priority), "pin": v.pin,
                        "cases": {c: {"priority": list(p)} for c, p in v.cases.items()},
                        "sizes": [{"min_elements": n, "priority": list(p)} for n, p in v.sizes] + [
                            {"min_elements": n, "priority": list(p), "device": text}
                            for text, ranges in v.device_sizes.items() for n, p in ranges]}
                    for k, v in self.ops.items()},
            "tune": {"mode": self.tune.mode, "cache": self.tune.cache, "cache_path": str(self.tune.cache_path())},
            "compile": {"priority": list(self.compile_priority)},
            "lock": {"file": self.lock.file, "strict": self.lock.strict},
        }


_TOP_KEYS = {"kill_switch": bool, "strict": bool, "disabled": list, "priority": list, "ops": dict, "tune": dict,
             "compile": dict, "lock": dict}
_OP_KEYS = {"priority": list, "pin": str, "cases": dict, "sizes": list}
_CASE_KEYS = {"priority": list}
_SIZE_KEYS = {"min_elements": int, "priority": list, "device": str}
_TUNE_KEYS = {"mode": str, "cache": str}
_COMPILE_KEYS = {"priority": list}
_LOCK_KEYS = {"file": str, "strict": bool}


def find_config_file(cwd: Path | None = None) -> Path | None:
    env = os.environ.get("KERNELHUB_CONFIG")
    if env:
        path = Path(env)
        if not path.is_file():
            raise ConfigError(f"KERNELHUB_CONFIG={env!r}: no such file")
        return path
    local = (cwd or Path.cwd()) / "kernelhub.toml"
    if local.is_file():
        return local
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    user = base / "kernelhub" / "kernelhub.toml"
    return user if user.is_file() else None


class BackendNames(frozenset):
    """The backend names a configuration may use, and ``plugins``: plugin (entry point) name -> the backends it
    registered, for the hint where a setting names a plugin instead of its backends."""

    plugins: Mapping[str, tuple[str, ...]] = types.MappingProxyType({})

    @classmethod
    def of(cls, names: Iterable[str], plugins: Mapping[str, tuple[str, ...]]) -> BackendNames:
        known = cls(names)
        known.plugins = types.MappingProxyType({p: b for p, b in plugins.items() if p not in known})
        return known


class _AnyBackend(frozenset):
    """Every name: a configuration read before the plugins load (for its `strict` switch); `kernelhub.hub.Hub` reads
    it again with the names of the backends that loaded."""

    def __contains__(self, item: object) -> bool:
        return True


ANY_BACKEND = _AnyBackend()


def unknown_backend(where: str, name: object, known: frozenset[str]) -> str:
    """The message for a setting naming a backend not in ``known`` (a plugin's name: which backends it has)."""
    registered = getattr(known, "plugins", {}).get(name)
    hint = (f" ({name!r} is a plugin; settings name its backends: {', '.join(registered)})" if registered else "")
    return f"{where}: unknown backend {name!r}{hint}; allowed: {sorted(known)}"


def _names(value: object, where: str, known: frozenset[str]) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: expected a list of backend names, got {value!r}")
    for i, v in enumerate(value):
        if v not in known:
            raise ConfigError(unknown_backend(where, v, known))
        if v in value[:i]:
            raise ConfigError(f"{where}: backend {v!r} is listed twice")
    return tuple(value)


def _check_keys(table: Mapping, allowed: Mapping[str, type], where: str) -> None:
    for key, value in table.items():
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key {key!r}; allowed keys: {sorted(allowed)}")
        if not isinstance(value, allowed[key]):
            kind = "a table" if allowed[key] is dict else allowed[key].__name__
            name = f"{where}.{key}" if ": " in where else f"{where}: {key}"  # "f.toml: [tune].mode", "f.toml: ops"
            raise ConfigError(f"{name}: expected {kind}, got {type(value).__name__} {value!r}")


def _check_table(table: object, allowed: Mapping[str, type], where: str) -> None:
    """`_check_keys` for a value that must be a table (an ``[ops.<op>]`` or a case's)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table with keys {sorted(allowed)}")
    _check_keys(table, allowed, where)


def _over_shipped(data: Mapping) -> dict:
    """A user's data over the shipped file's: top-level keys replaced, [tune] and each [ops.<op>] merged key by key
    (a value that is not a table replaces the shipped one, and the checks then name it)."""
    merged = {**SHIPPED_DATA, **data}
    for key in ("tune", "ops", "compile"):
        if isinstance(data.get(key), dict):
            merged[key] = {**SHIPPED_DATA.get(key, {}), **data[key]}
    if isinstance(data.get("ops"), dict):
        for name, table in data["ops"].items():
            if isinstance(table, dict) and name in SHIPPED_DATA.get("ops", {}):
                shipped = SHIPPED_DATA["ops"][name]
                merged["ops"][name] = {**shipped, **table}
                for key in ("cases", "sizes"):
                    if "priority" in table and key not in table:
                        merged["ops"][name].pop(key, None)  # the user's order holds for every call of the op
                if isinstance(table.get("cases"), dict):
                    merged["ops"][name]["cases"] = {**shipped.get("cases", {}), **table["cases"]}
    return merged


def _sizes(tables: list, where: str, known_backends: frozenset[str]) -> dict[str, Ranges]:
    """An op's size ranges by device text ("": those naming none), each ascending: each table a whole
    ``min_elements`` >= 1 (each once per device), a ``priority`` and, optionally, a non-empty ``device``."""
    ranges: dict[str, list] = {}
    for i, table in enumerate(tables):
        _check_table(table, _SIZE_KEYS, f"{where} #{i + 1}")
        least = table.get("min_elements")
        if isinstance(least, bool) or not isinstance(least, int) or least < 1:
            raise ConfigError(f"{where} #{i + 1}.min_elements: expected a whole number >= 1, got {least!r}")
        device = table.get("device", "")
        if "device" in table and not device.strip():
            raise ConfigError(f"{where} #{i + 1}.device: expected part of a device's name (\"H100\"), got {device!r}")
        mine = ranges.setdefault(device, [])
        if least in [n for n, _ in mine]:
            raise ConfigError(f"{where} #{i + 1}.min_elements: {least} is given twice"
                              + (f" for device {device!r}" if device else ""))
        mine.append((least, _names(table.get("priority", []), f"{where} #{i + 1}.priority", known_backends)))
    return {device: tuple(sorted(r)) for device, r in ranges.items()}


def parse_config(data: Mapping, source: str, known_backends: frozenset[str]) -> Config:
    """The configuration of a user's ``data`` (from ``source``) over the shipped file."""
    _check_keys(data, _TOP_KEYS, source)
    data = _over_shipped(data)
    ops = {}
    for name, table in data.get("ops", {}).items():
        where = f"{source}: [ops.{name}]"
        _check_table(table, _OP_KEYS, where)
        pin = table.get("pin", "")
        if pin and pin not in known_backends:
            raise ConfigError(unknown_backend(f"{where}.pin", pin, known_backends))
        cases = {}
        for case, case_table in table.get("cases", {}).items():
            case_where = f"{source}: [ops.{name}.cases.{case}]"
            _check_table(case_table, _CASE_KEYS, case_where)
            cases[case] = _names(case_table.get("priority", []), f"{case_where}.priority", known_backends)
        sizes = _sizes(table.get("sizes", []), f"{source}: [[ops.{name}.sizes]]", known_backends)
        ops[name] = OpConfig(priority=_names(table.get("priority", []), f"{where}.priority", known_backends), pin=pin,
                             cases=types.MappingProxyType(cases), sizes=sizes.pop("", ()),
                             device_sizes=types.MappingProxyType(sizes))
    tune = data.get("tune", {})
    _check_keys(tune, _TUNE_KEYS, f"{source}: [tune]")
    if tune.get("mode", "cached") not in TUNE_MODES:
        raise ConfigError(f"{source}: [tune].mode: {tune['mode']!r}; allowed: {list(TUNE_MODES)}")
    if "\0" in tune.get("cache", ""):
        raise ConfigError(f"{source}: [tune].cache: a path cannot hold a NUL character, got {tune['cache']!r}")
    compiled = data.get("compile", {})
    _check_keys(compiled, _COMPILE_KEYS, f"{source}: [compile]")
    locked = data.get("lock", {})
    _check_keys(locked, _LOCK_KEYS, f"{source}: [lock]")
    if "\0" in locked.get("file", ""):
        raise ConfigError(f"{source}: [lock].file: a path cannot hold a NUL character, got {locked['file']!r}")
    return Config(
        kill_switch=data.get("kill_switch", False),
        strict=data.get("strict", False),
        disabled=frozenset(_names(data.get("disabled", []), f"{source}: disabled", known_backends)),
        priority=_names(data.get("priority", list(DEFAULT_PRIORITY)), f"{source}: priority", known_backends),
        ops=types.MappingProxyType(ops),
        tune=TuneConfig(mode=tune.get("mode", "cached"), cache=tune.get("cache", "")),
        source=source,
        compile_priority=_names(compiled.get("priority", []), f"{source}: [compile].priority", known_backends),
        lock=LockConfig(file=locked.get("file", ""), strict=locked.get("strict", False)),
    )


def check_config(config: Config, known_backends: frozenset[str]) -> Config:
    """Raise ConfigError unless ``config`` (a `Config` built in code, for ``kernelhub.reload(config=...)`` or
    ``Hub(config=...)``) holds what a file may: the same checks, naming the field and the allowed values."""
    where = f"Config ({config.source})"

    def flag(name: str) -> None:
        if not isinstance(getattr(config, name), bool):
            raise ConfigError(f"{where}: {name}: expected True or False, got {getattr(config, name)!r}")
    def names(value: object, field: str) -> None:
        """A collection of backend names (a tuple, list or set of str; a str alone is one name's letters)."""
        if not isinstance(value, (tuple, list, frozenset, set)):
            raise ConfigError(f"{where}: {field}: expected a tuple of backend names (allowed: "
                              f"{sorted(known_backends)}), got {type(value).__name__} {value!r}")
        _names(sorted(value) if isinstance(value, (set, frozenset)) else list(value), f"{where}: {field}",
               known_backends)

    def mapping(value: object, field: str, of: str) -> None:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: {field}: expected a mapping of {of}, got {type(value).__name__} {value!r}")

    flag("kill_switch")
    flag("strict")
    names(config.disabled, "disabled")
    names(config.priority, "priority")
    names(config.compile_priority, "compile_priority")
    mapping(config.ops, "ops", "op name -> OpConfig")
    for name, table in config.ops.items():
        if not isinstance(table, OpConfig):
            raise ConfigError(f"{where}: ops[{name!r}]: expected an OpConfig, got {type(table).__name__}")
        if not isinstance(table.pin, str):
            raise ConfigError(f"{where}: ops[{name!r}].pin: expected a backend name (allowed: "
                              f"{sorted(known_backends)}) or \"\", got {table.pin!r}")
        if table.pin and table.pin not in known_backends:
            raise ConfigError(unknown_backend(f"{where}: ops[{name!r}].pin", table.pin, known_backends))
        names(table.priority, f"ops[{name!r}].priority")
        mapping(table.cases, f"ops[{name!r}].cases", "case name -> backend names")
        for case, case_names in table.cases.items():
            names(case_names, f"ops[{name!r}].cases[{case!r}]")
        if not isinstance(table.device_sizes, Mapping) or any(
                not isinstance(text, str) or not text.strip() for text in table.device_sizes):
            raise ConfigError(f"{where}: ops[{name!r}].device_sizes: expected device text (part of a device's name) "
                              f"-> size ranges, got {table.device_sizes!r}")
        for label, sizes in (("sizes", table.sizes), *((f"device_sizes[{t!r}]", r) for t, r in
                                                        table.device_sizes.items())):
            if not isinstance(sizes, tuple) or not all(isinstance(pair, tuple) and len(pair) == 2 for pair in sizes) \
                    or tuple(sorted(sizes)) != sizes \
                    or len({n for n, _ in sizes}) != len(sizes) \
                    or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n, _ in sizes):
                raise ConfigError(f"{where}: ops[{name!r}].{label}: expected (min_elements >= 1, backends) pairs, "
                                  f"ascending and each min_elements once, got {sizes!r}")
            for n, range_names in sizes:
                names(range_names, f"ops[{name!r}].{label}[{n}]")
    tune = config.tune
    if not isinstance(tune, TuneConfig) or tune.mode not in TUNE_MODES or not isinstance(tune.cache, str) \
            or "\0" in tune.cache:
        raise ConfigError(f"{where}: tune: expected TuneConfig(mode in {list(TUNE_MODES)}, cache a path without "
                          f"NUL), got {tune!r}")
    if not isinstance(config.lock, LockConfig) or not isinstance(config.lock.file, str) or "\0" in config.lock.file \
            or not isinstance(config.lock.strict, bool):
        raise ConfigError(f"{where}: lock: expected LockConfig(file a path without NUL or \"\", strict True or "
                          f"False), got {config.lock!r}")
    return config


def load_config(known_backends: frozenset[str], path: Path | None = None) -> Config:
    """Find, read and validate the configuration, then apply the environment overrides."""
    path = path if path is not None else find_config_file()
    if path is None:
        config = parse_config({}, f"shipped defaults ({SHIPPED})", known_backends)
    else:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid TOML (UTF-8): {exc}") from None
        except RecursionError:
            raise ConfigError(f"{path}: not read: its tables or arrays nest too deeply") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot be read: {exc}") from None
        config = parse_config(data, str(path), known_backends)
        if config.lock.file and not Path(config.lock.file).expanduser().is_absolute():  # beside the file naming it
            config = dataclasses.replace(config, lock=dataclasses.replace(
                config.lock, file=str(path.parent / Path(config.lock.file).expanduser())))

    overrides = []
    kill = os.environ.get("KERNELHUB_KILL_SWITCH")
    if kill is not None and kill != "":
        if kill not in ("0", "1"):
            raise ConfigError(f"KERNELHUB_KILL_SWITCH={kill!r}: allowed values are '0' and '1'")
        config = dataclasses.replace(config, kill_switch=kill == "1")
        overrides.append(f"KERNELHUB_KILL_SWITCH={kill}")
    disable = os.environ.get("KERNELHUB_DISABLE")
    if disable:
        names = [n.strip() for n in disable.split(",") if n.strip()]
        for n in names:
            if n not in known_backends:
                raise ConfigError(unknown_backend("KERNELHUB_DISABLE", n, known_backends))
        config = dataclasses.replace(config, disabled=config.disabled | frozenset(names))
        overrides.append(f"KERNELHUB_DISABLE={disable}")
    locked = os.environ.get("KERNELHUB_LOCK")
    if locked:
        if "\0" in locked:
            raise ConfigError(f"KERNELHUB_LOCK={locked!r}: a path cannot hold a NUL character")
        config = dataclasses.replace(config, lock=dataclasses.replace(config.lock, file=str(Path(locked).expanduser())))
        overrides.append(f"KERNELHUB_LOCK={locked}")
    return dataclasses.replace(config, overrides=tuple(overrides))
