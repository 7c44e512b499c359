"""kernelhub's process-wide state, all of it. Everything else lives on a hub (`kernelhub.hub.Hub`: its registry,
config, selector and caches), and the hubs are held here:

- ``hub``: the global hub (`kernelhub.get_hub`), None until its first use; `kernelhub.scoped` swaps it for a block.
- ``hubs``: Hub.key -> hub, every hub alive (an operator call names its hub by key); weak.
- ``fingerprints``: Hub.key -> that hub's fingerprint (config, plugins, versions), what torch.compile's caches are
  keyed on (`kernelhub.hub`).
- ``keys``: where the next Hub.key comes from.
- ``lock``: held while the global hub changes.
- ``scopes``: the thread of each open `kernelhub.scoped` block, innermost last (blocks of one thread only).
- ``GENERATION``: a token that changes where a torch.compile graph's traced choice may (dynamo guards on it).
- ``EAGER_FAST_PATH``: ``KERNELHUB_EAGER_FAST_PATH``, read at import (off: every call through the operators);
  ``ENVIRONMENT_ERROR``: its ConfigError where the value is not an on/off spelling, raised where a hub is built (an
  import that raised it would end the command line in a traceback instead of its usage error).
- ``operators``: op -> (forward, backward) operator, defined once per process (`kernelhub.dispatch.define_ops`), and
  ``library``, their torch.library fragment: operators cannot be undefined, so no scope resets these.

Only `kernelhub.hub`, `kernelhub.select` and `kernelhub.dispatch` read and write them."""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from typing import Any

from kernelhub.errors import ConfigError


def _switch(name: str, default: bool) -> bool:
    """An on/off environment variable: 1/true/on/yes or 0/false/off/no (any case; unset or empty: ``default``);
    anything else raises ConfigError naming the variable."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise ConfigError(f"{name}={os.environ[name]!r}: allowed values are 1/true/on/yes and 0/false/off/no")


hub: Any = None
hubs: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
fingerprints: dict[int, str] = {}
keys = itertools.count(1)
lock = threading.Lock()
scopes: list[int] = []
try:
    EAGER_FAST_PATH, ENVIRONMENT_ERROR = _switch("KERNELHUB_EAGER_FAST_PATH", True), None
except ConfigError as _exc:
    EAGER_FAST_PATH, ENVIRONMENT_ERROR = True, str(_exc)
operators: dict[str, tuple[Any, Any]] = {}
library: list = []


class _Generation:
    """``token``: a string that changes whenever a traced choice (`kernelhub.select.Selector.traced`) may change: a
    new global hub of another config or plugins (`kernelhub.hub`), or a backend marked failed for a call it was
    traced for. The handles read it while dynamo traces them (`kernelhub.dispatch.OpHandle`), so dynamo guards on
    its value and recompiles a graph made before a change. A string, never an int: dynamo specialises on a string's
    value, and may make an int that changed symbolic."""

    token = "0"

    def bump(self) -> None:
        self.token = str(int(self.token) + 1)


GENERATION = _Generation()
