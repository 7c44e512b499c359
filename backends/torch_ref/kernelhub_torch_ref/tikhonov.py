"""Tikhonov-regularised 2-row inverse (docs/ops.md): SVD forward, closed-form gradient."""

from __future__ import annotations

import torch


def _work_dtype(M: torch.Tensor) -> torch.dtype:
    return torch.complex128 if M.is_complex() else torch.float64


def tikhonov_inverse_2xn(M: torch.Tensor, lam: float) -> torch.Tensor:
    """U diag(S / (S^2 + lam)) Vh through torch.linalg.svd in complex128 (float64 for real M). A matrix with a
    NaN or an infinite entry gives NaN throughout (as the closed form does: its determinant is NaN)."""
    if M.numel() == 0:
        return torch.zeros(M.shape, dtype=M.dtype, device=M.device)
    work = M.to(_work_dtype(M))
    bad = ~torch.isfinite(work).all(dim=-1).all(dim=-1, keepdim=True)[..., None]  # [..., 1, 1]
    U, S, Vh = torch.linalg.svd(work.masked_fill(bad, 0), full_matrices=False)  # the SVD refuses non-finite input
    filt = (S / (S * S + lam)).to(Vh.dtype)
    return (U @ (filt[..., :, None] * Vh)).masked_fill(bad, float("nan")).to(M.dtype).contiguous()


def _abs2(z: torch.Tensor) -> torch.Tensor:
    return z.real.square() + z.imag.square() if z.is_complex() else z.square()


def closed_form(M: torch.Tensor, lam: float) -> torch.Tensor:
    """(M M^H + lam I)^-1 M with the explicit 2x2 inverse."""
    M0, M1 = M[..., 0, :], M[..., 1, :]
    a = _abs2(M0).sum(-1, keepdim=True)
    c = _abs2(M1).sum(-1, keepdim=True)
    b = (M0 * M1.conj()).sum(-1, keepdim=True)
    det = (a + lam) * (c + lam) - _abs2(b)
    W0 = ((c + lam) * M0 - b * M1) / det
    W1 = ((a + lam) * M1 - b.conj() * M0) / det
    return torch.stack([W0, W1], dim=-2)


def closed_form_float64(M: torch.Tensor, lam: float) -> torch.Tensor:
    """The function whose gradient the reference uses: the closed form in complex128 / float64."""
    return closed_form(M.to(_work_dtype(M)), lam).to(M.dtype)
