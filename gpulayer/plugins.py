"""The plugin manager: finds plugins, loads them once, and collects their records.

Plugins come from three places, in this order:

1. entry points in the ``gpulayer`` group (our bundled plugins use this door too);
2. modules named in ``GPULAYER_PLUGINS`` (comma separated), handy for tests and for a
   plugin under development that is not installed yet;
3. objects registered in-process with :func:`register` (tests, notebooks).

``GPULAYER_DISABLE_PLUGINS=cuda,rocm`` blocks plugins by name before they are imported.

What is an error and what is only a warning follows who asked for the plugin. An entry
point found by scanning that fails to import is skipped with one warning and listed as
``broken``: one bad package must not take GPUlayer down. A module named in
``GPULAYER_PLUGINS`` was asked for by name, so failing to import it is a
:class:`~gpulayer.errors.PluginError` carrying its traceback. Two distributions offering an
entry point of the same name are reported naming both; the one first on ``sys.path`` is
loaded, as Python would import it.

A plugin that imports but misbehaves is isolated, not fatal: one that implements a hook
GPUlayer does not define (a misspelt name) or wraps a record hook is left unregistered,
and a record hook that raises or returns something other than records has its records of
that hook left out. Either way the plugin is listed as ``failed`` with the reason, and one
:class:`PluginWarning` names the plugin, the hook, the error and the way out
(``GPULAYER_DISABLE_PLUGINS=<name>``); every other plugin, and every command that does not
need the failed one, keeps working. (:meth:`PluginManager.register`, an explicit call,
still raises.)

Record hooks are called through pluggy's own hook caller, one plugin at a time (a subset
caller that leaves the others out), so that pluggy's tracing and call monitoring see every
call and every record is known by the plugin that offered it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import threading
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, TypeVar, cast

import pluggy

from gpulayer import config, hookspecs
from gpulayer.errors import PluginError, one_line
from gpulayer.hookrecords import (
    AcceleratorDetector,
    Device,
    DeviceEnvironment,
    DistributedLauncher,
    FrameworkProbe,
    HookRecord,
    ProviderAdapter,
    RuntimeProfile,
)

ENTRY_POINT_GROUP = "gpulayer"
DISABLE_ENV = "GPULAYER_DISABLE_PLUGINS"
EXTRA_ENV = "GPULAYER_PLUGINS"
#: Which accelerator detectors run, by kind; ``none`` for no detector at all. Stand-in
#: (fake) detectors always run, which is how tests hide the machine's real hardware.
DETECTORS_ENV = "GPULAYER_DETECTORS"
NO_DETECTORS = "none"

DETECTORS_HOOK = "gpulayer_accelerator_detectors"
PROBES_HOOK = "gpulayer_framework_probes"
DEVICE_ENVIRONMENT_HOOK = "gpulayer_device_environment"

R = TypeVar("R", bound=HookRecord)
#: what a plugin's code may raise that is its failure, reported naming it (sys.exit() too)
PLUGIN_FAULTS = (Exception, SystemExit)


class PluginWarning(UserWarning):
    """A plugin was skipped (it failed to import, or its name was taken) or a setting named no plugin."""


@dataclass
class PluginInfo:
    """One plugin as ``gpulayer plugins list`` shows it."""

    name: str
    distribution: str | None = None
    version: str | None = None
    module: str | None = None
    status: str = "loaded"  # loaded | disabled | broken (did not import) | failed (misbehaved)
    error: str | None = None
    traceback: str | None = None
    hooks: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "distribution": self.distribution, "version": self.version,
            "module": self.module, "status": self.status, "error": self.error,
            "traceback": self.traceback, "hooks": self.hooks,
        }


def _split_env(name: str) -> list[str]:
    """A comma-separated setting (GPULAYER_PLUGINS, ..._DISABLE_PLUGINS, ..._DETECTORS)."""
    env = config.settings()
    return list({EXTRA_ENV: env.plugins, DISABLE_ENV: env.disable_plugins, DETECTORS_ENV: env.detectors}[name])


def allowed_detectors() -> set[str] | None:
    """The detector kinds ``GPULAYER_DETECTORS`` lets run; None when it is unset (all run)."""
    names = {p.lower() for p in _split_env(DETECTORS_ENV)}
    if not names:
        return None
    return names - {NO_DETECTORS}


def _normalize(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _short_error(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _import_traceback(exc: BaseException) -> str:
    """The traceback of a failed import, without the frames of the import machinery and of
    this module: what is left is the plugin's own code."""
    te = traceback.TracebackException.from_exception(exc)
    te.stack = traceback.StackSummary.from_list([
        frame for frame in te.stack
        if "importlib" not in frame.filename and frame.filename != __file__
    ])
    return "".join(te.format()).rstrip()


class PluginManager:
    """Wraps :class:`pluggy.PluginManager` with loading rules and record registries."""

    def __init__(self, *, load_entry_points: bool = True) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}
        self.unknown_disabled: list[str] = []
        #: one line per entry-point name claimed by two distributions
        self.clashes: list[str] = []
        #: record hooks two plugins offered one name in: hook -> the error (see _collect),
        #: and the plugins marked failed for it (loaded again once the records are forgotten)
        self.conflicts: dict[str, PluginError] = {}
        self._conflicted: dict[str, str] = {}
        #: hard errors met while loading, raised by every strict :meth:`load`
        self.fatal: list[tuple[str, BaseException]] = []
        self._load_entry_points = load_entry_points
        self._loaded = False
        self._lock = threading.RLock()
        self._cache: dict[str, dict[str, HookRecord]] = {}
        self._owners: dict[str, dict[str, str]] = {}
        #: detector kind -> the plugin whose detector a stand-in replaced
        self._replaced: dict[str, str] = {}
        #: (plugin, hook) pairs whose failure was reported: each is reported once
        self._reported: set[tuple[str, str]] = set()
        self._hook_errors: dict[str, dict[str, str]] = {}  # plugin -> hook -> its latest failure

    # ------------------------------------------------------------------ loading

    def load(self, *, strict: bool = True) -> PluginManager:
        """Load every plugin once. ``strict``: raise the first hard error (every time, not
        only the first), else leave it in :attr:`fatal` and the plugin listed as broken."""
        with self._lock:
            if not self._loaded:
                self._loaded = True
                self._load_all()
            if strict and self.fatal:
                message, cause = self.fatal[0]
                raise PluginError(message) from cause
            return self

    def _load_all(self) -> None:
        disabled = set(_split_env(DISABLE_ENV))
        seen: set[str] = set()
        if self._load_entry_points:
            # each read of a distribution's .metadata (and .version) parses its METADATA file
            # again: once per distribution here (the bundled plugins share one)
            about: dict[int, tuple[str | None, str | None]] = {}
            for ep in self._entry_points():
                seen.add(ep.name)
                dist = getattr(ep, "dist", None)
                if dist is not None and id(dist) not in about:
                    meta = dist.metadata
                    about[id(dist)] = (meta["Name"], meta["Version"])
                name, version = about[id(dist)] if dist is not None else (None, None)
                info = PluginInfo(name=ep.name, module=ep.value, distribution=name, version=version)
                self._load_one(info, ep.load, disabled, named=False)
        for modname in _split_env(EXTRA_ENV):
            if modname in seen:
                continue
            seen.add(modname)
            info = PluginInfo(name=modname, module=modname, distribution=None)
            self._load_one(info, functools.partial(importlib.import_module, modname), disabled, named=True)
        self.unknown_disabled = sorted(disabled - seen)
        if self.unknown_disabled:
            warnings.warn(
                f"{DISABLE_ENV} names no installed plugin: {', '.join(self.unknown_disabled)} "
                f"(installed: {', '.join(sorted(seen)) or 'none'})",
                PluginWarning, stacklevel=3,
            )

    def _entry_points(self) -> list[metadata.EntryPoint]:
        """Entry points by name, one per name: the first on ``sys.path`` wins a clash."""
        chosen: dict[str, metadata.EntryPoint] = {}
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):  # sys.path order
            first = chosen.get(ep.name)
            if first is None:
                chosen[ep.name] = ep
                continue
            a, b = getattr(first, "dist", None), getattr(ep, "dist", None)
            if a is not None and b is not None and _normalize(a.metadata["Name"]) == _normalize(b.metadata["Name"]):
                continue  # one distribution seen twice on sys.path
            if (a is None or b is None) and first.value == ep.value:
                continue
            message = (
                f"gpulayer plugin name {ep.name!r} is claimed by two distributions: "
                f"{_describe(first)} and {_describe(ep)}; loaded the first (earlier on sys.path) "
                f"and skipped the second: uninstall one of them"
            )
            self.clashes.append(message)
            warnings.warn(message, PluginWarning, stacklevel=4)
        return [chosen[name] for name in sorted(chosen)]

    def _load_one(self, info: PluginInfo, loader: Callable[[], Any], disabled: set[str], *,
                  named: bool) -> None:
        self.infos[info.name] = info
        if info.name in disabled:
            info.status = "disabled"
            self.pm.set_blocked(info.name)
            return
        try:
            obj = loader()
        except PLUGIN_FAULTS as exc:  # any import-time failure, sys.exit() included
            info.status = "broken"
            info.error = _short_error(exc)
            info.traceback = _import_traceback(exc)
            if named:
                self.fatal.append((
                    f"plugin {info.name!r} named in {EXTRA_ENV} failed to import:\n{info.traceback}", exc))
                return
            warnings.warn(
                f"gpulayer plugin {info.name!r} (distribution {info.distribution or 'unknown'}) "
                f"failed to load and was skipped: {info.error}",
                PluginWarning, stacklevel=4,
            )
            return
        try:
            self._register(obj, info)
        except PluginError as exc:
            self._fail(info.name, None, str(exc).removeprefix(f"plugin {info.name!r}").lstrip(": "),
                       stacklevel=5)

    def _register(self, obj: Any, info: PluginInfo) -> None:
        """Register ``obj`` as ``info.name``; a plugin that breaks the contract is refused
        (left unregistered) with a :class:`PluginError` naming it."""
        try:
            self.pm.register(obj, name=info.name)
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {info.name!r}: {self._refusal(obj, exc)}") from exc
        except ValueError as exc:
            raise PluginError(f"plugin {info.name!r}: {exc}") from exc
        try:
            self._validate(obj, info.name)
        except PluginError:
            self.pm.unregister(obj)
            raise
        info.hooks = sorted(
            name for name in dir(obj)
            if name.startswith("gpulayer_") and self.pm.parse_hookimpl_opts(obj, name) is not None
        )

    def _refusal(self, obj: Any, exc: pluggy.PluginValidationError) -> str:
        """Why pluggy refused ``obj``, on one line (an argument a hook does not offer: which)."""
        for hook_name in hook_names():
            if self.pm.parse_hookimpl_opts(obj, hook_name) is None:
                continue
            offered = list(getattr(self.pm.hook, hook_name).spec.argnames)
            extra = [a for a in inspect.signature(getattr(obj, hook_name)).parameters if a not in offered]
            if extra:
                return (f"{hook_name} takes {', '.join(extra)}, which the hook does not offer; accepted: "
                        f"{', '.join(offered) + ' (or fewer)' if offered else 'no arguments'}")
        return " ".join(str(exc).split())

    def _validate(self, obj: Any, name: str) -> None:
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            unknown = next((h for h in dir(obj) if h.startswith("gpulayer_") and h not in hook_names()
                            and self.pm.parse_hookimpl_opts(obj, h) is not None), None)
            raise PluginError(
                f"plugin {name!r} implements {unknown or 'a hook'}, which GPUlayer does not define "
                f"(known hooks: {', '.join(hook_names())})", hook=unknown,
            ) from exc
        for hook_name in hookspecs.RECORD_HOOKS:
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                if impl.plugin is obj and (impl.wrapper or impl.hookwrapper):
                    # A wrapper would see and could rewrite other plugins' records, and the
                    # registry calls one plugin at a time, so it would wrap nothing.
                    raise PluginError(
                        f"plugin {name!r}: {hook_name} is a record hook and takes no wrapper "
                        f"(wrapper=True or hookwrapper=True); return or yield records instead",
                        hook=hook_name,
                    )

    def register(self, obj: Any, name: str | None = None) -> None:
        """Register a plugin object in this process (tests, notebooks)."""
        with self._lock:
            self.load()
            name = name or getattr(obj, "__name__", None) or f"plugin-{id(obj)}"
            info = PluginInfo(name=name, module=getattr(obj, "__name__", None), distribution=None)
            self._register(obj, info)
            self.infos[name] = info
            self._forget_records()

    def unregister(self, name: str) -> None:
        with self._lock:
            self.pm.unregister(name=name)
            self.infos.pop(name, None)
            self._forget_records()

    def _fail(self, plugin_name: str, hook_name: str | None, error: str, *, stacklevel: int = 4) -> None:
        """Mark ``plugin_name`` failed and say so once per (plugin, hook), with the way out.
        ``hook_name`` None: the plugin could not be registered at all."""
        info = self.infos.get(plugin_name)
        if info is not None:
            # each hook's latest failure, once (one failing anew at every task must not grow it)
            failed = self._hook_errors[plugin_name] = self._hook_errors.get(plugin_name, {}) if info.status == "failed" else {}
            failed[hook_name or ""] = error if hook_name is None else f"{hook_name}: {error}"
            info.error = "; ".join(failed.values())
            info.status = "failed"
        key = (plugin_name, hook_name or "")
        if key in self._reported:
            return
        self._reported.add(key)
        what = ("was not registered" if hook_name is None
                else f"failed in {hook_name}, which leaves it out")
        warnings.warn(
            f"gpulayer plugin {plugin_name!r} {what}: {error} "
            f"(to stop loading it: {DISABLE_ENV}={plugin_name})",
            PluginWarning, stacklevel=stacklevel,
        )

    def first_report(self, plugin_name: str, what: str) -> bool:
        """True the first time failure ``what`` of ``plugin_name`` is reported (as in :meth:`_fail`)."""
        key = (plugin_name, what)
        with self._lock:
            if key in self._reported:
                return False
            self._reported.add(key)
            return True

    def failures(self) -> list[PluginInfo]:
        """The plugins that imported but misbehaved (status ``failed``)."""
        return [i for i in self.infos.values() if i.status == "failed"]

    def _forget_records(self) -> None:
        self._cache.clear()
        self._owners.clear()
        self.conflicts.clear()
        for name, error in self._conflicted.items():  # (collected again: a conflict left is found again)
            info = self.infos.get(name)
            if info is not None and info.error == error:
                info.status, info.error = "loaded", None
        self._conflicted.clear()
        self._replaced.clear()

    # ------------------------------------------------------------------ results

    @property
    def hook(self) -> Any:
        self.load()
        return self.pm.hook

    def collect(self, hook_name: str, as_type: type[R]) -> dict[str, R]:
        """Call a record hook on every plugin; return ``{record.name: record}``.

        Two plugins offering one name is a :class:`PluginError` naming both, except that a
        stand-in detector (see :class:`~gpulayer.hookrecords.AcceleratorDetector`) replaces
        the detection of the one it shares its name with.
        """
        try:
            declared, _ = hookspecs.RECORD_HOOKS[hook_name]
        except KeyError:
            raise ValueError(
                f"{hook_name!r} is not a record hook; record hooks: {', '.join(sorted(hookspecs.RECORD_HOOKS))}"
            ) from None
        if not issubclass(declared, as_type):
            raise TypeError(f"{hook_name} offers {declared.__name__} records, not {as_type.__name__}")
        with self._lock:
            self.load()
            if hook_name not in self._cache:
                self._collect(hook_name)
            return cast("dict[str, R]", self._cache[hook_name])

    def _collect(self, hook_name: str) -> None:
        declared, what = hookspecs.RECORD_HOOKS[hook_name]
        caller = getattr(self.pm.hook, hook_name)
        impls = caller.get_hookimpls()  # registration order
        groups: dict[bool, tuple[dict[str, HookRecord], dict[str, str]]] = {False: ({}, {}), True: ({}, {})}
        for impl in impls:
            plugin_name = impl.plugin_name
            only_this = self.pm.subset_hook_caller(
                hook_name, [other.plugin for other in impls if other.plugin is not impl.plugin])
            try:
                items: list[Any] = []
                for result in only_this():
                    if isinstance(result, HookRecord):
                        raise TypeError(f"returned one {type(result).__name__}; return or yield an iterable of records")
                    if isinstance(result, (str, bytes, Mapping)) or not isinstance(result, Iterable):
                        # (a str or a dict would be read item by item: its characters, its keys)
                        raise TypeError(f"returned {type(result).__name__}; return or yield an iterable of records")
                    items.extend(result)
            except PLUGIN_FAULTS as exc:
                self._fail(plugin_name, hook_name, one_line(exc))
                continue
            wrong = next((rec for rec in items if not isinstance(rec, declared)), None)
            if wrong is not None:
                self._fail(plugin_name, hook_name, f"returned {type(wrong).__name__}, "
                                                   f"expected {what} records ({declared.__name__})")
                continue
            for rec in items:
                stand_in = isinstance(rec, AcceleratorDetector) and rec.stand_in
                records, owners = groups[stand_in]
                if rec.name in records:
                    first = owners[rec.name]
                    if first == plugin_name:
                        error = PluginError(f"plugin {first!r} offers two {what}s named {rec.name!r}", hook=hook_name)
                    else:
                        error = PluginError(
                            f"Conflicting plugins found for {what} {rec.name!r}: {first!r} and {plugin_name!r} "
                            f"(to use one of them: {DISABLE_ENV}={first} or {DISABLE_ENV}={plugin_name})",
                            hook=hook_name)
                    self.conflicts[hook_name] = error
                    for name in (first, plugin_name):  # (what plugins list shows of them)
                        info = self.infos.get(name)
                        if info is not None and info.status == "loaded":
                            info.status, info.error = "failed", f"{hook_name}: {error}"
                            self._conflicted[name] = info.error
                    raise error
                records[rec.name] = rec
                owners[rec.name] = plugin_name
        records, owners = groups[False]
        fakes, fake_owners = groups[True]
        for name, fake in fakes.items():
            real = records.get(name)
            if isinstance(real, AcceleratorDetector) and isinstance(fake, AcceleratorDetector):
                records[name] = fake.standing_in_for(real)
                self._replaced[name] = owners[name]
            else:
                records[name] = fake
            owners[name] = fake_owners[name]
        self._cache[hook_name] = records
        self._owners[hook_name] = owners

    def owner(self, hook_name: str, record_name: str) -> str | None:
        """The plugin that offered ``record_name`` (for a stand-in detector: the stand-in's)."""
        self.collect(hook_name, HookRecord)
        return self._owners[hook_name].get(record_name)

    def stood_in_for(self, kind: str) -> str | None:
        """The plugin whose detector of ``kind`` a stand-in replaced, if one did."""
        self.collect(DETECTORS_HOOK, AcceleratorDetector)
        return self._replaced.get(kind)

    def device_environment(self, kind: str, devices: Sequence[Device]) -> dict[str, str]:
        """The first answer of ``gpulayer_device_environment`` for granted ``devices``.

        Where a stand-in replaced the detector of ``kind``, the stand-in's plugin is left out
        of the call, so the plugin it stands in for answers as it would for real devices.
        """
        if not devices:
            raise ValueError(
                f"{DEVICE_ENVIRONMENT_HOOK} is called only with granted devices; a task granted "
                f"no {kind} device gets the hide_env of the {kind} detector instead"
            )
        with self._lock:
            self.load()
            every = self.pm.hook.gpulayer_device_environment.get_hookimpls()
            impls = every
            if self.stood_in_for(kind) is not None:
                fake = self.pm.get_plugin(self._owners[DETECTORS_HOOK][kind])
                impls = [i for i in every if i.plugin is not fake]
        # One plugin at a time, in pluggy's order (last registered first), so that one that
        # raises is named and passed over instead of failing every task of every kind.
        failed: list[str] = []
        for impl in reversed(impls):
            only_this = self.pm.subset_hook_caller(
                DEVICE_ENVIRONMENT_HOOK, [o.plugin for o in every if o.plugin is not impl.plugin])
            try:
                result = only_this(kind=kind, devices=list(devices))
            except PLUGIN_FAULTS as exc:
                self._fail(impl.plugin_name, DEVICE_ENVIRONMENT_HOOK, one_line(exc))
                failed.append(impl.plugin_name)
                continue
            if result is None:
                continue
            if not isinstance(result, DeviceEnvironment):
                raise PluginError(
                    f"plugin {impl.plugin_name!r}: {DEVICE_ENVIRONMENT_HOOK} for {kind!r} returned "
                    f"{type(result).__name__}, expected a DeviceEnvironment or None", hook=DEVICE_ENVIRONMENT_HOOK)
            return dict(result.env)
        if failed:
            # Without an answer the task would see every device of the kind: refuse instead.
            raise PluginError(
                f"no environment for the granted {kind} device(s): {DEVICE_ENVIRONMENT_HOOK} failed in "
                f"plugin(s) {', '.join(map(repr, failed))}", hook=DEVICE_ENVIRONMENT_HOOK)
        return {}

    def list_plugins(self) -> list[PluginInfo]:
        """Every plugin found, broken and failed ones included: listing never raises for a
        plugin. Every record hook is collected (no detector runs), so a hook that raises
        shows as ``failed``; so do two plugins in conflict (:attr:`conflicts`), without a warning."""
        self.load(strict=False)
        for hook_name in hookspecs.RECORD_HOOKS:
            try:
                with self._lock:
                    if hook_name not in self._cache:
                        self._collect(hook_name)
            except PluginError as exc:
                if hook_name not in self.conflicts:  # (a conflict is shown by the plugins' status)
                    warnings.warn(str(exc), PluginWarning, stacklevel=2)
        return sorted(self.infos.values(), key=lambda i: i.name)


def _describe(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    who = f"{dist.metadata['Name']} {dist.version}" if dist is not None else "an unknown distribution"
    return f"{who} ({ep.value})"


_manager: PluginManager | None = None
_manager_lock = threading.Lock()


def get_manager(*, strict: bool = True) -> PluginManager:
    """The process-wide plugin manager, loaded on first use (see :meth:`PluginManager.load`)."""
    global _manager
    with _manager_lock:
        if _manager is None:
            _manager = PluginManager()
    return _manager.load(strict=strict)


def reset_manager(manager: PluginManager | None = None) -> None:
    """Forget the process-wide manager (tests), or install ``manager`` in its place."""
    global _manager
    with _manager_lock:
        _manager = manager


def register(obj: Any, name: str | None = None) -> None:
    get_manager().register(obj, name)


def detectors() -> dict[str, AcceleratorDetector]:
    return get_manager().collect(DETECTORS_HOOK, AcceleratorDetector)


def framework_probes() -> dict[str, FrameworkProbe]:
    return get_manager().collect("gpulayer_framework_probes", FrameworkProbe)


def profiles() -> dict[str, RuntimeProfile]:
    return get_manager().collect("gpulayer_runtime_profiles", RuntimeProfile)


def providers() -> dict[str, ProviderAdapter]:
    return get_manager().collect("gpulayer_provider_adapters", ProviderAdapter)


def launchers() -> dict[str, DistributedLauncher]:
    return get_manager().collect("gpulayer_distributed_launchers", DistributedLauncher)


def records(record_type: type[R]) -> dict[str, R]:
    """Every record of ``record_type`` the loaded plugins offer (the hook is the one whose
    records have that type)."""
    for hook_name, (declared, _) in hookspecs.RECORD_HOOKS.items():
        if declared is record_type:
            return get_manager().collect(hook_name, record_type)
    raise TypeError(
        f"no hook offers {record_type.__name__} records; record types: "
        f"{', '.join(sorted(t.__name__ for t, _ in hookspecs.RECORD_HOOKS.values()))}"
    )


def device_environment(kind: str, devices: Sequence[Device]) -> dict[str, str]:
    return get_manager().device_environment(kind, devices)


def hook_names() -> list[str]:
    return sorted(name for name, _ in inspect.getmembers(hookspecs) if name.startswith("gpulayer_"))
