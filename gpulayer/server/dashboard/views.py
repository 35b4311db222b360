"""What the dashboard's pages show: data read through the control plane, rendered by Jinja2.

Every function here reads through the :class:`~gpulayer.control.ControlPlane` methods the
API serves (``list_jobs``, ``get_job``, ``logs``, ``events``, ``list_workers``,
``worker_usage``), with the visibility the API gives the same token (an admin sees every
job, a client token its own: :attr:`Identity.owner`), never the database. They block, so
the routes call them in the thread pool; rendering happens there too, since a page of logs
is real work.

Templates are rendered with autoescaping on: a job's command, name, logs and errors may hold
anything (HTML, terminal escapes) and are shown as text. A page's live regions are its
blocks named ``live_*``: the page renders them in place, and the live stream renders the
same blocks again (:func:`render_live`) and sends those that changed, so there is one
definition of what a region shows.
"""

from __future__ import annotations

import datetime
import functools
import json
import re
import shlex
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpulayer.api import MAX_LOG_CHUNKS, LogChunk, ResultJSON, log_page_cut
from gpulayer.artifacts import format_size
from gpulayer.artifacts import latest as latest_artifacts
from gpulayer.client import chunk_text, prefixes_nodes
from gpulayer.control import ControlPlane
from gpulayer.errors import NotFound
from gpulayer.records import JobRecord, JobState, TaskRecord, WorkerRecord
from gpulayer.server.dashboard.sessions import Identity
from gpulayer.units import format_gb

if TYPE_CHECKING:
    import jinja2

#: log chunks read per call (the API's own limit per request)
LOG_BATCH = MAX_LOG_CHUNKS
#: active jobs whose tasks the workers page lists (each is one more read: list_jobs
#: returns jobs without their tasks)
ACTIVE_JOBS = 200


# CSI (colours, cursor moves), OSC (window titles, links) and other ESC sequences, then
# control characters other than tab and newline: a terminal's instructions, not text
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean_log(text: str) -> str:
    """Log text as it reads, without the terminal's escape sequences and control characters
    (a carriage return that redraws a progress bar becomes a new line)."""
    text = _ESCAPES.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROLS.sub("", text)


def age(ts: float | None, now: float) -> str:
    if not ts:
        return "never"
    seconds = max(0.0, now - ts)
    if seconds < 60:
        return f"{seconds:.0f} s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} d ago"


def when(ts: float | None) -> str:
    if not ts:
        return ""
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(ts: float | None) -> str:
    if not ts:
        return ""
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat(timespec="seconds")


def visible(text: str) -> str:
    """``text`` with its control characters written out (``\\x1b``), so they show."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def what(job: JobRecord) -> str:
    """What a job runs, in one line: its command, function or distributed entry point."""
    spec = job.spec
    if spec.kind == "command":
        return visible(shlex.join(spec.command))
    if spec.kind == "function":
        return visible(spec.function)
    return visible(" ".join([spec.entry, *spec.args])) + f" ({spec.nodes} node(s) x {spec.nproc_per_node})"


def needs(job: JobRecord) -> str:
    req = job.spec.requirements.model_dump(exclude_defaults=True)
    return ", ".join(f"{k}={json.dumps(v) if isinstance(v, dict) else v}" for k, v in req.items()) or \
        "nothing special (CPU)"


def result_json(result: Any) -> str:
    """A job's result as JSON text: as stored, where the control plane gives it so
    (:class:`~gpulayer.wire.ResultJSON`, a server's), else written from the value."""
    return result.text if isinstance(result, ResultJSON) else json.dumps(result)


@functools.cache
def environment() -> jinja2.Environment:
    """The pages' Jinja environment, made at the first page (a server that serves no page
    does not import Jinja: some 70 ms of every ``gpulayer server start``)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("gpulayer.server.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,  # a misspelt variable is a bug, not an empty cell
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(size=format_size, gb=format_gb, when=when, iso=iso, what=what, needs=needs,
                       result_json=result_json)
    env.globals.update(age=age, states=[s.value for s in JobState])
    return env


def render(template: str, context: dict[str, Any]) -> str:
    return environment().get_template(template).render(context)


def render_live(template: str, context: dict[str, Any]) -> dict[str, str]:
    """The page's live regions (its ``live_*`` blocks), by element id."""
    tmpl = environment().get_template(template)
    ctx = tmpl.new_context(context)
    return {name: "".join(block(ctx)) for name, block in tmpl.blocks.items() if name.startswith("live_")}


# ---------------------------------------------------------------------------------- logs


@dataclass
class LogPart:
    """Consecutive output of one stream, as it is shown."""

    stream: str
    text: str


def log_parts(chunks: list[LogChunk], *, prefix: bool) -> list[LogPart]:
    parts: list[LogPart] = []
    for c in chunks:
        text = clean_log(chunk_text(c, prefix=prefix))
        stream = "stderr" if c.stream == "stderr" else "stdout"
        if parts and parts[-1].stream == stream:
            parts[-1].text += text
        else:
            parts.append(LogPart(stream, text))
    return parts


def read_logs(control: ControlPlane, job: JobRecord, after: int) -> tuple[list[LogPart], int, bool]:
    """Log chunks after id ``after``: (parts, last id, whether more are waiting)."""
    chunks = control.logs(job.id, after=after, limit=LOG_BATCH)
    last = chunks[-1].id if chunks else after
    return log_parts(chunks, prefix=prefixes_nodes(job.spec)), last, log_page_cut(chunks, LOG_BATCH)


# ---------------------------------------------------------------------------------- pages


def visible_job(control: ControlPlane, who: Identity, job_id: str, *, arguments: bool = True) -> JobRecord:
    """The job, if this identity may see it; another owner's job is "no such job", as in the API."""
    if not who.admin and not who.may_see(control.job_owner(job_id)):
        raise NotFound(f"job {job_id!r}: no such job")
    return control.get_job(job_id, arguments=arguments)


def jobs(control: ControlPlane, who: Identity, *, state: JobState | None, limit: int,
         before: str | None = None) -> dict[str, Any]:
    """The ``limit`` newest jobs (submitted ``before`` that one: a page further back), and
    whether there are more (one more is read to know: the page then links to the next page)."""
    listed = control.list_jobs(state=state, limit=limit + 1, owner=who.owner, before=before)
    return {"jobs": listed[:limit], "more": len(listed) > limit, "limit": limit, "now": time.time(),
            "before": before}


@dataclass
class TaskView:
    task: TaskRecord
    worker_name: str


def job(control: ControlPlane, who: Identity, job_id: str, *, logs: bool = True, spec: bool = True) -> dict[str, Any]:
    """What the job's page shows; a live look leaves out the ``logs`` (it reads them from
    where it was) and the ``spec`` (no live region shows it; a function's arguments may be a
    megabyte, read and written again at every look)."""
    record = visible_job(control, who, job_id, arguments=spec)
    names = {w.id: w.name for w in control.list_workers()}
    attempts: dict[int, list[TaskView]] = {}
    for t in sorted(record.tasks, key=lambda t: (-t.attempt, t.node_rank)):
        attempts.setdefault(t.attempt, []).append(TaskView(t, names.get(t.worker_id, "")))
    out: dict[str, Any] = {"job": record, "attempts": attempts, "events": control.events(job_id),
                           "now": time.time(), "spec_json": spec_json(record) if spec else "",
                           "nearest": nearest_miss(control, who, record),
                           "artifacts": latest_artifacts(control.list_artifacts(job_id))}
    if logs:
        parts, last, more = read_logs(control, record, 0)
        out.update(log=parts, log_after=last, log_more=more)
    return out


def nearest_miss(control: ControlPlane, who: Identity, record: JobRecord) -> list[str]:
    """For a job that waits or could not be placed: the nearest miss and the relaxations that
    would let it run, in the CLI's words (what ``gpulayer jobs explain`` ends with)."""
    if record.state not in (JobState.QUEUED, JobState.UNSCHEDULABLE):
        return []
    from gpulayer.explanations import relaxation_text
    from gpulayer.joboptions import CLI_SPELLING

    explanation = control.explain_job(record.id, owner=who.owner)
    lines = [line for line in (explanation.closest_line(),) if line]
    lines.extend(relaxation_text(r, CLI_SPELLING) for r in explanation.relaxations)
    return lines


#: the most characters of a function's arguments (``args``, ``kwargs``) a job's page shows
#: in its spec (they may be a megabyte); larger, it says how large and where they are
ARGS_SHOWN = 10_000


def spec_json(record: JobRecord) -> str:
    """The spec as stored, with environment values hidden (a page may be on a shared screen)
    and a function's arguments over :data:`ARGS_SHOWN` characters of JSON left out, saying
    so: the rest of the spec stays in view."""
    data = record.spec.model_dump(mode="json", exclude_defaults=True)
    if data.get("env"):
        data["env"] = {name: "(set)" for name in data["env"]}
    for key in ("args", "kwargs") if record.spec.kind == "function" else ():
        if key in data and len(size := json.dumps(data[key])) > ARGS_SHOWN:
            data[key] = f"({len(size):,} characters of JSON, not shown: gpulayer jobs show {record.id} --json)"
    return json.dumps(data, indent=2, sort_keys=True)


@dataclass
class DeviceView:
    kind: str
    index: int
    name: str
    memory: str
    usable: bool
    why_not: str
    busy: bool


@dataclass
class WorkerView:
    record: WorkerRecord
    status: str
    devices: list[DeviceView]
    busy_cpu_slots: int
    tasks: list[tuple[TaskRecord, JobRecord]] = field(default_factory=list)


@dataclass
class KindSummary:
    kind: str
    total: int = 0
    busy: int = 0
    #: not busy, and no new work can use it: not usable, or on a draining or paused worker
    unavailable: int = 0

    @property
    def free(self) -> int:
        return self.total - self.busy - self.unavailable


def _status(w: WorkerRecord) -> str:
    if not w.online:
        return "offline"
    return "draining" if w.draining else ("paused" if w.paused else "online")


def _worker_views(control: ControlPlane) -> list[WorkerView]:
    records = control.list_workers()
    usage = control.worker_usage()
    views = []
    for w in records:
        u = usage.get(w.id)
        busy = set(u.busy_devices) if u else set()
        devices = [DeviceView(d.kind, d.index, d.name, f"{format_gb(d.memory_bytes)} GB" if d.memory_bytes else "",
                              d.usable, d.unusable_reason or "", f"{d.kind}:{d.index}" in busy)
                   for d in w.capabilities.devices]
        views.append(WorkerView(w, _status(w), devices, u.busy_cpu_slots if u else 0))
    return views


def workers(control: ControlPlane, who: Identity) -> dict[str, Any]:
    views = _worker_views(control)
    by_id = {v.record.id: v for v in views}
    # the tasks shown are those of jobs this identity may see; the busy counts cover everyone's
    active = [j for state in (JobState.RUNNING, JobState.ASSIGNED)
              for j in control.list_jobs(state=state, limit=ACTIVE_JOBS, owner=who.owner)]
    for listed in active[:ACTIVE_JOBS]:
        try:  # (without a function's arguments: up to a megabyte each, at every look, and not shown)
            j = control.get_job(listed.id, arguments=False)
        except NotFound:  # gone since it was listed
            continue
        for t in j.tasks:
            if t.attempt == j.attempt and not t.state.terminal and t.worker_id in by_id:
                by_id[t.worker_id].tasks.append((t, j))
    return {"workers": views, "now": time.time(), "fleet": fleet(views)}


@dataclass
class Fleet:
    kinds: list[KindSummary]
    online: int
    draining: int
    offline: int
    paused: int
    cpu_slots: int
    busy_cpu_slots: int


def fleet(views: list[WorkerView]) -> Fleet:
    """Devices busy and free by kind, CPU slots and workers, over the online workers (a
    draining or paused worker's idle devices take no new work, so they count as unavailable)."""
    kinds: dict[str, KindSummary] = {}
    cpu = busy_cpu = 0
    for v in views:
        if v.status == "offline":
            continue
        for d in v.devices:
            k = kinds.setdefault(d.kind, KindSummary(d.kind))
            k.total += 1
            if d.busy:
                k.busy += 1
            elif not d.usable or v.status in ("draining", "paused"):
                k.unavailable += 1
        if v.status == "online":
            cpu += v.record.cpu_slots
        busy_cpu += v.busy_cpu_slots
    count = {s: sum(1 for v in views if v.status == s) for s in ("online", "draining", "offline", "paused")}
    return Fleet(sorted(kinds.values(), key=lambda k: k.kind), count["online"], count["draining"],
                 count["offline"], count["paused"], max(cpu, busy_cpu), busy_cpu)


def overview(control: ControlPlane, who: Identity) -> dict[str, Any]:
    return {"fleet": fleet(_worker_views(control)), "jobs": control.list_jobs(limit=10, owner=who.owner),
            "now": time.time()}


def _columns(records: list[Any]) -> tuple[list[str], list[list[str]]]:
    """A table of records whose fields this dashboard does not know in advance."""
    dumped = [r.model_dump(mode="json") if hasattr(r, "model_dump") else dict(r) for r in records]
    names: list[str] = []
    for d in dumped:
        names.extend(k for k in d if k not in names)
    rows = [[v if isinstance(v, str) else json.dumps(v) for v in (d.get(n, "") for n in names)] for d in dumped]
    return names, rows


def machines(control: ControlPlane, who: Identity) -> dict[str, Any]:
    shown = who.admin and control.providers is not None
    out: dict[str, Any] = {"provisioning": shown, "now": time.time()}
    if shown:
        out["providers"] = _columns(list(control.list_providers()))
        out["machines"] = _columns(list(control.list_machines()))
    return out
