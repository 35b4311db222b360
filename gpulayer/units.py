"""GPUlayer's one memory unit, and durations as people write them (:func:`parse_duration`).

"GB" in GPUlayer is the binary gigabyte, :data:`GB` = 1024**3 bytes (what some tools call a
GiB), wherever a size is shown or compared: device memory and host RAM as
``gpulayer resources detect`` and ``gpulayer worker status`` print them, the
``min_gpu_memory_gb`` and ``memory_gb`` requirements, and the numbers in scheduling reasons.
It is how GPU vendors size memory (a 32 GB Mac has 32 * 1024**3 bytes). Sizes are shown to one
decimal and compared unrounded, in the same unit: a card shown as "80.0 GB" with exactly
80 * 1024**3 bytes meets ``min_gpu_memory_gb=80`` and not ``85``.
"""

from __future__ import annotations

import math

from gpulayer.errors import InvalidInput

GB = 1024**3


def gb(nbytes: float) -> float:
    """``nbytes`` in GB."""
    return nbytes / GB


def format_gb(nbytes: float, digits: int = 1) -> str:
    """``nbytes`` as GPUlayer shows a size, without the unit: ``format_gb(80 * GB) == "80.0"``."""
    return f"{nbytes / GB:.{digits}f}"


def format_wanted_gb(value: float) -> str:
    """A requirement in GB as reasons show it: one decimal (``"64.0"``), or as many as it
    has (``"80.05"``), so that the number shown is the number compared."""
    one = f"{value:.1f}"
    return one if float(one) == value else f"{value:.10g}"


def format_gb_below(nbytes: float, limit: float) -> str:
    """``nbytes``, less than ``limit`` GB, as a reason shows it: one decimal, or three rounded
    down where one decimal would read as ``limit`` or more (``"63.999"``, not ``"64.0"``)."""
    shown = format_gb(nbytes)
    if float(shown) < limit:
        return shown
    return f"{math.floor(nbytes / GB * 1000) / 1000:.3f}"


#: the longest duration :func:`parse_duration` takes (the API's bound on a token's ttl)
MAX_DURATION = 10 * 365 * 86400.0


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``24h``, ``7d`` -> seconds."""
    raw = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    mult = 1.0
    if raw and raw[-1] in units:
        mult, raw = units[raw[-1]], raw[:-1]
    try:
        value = float(raw) * mult
    except ValueError:
        raise InvalidInput(f"duration {text!r}: expected a number with an optional unit s, m, h or d (e.g. 24h)") from None
    if not 0 < value <= MAX_DURATION:  # (nan and inf too)
        raise InvalidInput(f"duration {text!r}: expected more than 0 seconds and at most 10 years (3650d)")
    return value
