"""Two Triton kernels that `kernelhub.bench.rates` times on a GPU: a cache gather and an atomic scatter of 128-byte
rows (32 float32) at random rows of a table, each the simplest kernel of its kind. torch's own kernels for these
(``embedding_bag``, ``index_add_``, ``scatter_add_``) reach well under their rate on an H200, and a floor from a
rate a kernel of the op beats is no floor (docs/ops.md, "Least work"; the figures:
docs/lab/benchmarks-history.md#measurements-behind-the-code). Imported only where triton is.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS = 64  # rows per program: one bag of the gather


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
