"""The device part of a task's environment: its granted devices visible, every other one hidden.

Two rules, both answered by plugins, neither knowing a vendor:

* the kind the task was granted devices of: the ``gpulayer_device_environment`` hook,
  called with exactly the granted devices (never with an empty list);
* every other kind the worker has (all of them for a CPU task, and the task's own kind
  when it was granted none): the ``hide_env`` of that kind's accelerator detector, the
  variables that leave a process no device of the kind.

A kind whose detector is gone (its plugin disabled since the worker detected it) or has
no ``hide_env`` sets nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpulayer import plugins
from gpulayer.hookrecords import Device

__all__ = ["kind_environment", "task_environment"]


def kind_environment(kind: str, granted: Sequence[Device]) -> dict[str, str]:
    """What a task granted ``granted`` devices of ``kind`` sees for that kind."""
    if granted:
        return plugins.device_environment(kind, granted)
    detector = plugins.detectors().get(kind)
    return dict(detector.hide_env) if detector is not None else {}


def task_environment(worker_devices: Iterable[Device], accelerator: str | None,
                     granted: Iterable[int]) -> dict[str, str]:
    """The device variables of a task on a worker with ``worker_devices`` that was granted
    the devices of kind ``accelerator`` with runtime indices ``granted`` (in grant order)."""
    have = list(worker_devices)
    by_kind: dict[str, list[Device]] = {d.kind: [] for d in have}
    if accelerator:
        by_index = {d.index: d for d in have if d.kind == accelerator}
        by_kind[accelerator] = [by_index[i] for i in granted if i in by_index]
    env: dict[str, str] = {}
    for kind, devices in by_kind.items():
        env.update(kind_environment(kind, devices))
    return env
