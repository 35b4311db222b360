"""One way to describe a job, shared by every front end.

``@gl.remote``, ``gpulayer submit``, :class:`gpulayer.torch.Trainer` and
:func:`gpulayer.torch.launch` take the same options (:class:`JobOptions`: every field of
:class:`~gpulayer.specs.Requirements` and :class:`~gpulayer.specs.Placement` and the
common job fields) and turn them into a spec here, with :func:`command_job`,
:func:`function_job` or :func:`distributed_job`. Each front end passes a
:class:`~gpulayer.specs.Spelling`, so that a bad value is reported as its user wrote it:
``--gpus 2``, ``@gl.remote(gpus=2)``, ``Trainer(gpus_per_node=2)``.

Beyond what a spec checks by itself, a front end refuses what would otherwise fail later
or silently do something else:

* an accelerator kind no installed detector plugin offers (``allow_unknown_accelerator``
  lets through a kind only the server's workers know);
* devices, GPU memory or a compute capability without an accelerator (they would run on a
  CPU slot), unless the profile or a sub-probe (``torch.cuda``) names one;
* a sub-probe of another accelerator than the job's (``torch.cuda`` with ``rocm``), or
  sub-probes of two;
* a runtime profile or a distributed launcher that no installed plugin offers.

These read the plugins' records (cheap: nothing is detected); ``check_installed=False``
skips them where the spec is only being checked, not submitted.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from os import PathLike
from typing import Any, TypedDict, TypeVar

from gpulayer import plugins
from gpulayer.errors import InvalidArgument, InvalidInput, InvalidRequirement
from gpulayer.launchers import check_launch
from gpulayer.profiles import check_implied_accelerator, refuse_devices_without_accelerator
from gpulayer.specs import (
    CHECKED,
    CommandJob,
    DistributedJob,
    FunctionJob,
    Requirements,
    Spelling,
    build,
    check_framework_name,
    check_framework_specifier,
    split_framework_spec,
)

__all__ = [
    "OPTION_FIELDS",
    "JobOptions",
    "SharedOptions",
    "check_device_options",
    "check_launcher",
    "check_option_names",
    "command_job",
    "distributed_job",
    "frameworks",
    "function_job",
    "keyword_spelling",
]


class SharedOptions(TypedDict, total=False):
    """The options every front end takes under the same name (all but the device count)."""

    accelerator: str | None
    #: let through an accelerator kind no installed plugin knows (one only the server's workers know)
    allow_unknown_accelerator: bool
    min_gpu_memory_gb: float | None
    compute_capability: str | None
    frameworks: Mapping[str, str] | Iterable[str] | None
    python_version: str | None
    os: str | None
    cpus: int | None
    memory_gb: float | None
    labels: Mapping[str, str] | None
    profile: str | None
    target: str | None
    fallback_targets: Sequence[str] | None
    on_unschedulable: str | None
    prefer: Sequence[str] | None
    timeout: float | None
    retries: int | None
    priority: int | None
    env: Mapping[str, str] | None
    name: str | None
    bundle: str | PathLike[str] | None
    #: the jobs it runs after (ids or handles; one alone may be given as itself): it is placed
    #: once each has succeeded, and fails without running if one ends otherwise
    after: Sequence[Any] | str | Any | None
    #: the same, for jobs whose end (whatever it is) will do: a job that cleans up or reports
    after_ended: Sequence[Any] | str | Any | None


class JobOptions(SharedOptions, total=False):
    """Every option of a job: :class:`SharedOptions` and ``gpus`` (devices per node)."""

    gpus: int | None


#: option -> the spec field it sets (``allow_unknown_accelerator`` sets none)
OPTION_FIELDS: dict[str, str] = {
    "accelerator": "requirements.accelerator",
    "gpus": "requirements.gpus",
    "min_gpu_memory_gb": "requirements.min_gpu_memory_gb",
    "compute_capability": "requirements.compute_capability",
    "frameworks": "requirements.frameworks",
    "python_version": "requirements.python",
    "os": "requirements.os",
    "cpus": "requirements.cpus",
    "memory_gb": "requirements.memory_gb",
    "labels": "requirements.labels",
    "profile": "requirements.profile",
    "target": "placement.target",
    "fallback_targets": "placement.fallback_targets",
    "on_unschedulable": "placement.on_unschedulable",
    "prefer": "placement.prefer",
    "timeout": "timeout",
    "retries": "retries",
    "priority": "priority",
    "env": "env",
    "name": "name",
    "bundle": "bundle",
    "after": "after",
    "after_ended": "after_ended",
}

_SWITCH = "allow_unknown_accelerator"

J = TypeVar("J", CommandJob, FunctionJob, DistributedJob)


def keyword_spelling(call: str, **renames: str) -> Spelling:
    """The spelling of a Python front end whose keywords are the option names, except
    ``renames`` (option -> keyword): ``keyword_spelling("Trainer", gpus="gpus_per_node")``."""
    names = {path: renames.get(option, option) for option, path in OPTION_FIELDS.items()}
    names[_SWITCH] = renames.get(_SWITCH, _SWITCH)
    return Spelling(call=call, names=names)


def check_option_names(given: Iterable[str], accepted: Iterable[str], call: str, *,
                       renamed: Mapping[str, str] | None = None) -> None:
    """Refuse options ``call`` does not take, naming the one meant where that is clear:
    ``renamed`` maps another front end's name to ours (``gpus`` -> ``gpus_per_node``)."""
    known = sorted(accepted)
    unknown = sorted(set(given) - set(known))
    if not unknown:
        return
    hints = []
    for name in unknown:
        meant = (renamed or {}).get(name) or next(iter(difflib.get_close_matches(name, known, n=1)), None)
        hints.append(f"{name} (did you mean {meant}?)" if meant else name)
    raise InvalidArgument(f"{call}: unknown option(s) {', '.join(hints)}; accepted: {', '.join(known)}")


def frameworks(value: Mapping[str, str] | Iterable[str] | None, spelling: Spelling) -> dict[str, str]:
    """``value`` (``{name: specifier}``, ``'name>=x'`` strings, or one such string) as
    ``{name: specifier}``, each bad entry reported as its user wrote it."""
    path = OPTION_FIELDS["frameworks"]
    if value is None:
        return {}
    out: dict[str, str] = {}
    if isinstance(value, Mapping):
        for name, spec in value.items():
            try:
                out[check_framework_name(name)] = check_framework_specifier(spec)
            except InvalidRequirement as exc:
                raise InvalidRequirement(f"{spelling.input(path, spec, (name,))}: {exc}") from None
        return out
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, Iterable):
        raise InvalidRequirement(f"{spelling.input(path, value)}: not a list or a mapping; accepted: "
                                 "'name>=x' strings, or {name: specifier}")
    for i, item in enumerate(items):
        where = spelling.input(path, item, (i,))
        if not isinstance(item, str):
            raise InvalidRequirement(f"{where}: not text; accepted: NAME or NAME followed by a PEP 440 version "
                                     "specifier, e.g. 'torch>=2.2' or 'jax'")
        try:
            name, spec = split_framework_spec(item)
        except InvalidRequirement as exc:
            raise InvalidRequirement(f"{where}: {exc}") from None
        out[name] = spec
    return out


def command_job(command: Sequence[str], options: JobOptions, spelling: Spelling, *,
                check_installed: bool = True) -> CommandJob:
    """A :class:`CommandJob` running ``command`` with ``options``."""
    data = _job_fields(options, spelling)
    data["command"] = list(command) if isinstance(command, (list, tuple)) else command
    return _finish(build(CommandJob, data, spelling), options, spelling, check_installed)


def function_job(function: str, args: Sequence[Any], kwargs: Mapping[str, Any], options: JobOptions,
                 spelling: Spelling, *, check_installed: bool = True, arguments_checked: bool = False) -> FunctionJob:
    """A :class:`FunctionJob` calling ``function(*args, **kwargs)`` with ``options``;
    ``arguments_checked``: the caller checked ``args`` and ``kwargs`` already
    (:func:`~gpulayer.specs.check_json`), which are then not walked again."""
    data = _job_fields(options, spelling)
    data.update(function=function, args=list(args), kwargs=dict(kwargs))
    job = build(FunctionJob, data, spelling, context=CHECKED if arguments_checked else None)
    return _finish(job, options, spelling, check_installed)


def distributed_job(entry: str, args: Sequence[str], options: JobOptions, spelling: Spelling, *,
                    nodes: int | None = None, nproc_per_node: int | None = None, launcher: str | None = None,
                    check_installed: bool = True) -> DistributedJob:
    """A :class:`DistributedJob` of ``entry`` with ``options``; ``launcher`` None is the
    default (torchrun), which only the workers need to have."""
    data = _job_fields(options, spelling)
    data.update(entry=entry, args=list(args) if isinstance(args, (list, tuple)) else args)
    for key, value in (("nodes", nodes), ("nproc_per_node", nproc_per_node), ("launcher", launcher)):
        if value is not None:
            data[key] = value
    job = build(DistributedJob, data, spelling)
    if check_installed:
        if launcher is not None:
            check_launcher(launcher, spelling)
        check_launch(job)  # (the control plane checks again: a spec may come from anywhere)
    return _finish(job, options, spelling, check_installed)


def check_launcher(launcher: str, spelling: Spelling) -> None:
    """Refuse a distributed launcher no installed plugin offers, listing those that are."""
    known = plugins.launchers()
    if launcher not in known:
        raise InvalidInput(
            f"{spelling.input('launcher', launcher)}: no installed plugin offers this distributed launcher; "
            f"installed launchers: {', '.join(sorted(known)) or 'none'}"
        )


def _job_fields(options: JobOptions, spelling: Spelling) -> dict[str, Any]:
    """The spec fields ``options`` sets, nested as the spec nests them; an option left out
    (or None) stays unset, so the spec's default applies (the client's default target)."""
    data: dict[str, Any] = {}
    given: Mapping[str, Any] = options
    for option, path in OPTION_FIELDS.items():
        value = given.get(option)
        if value is None:
            continue
        if option == "frameworks":
            value = frameworks(value, spelling)
        elif option == "bundle" and isinstance(value, PathLike):
            value = str(value)
        elif option in ("after", "after_ended") and (isinstance(value, str) or not isinstance(value, Iterable)):
            value = [value]  # (one job, or its handle)
        head, _, leaf = path.rpartition(".")
        (data.setdefault(head, {}) if head else data)[leaf] = value
    return data


def _finish(job: J, options: JobOptions, spelling: Spelling, check_installed: bool) -> J:
    """The checks that need more than the spec: plugins, and fields that only mean
    something together."""
    given: Mapping[str, Any] = options
    if job.bundle is not None and check_installed:  # (at submit, or explain: a decorator's folder may come later)
        _check_bundle_directory(job.bundle, given.get("bundle"), spelling)
    req = job.requirements
    profile_accelerator: str | None = None
    if req.profile is not None and check_installed:
        known = plugins.profiles()
        if req.profile not in known:
            raise InvalidRequirement(
                f"{spelling.input(OPTION_FIELDS['profile'], given.get('profile'))}: no installed plugin offers "
                f"this runtime profile; known profiles: {', '.join(sorted(known)) or 'none'}"
            )
        profile_accelerator = known[req.profile].accelerator
    kinds = plugins.detectors() if check_installed else {}
    # a sub-probe such as torch.cuda names its accelerator (profiles.resolve_requirements
    # fills it in); before the plugins are read, a dotted name may be one
    implied: str | None = None
    if check_installed:
        asked = given.get("accelerator")
        named = "cpu" if isinstance(asked, str) and asked.strip().lower() == "cpu" else req.accelerator
        implied = check_implied_accelerator(req, named or profile_accelerator, spelling)
    elif any("." in name for name in req.frameworks):
        implied = "?"
    if req.accelerator is None and implied is None and (
            req.profile is None or (check_installed and profile_accelerator is None)):
        refuse_devices_without_accelerator(req.profile, given, spelling, ", ".join(sorted(kinds)))
    if req.accelerator is not None and check_installed and not given.get(_SWITCH):
        if req.accelerator not in kinds:
            verb = "add" if spelling.call is None else "pass"
            raise InvalidRequirement(
                f"{spelling.input(OPTION_FIELDS['accelerator'], given.get('accelerator'))}: no installed plugin "
                f"detects this accelerator kind; known kinds: {', '.join(sorted(kinds))}, or cpu for none. "
                f"For a kind only the server's workers know, {verb} {spelling.switch(_SWITCH)}"
            )
    return job


def _check_bundle_directory(path: str, given: Any, spelling: Spelling) -> None:
    """Refuse a bundle that is no directory here, naming the option (the bundle builder said
    ``bundle directory '...'``, at submit only: ``gpulayer explain`` took it)."""
    import os

    folder = os.path.expanduser(path)
    if not os.path.isdir(folder):
        why = "no such directory" if not os.path.exists(folder) else "not a directory"
        raise InvalidArgument(f"{spelling.input(OPTION_FIELDS['bundle'], given if given is not None else path)}: "
                           f"{why}; accepted: the path of a directory")


def check_device_options(req: Requirements, given: Mapping[str, Any], spelling: Spelling) -> None:
    """For a command that takes the requirement options without a job or a profile
    (``gpulayer providers offers``): refuse devices, GPU memory or a compute capability with no
    accelerator, as submit does, instead of ignoring them (``--gpus 2`` listed CPU-only offers)."""
    if req.accelerator is None:
        refuse_devices_without_accelerator(None, given, spelling, ", ".join(sorted(plugins.detectors())),
                                           profiles=False)


#: how the CLI (``gpulayer submit``, ``gpulayer explain``) writes each spec field, so that an
#: error or a hint names the flag as typed (the dashboard words hints this way too)
CLI_SPELLING = Spelling(
    names={
        "requirements.accelerator": "--accelerator", "requirements.gpus": "--gpus",
        "requirements.min_gpu_memory_gb": "--min-gpu-memory", "requirements.compute_capability": "--compute-capability",
        "requirements.frameworks": "--framework", "requirements.python": "--python-version", "requirements.os": "--os",
        "requirements.cpus": "--cpus", "requirements.memory_gb": "--memory", "requirements.labels": "--label",
        "requirements.profile": "--profile", "placement.target": "--target", "placement.fallback_targets": "--fallback",
        "placement.on_unschedulable": "--on-unschedulable", "placement.prefer": "--prefer", "timeout": "--timeout", "retries": "--retries",
        "priority": "--priority", "env": "--env", "name": "--name", "bundle": "--bundle", "after": "--after",
        "after_ended": "--after-ended",
        "nodes": "--nodes",
        "nproc_per_node": "--nproc-per-node", "launcher": "--launcher",
        "allow_unknown_accelerator": "--allow-unknown-accelerator",
    },
    # the words after --: a command job's command; a distributed job's entry, then its arguments
    words={"command": 1, "entry": 1, "args": 2},
)
