"""Where GPUlayer keeps its state, and the settings read from the environment.

=========================  ==============================================================
``GPULAYER_HOME``          state directory (default ``~/.gpulayer``): the embedded
                           SQLite database, bundle cache, worker scratch space, tokens
``GPULAYER_URL``           a self-hosted control plane; unset means embedded
``GPULAYER_TOKEN``         the API token for ``GPULAYER_URL``
``GPULAYER_CA``            CA bundle / certificate file to trust for ``GPULAYER_URL``
``GPULAYER_DISABLE_PLUGINS``  plugins not to load, comma separated
``GPULAYER_PLUGINS``       extra plugin modules to load, comma separated
``GPULAYER_MAX_BUNDLE_MB`` largest source bundle accepted (default 100)
=========================  ==============================================================
"""

from __future__ import annotations

import os
from pathlib import Path

from gpulayer.errors import InvalidInput

DEFAULT_MAX_BUNDLE_MB = 100.0


def home() -> Path:
    """The state directory, created on first use."""
    raw = os.environ.get("GPULAYER_HOME") or str(Path.home() / ".gpulayer")
    path = Path(raw).expanduser().resolve()
    # owner only: it holds the database (job specs, code, logs, results) and tokens
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    """A float setting from the environment; a bad value names the variable."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidInput(f"{name}={raw!r}: expected a number") from None
    if value < minimum:
        raise InvalidInput(f"{name}={raw!r}: expected a number >= {minimum}")
    return value


def max_bundle_bytes() -> int:
    return int(env_float("GPULAYER_MAX_BUNDLE_MB", DEFAULT_MAX_BUNDLE_MB, minimum=0.001) * 1024 * 1024)
