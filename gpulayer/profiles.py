"""Resolving a job's requirements: its runtime profile, and the accelerator its sub-probes imply."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulayer import plugins
from gpulayer.errors import InvalidRequirement
from gpulayer.hookrecords import RuntimeProfile
from gpulayer.specs import Requirements, Spelling

__all__ = ["check_implied_accelerator", "get_profile", "implied_accelerator", "refuse_devices_without_accelerator",
           "resolve_requirements"]

#: how a requirement is named when no front end says otherwise (a spec built by hand)
RECORD_SPELLING = Spelling(call="Requirements", names={
    f"requirements.{field}": field for field in ("frameworks", "accelerator", "gpus", "min_gpu_memory_gb",
                                                 "compute_capability", "profile")})

#: the requirements that only an accelerator's devices have
_DEVICE_FIELDS = ("gpus", "min_gpu_memory_gb", "compute_capability")


def get_profile(name: str) -> RuntimeProfile:
    """The profile called ``name``; an unknown name raises, listing the known ones."""
    known = plugins.profiles()
    try:
        return known[name]
    except KeyError:
        raise InvalidRequirement(
            f"unknown runtime profile {name!r}; known profiles: {', '.join(sorted(known)) or 'none'}"
        ) from None


def _subprobe_kinds() -> dict[str, str]:
    """Sub-probe name -> the accelerator kind it is for, from the installed framework probes."""
    return {sub.name.lower(): sub.accelerator for probe in plugins.framework_probes().values()
            for sub in probe.subprobes if sub.accelerator}


def implied_accelerator(frameworks: Mapping[str, str]) -> dict[str, str]:
    """The sub-probes among ``frameworks`` that belong to an accelerator: name -> kind
    (``{"torch.cuda": "cuda"}``). A job asking for one runs on that accelerator."""
    kinds = _subprobe_kinds()
    return {name: kinds[name.lower()] for name in frameworks if name.lower() in kinds}


def check_implied_accelerator(req: Requirements, accelerator: str | None,
                              spelling: Spelling = RECORD_SPELLING) -> str | None:
    """The accelerator ``req``'s sub-probes imply (None when none does), refusing sub-probes
    of two accelerators, or of another one than ``accelerator`` (the job's or its profile's)."""
    implied = implied_accelerator(req.frameworks)
    if not implied:
        return None
    kinds = sorted(set(implied.values()))
    first = next(iter(implied))
    if spelling.call is None:  # a flag: --framework 'torch.cuda>=2'
        where = spelling.input("requirements.frameworks", f"{first}{req.frameworks[first]}", (0,))
    else:  # a keyword: frameworks={'torch.cuda': '>=2'}
        where = spelling.input("requirements.frameworks", req.frameworks[first], (first,))
    if len(kinds) > 1:
        named = ", ".join(f"{n!r} ({k})" for n, k in implied.items())
        raise InvalidRequirement(f"{where}: the frameworks name sub-probes of different accelerators: {named}; "
                                 f"accepted: sub-probes of one accelerator, the one the job runs on")
    kind = kinds[0]
    if accelerator is not None and accelerator != kind:
        own = [n for n, k in _subprobe_kinds().items() if k == accelerator and n.split(".")[0] == first.split(".")[0]]
        instead = f", or {own[0]!r} for {accelerator}" if own else ""
        flag = spelling.option("requirements.accelerator", kind if spelling.call is None else repr(kind))
        raise InvalidRequirement(f"{where}: {first!r} is for accelerator {kind!r}, but the job asks for {accelerator!r}; "
                                 f"accepted: {flag} or none (it implies {kind}){instead}")
    return kind


def resolve_requirements(req: Requirements, spelling: Spelling = RECORD_SPELLING) -> Requirements:
    """``req`` with its profile's accelerator and frameworks filled in where it leaves them
    empty (the job's own framework specifiers win), and the accelerator a sub-probe such as
    ``torch.cuda`` implies when none is named. Idempotent.

    A job that names an accelerator other than its profile's, or than its sub-probes', is
    refused: it would be unschedulable anyway.
    """
    if req.profile:
        profile = get_profile(req.profile)
        if req.accelerator is not None and profile.accelerator is not None and req.accelerator != profile.accelerator:
            raise InvalidRequirement(
                f"profile {profile.name!r} is for accelerator {profile.accelerator!r} but the job asks "
                f"for {req.accelerator!r}; drop one of them or pick a profile for {req.accelerator!r}"
            )
        fill: dict[str, object] = {"frameworks": dict(profile.frameworks)}
        if profile.accelerator is not None:
            fill["accelerator"] = profile.accelerator
        req = req.merged(Requirements.model_validate(fill))
    implied = check_implied_accelerator(req, req.accelerator, spelling)
    if implied is not None and req.accelerator is None:
        req = req.model_copy(update={"accelerator": implied})
    if req.accelerator is None:  # (a spec built by hand: the front ends refuse it where it is written)
        refuse_devices_without_accelerator(req.profile, {f: getattr(req, f) for f in _DEVICE_FIELDS}, spelling,
                                           ", ".join(sorted(plugins.detectors())))
    return req


def refuse_devices_without_accelerator(profile: str | None, given: Mapping[str, Any], spelling: Spelling,
                                       kinds: str, *, profiles: bool = True) -> None:
    """Devices, GPU memory or a compute capability with no accelerator would be ignored:
    the job would run on a CPU slot. ``given``: those of them the job asks for, by field
    name, as its user gave them; ``kinds``: the accelerator kinds to offer; ``profiles``:
    whether to offer a profile instead (a command without ``--profile`` does not)."""
    for option in _DEVICE_FIELDS:
        value = given.get(option)
        if value is None or (option == "gpus" and value == 0):
            continue
        path = f"requirements.{option}"
        what = "devices need an accelerator" if option == "gpus" else "applies only to accelerator devices"
        whose = f"the profile {profile!r} names none" if profile else "none is named"
        flags = spelling.call is None
        accelerator = spelling.option("requirements.accelerator", "KIND" if flags else "'KIND'")
        with_profile = spelling.name("requirements.profile") + ("" if flags else "=")
        kinds_shown = f"{accelerator} ({kinds})" if kinds else accelerator
        raise InvalidRequirement(
            f"{spelling.input(path, value)}: {what}, and {whose}; accepted: {spelling.name(path)} together with "
            f"{kinds_shown}" + (f", or with a {with_profile} that names one" if profiles else "")
        )
