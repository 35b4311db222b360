"""Every top-level ``gpulayer`` command: the module that defines it and its one-line help.

This table is the one place that text is written: ``gpulayer --help`` lists it without
importing any command module, and each module takes its group's or command's help from
:func:`help_of`. A module is imported, and its Typer commands converted to click's, only
when one of its commands runs or shows its own help (:class:`LazyCommands`), so a command
pays only for its own group's start-up.

A new command: a module in this package with a ``register(app)`` function that adds its
groups and commands to ``app`` (named as here), and one row per name in :data:`COMMANDS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import Any

import typer
import typer.main

from gpulayer.cli import conventions

#: name -> (module in gpulayer.cli, one-line help), in the order ``gpulayer --help`` lists them
COMMANDS: dict[str, tuple[str, str]] = {
    "submit": ("jobs", "Submit a command as a job, stream its output and exit with its exit code."),
    "explain": ("explain", "Could this job run, where, and if not, which worker comes closest? Takes "
                           "gpulayer submit's options; submits nothing."),
    "dashboard": ("dashboard", "Serve the web dashboard of the embedded control plane on 127.0.0.1."),
    "resources": ("resources", "What this machine offers to jobs."),
    "plugins": ("resources", "Installed GPUlayer plugins."),
    "profiles": ("resources", "Runtime profiles (named accelerator + framework presets)."),
    "bundle": ("bundle", "Source bundles: the deterministic zip your code travels in."),
    "jobs": ("jobs", "Inspect and control jobs."),
    "worker": ("worker", "Run and inspect workers."),
    "server": ("server", "Run the self-hosted control plane."),
    "token": ("token", "Manage a server's API tokens (needs --url and an admin token)."),
    "providers": ("machines", "Providers that bring up machines for cloud jobs (admin)."),
    "machines": ("machines", "Machines providers brought up for cloud jobs (admin)."),
}


def help_of(name: str) -> str:
    """The one-line help of the top-level command ``name``."""
    return COMMANDS[name][1]


class LazyCommands(MutableMapping[str, Any]):
    """The root group's ``commands``: every name of :data:`COMMANDS` is there from the
    start, and reading one imports its module (once) and converts what it registers.
    Iterating gives names only; reading every value (a walk of the tree) loads them all."""

    def __init__(self, extra: MutableMapping[str, Any] | None = None) -> None:
        self._loaded: dict[str, Any] = dict(extra or {})
        self._modules: set[str] = set()

    def _load(self, module: str) -> None:
        if module in self._modules:
            return
        mod = importlib.import_module(f"gpulayer.cli.{module}")
        holder = typer.Typer(rich_markup_mode=None, add_completion=False, pretty_exceptions_enable=False)
        mod.register(holder)
        for name, cmd in typer.main.get_group(holder).commands.items():
            self._loaded[name] = conventions.prepare(cmd)
        self._modules.add(module)

    def loaded(self) -> list[Any]:
        """The commands converted so far (what :func:`conventions.prepare` walks)."""
        return list(self._loaded.values())

    def __getitem__(self, name: str) -> Any:
        if name not in self._loaded and name in COMMANDS:
            self._load(COMMANDS[name][0])
        return self._loaded[name]

    def __setitem__(self, name: str, cmd: Any) -> None:
        self._loaded[name] = cmd

    def __delitem__(self, name: str) -> None:
        del self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        yield from COMMANDS
        yield from (n for n in self._loaded if n not in COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS) + sum(1 for n in self._loaded if n not in COMMANDS)

    def __contains__(self, name: object) -> bool:
        return name in COMMANDS or name in self._loaded
