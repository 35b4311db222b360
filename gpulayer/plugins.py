"""The plugin manager: finds plugins, loads them once, and collects their records.

Plugins come from three places, in this order:

1. entry points in the ``gpulayer`` group (our bundled plugins use this door too);
2. modules named in ``GPULAYER_PLUGINS`` (comma separated), handy for tests and for a
   plugin under development that is not installed yet;
3. objects registered in-process with :func:`register` (tests, notebooks).

``GPULAYER_DISABLE_PLUGINS=cuda,rocm`` blocks plugins by name before they are imported.
A plugin that fails to import is skipped with one warning and listed as ``broken``; a
hookimpl that matches no hook is a :class:`~gpulayer.errors.PluginError` naming the plugin.
"""

from __future__ import annotations

import importlib
import inspect
import os
import threading
import traceback
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, TypeVar

import pluggy

from gpulayer import hookspecs
from gpulayer.errors import PluginError
from gpulayer.hookrecords import HookRecord

ENTRY_POINT_GROUP = "gpulayer"
DISABLE_ENV = "GPULAYER_DISABLE_PLUGINS"
EXTRA_ENV = "GPULAYER_PLUGINS"

R = TypeVar("R", bound=HookRecord)


class PluginWarning(UserWarning):
    """A plugin was skipped (it failed to import) or a setting named no plugin."""


@dataclass
class PluginInfo:
    """One plugin as ``gpulayer plugins list`` shows it."""

    name: str
    distribution: str | None = None
    version: str | None = None
    module: str | None = None
    status: str = "loaded"  # loaded | disabled | broken
    error: str | None = None
    hooks: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "distribution": self.distribution, "version": self.version,
            "module": self.module, "status": self.status, "error": self.error,
            "hooks": self.hooks,
        }


def _split_env(name: str) -> list[str]:
    return [p.strip() for p in os.environ.get(name, "").split(",") if p.strip()]


class PluginManager:
    """Wraps :class:`pluggy.PluginManager` with loading rules and record registries."""

    def __init__(self, *, load_entry_points: bool = True) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}
        self.unknown_disabled: list[str] = []
        self._load_entry_points = load_entry_points
        self._loaded = False
        self._lock = threading.RLock()
        self._cache: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ loading

    def load(self) -> PluginManager:
        with self._lock:
            if self._loaded:
                return self
            self._loaded = True
            disabled = set(_split_env(DISABLE_ENV))
            seen: set[str] = set()
            if self._load_entry_points:
                for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
                    if ep.name in seen:
                        continue  # the same distribution seen twice on sys.path
                    seen.add(ep.name)
                    dist = getattr(ep, "dist", None)
                    info = PluginInfo(
                        name=ep.name, module=ep.value,
                        distribution=dist.metadata["Name"] if dist is not None else None,
                        version=dist.version if dist is not None else None,
                    )
                    self._load_one(info, ep.load, disabled)
            for modname in _split_env(EXTRA_ENV):
                if modname in seen:
                    continue
                seen.add(modname)
                info = PluginInfo(name=modname, module=modname, distribution=None)
                self._load_one(info, lambda m=modname: importlib.import_module(m), disabled)
            self.unknown_disabled = sorted(disabled - seen)
            if self.unknown_disabled:
                warnings.warn(
                    f"{DISABLE_ENV} names no installed plugin: {', '.join(self.unknown_disabled)} "
                    f"(installed: {', '.join(sorted(seen)) or 'none'})",
                    PluginWarning, stacklevel=2,
                )
            self._check_pending()
            return self

    def _load_one(self, info: PluginInfo, loader: Any, disabled: set[str]) -> None:
        self.infos[info.name] = info
        if info.name in disabled:
            info.status = "disabled"
            self.pm.set_blocked(info.name)
            return
        try:
            obj = loader()
        except Exception as exc:  # any import-time failure: skip, warn once, list as broken
            info.status = "broken"
            info.error = f"{type(exc).__name__}: {exc}"
            tb = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            warnings.warn(
                f"gpulayer plugin {info.name!r} (distribution {info.distribution or 'unknown'}) "
                f"failed to load and was skipped: {tb}",
                PluginWarning, stacklevel=3,
            )
            return
        self._register(obj, info)

    def _register(self, obj: Any, info: PluginInfo) -> None:
        try:
            self.pm.register(obj, name=info.name)
        except ValueError as exc:
            raise PluginError(f"plugin {info.name!r}: {exc}") from exc
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {info.name!r}: {exc}") from exc
        info.hooks = sorted(
            name for name in dir(obj)
            if name.startswith("gpulayer_") and self.pm.parse_hookimpl_opts(obj, name) is not None
        )

    def _check_pending(self) -> None:
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            plugin_name = self.pm.get_name(exc.plugin) if exc.plugin is not None else "?"
            raise PluginError(
                f"plugin {plugin_name!r} implements a hook that GPUlayer does not define: {exc}; "
                f"known hooks: {', '.join(sorted(hookspecs.RECORD_HOOKS) + ['gpulayer_device_environment'])}"
            ) from exc

    def register(self, obj: Any, name: str | None = None) -> None:
        """Register a plugin object in this process (tests, notebooks)."""
        with self._lock:
            self.load()
            name = name or getattr(obj, "__name__", None) or f"plugin-{id(obj)}"
            info = PluginInfo(name=name, module=getattr(obj, "__name__", None), distribution=None)
            self.infos[name] = info
            self._register(obj, info)
            self._check_pending()
            self._cache.clear()

    def unregister(self, name: str) -> None:
        with self._lock:
            self.pm.unregister(name=name)
            self.infos.pop(name, None)
            self._cache.clear()

    # ------------------------------------------------------------------ results

    @property
    def hook(self) -> Any:
        self.load()
        return self.pm.hook

    def collect(self, hook_name: str) -> dict[str, Any]:
        """Call a record hook on every plugin; return ``{record.name: record}``.

        Two plugins offering one name is a :class:`PluginError` naming both.
        """
        with self._lock:
            self.load()
            if hook_name in self._cache:
                return self._cache[hook_name]
            what = hookspecs.RECORD_HOOKS[hook_name]
            records: dict[str, Any] = {}
            owners: dict[str, str] = {}
            caller = getattr(self.pm.hook, hook_name)
            for impl in caller.get_hookimpls():  # registration order
                plugin_name = impl.plugin_name
                try:
                    result = impl.function()
                    items = list(result or [])
                except Exception as exc:
                    raise PluginError(f"plugin {plugin_name!r}: {hook_name} raised {type(exc).__name__}: {exc}") from exc
                for rec in items:
                    if not isinstance(rec, HookRecord):
                        raise PluginError(
                            f"plugin {plugin_name!r}: {hook_name} returned {type(rec).__name__}, "
                            f"expected {what} records"
                        )
                    if rec.name in records:
                        raise PluginError(
                            f"Conflicting plugins found for {what} {rec.name!r}: "
                            f"{owners[rec.name]!r} and {plugin_name!r}"
                        )
                    records[rec.name] = rec
                    owners[rec.name] = plugin_name
            self._cache[hook_name] = records
            self._cache[hook_name + ":owners"] = owners
            return records

    def owner(self, hook_name: str, record_name: str) -> str | None:
        self.collect(hook_name)
        return self._cache[hook_name + ":owners"].get(record_name)

    def list_plugins(self) -> list[PluginInfo]:
        self.load()
        return sorted(self.infos.values(), key=lambda i: i.name)


_manager: PluginManager | None = None
_manager_lock = threading.Lock()


def get_manager() -> PluginManager:
    """The process-wide plugin manager, loaded on first use."""
    global _manager
    with _manager_lock:
        if _manager is None:
            _manager = PluginManager()
    return _manager.load()


def reset_manager(manager: PluginManager | None = None) -> None:
    """Forget the process-wide manager (tests), or install ``manager`` in its place."""
    global _manager
    with _manager_lock:
        _manager = manager


def register(obj: Any, name: str | None = None) -> None:
    get_manager().register(obj, name)


def detectors() -> dict[str, Any]:
    return get_manager().collect("gpulayer_accelerator_detectors")


def framework_probes() -> dict[str, Any]:
    return get_manager().collect("gpulayer_framework_probes")


def profiles() -> dict[str, Any]:
    return get_manager().collect("gpulayer_runtime_profiles")


def providers() -> dict[str, Any]:
    return get_manager().collect("gpulayer_provider_adapters")


def launchers() -> dict[str, Any]:
    return get_manager().collect("gpulayer_distributed_launchers")


def device_environment(kind: str, devices: Iterable[Any]) -> dict[str, str]:
    result = get_manager().hook.gpulayer_device_environment(kind=kind, devices=list(devices))
    return dict(result.env) if result is not None else {}


def hook_names() -> list[str]:
    return sorted(name for name, _ in inspect.getmembers(hookspecs) if name.startswith("gpulayer_"))
