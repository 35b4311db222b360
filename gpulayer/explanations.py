"""An :class:`~gpulayer.records.Explanation` in words: what ``gpulayer explain`` and
``gpulayer jobs explain`` print, and what ``print(gl.explain(...))`` shows.

Reasons keep the scheduler's wording (``wkr-10c5089a6044: needs 1 usable cuda device(s),
worker has 0``); relaxations name each option the way the front end spells it
(:class:`~gpulayer.wording.Spelling`): ``relax --gpus to 1 and 3 workers fit`` for the
command line, ``relax gpus to 1 and 3 workers fit`` for ``@gl.remote``.
"""

from __future__ import annotations

import shlex
import time

from gpulayer.records import Explanation, Relaxation, RunningTask, WorkerExplanation
from gpulayer.wording import Spelling

__all__ = ["elapsed_text", "relaxation_text", "render", "verdict_text"]

#: workers listed one by one in the text; --json always lists every one
LISTED = 100


def _workers(n: int) -> str:
    return f"{n} worker fits" if n == 1 else f"{n} workers fit"


def relaxation_text(r: Relaxation, spelling: Spelling, profile: str | None = None,
                    profile_frameworks: dict[str, str] | None = None) -> str:
    """``relax --gpus to 1 and 3 workers fit``, ``drop --framework jax and 2 workers fit``,
    ``add --fallback remote and 1 worker fits``: in ``spelling``'s words. A framework the
    job's runtime ``profile`` asks for (``profile_frameworks``), and the job does not name
    itself, is the profile's to change: ``change --profile pytorch-cuda (it asks for
    torch.cuda) and 1 worker fits``."""
    flags = spelling.call is None
    field, key = r.field, ""
    for group in ("requirements.frameworks", "requirements.labels"):
        if r.field.startswith(group + "."):
            field, key = group, r.field[len(group) + 1:]
    name = spelling.name(field)
    fits = _workers(r.fits)
    if profile and field == "requirements.frameworks" and key and profile_frameworks is not None \
            and key in profile_frameworks:
        written = (spelling.input("requirements.profile", profile) if flags
                   else f"{spelling.name('requirements.profile')}={profile!r}")
        return f"change {written} (it asks for {key}) and {fits}"
    if r.action == "add":  # a fallback target
        what = spelling.input(field, r.value, (0,)) if flags else f"{r.value!r} to {name}"
        return f"add {what} and {fits}"
    if r.action == "drop":
        if flags:
            what = spelling.input(field, r.was, (0,)) if key else spelling.input(field, r.was)
        else:
            what = f"{key!r} from {name}" if key else f"{name}={r.was!r}"
        return f"drop {what} and {fits}"
    if key:  # a framework's version: any will do
        if flags:
            return f"relax {spelling.input(field, r.was, (0,))} to {shlex.quote(r.value or key)} and {fits}"
        spec = (r.was or "")[len(key):]
        return f"relax {name}[{key!r}] from {spec!r} to any version and {fits}"
    return f"relax {name} to {r.value} and {fits}"


def _profile_frameworks(e: Explanation) -> tuple[str | None, dict[str, str] | None]:
    """The job's runtime profile and the frameworks it asks for that the job keeps as the
    profile has them (so the job did not name them itself); (None, None) without a profile."""
    name = e.spec.requirements.profile if e.spec is not None else None
    if not name:
        return None, None
    from gpulayer.profiles import get_profile

    try:
        wanted = get_profile(name).frameworks
    except Exception:  # (a profile no longer installed: the relaxations say what they say)
        return None, None
    have = e.spec.requirements.frameworks if e.spec is not None else {}
    return name, {k: v for k, v in wanted.items() if have.get(k) == v}


def verdict_text(e: Explanation) -> str:
    """``would be placed now: ...``, ``would wait: ...`` or ``would fail: ...``."""
    d = e.decision
    if d.outcome == "assigned":
        return f"would be placed now: {d.summary}"
    if d.outcome == "waiting":
        return f"would wait: {d.summary.removeprefix('waiting: ')}"
    if e.spec.placement.on_unschedulable == "wait":
        return f"would wait (on_unschedulable=wait) until a worker that can run it joins: {d.summary}"
    return f"would fail: {d.summary}"


def elapsed_text(seconds: float) -> str:
    """``4.2s``, ``3m07s``, ``2h05m``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _ago(at: float, now: float) -> str:
    return elapsed_text(max(0.0, now - at))


def _running(t: RunningTask, now: float) -> str:
    who = t.job_id or "another user's job"
    devices = f" {t.accelerator} {','.join(map(str, t.devices))}" if t.devices else ""
    since = f" for {_ago(t.started_at, now)}" if t.started_at is not None else " (not started yet)"
    ends = f", ends within {_ago(now, t.ends_by)}" if t.ends_by is not None else ""
    return f"{who}{devices}{since}{ends}"


def _worker_lines(w: WorkerExplanation, now: float) -> list[str]:
    if w.status == "free":
        return [f"{w.worker}: eligible, free now"]
    lines = [r.render() for r in w.reasons]
    if w.status == "busy":
        running = "; ".join(_running(t, now) for t in w.running)
        frees = f"; room for it within {_ago(now, w.frees_at)}" if w.frees_at is not None else ""
        if running or frees:
            lines[-1] += f" (running {running or 'nothing it reports'}{frees})"
    return lines


#: reasons of a decision about a target rather than a worker (a worker's own are in
#: ``e.workers``), shown before the workers' lines; then those about offers that fit but
#: that their provider never brings up so many of at once
_TARGET_CODES = frozenset({"no_workers", "too_few_workers"})
_OFFER_CODES = frozenset({"machines"})


def render(e: Explanation, spelling: Spelling | None = None, *, command: str | None = None) -> str:
    """The explanation as ``gpulayer explain`` prints it. ``command``: how to ask again for
    every worker (shown when the list is cut)."""
    spelling = spelling or Spelling()
    now = e.at or time.time()
    out: list[str] = []
    if e.job_id is not None:
        head = f"job {e.job_id}: {e.state.value if e.state else 'unknown'}"
        if e.queue_position is not None:
            head += f", position {e.queue_position} in the queue"
        out.append(head)
        if e.stored_decision is not None:
            out.append(f"last placement pass: {e.stored_decision.summary}")
        out.append(f"if placed now on its own: {verdict_text(e)}")
    else:
        if e.spec.after or e.spec.after_ended:  # (not placed before then: the verdict is for then)
            out.append(f"it runs after {', '.join([*e.spec.after, *e.spec.after_ended])}: placed once "
                       f"{'each has' if not e.spec.after_ended else 'they have'} "
                       f"{'succeeded' if not e.spec.after_ended else 'ended as it needs'}; then:")
        out.append(verdict_text(e))
        if e.queue_position is not None and e.queue_position > 1:
            out.append(f"{e.queue_position - 1} queued job(s) would be placed before it")
    out.append("")
    # what the decision says of a target, not of one worker (``no cloud worker registered
    # ...``, ``2 compatible remote worker(s), the job needs 4 at once``), as submit prints it
    out.extend(r.render() for r in e.decision.reasons if r.code in _TARGET_CODES)
    if not e.workers:
        out.append("workers: none registered (or online)")
    for w in e.workers[:LISTED]:
        out.extend(_worker_lines(w, now))
    out.extend(r.render() for r in e.decision.reasons if r.code in _OFFER_CODES)
    if len(e.workers) > LISTED:
        more = len(e.workers) - LISTED
        out.append(f"... and {more} more worker(s); {command + ' --json' if command else '--json'} lists every one")
    if e.offers is None and "cloud" in e.spec.placement.targets:
        # (said here as the unschedulable message says it: explain listed the workers only)
        out.append("offers: none: no provider is configured on this control plane, so no machine is brought "
                   "up for the cloud target (providers.toml for gpulayer server start; see docs/providers.md)")
    if e.offers is not None:
        if not e.offers:
            out.append("offers: no configured provider offers a machine that fits")
        for o in e.offers:
            price = "owned capacity" if o.price_per_hour is None else f"${o.price_per_hour:.2f}/h"
            spot = ", spot" if o.spot else ""
            region = f" in {o.region}" if o.region else ""
            never = f"; never launched: {o.never_launched}" if o.never_launched else ""
            if o.blocked_until is not None and o.blocked_until > now:
                never += f"; not tried for another {o.blocked_until - now:.0f} s after: {o.blocked_why or 'a failure'}"
            if o.no_room:
                never += f"; no room now: {o.no_room}"
            out.append(f"offer {o.provider}:{o.shape}{region}: {price}{spot}, availability {o.availability}{never}")
        for o in e.unfit_offers[:LISTED]:
            region = f" in {o.region}" if o.region else ""
            out.append(f"offer {o.provider}:{o.shape}{region}: {o.unfit}")
        if len(e.unfit_offers) > LISTED:
            out.append(f"... and {len(e.unfit_offers) - LISTED} more offer(s) that do not fit; "
                       f"{command + ' --json' if command else '--json'} lists every one")
        out.extend(f"provider {down}" for down in e.providers_down)
    line = e.closest_line()
    if line:
        out.append("")
        out.append(line)
    profile, implied = _profile_frameworks(e)
    for r in e.relaxations:
        out.append(relaxation_text(r, spelling, profile, implied))
    if e.closest and not e.relaxations and e.decision.outcome == "unschedulable":
        out.append("no single change to the job makes a worker fit")
    return "\n".join(out)
