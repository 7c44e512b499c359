"""Exceptions raised by kernelhub. Every message names the op, the argument or the plugin involved."""

from __future__ import annotations

__all__ = [
    "KernelhubError",
    "PluginValidationError",
    "ConfigError",
    "NoImplementationError",
    "StrictModeError",
    "LockDriftError",
    "WrongOutputError",
]


class KernelhubError(Exception):
    """Base class of kernelhub's own errors."""


class PluginValidationError(KernelhubError):
    """A plugin registered something that contradicts a spec (raised at registration, not at call time)."""

    def __init__(self, plugin: str, message: str) -> None:
        self.plugin = plugin
        super().__init__(f"plugin {plugin!r}: {message}")


class ConfigError(KernelhubError, ValueError):
    """A configuration file or environment override is invalid; the message names the source, key and allowed values."""


class NoImplementationError(KernelhubError, RuntimeError):
    """No registered implementation can serve a call; the message lists every candidate with its reasons."""


class StrictModeError(KernelhubError, RuntimeError):
    """Strict mode is on and a call would have fallen back to another backend."""


class LockDriftError(KernelhubError, RuntimeError):
    """``[lock] strict = true`` and a call the lock names cannot be served as locked: the environment or the locked
    backend drifted since `kernelhub lock` (the message names what, and what to do)."""


class WrongOutputError(KernelhubError, RuntimeError):
    """An impl returned an output or gradient whose shape, dtype or device contradicts the spec. It is treated as
    the impl raising at call time: the call falls back (strict mode and forced calls raise), never reaching the user."""
