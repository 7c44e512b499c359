"""The Triton kernels that `kernelhub.bench.rates` times on a GPU, each the simplest kernel of its kind:

- a cache gather and an atomic scatter of 128-byte rows (32 float32) at random rows of a table. torch's own kernels
  for these (``embedding_bag``, ``index_add_``, ``scatter_add_``) reach well under their rate on an H200, and a
  floor from a rate a kernel of the op beats is no floor (docs/ops.md, "Least work"; the figures:
  docs/lab/benchmarks-history.md#measurements-behind-the-code);
- two arithmetic units' peak: max-plus taps (``x = max(x, y) + s``, a max and an add, what a tropical semiconv tap
  does) and exponentials (``x = exp2(-x)``), in registers only, 8 independent chains a lane so that the unit, not
  a chain's latency, binds.

Imported only where triton is.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS = 64  # rows per program: one bag of the gather
CHAINS = 1024  # the arithmetic probes' chains per program: 8 a lane at 4 warps
UNROLL = 8  # steps of each chain per loop trip, so the loop's own instructions do not count


@triton.jit
def _rows(idx_ptr, n, ROWS: tl.constexpr):
    """This program's rows r, which of them exist, their table rows idx[r] and the 32 columns."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    mask = r < n
    return r, mask, tl.load(idx_ptr + r, mask=mask, other=0), tl.arange(0, 32)


@triton.jit
def _gather(out_ptr, table_ptr, idx_ptr, n, ROWS: tl.constexpr):
    # each program sums ROWS rows of 32 gathered at the indices: out[program] = sum of table[idx[r]]
    r, mask, i, c = _rows(idx_ptr, n, ROWS)
    rows = tl.load(table_ptr + i[:, None] * 32 + c[None, :], mask=mask[:, None], other=0.0)
    tl.store(out_ptr + tl.program_id(0) * 32 + c, tl.sum(rows, axis=0))


@triton.jit
def _scatter(acc_ptr, src_ptr, idx_ptr, n, ROWS: tl.constexpr):
    # acc[idx[r]] += src[r], row by row, with relaxed atomics (what a gradient's scatter-add issues)
    r, mask, i, c = _rows(idx_ptr, n, ROWS)
    v = tl.load(src_ptr + r[:, None] * 32 + c[None, :], mask=mask[:, None], other=0.0)
    tl.atomic_add(acc_ptr + i[:, None] * 32 + c[None, :], v, mask=mask[:, None], sem="relaxed")


def gather(out: torch.Tensor, table: torch.Tensor, idx: torch.Tensor) -> None:
    """``out[k] = table[idx[k*64 : (k+1)*64]].sum(0)``: ``table`` [R, 32] float32, ``out`` [cdiv(n, 64), 32]."""
    _gather[(triton.cdiv(idx.numel(), ROWS),)](out, table, idx, idx.numel(), ROWS=ROWS)


def scatter(acc: torch.Tensor, src: torch.Tensor, idx: torch.Tensor) -> None:
    """``acc.index_add_(0, idx, src)`` with atomics: ``acc`` [R, 32], ``src`` [n, 32] float32."""
    _scatter[(triton.cdiv(idx.numel(), ROWS),)](acc, src, idx, idx.numel(), ROWS=ROWS)


@triton.jit
def _maxplus(out_ptr, step, trips, CHAINS: tl.constexpr, UNROLL: tl.constexpr):
    i = tl.program_id(0) * CHAINS + tl.arange(0, CHAINS)
    x = i.to(tl.float32) * 1e-6
    y = 1.0 - x
    for _ in range(trips):
        for _u in tl.static_range(UNROLL):
            x = tl.maximum(x, y) + step
    tl.store(out_ptr + i, x)


@triton.jit
def _exp2(out_ptr, trips, CHAINS: tl.constexpr, UNROLL: tl.constexpr):
    i = tl.program_id(0) * CHAINS + tl.arange(0, CHAINS)
    x = i.to(tl.float32) * 1e-9
    for _ in range(trips):
        for _u in tl.static_range(UNROLL):
            x = tl.exp2(-x)
    tl.store(out_ptr + i, x)


def maxplus(out: torch.Tensor, step: float, trips: int) -> int:
    """Chains ``x = max(x, 1 - x0) + step`` from ``x0 = 1e-6 k`` (k: the chain), ``trips * UNROLL`` steps each, the
    results into ``out`` (float32, a multiple of CHAINS elements); returns the taps done (each a max and an add)."""
    _maxplus[(out.numel() // CHAINS,)](out, step, trips, CHAINS=CHAINS, UNROLL=UNROLL)
    return out.numel() * trips * UNROLL


def exp2(out: torch.Tensor, trips: int) -> int:
    """Chains ``x = exp2(-x)`` from ``x0 = 1e-9 k``, as `maxplus`; returns the exponentials done."""
    _exp2[(out.numel() // CHAINS,)](out, trips, CHAINS=CHAINS, UNROLL=UNROLL)
    return out.numel() * trips * UNROLL
