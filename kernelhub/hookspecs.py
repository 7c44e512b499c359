"""Hook specifications: everything a plugin author needs to know.

A kernelhub plugin is any module or object with functions named like the hooks
below, decorated with ``kernelhub.hookimpl``. It is found through the entry-point
group ``kernelhub.backends`` in the plugin distribution's ``pyproject.toml``::

    [project.entry-points."kernelhub.backends"]
    my_backend = "my_backend_package.plugin"

The entry-point name is the plugin's name. Entry points are loaded one at a time:
a plugin that fails to import, or whose hooks raise or register something that
contradicts a spec, is recorded with its error (``kernelhub list`` and
``kernelhub doctor`` show it) and skipped; the rest of the hub works as if it
were not installed. With ``strict = true`` in the configuration such a failure
is raised instead.

The order of the calls is: every plugin's ``kernelhub_register_specs``, then every
plugin's ``kernelhub_register_impls``. kernelhub's own op specs are registered by
the same hook from ``kernelhub.ops``, exactly like a third party's.
"""

from __future__ import annotations

import pluggy

__all__ = ["hookspec", "hookimpl", "kernelhub_register_specs", "kernelhub_register_impls"]

hookspec = pluggy.HookspecMarker("kernelhub")
hookimpl = pluggy.HookimplMarker("kernelhub")


@hookspec
def kernelhub_register_specs(registry) -> None:
    """Declare new ops.

    Called once per plugin, before any implementation is registered. Call
    ``registry.add_spec(spec)`` with a :class:`kernelhub.spec.OpSpec` for each op
    the plugin defines. An op name already registered is a
    :class:`~kernelhub.errors.PluginValidationError`. Only plugins that introduce
    ops implement this hook; backends of existing ops do not.

    A new op must come with a reference implementation (usually in the same
    plugin, under the backend named by ``spec.reference_backend``) that the
    testing kit runs in float64 as ground truth.
    """


@hookspec
def kernelhub_register_impls(registry) -> None:
    """Declare a backend and its implementations.

    Called once per plugin after all specs are known. Call
    ``registry.add_backend(kernelhub.spec.Backend(name, version, ...))`` once, then
    ``registry.add_impl(kernelhub.spec.Impl(op=..., backend=name, ...))`` for each op
    implemented. Every impl is validated against its spec when added: an unknown op,
    a dtype the spec does not allow, a backend not declared by this plugin, or a
    duplicate (op, backend) raises :class:`~kernelhub.errors.PluginValidationError`
    naming this plugin, and the whole plugin is skipped.

    Keep this hook cheap: import heavy dependencies (triton, a compiled extension)
    inside ``Backend.unavailable_reason`` or inside the impl's callables, so that a
    missing compiler or GPU makes the backend *unavailable with a reason* instead of
    failing the import.
    """
