"""What a check reached: the samples a backend accepts and refuses (with its reasons), and the tags of the op's
sample space they cover (`reach`; kernelhub.testing re-exports it)."""

from __future__ import annotations

import collections
import dataclasses
import fnmatch
from collections.abc import Iterable

import torch

from kernelhub.errors import NoImplementationError
from kernelhub.hub import get_hub
from kernelhub.spec import SampleInput
from kernelhub.testing._core import ParityCase, _spec, run


def _refused(op: str, backend: str, impl, sample: SampleInput, confirm: bool = True) -> list[str]:
    """The impl's reasons to decline ``sample`` ([] where it accepts it); with ``confirm``, a declined call forced on
    the backend must be refused, naming the first reason (an unforced call falls back: the selector's tests)."""
    reasons = impl.not_supported_reasons(sample.args)
    if reasons and confirm:
        try:
            run(op, backend, sample.args)
        except NoImplementationError as exc:
            assert reasons[0] in str(exc), f"{op} on {backend} [{sample.name}]: the refusal does not name {reasons}"
        else:
            raise AssertionError(f"{op} on {backend} [{sample.name}]: rejected ({reasons}) but a forced call ran")
    return reasons


def supported(op: str, backend: str, sample_list: Iterable[SampleInput]) -> list[SampleInput]:
    """The samples the impl accepts (``not_supported_reasons``: a part of the parameter space it does not cover, or
    a call it is known to get wrong); each one it declines is checked to be refused when forced, naming the
    reason."""
    impl = get_hub().registry.impls(op)[backend]
    return [sample for sample in sample_list if not _refused(op, backend, impl, sample)]


CONFIRM = 8  # declined calls per check that are forced, to see the refusal name its reason
MINIMUM = 1  # accepted calls a check needs of each tag its size requires (`SampleSpace.required`), and in all


@dataclasses.dataclass
class Reached:
    """The calls a check reached: ``samples`` the impl accepted (the check runs each; ``run`` counts those it ran),
    ``declined`` how many it declined (``reasons``: how often each first reason), ``drawn`` how many of all came
    from the op's `SampleSpace` beyond its samples, and ``tags``: for each tag the check requires, how many
    accepted calls carry it; ``not_in``: for an impl of an older contract version (`kernelhub.spec.Change`), the
    tags only later versions' calls carry, required of none of its checks ("not in v1: group_broadcasting")."""

    samples: list[SampleInput]
    declined: int = 0
    drawn: int = 0
    run: int = 0
    tags: dict[str, int] = dataclasses.field(default_factory=dict)
    reasons: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    not_in: str = ""

    def missing(self, allow: Iterable[str] = ()) -> list[str]:
        """The required tags below `MINIMUM` (``allow``: fnmatch patterns of tags a partial impl may leave out)
        and, where the impl accepted no call at all, "any call"."""
        allow = list(allow)
        short = [t for t, n in self.tags.items() if n < MINIMUM] + ([] if self.samples else ["any call"])
        return [t for t in short if not any(fnmatch.fnmatchcase(t, p) for p in allow)]

    @property
    def counts(self) -> str:
        text = f"{len(self.samples)} accepted, {self.declined} declined, {self.run} run"
        return text + (f" ({self.drawn} drawn from the op's sample space)" if self.drawn else "")

    def declines(self) -> str:
        """The impl's reasons to decline, most frequent first, with how often each ("" where it declined none)."""
        why = "; ".join(f"{n}x {r!r}" for r, n in self.reasons.most_common())
        return f"declined for {why}" if why else ""

    def summary(self) -> str:
        """The counts, why the impl declined, and what is not in its contract version."""
        return "; ".join(filter(None, (self.counts, self.declines(), self.not_in)))


class NotCovered(AssertionError):
    """A check reached fewer accepted calls of a required tag than `MINIMUM` (or none at all): what was not
    compared is not a pass. ``reached`` says what was."""

    def __init__(self, message: str, reached: Reached) -> None:
        super().__init__(message)
        self.reached = reached


def reach(op: str, backend: str, size: str, dtype: torch.dtype, device: str = "cpu", seed: int = 0,
          sample: str | None = None) -> Reached:
    """The calls a check of ``op`` on ``backend`` runs: the spec's samples of ``size`` the impl accepts, then,
    for each tag the op's `SampleSpace` requires of that size and the accepted ones lack, calls drawn from the space
    until `MINIMUM` carry it or `SampleSpace.DRAWS` were declined. ``sample`` names the one sample to run (no
    drawing, no tag required); ``backend`` "" (the hub selects) declines nothing."""
    spec = _spec(op)
    impl = get_hub().registry.impls(op)[backend] if backend else None
    out = Reached([])

    def offer(candidate: SampleInput) -> bool:
        # the first declines are forced too, to see them refused; the rest (hundreds where a partial impl declines
        # most of a space) only asked
        reasons = _refused(op, backend, impl, candidate, out.declined < CONFIRM) if impl is not None else []
        if reasons:
            out.declined += 1
            out.reasons[reasons[0]] += 1
            return False
        out.samples.append(candidate)
        for tag in space.tags(candidate.args) & out.tags.keys() if space else ():
            out.tags[tag] += 1
        return True

    space = spec.space if sample is None else None
    later = {t: c.version for c in spec.changes
             if impl is not None and impl.version is not None and c.version > impl.version for t in c.tags}
    required = space.required.get(size, ()) if space else ()
    out.tags = {t: 0 for t in required if t not in later}
    if impl is not None and any(t in later for t in required):
        out.not_in = f"not in v{impl.version}: " + ", ".join(f"{t} (v{later[t]})" for t in required if t in later)
    for candidate in ParityCase(op, backend, dtype, str(device), size, sample).samples(seed):
        offer(candidate)
    if space is not None:
        gen = torch.Generator(device=device).manual_seed(seed + 1)
        for tag in list(out.tags):
            for i in range(space.DRAWS):
                if out.tags[tag] >= MINIMUM:
                    break
                out.drawn += 1
                offer(space.draw(size, tag, i, dtype, torch.device(device), gen))
    return out


def _covered(reached: Reached, what: str, allow: Iterable[str]) -> Reached:
    """``reached``, after its samples ran; a `NotCovered` where a required tag (not allowed) was not reached."""
    missing = reached.missing(allow)
    if missing:
        raise NotCovered(f"{what}: not covered: {', '.join(missing)} (minimum {MINIMUM} accepted call each; "
                         f"{reached.summary()})", reached)
    return reached


def is_skip(exc: BaseException) -> bool:
    """Whether ``exc`` is pytest's skip (a check that does not apply here)."""
    try:
        import pytest
    except ImportError:
        return False
    return isinstance(exc, pytest.skip.Exception)
