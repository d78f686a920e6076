import math

import pytest
import torch

from longctx_kernels.lse_merge import lse_merge, lse_merge_reference

from .conftest import relative_error


@pytest.mark.parametrize("num_ranks", [1, 2, 5, 8])
@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 1e-2), (torch.float32, 1e-5)])
@pytest.mark.parametrize("base_e", [True, False])
def test_merge_matches_reference(num_ranks, dtype, tol, base_e, gen):
    batch, heads, dim = 3, 6, 512
    partial = torch.randn(num_ranks, batch, heads, dim, generator=gen).to(dtype)
    lse = torch.randn(num_ranks, batch, heads, generator=gen) * 4
    # Empty shards (the merge identity), a broken NaN shard, and one fully empty row.
    lse[0, 0, 0] = -math.inf
    partial[0, 0, 0] = float("nan")  # an empty shard's output must not leak into the result
    if num_ranks > 1:
        lse[1, 2, 3] = float("nan")
    lse[:, 1, 4] = -math.inf
    out = torch.full((batch, heads, dim), float("nan"), dtype=dtype)
    out_lse = torch.full((batch, heads), float("nan"))
    lse_merge(partial, lse, base_e=base_e, out=out, out_lse=out_lse)
    ref, ref_lse = lse_merge_reference(partial, lse, base_e=base_e)
    assert relative_error(out, ref) < tol
    assert torch.equal(out[1, 4], torch.zeros(dim, dtype=dtype))
    assert out_lse[1, 4] == -math.inf
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(out_lse))
    assert relative_error(out_lse[finite], ref_lse[finite]) < 1e-6


def test_merge_of_split_softmax_equals_full_softmax(gen):
    """Two halves of one softmax, merged, equal the softmax over everything."""
    scores = torch.randn(2, 4, 64, generator=gen, dtype=torch.float64)
    values = torch.randn(64, 32, generator=gen, dtype=torch.float64)
    halves = [slice(0, 20), slice(20, 64)]
    part = torch.stack([torch.softmax(scores[..., s], -1) @ values[s] for s in halves]).float()
    part_lse = torch.stack([torch.logsumexp(scores[..., s], -1) for s in halves]).float()
    out, out_lse = lse_merge(part, part_lse)
    assert relative_error(out, torch.softmax(scores, -1) @ values) < 1e-5
    assert relative_error(out_lse, torch.logsumexp(scores, -1)) < 1e-6
