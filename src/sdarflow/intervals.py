"""The Wilson score interval of a proportion, the one interval both evaluation (pass rates) and skill extraction
(a rule's success rate) use, so it sits below both."""

from __future__ import annotations

import math

# Two-sided 95% quantile of the standard normal.
Z95 = 1.959963984540054


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion (Wilson 1927): right for small counts, never ``(0, 0)``.

    ``(p + z^2 / 2n -+ z sqrt(p (1 - p) / n + z^2 / 4n^2)) / (1 + z^2 / n)`` with ``p = successes / trials``;
    0 of 16 gives ``(0, 0.194)``, where the normal approximation would give ``(0, 0)``.
    """
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(
            f"wilson_interval needs 0 <= successes ({successes}) <= trials ({trials}), trials >= 1"
        )
    p, n, z2 = successes / trials, trials, z * z
    center = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (max(0.0, center - half), min(1.0, center + half))
