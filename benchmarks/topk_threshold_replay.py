"""Replays radix_topk.cu's candidate threshold (the sample of 2048 float4 chunks, bins fitted in
key space, one or two levels) on random rows with numpy, and prints how many candidates each row
lists: the number that must fit a shared-memory list (8192 entries) for the fast path. No GPU.
Run:  python benchmarks/topk_threshold_replay.py
"""

import numpy as np


def ordered_keys(x: np.ndarray) -> np.ndarray:
    b = x.astype(np.float32).view(np.uint32)
    return np.where(b >> 31, ~b, b | 0x80000000).astype(np.uint64)


def candidates(row: np.ndarray, k: int, levels: int) -> int:
    n = row.size
    chunks = (n + 3) // 4
    sample = ordered_keys(np.concatenate([row[4 * c : 4 * c + 4] for c in np.arange(2048) * chunks // 2048]))
    lo, hi = int(sample.min()), int(sample.max())
    target = min(sample.size, (3 * k * sample.size + 2 * n - 1) // (2 * n) + 16)
    above = 0
    for _ in range(levels):
        shift = max(0, (hi - lo).bit_length() - 11)
        inside = sample[(sample >= lo) & (sample <= hi)]
        bins = np.where(inside >= hi, 0, np.minimum((hi - inside) >> shift, 2047)).astype(np.int64)
        hist = np.bincount(bins, minlength=2048)
        cum = np.cumsum(hist)
        t = int(np.argmax(cum >= target - above))
        above += int(cum[t] - hist[t])
        bin_lo = hi - ((t + 1) << shift) + 1
        hi -= t << shift
        lo = lo if t == 2047 or bin_lo < lo else bin_lo
    return int((ordered_keys(row) >= max(lo, 0x00800000)).sum())


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    for n in (1 << 16, 1 << 20):
        for levels in (1, 2):
            counts = [candidates(rng.standard_normal(n).astype(np.float32), 2048, levels) for _ in range(8)]
            print(f"row of {n:>8} logits, {levels} level(s): candidates {counts}")
