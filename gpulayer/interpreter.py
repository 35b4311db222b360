"""What a Python interpreter takes from its environment as it starts.

A warm interpreter that forks a child to do what a fresh one would (the worker's fork server
for a FunctionJob, :mod:`gpulayer.worker.forking`; a worker's CLI server for a command line,
:mod:`gpulayer.cli.warm`) is only a stand-in for a fresh one while these match: the child
inherits what its parent read at its own start. Standard library only (the CLI's start-up
imports it).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["start_variables"]

#: variables an interpreter (or the C library under it) reads as it starts: ``PYTHON*``,
#: the dynamic linker's and the allocator's
_PREFIXES = ("PYTHON", "LD_", "MALLOC_")
#: read at start-up too, but a forked child applies them itself: ``PYTHONPATH`` (its
#: ``sys.path``), ``PYTHONUNBUFFERED`` (how its streams are buffered)
_APPLIED_AFTER = frozenset({"PYTHONPATH", "PYTHONUNBUFFERED"})
#: the locale's, which set the standard streams' encoding (``locale=True``)
_LOCALE = ("LC_", "LANG")


def start_variables(env: Mapping[str, str], *, locale: bool = False) -> dict[str, str]:
    """The variables of ``env`` a fresh interpreter would read as it starts and a forked child
    cannot apply after the fork (with ``locale``: the locale's too)."""
    prefixes = _PREFIXES + _LOCALE if locale else _PREFIXES
    return {k: v for k, v in env.items() if k.startswith(prefixes) and k not in _APPLIED_AFTER}
