"""Calls into the distributed launcher a job names: its ``check`` where the job is
submitted, its ``build`` on each node's worker. A launcher is a plugin's record
(:class:`~gpulayer.hookrecords.DistributedLauncher`); what it raises or returns is checked
here and reported naming the launcher and its plugin."""

from __future__ import annotations

import warnings

from gpulayer import plugins
from gpulayer.errors import InvalidInput, PluginError, one_line
from gpulayer.hookrecords import LaunchCommand, Rendezvous
from gpulayer.specs import DistributedJob

__all__ = ["check_launch", "launch_command"]

HOOK = "gpulayer_distributed_launchers"


def _where(job: DistributedJob) -> str:
    return f"launcher {job.launcher!r} (plugin {plugins.get_manager().owner(HOOK, job.launcher)!r})"


def check_launch(job: DistributedJob) -> None:
    """Refuse, with :class:`InvalidInput`, a job its launcher's ``check`` says it could
    never run. A launcher not installed here is left to the workers, which have it or say
    so; a ``check`` that raises anything but :class:`ValueError` is the plugin's fault: a
    :class:`~gpulayer.plugins.PluginWarning` (once per launcher in a process), and the job goes on."""
    launcher = plugins.launchers().get(job.launcher)
    if launcher is None or launcher.check is None:
        return
    try:
        launcher.check(job)
    except ValueError as exc:
        why = " ".join(str(exc).split()) or "refused by its check()"
        raise InvalidInput(f"launcher {job.launcher!r} cannot run this job: {why}") from None
    except plugins.PLUGIN_FAULTS as exc:
        manager = plugins.get_manager()
        owner = manager.owner(HOOK, job.launcher) or "?"
        # (a submit checks twice, where the spec is built and in the control plane: one warning)
        if manager.first_report(owner, f"{HOOK} {job.launcher!r} check()"):
            warnings.warn(f"{_where(job)}: check() raised {one_line(exc)}; the job was not checked",
                          plugins.PluginWarning, stacklevel=2)


def launch_command(job: DistributedJob, rendezvous: Rendezvous, node_rank: int, python: str) -> LaunchCommand:
    """One node's command, from the launcher ``job`` names; a :class:`PluginError` that
    names the launcher and its plugin where it is not installed, or its ``build`` raised or
    returned something else than a :class:`LaunchCommand`."""
    found = plugins.launchers()
    launcher = found.get(job.launcher)
    if launcher is None:
        raise PluginError(f"launcher {job.launcher!r} is not installed on this worker "
                          f"(installed: {', '.join(sorted(found)) or 'none'})", hook=HOOK)
    try:
        command = launcher.build(job, rendezvous, node_rank, python)
    except plugins.PLUGIN_FAULTS as exc:
        raise PluginError(f"{_where(job)}: build() raised {one_line(exc)}", hook=HOOK) from exc
    if not isinstance(command, LaunchCommand):
        raise PluginError(f"{_where(job)}: build() returned {type(command).__name__}; accepted: a LaunchCommand "
                          "(gpulayer.plugin.LaunchCommand(argv=[...], env={...}))", hook=HOOK)
    return command
