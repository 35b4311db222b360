"""The framework probes: what frameworks the job Python has, read without importing them here.

The probes (``gpulayer_framework_probes``) are evaluated in subprocesses of the job Python
(which need not be ours), one per plugin, all at once and each bounded by the timeout on its
own: versions from package metadata first, then the sub-probes and backend checks, which
import frameworks such as torch. The CLI's own process never imports a framework. Each step
is written as soon as it is known, so a probe killed for hanging keeps what it had read and
its diagnostic names the plugin and the sub-probe it was running.

Answers are cached in ``$GPULAYER_HOME/cache/probes/``, one entry per plugin's probes, keyed
by the job Python's path, the probe definitions and ``PYTHONPATH``, and valid while the
Python executable and every directory on that Python's ``sys.path`` keep their modification
time; installing or removing a package touches its ``site-packages`` directory, so the next
detection probes again. ``use_cache=False`` (``--refresh``) always probes.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpulayer import config, plugins
from gpulayer.hookrecords import FrameworkProbe

__all__ = ["PROBE_SCRIPT", "ProbeResult", "probe_frameworks"]

_SENTINEL = "@@gpulayer-probe@@"
_STEP = "@@gpulayer-probe-step@@"
# Grace on top of the timeout before we stop waiting for a plugin's probe thread.
_GRACE = 1.0

# Runs in the job Python: `python -c PROBE_SCRIPT`, probes as JSON on stdin, one JSON line
# (after the sentinel) on stdout. Kept compatible with Python 3.8+. Each step is also written
# (after the step sentinel) as soon as it is known, so that a probe killed for hanging still
# tells which versions it read and which sub-probe it was running.
PROBE_SCRIPT = r"""
import fnmatch, json, re, sys, traceback
from importlib import metadata
spec = json.load(sys.stdin)
out = {"python_version": "%d.%d.%d" % sys.version_info[:3], "python_path": sys.executable,
       "sys_path": [p for p in sys.path if p], "frameworks": {}, "backends": [], "errors": [],
       "sources": {}}
def step(**kw):
    sys.stdout.write("\n" + STEP + json.dumps(kw) + "\n")
    sys.stdout.flush()
_all = None
def _norm(n):
    return re.sub(r"[-_.]+", "-", n).lower()
def version_of(names):
    global _all
    for name in names:
        if "*" in name:
            if _all is None:
                _all = {}
                for d in metadata.distributions():
                    try:
                        _all.setdefault(_norm(d.metadata["Name"]), (d.metadata["Name"], d.version))
                    except Exception:
                        pass
            for dn in sorted(_all):
                if fnmatch.fnmatchcase(dn, _norm(name)):
                    return _all[dn]
        else:
            try:
                return name, metadata.version(name)
            except metadata.PackageNotFoundError:
                pass
    return None
def run(name, code):
    src = "def _probe():\n" + "\n".join("    " + l for l in code.strip().splitlines())
    ns = {}
    exec(compile(src, "<probe %s>" % name, "exec"), ns)
    return ns["_probe"]()
found = []
for p in spec["probes"]:
    v = version_of(p["distributions"] or [p["name"]])
    if v is None:
        continue
    out["frameworks"][p["name"]] = v[1]
    out["sources"][p["name"]] = "package metadata (%s)" % v[0]
    step(framework=p["name"], version=v[1], distribution=v[0])
    found.append(p)
for p in found:
    for sp in p["subprobes"]:
        step(start=sp["name"])
        try:
            r = run(sp["name"], sp["code"])
        except Exception as exc:
            out["errors"].append("%s: %s: %s" % (sp["name"], type(exc).__name__, exc))
            step(error=out["errors"][-1])
            step(done=sp["name"])
            continue
        if r:
            out["frameworks"][sp["name"]] = str(r)
            out["sources"][sp["name"]] = "sub-probe %s" % sp["name"]
            step(framework=sp["name"], version=str(r), subprobe=True)
        step(done=sp["name"])
    if p.get("backends_code"):
        step(start=p["name"] + " backends")
        try:
            for b in run(p["name"] + " backends", p["backends_code"]) or []:
                if b not in out["backends"]:
                    out["backends"].append(str(b))
                    out["sources"]["backend " + str(b)] = "%s backends check" % p["name"]
                    step(backend=str(b), source=out["sources"]["backend " + str(b)])
        except Exception as exc:
            out["errors"].append("%s backends: %s: %s" % (p["name"], type(exc).__name__, exc))
            step(error=out["errors"][-1])
        step(done=p["name"] + " backends")
sys.stdout.flush()
print("\n" + SENTINEL + json.dumps(out))
""".replace("SENTINEL", repr(_SENTINEL)).replace("STEP", repr(_STEP))


class ProbeResult(dict):  # type: ignore[type-arg]
    """The framework probe's answer: python_version, python_path, sys_path, frameworks,
    backends, errors, sources (framework or ``backend NAME`` -> where it was read; plain
    JSON, as cached), and ``plugins`` (framework or ``backend NAME`` -> the plugin whose
    probe read it)."""


# --------------------------------------------------------------------------- frameworks


def _probe_spec(probes: Mapping[str, FrameworkProbe]) -> dict[str, Any]:
    return {"probes": [
        {"name": p.name, "distributions": p.distributions,
         "subprobes": [{"name": s.name, "code": s.code} for s in p.subprobes],
         "backends_code": p.backends_code}
        for p in sorted(probes.values(), key=lambda p: p.name)
    ]}


def _cache_path(python: str, spec: dict[str, Any]) -> Path:
    key = json.dumps([python, spec, os.environ.get("PYTHONPATH", "")], sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return config.home() / "cache" / "probes" / f"{digest}.json"


def _stamp(paths: list[str]) -> list[list[Any]]:
    stamps: list[list[Any]] = []
    for p in paths:
        try:
            st = os.stat(p)
            stamps.append([p, st.st_mtime_ns, st.st_size])
        except OSError:
            stamps.append([p, None, None])
    return stamps


def _read_cache(path: Path) -> ProbeResult | None:
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or "result" not in entry or "stamps" not in entry:
        return None
    paths = [s[0] for s in entry["stamps"]]
    if _stamp(paths) != entry["stamps"]:
        return None
    return ProbeResult(entry["result"])


def _write_cache(path: Path, python: str, result: ProbeResult) -> None:
    stamps = _stamp([python, *result.get("sys_path", [])])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps({"stamps": stamps, "result": dict(result)}))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home only costs speed


def _metadata_only(probes: Mapping[str, FrameworkProbe]) -> tuple[dict[str, str], dict[str, str]]:
    """Versions from our own package metadata (when the job Python is ours), and where each came from."""
    from importlib import metadata

    found: dict[str, str] = {}
    sources: dict[str, str] = {}
    for probe in probes.values():
        for dist in probe.distributions or [probe.name]:
            if "*" in dist:
                continue
            try:
                found[probe.name] = metadata.version(dist)
                sources[probe.name] = f"package metadata ({dist}), read here: the probe gave no answer"
                break
            except metadata.PackageNotFoundError:
                continue
    return found, sources


def _steps(out: str) -> tuple[dict[str, str], dict[str, str], str | None, list[str], list[str]]:
    """What a probe killed part-way had written: versions, their sources (and the
    backends'), the sub-probe it was running (None when it was between steps), the errors
    of the sub-probes that raised before it, and the backends it had read."""
    versions: dict[str, str] = {}
    sources: dict[str, str] = {}
    running: str | None = None
    errors: list[str] = []
    backends: list[str] = []
    for ln in out.splitlines():
        if not ln.startswith(_STEP):
            continue
        try:
            st = json.loads(ln[len(_STEP):])
        except ValueError:
            continue
        if "framework" in st:
            versions[st["framework"]] = st["version"]
            sources[st["framework"]] = (f"sub-probe {st['framework']}" if st.get("subprobe")
                                        else f"package metadata ({st.get('distribution')})")
        elif "backend" in st:
            backends.append(st["backend"])
            sources["backend " + st["backend"]] = st.get("source", "backends check")
        elif "error" in st:
            errors.append(st["error"])
        elif "start" in st:
            running = st["start"]
        elif "done" in st:
            running = None
    return versions, sources, running, errors, backends


def _probe_one(
    python: str, probes: Mapping[str, FrameworkProbe], plugin_name: str | None, *, timeout: float,
    use_cache: bool,
) -> tuple[ProbeResult, list[str], bool]:
    """One plugin's probes in one bounded subprocess: (result, diagnostics, answered)."""
    spec = _probe_spec(probes)
    cache = _cache_path(python, spec)
    who = f"plugin {plugin_name!r}" if plugin_name else "framework probe"
    if use_cache:
        cached = _read_cache(cache)
        if cached is not None:
            return cached, [_raised(e, who) for e in cached.get("errors", [])], True
    ours = os.path.realpath(python) == os.path.realpath(sys.executable)
    versions, sources = _metadata_only(probes) if ours else ({}, {})
    fallback = ProbeResult(
        python_version=platform.python_version() if ours else "unknown",
        python_path=python, sys_path=[], frameworks=versions, backends=[], errors=[], sources=sources,
    )
    env = dict(os.environ)
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    try:
        proc = subprocess.Popen(
            [python, "-c", PROBE_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, errors="replace", env=env,
            start_new_session=(os.name == "posix"),
        )
    except OSError as exc:
        return fallback, [f"framework probe: cannot run {python}: {exc}"], False
    try:
        out, err = proc.communicate(json.dumps(spec), timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            if os.name == "posix":
                os.killpg(proc.pid, 9)
            else:  # pragma: no cover
                proc.kill()
        except OSError:
            pass
        out, _ = proc.communicate()
        got, got_sources, running, errors, backends = _steps(out or "")
        fallback["frameworks"] = {**fallback["frameworks"], **got}
        fallback["sources"] = {**fallback["sources"], **got_sources}
        fallback["backends"] = backends
        if running:
            what = f"sub-probe {running!r} ({who}) gave no answer within {timeout:g}s (killed)"
        else:
            what = f"{python} gave no answer within {timeout:g}s (killed) probing for {who}"
        # (what raised before the hang is told too, as an answer would have told it)
        return fallback, [*(_raised(e, who) for e in errors),
                          f"framework probe: {what}; the sub-probes after it are not reported"], False
    line = next((ln for ln in reversed(out.splitlines()) if ln.startswith(_SENTINEL)), None)
    if proc.returncode != 0 or line is None:
        tail = (err.strip().splitlines() or ["no output"])[-1][:300]
        return fallback, [f"framework probe: {python} exited with status {proc.returncode} "
                          f"probing for {who}: {tail}"], False
    result = ProbeResult(json.loads(line[len(_SENTINEL):]))
    _write_cache(cache, python, result)  # a fresh answer refreshes the cache either way
    return result, [_raised(e, who) for e in result.get("errors", [])], True


def _raised(error: str, who: str) -> str:
    """A diagnostic for an error the probe script recorded (``NAME: Type: message``, where a
    sub-probe or a probe's ``backends_code`` raised), naming the plugin as the other
    diagnostics do: ``framework probe: sub-probe 'torch.npu' (plugin 'acme') raised ...``."""
    name, sep, rest = error.partition(": ")
    if not sep:
        return f"framework probe: {error} ({who})"
    if name.endswith(" backends"):
        return f"framework probe: the backends check of {name[:-len(' backends')]!r} ({who}) raised {rest}"
    return f"framework probe: sub-probe {name!r} ({who}) raised {rest}"


def probe_frameworks(
    python: str | None = None, *, timeout: float = 10.0, use_cache: bool = True,
    probes: Mapping[str, FrameworkProbe] | None = None,
) -> tuple[ProbeResult, list[str]]:
    """Run the framework probes, one bounded subprocess of ``python`` per plugin, all at
    once; return (result, diagnostics).

    Each plugin's probes are bounded on their own: one whose sub-probe hangs is killed after
    ``timeout``, keeps the versions it had read, and is named with the sub-probe in its
    diagnostic; the other plugins' answers are not affected. On a timeout or a broken
    interpreter the result holds what could be learned without it (our own metadata when
    ``python`` is this interpreter).
    """
    python = python or sys.executable
    manager = plugins.get_manager()
    if probes is None:
        probes = plugins.framework_probes()
    groups: dict[str | None, dict[str, FrameworkProbe]] = {}
    for name, probe in probes.items():
        owner = manager.owner(plugins.PROBES_HOOK, name)  # None for a probe handed in (tests)
        groups.setdefault(owner, {})[name] = probe
    if not groups:
        groups[None] = {}
    answers: dict[str | None, tuple[ProbeResult, list[str], bool]] = {}

    def run(owner: str | None, group: dict[str, FrameworkProbe]) -> None:
        answers[owner] = _probe_one(python, group, owner, timeout=timeout, use_cache=use_cache)

    threads = [threading.Thread(target=run, args=(o, g), name=f"gpulayer-probe-{o}", daemon=True)
               for o, g in groups.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + _GRACE + 5)
    merged = ProbeResult(python_version="unknown", python_path=python, sys_path=[], frameworks={},
                         backends=[], errors=[], sources={}, plugins={})
    diagnostics: list[str] = []
    for owner in sorted(groups, key=lambda o: o or ""):
        if owner not in answers:
            diagnostics.append(f"framework probe for plugin {owner!r} gave no answer")
            continue
        result, diags, answered = answers[owner]
        diagnostics.extend(diags)
        if answered or merged["python_version"] == "unknown":
            # a probe that hung or crashed still knows the version of this interpreter (its
            # fallback): it replaces the "unknown" the merge starts from, not an answer's
            for key in ("python_version", "python_path", "sys_path"):
                value = result.get(key)
                if value and value != "unknown" and (answered or merged.get(key) in (None, "", [], "unknown")):
                    merged[key] = value
        merged["frameworks"].update(result.get("frameworks", {}))
        merged["sources"].update(result.get("sources", {}))
        merged["errors"].extend(result.get("errors", []))
        for b in result.get("backends", []):
            if b not in merged["backends"]:
                merged["backends"].append(b)
                merged["plugins"]["backend " + b] = owner
        for fw in result.get("frameworks", {}):
            merged["plugins"][fw] = owner
    return merged, diagnostics
