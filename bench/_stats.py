"""What every bench prints: median, p95, the floor from the same run, and the ratio."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def pct(values: Sequence[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def table(title: str, rows: Sequence[tuple[str, Sequence[float], str, Sequence[float]]]) -> str:
    """``rows``: (measure, samples in seconds, floor's name, floor's samples in seconds)."""
    head = (f"{'measure':<34}{'median':>10}{'p95':>10}   {'floor':<34}{'median':>10}{'p95':>10}"
            f"{'+median':>10}{'ratio':>7}")
    lines = [title, head, "-" * len(head)]
    for name, got, floor_name, floor in rows:
        gm, gp = statistics.median(got), pct(got, 95)
        fm, fp = statistics.median(floor), pct(floor, 95)
        lines.append(f"{name:<34}{ms(gm):>10}{ms(gp):>10}   {floor_name:<34}{ms(fm):>10}{ms(fp):>10}"
                     f"{ms(gm - fm):>10}{gm / fm:>6.2f}x")
    return "\n".join(lines)
