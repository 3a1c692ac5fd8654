"""Shape buckets: many shapes share one tuning decision.

Small sizes are kept exact (launch-bound, and the best tile often changes with every few elements);
up to 2**16 a bucket is one power of two; above that each octave is split in four, because at large
sizes time grows with size and the crossover between two algorithms can fall anywhere in an octave.
The functions are plain integer arithmetic: they run on every call.
"""

from __future__ import annotations

EXACT_UP_TO = 64
COARSE_UP_TO = 1 << 16
STEPS_PER_OCTAVE = 4


def bucket(n: int) -> int:
    """The representative size of n's bucket: the bucket's upper end (so tuning sees the worst case)."""
    if n <= EXACT_UP_TO:
        return n
    if n <= COARSE_UP_TO:
        return 1 << (n - 1).bit_length()
    low = 1 << ((n - 1).bit_length() - 1)  # the power of two below n (n > low)
    step = low // STEPS_PER_OCTAVE
    return low + -(-(n - low) // step) * step


def bucket_range(n: int) -> tuple[int, int]:
    """(first, last) size in the bucket whose representative is bucket(n), for display."""
    b = bucket(n)
    if b <= EXACT_UP_TO:
        return b, b
    if b <= COARSE_UP_TO:
        return b // 2 + 1, b
    low = 1 << ((b - 1).bit_length() - 1)
    step = low // STEPS_PER_OCTAVE
    return b - step + 1, b
