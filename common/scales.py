"""Chart scales: an axis ends at a round figure above the data, written with the digits it needs."""

import math

STEPS = (1.0, 2.0, 2.5, 5.0, 10.0)


def nice_ceiling(peak: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times 10^k at or above ``peak`` (0 for nothing): 0.014 -> 0.02, 7 -> 10."""
    if peak <= 0:
        return 0.0
    power = 10.0 ** math.floor(math.log10(peak))
    return next(step * power for step in STEPS if step * power >= peak * (1 - 1e-12))


def figure(value: float) -> str:
    """0.02, 2.5, 2,000: no more digits than the value has (to 3 significant ones), never 0.0 for 0.02."""
    if value == 0:
        return "0"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{digits}f}".rstrip("0").rstrip(".") if digits else f"{value:,.0f}"
