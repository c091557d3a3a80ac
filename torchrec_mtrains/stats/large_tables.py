"""Synthetic ids for tables too large for per-row arrays (hundreds of millions of rows).

The small-table generators hold a permutation of the rows (8 B per row) and, for Zipf, a
cumulative distribution (8 B more): 4.8 GB for a 300M-row table, in every rank. Here every
per-row quantity is a function instead:

- ``KeyedPermutation``: a pseudo-random bijection of [0, n) (a Feistel network on the
  smallest bit width that covers n, cycle-walking back into range), so rank r maps
  to a row spread over the table as hashed ids are, in O(1) memory.
- ``zipf_ranks``: Zipf(alpha) ranks over n rows, exact for the first ``head`` ranks (their
  cumulative weights, 8 B each) and by the inverse of the continuous tail integral beyond,
  whose error per rank is under (head)^-1 relative.
- ``hashed_normal``: a standard normal per (key, index), from splitmix64 and Box-Muller, for
  per-row hidden effects without a per-row array.
"""

from __future__ import annotations

import numpy as np

__all__ = ["KeyedPermutation", "ZIPF_EXACT_HEAD", "expected_distinct_zipf", "hashed_normal", "hashed_uniform",
           "zipf_ranks"]

ZIPF_EXACT_HEAD = 1 << 20  # ranks whose cumulative weights are held exactly (8 MiB)
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective 64-bit mix (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _key(seed: int, salt: int) -> np.uint64:
    return _splitmix64(np.array([(int(seed) * 0x2545F4914F6CDD1D + salt) & 0xFFFFFFFFFFFFFFFF],
                                dtype=np.uint64))[0]


def hashed_uniform(seed: int, index: np.ndarray) -> np.ndarray:
    """Uniform floats in (0, 1), one per ``index`` (int64 >= 0), fixed by ``seed``."""
    z = _splitmix64(np.asarray(index, dtype=np.int64).astype(np.uint64) ^ _key(seed, 1))
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / (1 << 53))


def hashed_normal(seed: int, index: np.ndarray) -> np.ndarray:
    """Standard normal float32 values, one per ``index``, fixed by ``seed`` (Box-Muller of
    two hashed uniforms)."""
    index = np.asarray(index, dtype=np.int64)
    u1 = hashed_uniform(seed, index)
    u2 = hashed_uniform(seed + 0x5BD1E995, index)
    return (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)).astype(np.float32)


class KeyedPermutation:
    """A bijection of [0, n) chosen by ``seed``, evaluated on arrays in O(1) memory.

    Args:
        n: domain size (>= 1).
        seed: picks the permutation.

    Raises:
        ValueError: n < 1 or n >= 2^62.
    """

    _ROUNDS = 3  # each round mixes both halves: six keyed splitmix64 passes in all

    def __init__(self, n: int, seed: int) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n < (1 << 62):
            raise ValueError(f"KeyedPermutation: n={n!r} must be an integer in [1, 2^62)")
        self.n = int(n)
        bits = max(2, (self.n - 1).bit_length())  # the domain [0, 2^bits) is under 2n
        self._low_bits = np.uint64(bits // 2)
        self._low_mask = np.uint64((1 << (bits // 2)) - 1)
        self._high_mask = np.uint64((1 << (bits - bits // 2)) - 1)
        self._keys = [(_key(seed, 100 + 2 * r), _key(seed, 101 + 2 * r)) for r in range(self._ROUNDS)]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        """A bijection of [0, 2^bits): an unbalanced Feistel network (each half in turn
        xored with a keyed hash of the other)."""
        high, low = x >> self._low_bits, x & self._low_mask
        for k_high, k_low in self._keys:
            high = high ^ (_splitmix64(low ^ k_high) & self._high_mask)
            low = low ^ (_splitmix64(high ^ k_low) & self._low_mask)
        return (high << self._low_bits) | low

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """The images of ``x`` (int64 in [0, n)) as int64.

        Raises:
            ValueError: a value outside [0, n), naming the first.
        """
        x = np.asarray(x, dtype=np.int64)
        if x.size and (x.min() < 0 or x.max() >= self.n):
            bad = x[(x < 0) | (x >= self.n)][0]
            raise ValueError(f"KeyedPermutation: {int(bad)} is outside [0, {self.n})")
        y = self._encrypt(x.astype(np.uint64))
        # Cycle-walking: the network permutes [0, 2^bits), under 2n values; re-encrypt
        # until back in [0, n) (a bijection of [0, n), under two passes per value expected).
        out = y >= np.uint64(self.n)
        while out.any():
            y[out] = self._encrypt(y[out])
            out[out] = y[out] >= np.uint64(self.n)
        return y.astype(np.int64)


def zipf_ranks(rng: np.random.Generator, n: int, count: int, alpha: float,
               head: int = ZIPF_EXACT_HEAD) -> np.ndarray:
    """``count`` 0-based ranks with P(rank k) proportional to (k + 1)^-alpha over ``n`` ranks.

    The first ``min(head, n)`` ranks are drawn exactly; the tail's mass and draws come from
    the integral of x^-alpha over [head + 0.5, n + 0.5] (the midpoint rule's error is
    second order in 1/k, so the tail's ranks are off by well under one rank in a million).
    """
    if not alpha >= 0:
        raise ValueError(f"zipf_ranks: alpha={alpha!r} must be >= 0")
    h = int(min(head, n))
    w = np.arange(1, h + 1, dtype=np.float64) ** -float(alpha)
    head_cdf = np.cumsum(w)
    head_mass = head_cdf[-1]
    a, b = h + 0.5, n + 0.5
    tail_mass = _power_integral(a, b, alpha) if n > h else 0.0
    u = rng.random(count) * (head_mass + tail_mass)
    ranks = np.empty(count, dtype=np.int64)
    in_head = u < head_mass
    ranks[in_head] = np.minimum(np.searchsorted(head_cdf, u[in_head], side="right"), h - 1)
    if n > h:
        v = u[~in_head] - head_mass
        x = _invert_power_integral(a, v, alpha)
        ranks[~in_head] = np.clip(np.floor(x + 0.5).astype(np.int64) - 1, h, n - 1)
    return ranks


def _power_integral(a: float, b: float, alpha: float) -> float:
    """Integral of x^-alpha over [a, b]."""
    if abs(alpha - 1.0) < 1e-12:
        return float(np.log(b / a))
    e = 1.0 - alpha
    return float((b**e - a**e) / e)


def _invert_power_integral(a: float, v: np.ndarray, alpha: float) -> np.ndarray:
    """x with integral of t^-alpha over [a, x] equal to ``v``."""
    if abs(alpha - 1.0) < 1e-12:
        return a * np.exp(v)
    e = 1.0 - alpha
    return np.maximum(a**e + e * v, 1e-300) ** (1.0 / e)


def expected_distinct_zipf(n: int, alpha: float, lookups: float, head: int = ZIPF_EXACT_HEAD) -> float:
    """Expected distinct ranks among ``lookups`` independent Zipf(alpha) draws over ``n``
    ranks: sum over ranks of 1 - exp(-lookups p_k), exact over the head and by the
    trapezoid rule on a log grid of 4,096 points over the tail."""
    h = int(min(head, n))
    w = np.arange(1, h + 1, dtype=np.float64) ** -float(alpha)
    a, b = h + 0.5, n + 0.5
    total = w.sum() + (_power_integral(a, b, alpha) if n > h else 0.0)
    out = float(-np.expm1(-lookups * w / total).sum())
    if n > h:
        x = np.geomspace(a, b, 4096)
        y = -np.expm1(-lookups * x ** -float(alpha) / total)
        out += float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2)
    return min(out, float(n))
