"""DCP log-sum-exp merge of partial attention outputs from N ranks.

Each DCP rank attends over its shard of the KV cache and returns a partial
output ``o_n`` with its log-sum-exp ``lse_n``. The exact full-context result is

    lse = log(sum_n exp(lse_n)),   out = sum_n exp(lse_n - lse) * o_n

A rank that owns none of the selected tokens reports ``(o=0, lse=-inf)``, the
identity element of the merge. NaN or +inf LSEs are treated as -inf (a broken
shard must not poison the others), and when every shard is empty the output is
0 with ``lse=-inf``. ``base_e=False`` merges base-2 LSEs (FlashMLA's sparse
prefill reports ``log2sumexp2``), so callers pass the base explicitly.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


def _sanitize_lse(lse: torch.Tensor) -> torch.Tensor:
    bad = torch.isnan(lse) | (lse == math.inf)
    return torch.where(bad, torch.full_like(lse, -math.inf), lse)


def lse_merge_reference(
    partial_out: torch.Tensor, partial_lse: torch.Tensor, base_e: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """partial_out [N, B, H, D], partial_lse [N, B, H] -> out [B, H, D], lse [B, H] fp32."""
    lse = _sanitize_lse(partial_lse.double())
    if not base_e:
        lse = lse * math.log(2.0)
    lse_max = lse.amax(dim=0)
    # All shards empty: use 0 as the max so exp() gives 0 instead of NaN.
    lse_max = torch.where(torch.isinf(lse_max), torch.zeros_like(lse_max), lse_max)
    weights = torch.exp(lse - lse_max)
    total = weights.sum(dim=0)
    merged_lse = torch.log(total) + lse_max
    scale = torch.where(total > 0, weights / total, torch.zeros_like(weights))
    # A zero weight must also silence a garbage (e.g. NaN) partial output.
    scale = scale.unsqueeze(-1)
    out = torch.where(scale > 0, scale * partial_out.double(), 0.0).sum(dim=0)
    if not base_e:
        merged_lse = merged_lse / math.log(2.0)
    return out.to(partial_out.dtype), merged_lse.float()


@triton.jit
def _lse_merge_kernel(
    out_ptr, out_lse_ptr, part_ptr, part_lse_ptr,
    num_ranks, B, H, D,
    stride_pn, stride_pb, stride_ph,
    stride_ob, stride_oh,
    BASE_E: tl.constexpr, N_POW2: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program per (token, block of heads): at decode sizes this kernel is
    # launch-bound, so several heads per program keep the grid small.
    b = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    n = tl.arange(0, N_POW2)
    h_ok = h < H
    lse_mask = (n[:, None] < num_ranks) & h_ok[None, :]
    lse = tl.load(
        part_lse_ptr + n[:, None] * (B * H) + b * H + h[None, :], mask=lse_mask, other=float("-inf")
    ).to(tl.float32)
    lse = tl.where((lse != lse) | (lse == float("inf")), float("-inf"), lse)
    lse_max = tl.max(lse, axis=0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    if BASE_E:
        weights = tl.exp(lse - lse_max[None, :])
    else:
        weights = tl.exp2(lse - lse_max[None, :])
    total = tl.sum(weights, axis=0)
    scale = tl.where(total[None, :] > 0, weights / total[None, :], 0.0)
    if BASE_E:
        merged_lse = tl.log(total) + lse_max
    else:
        merged_lse = tl.log2(total) + lse_max
    tl.store(out_lse_ptr + b * H + h, merged_lse, mask=h_ok)

    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        acc = tl.zeros((BLOCK_H, BLOCK_D), dtype=tl.float32)
        row_mask = h_ok[:, None] & (d[None, :] < D)
        for r in range(0, num_ranks):
            # The rank's scale is column r of `scale`; extracting it with a
            # masked sum keeps the N LSEs in one vector load above.
            scale_r = tl.sum(tl.where(n[:, None] == r, scale, 0.0), axis=0)
            part = tl.load(
                part_ptr + r * stride_pn + b * stride_pb + h[:, None] * stride_ph + d[None, :],
                mask=row_mask & (scale_r[:, None] > 0), other=0.0,
            )
            acc += scale_r[:, None] * part.to(tl.float32)
        tl.store(
            out_ptr + b * stride_ob + h[:, None] * stride_oh + d[None, :],
            acc.to(out_ptr.dtype.element_ty), mask=row_mask,
        )


def lse_merge(
    partial_out: torch.Tensor,
    partial_lse: torch.Tensor,
    base_e: bool = True,
    out_dtype: torch.dtype | None = None,
    block_h: int = 4,
    out: torch.Tensor | None = None,
    out_lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton merge; same contract as :func:`lse_merge_reference` (`out`/`out_lse` may be given)."""
    num_ranks, B, H, D = partial_out.shape
    assert partial_lse.shape == (num_ranks, B, H)
    assert partial_out.stride(-1) == 1
    partial_lse = partial_lse.contiguous()
    if out is None:
        out = torch.empty((B, H, D), dtype=out_dtype or partial_out.dtype, device=partial_out.device)
    if out_lse is None:
        out_lse = torch.empty((B, H), dtype=torch.float32, device=partial_out.device)
    block_d = min(triton.next_power_of_2(D), 512)
    grid = (B, triton.cdiv(H, block_h))
    _lse_merge_kernel[grid](
        out, out_lse, partial_out, partial_lse,
        num_ranks, B, H, D,
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        out.stride(0), out.stride(1),
        BASE_E=base_e, N_POW2=max(triton.next_power_of_2(num_ranks), 2),
        BLOCK_H=block_h, BLOCK_D=block_d,
    )
    return out, out_lse
