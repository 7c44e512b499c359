"""Argument checks the modules share: counts and pytorch_nd_semiconv's init options, each error naming the module and
argument."""

from __future__ import annotations


def _count(owner: str, name: str, value: object, least: int = 1) -> int:
    """An int argument of at least ``least`` (not a bool), or a TypeError / ValueError naming the module and
    argument."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{owner}: argument {name!r} must be an int >= {least}, got {value!r}")
    if value < least:
        raise ValueError(f"{owner}: argument {name!r} must be an int >= {least}, got {value!r}")
    return value


def _counts(owner: str, name: str, value: object, least: int = 1) -> None:
    """An int of at least ``least``, or a non-empty list or tuple of them."""
    for v in value if isinstance(value, (list, tuple)) and value else (value,):
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            raise (ValueError if isinstance(v, int) and not isinstance(v, bool) else TypeError)(
                f"{owner}: argument {name!r} must be an int >= {least} or a list of them, got {value!r}")


def _init_dict(owner: str, init: object) -> None:
    if init is not None and not isinstance(init, dict):
        raise TypeError(f"{owner}: argument 'init' must be a dict (pytorch_nd_semiconv's init options) or None, "
                        f"got {init!r}")
