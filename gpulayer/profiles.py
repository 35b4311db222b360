"""Runtime profiles: applying a job's ``profile`` to its requirements."""

from __future__ import annotations

from gpulayer import plugins
from gpulayer.errors import InvalidRequirement
from gpulayer.hookrecords import RuntimeProfile
from gpulayer.specs import Requirements

__all__ = ["get_profile", "resolve_requirements"]


def get_profile(name: str) -> RuntimeProfile:
    """The profile called ``name``; an unknown name raises, listing the known ones."""
    known = plugins.profiles()
    try:
        return known[name]
    except KeyError:
        raise InvalidRequirement(
            f"unknown runtime profile {name!r}; known profiles: {', '.join(sorted(known)) or 'none'}"
        ) from None


def resolve_requirements(req: Requirements) -> Requirements:
    """``req`` with its profile's accelerator and frameworks filled in where it leaves them
    empty (the job's own framework specifiers win). Idempotent; no profile, no change.

    A job that names an accelerator other than its profile's is refused: the profile's
    frameworks (``torch.cuda``, ...) would make it unschedulable anyway.
    """
    if not req.profile:
        return req
    profile = get_profile(req.profile)
    if req.accelerator is not None and profile.accelerator is not None and req.accelerator != profile.accelerator:
        raise InvalidRequirement(
            f"profile {profile.name!r} is for accelerator {profile.accelerator!r} but the job asks "
            f"for {req.accelerator!r}; drop one of them or pick a profile for {req.accelerator!r}"
        )
    fill: dict[str, object] = {"frameworks": dict(profile.frameworks)}
    if profile.accelerator is not None:
        fill["accelerator"] = profile.accelerator
    return req.merged(Requirements.model_validate(fill))
