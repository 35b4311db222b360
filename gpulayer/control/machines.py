"""The cloud target's I/O: the provisioning pass, machines, providers and offers.

:meth:`MachineOps.provision` is one pass, run by the server's background loop (never by a
request handler): refresh the offers (cached, :mod:`.providers`), look after the machines
there are (idle, not joined in time, worker gone: :func:`provisioning.housekeeping`), sweep
orphans now and then, and launch machines for the demand (:func:`provisioning.plan`). Every
step is written to the database before the provider is called, so a crash at any point
leaves a record that the next pass (or the reconciliation after a restart) finishes.

A launch makes a single-use bootstrap token bound to the machine (the machine row holds the
token's id; the token expires at the join deadline) and hands it to the provider in the
:class:`~gpulayer.hookrecords.LaunchRequest`, never in argv. The worker that joins with it
(:meth:`WorkerOps.join_worker`) gets the origin ``provider`` and is bound to the machine
(:meth:`MachineOps._bind_machine`).
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

from pydantic import SecretStr
from sqlmodel import Session

from gpulayer import provisioning, tokens
from gpulayer.control.providers import ProviderSet
from gpulayer.control.workers import WorkerOps
from gpulayer.errors import InvalidInput, NoCapacity, ProviderAuthFailed, ProviderError, QuotaExceeded, SkipOffer
from gpulayer.hookrecords import LaunchedMachine, LaunchRequest, LiveMachine, MachineOffer
from gpulayer.provider_config import Limits
from gpulayer.records import JobState, MachineRecord, ProviderInfo, new_id
from gpulayer.specs import CommandJob, Placement, Requirements
from gpulayer.store import JobRow, MachineRow, mapping, queries

log = logging.getLogger("gpulayer.provisioning")

#: how often the orphan sweep asks every provider for its machines, seconds
SWEEP_SECONDS = 60.0
TERMINATED_BY_ADMIN = "terminated by an admin (gpulayer machines terminate)"
#: a machine whose worker went silent is terminated after this many heartbeat timeouts
LOST_GRACE_TIMEOUTS = 3
#: a scope whose launch failed for a transient reason is skipped this long, seconds
TRANSIENT_BLOCK = 30.0
#: a machine whose terminate failed is not tried again for this long, seconds
TERMINATE_RETRY = 30.0

_FAILURE_WORDS = {NoCapacity: "no capacity", QuotaExceeded: "quota exceeded", SkipOffer: "skipped"}


def _words(exc: ProviderError) -> str:
    for cls, words in _FAILURE_WORDS.items():
        if isinstance(exc, cls):
            return f"{words} ({exc})" if str(exc) else words
    if isinstance(exc, ProviderAuthFailed):
        return f"credentials failed ({exc})"
    return f"launch failed ({exc})"


class MachineOps(WorkerOps):
    # ------------------------------------------------------------------ operations (admin)

    def list_providers(self) -> list[ProviderInfo]:
        """Every provider instance of providers.toml, then every installed adapter that no
        section configures (``configured`` False)."""
        from gpulayer import plugins

        out = []
        ps = self.providers
        with self.store.read() as s:
            rows = queries.machines(s, live_only=True)
        running: dict[str, int] = {}
        for r in rows:
            running[r.provider] = running.get(r.provider, 0) + 1
        types = set()
        if ps is not None:
            for name, c in ps.configured.items():
                st = ps.status[name]
                types.add(c.type)
                out.append(ProviderInfo(
                    name=name, type=c.type, plugin=c.plugin, configured=True, credentials_ok=st.credentials_ok,
                    disabled=st.disabled, machines_running=running.get(name, 0),
                    max_machines=c.limits.max_machines, max_price_per_hour=c.limits.max_price_per_hour,
                    idle_timeout=c.limits.idle_timeout, join_timeout=c.limits.join_timeout,
                    last_error=st.last_error))
        manager = plugins.get_manager()
        for kind in sorted(plugins.providers()):
            if kind not in types:
                lim = Limits()
                out.append(ProviderInfo(
                    name=kind, type=kind, plugin=manager.owner("gpulayer_provider_adapters", kind) or "",
                    configured=False, max_machines=lim.max_machines, idle_timeout=lim.idle_timeout,
                    join_timeout=lim.join_timeout))
        return out

    def offers(self, requirements: Requirements, *, barred: bool = False) -> list[MachineOffer]:
        """Every cached offer that fits ``requirements`` and its section's limits let be
        launched (``barred``: also those they never let be), cheapest first (capacity you
        own, priced None, after the priced ones), then fastest to boot. Never calls a provider."""
        if self.providers is None:
            return []
        spec = CommandJob(command=["true"], requirements=requirements, placement=Placement(target="cloud"))
        fits = provisioning.fitting(spec, self.providers.cached_offers(barred=barred))
        return sorted(fits, key=offer_sort_key)

    def list_machines(self) -> list[MachineRecord]:
        now = self.clock()
        with self.store.read() as s:
            rows = queries.machines(s)
            ended = queries.last_task_ends(s, {r.worker_id for r in rows if r.state == "idle" and r.worker_id})
            return [mapping.machine_record(r, now, ended.get(r.worker_id or "")) for r in rows]

    def get_machine(self, machine_id: str) -> MachineRecord:
        with self.store.read() as s:
            row = queries.machine(s, machine_id)
            ended = queries.last_task_ends(s, [row.worker_id] if row.state == "idle" and row.worker_id else [])
            return mapping.machine_record(row, self.clock(), ended.get(row.worker_id or ""))

    def terminate_machine(self, machine_id: str) -> MachineRecord:
        """Drain the machine's worker and mark the machine ``terminating``: the next
        provisioning pass (within about a second on a server) calls the provider, as for
        every other step. Idempotent; a machine already ended stays as it is, and one still
        terminating after a failed terminate is tried again at the next pass, not 30 s later
        (its admin has fixed what failed, or wants to see it fail now)."""
        with self.store.read() as s:
            row = queries.machine(s, machine_id)
        if row.state == "terminating" and self.providers is not None:
            if self.providers.terminate_after.pop(machine_id, None) is not None:
                self._changed()
        if row.state not in provisioning.LIVE_STATES or row.state == "terminating":
            return self.get_machine(machine_id)
        if self.providers is None or row.provider not in self.providers.configured:
            raise InvalidInput(f"machine {machine_id}: its provider {row.provider!r} is not configured on this "
                               "server (providers.toml); terminate it with the provider's own tools")
        if row.worker_id:
            self.drain_worker(row.worker_id)
        with self.store.write() as s:
            row = queries.machine(s, machine_id)
            if row.state in provisioning.LIVE_STATES and row.state != "terminating":
                row.state, row.reason, row.updated_at = "terminating", TERMINATED_BY_ADMIN, self.clock()
                s.add(row)
        self._changed()
        return self.get_machine(machine_id)

    # ------------------------------------------------------------------ the pass

    def machine_label(self) -> str:
        """The label every machine of this control plane carries (stored in the database, so
        every server on it and every restart use the same)."""
        if self._label is not None:
            return self._label
        with self.store.write() as s:
            label = queries.meta(s, "machine_label")
            if label is None:
                label = f"gpulayer-{secrets.token_hex(4)}"
                queries.set_meta(s, "machine_label", label)
        self._label = label
        return label

    def provision(self) -> None:
        """One provisioning pass (see the module doc); does nothing without providers."""
        ps = self.providers
        if ps is None:
            return
        ps.check()
        ps.refresh_offers()
        now = self.clock()
        if not ps.reconciled or now - ps.last_sweep >= SWEEP_SECONDS:
            self.sweep_orphans(after_start=not ps.reconciled)
        self._housekeeping()
        if ps.control_url is None:
            return  # the server does not know its own URL yet: nothing could join
        self.schedule()  # place what the machines there are can take, first
        self._launch_for_demand()

    def _housekeeping(self) -> None:
        ps = self.providers
        assert ps is not None
        now = self.clock()
        with self.store.read() as s:
            rows = [r for r in queries.machines(s, live_only=True) if r.provider in ps.configured]
            workers = {w.id: w for w in queries.workers(s) if w.id in {r.worker_id for r in rows}}
            busy = queries.busy_worker_ids(s, workers)
            ended = queries.last_task_ends(s, workers)
            wanting = queries.jobs_by_id(s, {r.job_id for r in rows if r.job_id and r.state == "booting"}, light=True)
        views = []
        for r in rows:
            w = workers.get(r.worker_id or "")
            # idle since its last task ended, even one too short for a pass to see it busy
            last = ended.get(r.worker_id or "")
            idle_since = max(r.idle_since or 0.0, last or 0.0) if (r.idle_since or last) else None
            views.append(provisioning.MachineView(
                id=r.id, provider=r.provider, scope=_scope(r), state=r.state, join_deadline=r.join_deadline,
                idle_since=idle_since, worker_id=r.worker_id, busy=(r.worker_id in busy),
                worker_online=w.online if w is not None else r.worker_id is None,
                last_heartbeat=w.last_heartbeat if w is not None else 0.0, gang=r.gang,
                unwanted=_unwanted(r.job_id, wanting)))
        limits = {n: c.limits for n, c in ps.configured.items()}
        grace = LOST_GRACE_TIMEOUTS * self.heartbeat_timeout
        for a in provisioning.housekeeping(views, limits, now, grace=grace):
            if a.kind in ("busy", "idle"):
                with self.store.write() as s:
                    row = queries.machine(s, a.machine_id)
                    if row.state in provisioning.JOINED_STATES:
                        row.state, row.idle_since, row.updated_at = a.kind, a.since, now
                        s.add(row)
                continue
            if a.block:
                ps.blocks.block(a.block, now, reason=f"{a.machine_id} {a.reason}")
            self._end_machine(a.machine_id, a.reason, drain_first=(a.kind == "terminate"),
                              failed=False if a.kind == "withdraw" else None,
                              unjoined=a.kind in ("withdraw", "fail"))

    def _launch_for_demand(self) -> None:
        """Plan the launches and write their machines (``requested``) in one serialised
        transaction, so control planes sharing a database never launch twice for one job;
        then call the provider for each, outside it."""
        ps = self.providers
        assert ps is not None
        now = self.clock()
        self.machine_label()  # (its own transaction, before the planning one)
        with self.store.read() as s:  # most passes launch nothing: find out without the writers' lock
            if not self._plan(s, now)[2]:
                return
        with self.store.write() as s:
            jobs, views, launches = self._plan(s, now)
            todo = [(lc, self._request(s, lc, now)) for lc in launches]
        tried: set[tuple[str, str]] = set()
        by_id = {j.job_id: j for j in jobs}
        while todo:
            retry = []
            for launch, requests in todo:
                tried.update((launch.job_id, offer.scope) for offer, _ in launch.pieces)
                if self._launch(launch, requests):
                    continue
                for offer, n in launch.pieces:
                    views[offer.provider].take(offer, -n)
                # failover: the job's next offer, in this same pass
                retry.extend(provisioning.plan([by_id[launch.job_id]], views, ps.blocks.active(self.clock()),
                                               self.clock(), tried=tried))
            todo = []
            for launch in retry:
                with self.store.write() as s:
                    todo.append((launch, self._request(s, launch, self.clock())))

    def _plan(self, s: Any, now: float) -> tuple[list[provisioning.DemandJob], dict[str, provisioning.ProviderView],
                                                   list[provisioning.Launch]]:
        """The demand, the providers' room and the launches of this pass, read in ``s``."""
        ps = self.providers
        assert ps is not None
        rows = queries.queued_jobs(s)
        live = queries.machines(s, live_only=True)
        # a stored spec never changes: parse each queued job's once, not at every pass
        specs = {r.id: ps.specs.get(r.id) or mapping.spec(r.spec) for r in rows}
        ps.specs = specs
        queue = [provisioning.QueuedCloudJob(job_id=jid, spec=spec, preference=tuple(spec.placement.prefer))
                 for jid, spec in specs.items()]
        pending: dict[str, int] = {}
        views = {n: provisioning.ProviderView(limits=c.limits, enabled=ps.status[n].disabled is None)
                 for n, c in ps.configured.items()}
        for r in live:
            view = views.get(r.provider)
            if view is not None:
                view.live += 1
                view.in_scope[_scope(r)] = view.in_scope.get(_scope(r), 0) + 1
            if r.state in provisioning.PENDING_STATES and r.job_id:
                pending[r.job_id] = pending.get(r.job_id, 0) + 1
        jobs = provisioning.demand(queue, ps.cached_offers(), pending)
        return jobs, views, provisioning.plan(jobs, views, ps.blocks.active(now), now)

    def _request(self, s: Any, launch: provisioning.Launch, now: float) -> list[LaunchRequest]:
        """Write the machines of one launch (``requested``, each with its bootstrap token)
        in ``s``'s transaction; returns what the provider is to be given."""
        ps = self.providers
        assert ps is not None and ps.control_url is not None
        limits = ps.configured[launch.offer.provider].limits
        deadline = now + limits.join_timeout
        gang = new_id("gang") if launch.count > 1 else None
        label = self.machine_label()
        requests: list[LaunchRequest] = []
        for offer in (o for o, n in launch.pieces for _ in range(n)):
            mid = new_id("m")
            info, secret = tokens.new_token(s, "bootstrap", now=now, ttl=limits.join_timeout,
                                            description=f"bootstrap token of machine {mid}")
            queries.add_machine(s, MachineRow(
                id=mid, provider=offer.provider, shape=offer.shape, region=offer.region,
                offer=offer.model_dump_json(), state="requested", job_id=launch.job_id, gang=gang,
                token_id=info.id, price_per_hour=offer.price_per_hour, created_at=now, updated_at=now,
                join_deadline=deadline))
            requests.append(LaunchRequest(machine_id=mid, label=label, offer=offer, control_url=ps.control_url,
                                          ca=ps.ca, bootstrap_token=SecretStr(secret), join_deadline=deadline))
        return requests

    def _launch(self, launch: provisioning.Launch, requests: list[LaunchRequest]) -> bool:
        """Call the provider for the machines of one launch, already stored (``count`` for a
        gang: all or none); False when it failed."""
        ps = self.providers
        assert ps is not None
        now = self.clock()
        launched: list[str] = []
        last_scope: str | None = None
        for req in requests:
            offer = req.offer
            with self.store.write() as s:
                self._set_state(s, req.machine_id, "launching", from_=("requested",))
            started = time.perf_counter()
            try:
                answer: LaunchedMachine = ps.call(offer.provider, "launch", req, timeout=ps.launch_timeout)
            except ProviderError as exc:
                self._launch_failed(launch, offer, req.machine_id, exc, [r.machine_id for r in requests], launched)
                return False
            took = time.perf_counter() - started
            with self.store.write() as s:
                row = queries.machine(s, req.machine_id)
                row.provider_id, row.address = answer.provider_id, answer.address
                row.data = json.dumps(answer.data)
                row.launched_at = row.launched_at or now
                if row.state == "launching":
                    row.state = "booting"
                row.updated_at = self.clock()
                s.add(row)
                # a gang's machines are one attempt: the second and later continue its line
                where = "" if offer.scope == last_scope else f"{offer.scope}: "
                self._event(s, "cloud_gang" if launched else "cloud", job_id=launch.job_id,
                            message=f"{where}launched {req.machine_id} ({took:.1f} s)")
            launched.append(req.machine_id)
            last_scope = offer.scope
        return True

    def _launch_failed(self, launch: provisioning.Launch, offer: MachineOffer, machine_id: str, exc: ProviderError,
                       gang: Sequence[str], launched: Sequence[str]) -> None:
        """``offer``'s launch of ``machine_id`` failed: its scope is blocked, the machines of
        ``gang`` not ``launched`` fail, and those launched are ended (a gang is all or none)."""
        ps = self.providers
        assert ps is not None
        now = self.clock()
        scope = offer.scope
        failover = isinstance(exc, (NoCapacity, QuotaExceeded, SkipOffer))
        blocked = provisioning.BLOCK_SECONDS if failover else TRANSIENT_BLOCK
        reason = _words(exc)
        ps.blocks.block(scope, now, blocked, reason)
        log.warning("%s; %s is skipped for %g s", ps.describe(offer.provider, "launch", exc), scope, blocked)
        with self.store.write() as s:
            for mid in gang:
                if mid in launched:
                    continue
                row = queries.machine(s, mid)
                row.state, row.reason, row.ended_at, row.updated_at = "failed", reason, now, now
                s.add(row)
                if row.token_id:
                    queries.revoke_token(s, row.token_id)
            self._event(s, "cloud", job_id=launch.job_id, message=f"{scope}: {reason}")
        if not failover:
            # the launch may have gone through before the error: make sure nothing is left
            try:
                ps.call(offer.provider, "terminate", machine_id, None)
            except ProviderError as texc:
                log.warning("terminate %s after a failed launch: %s", machine_id,
                            ps.describe(offer.provider, "terminate", texc))
        for mid in launched:  # a gang is all or nothing
            self._end_machine(mid, f"another machine of its group failed to launch ({reason})", failed=True)
        self.tokens.forget()

    # ------------------------------------------------------------------ ending machines

    def _ended_elsewhere(self, s: Session, machine_id: str, by: str) -> str | None:
        """A machine recorded under a provider section no longer configured (renamed,
        removed) that provider ``by`` listed and terminated as an orphan: its record ends
        too, instead of showing it alive for ever (no section could end it). Its worker's
        id, to be taken offline."""
        assert self.providers is not None
        row = s.get(MachineRow, machine_id)
        if (row is None or row.provider == by or row.state not in provisioning.LIVE_STATES
                or row.provider in self.providers.configured):  # (its own provider ends it, as usual)
            return None
        now = self.clock()
        row.state, row.ended_at, row.updated_at = "terminated", now, now
        row.reason = f"its provider {row.provider!r} is no longer configured; provider {by!r} terminated it"
        s.add(row)
        if row.token_id:
            queries.revoke_token(s, row.token_id)
        return row.worker_id

    def _end_machine(self, machine_id: str, reason: str, *, drain_first: bool = False,
                     failed: bool | None = None, unjoined: bool = False) -> None:
        """terminating (written first) -> the provider's terminate -> terminated, or failed
        for a machine that never joined. A terminate that fails leaves it terminating: a
        pass :data:`TERMINATE_RETRY` seconds later tries again. ``unjoined``: only if it has
        not joined since it was looked at (its worker may have taken a task meanwhile)."""
        ps = self.providers
        assert ps is not None
        with self.store.read() as s:
            row = queries.machine(s, machine_id)
        if row.state not in provisioning.LIVE_STATES:
            return
        if row.state == "terminating" and self.clock() < ps.terminate_after.get(machine_id, 0.0):
            return  # its last terminate failed: tried again after TERMINATE_RETRY, not at every pass
        if drain_first and row.worker_id and row.state != "terminating":
            self.drain_worker(row.worker_id)
            with self.store.read() as s:
                if queries.busy_worker_ids(s, [row.worker_id]):
                    return  # a task started meanwhile: it is drained now and ends later
        with self.store.write() as s:
            row = queries.machine(s, machine_id)
            if unjoined and row.state not in provisioning.PENDING_STATES:
                return
            if row.state != "terminating":
                row.state, row.reason, row.updated_at = "terminating", reason, self.clock()
                s.add(row)
        try:
            ps.call(row.provider, "terminate", machine_id, row.provider_id)
        except ProviderError as exc:
            ps.terminate_after[machine_id] = self.clock() + TERMINATE_RETRY
            log.warning("terminate %s failed (%s); trying again in %g s", machine_id,
                        ps.describe(row.provider, "terminate", exc), TERMINATE_RETRY)
            return
        ps.terminate_after.pop(machine_id, None)
        ps.machine_ended(row.provider)
        now = self.clock()
        never_joined = row.joined_at is None if failed is None else failed
        with self.store.write() as s:
            row = queries.machine(s, machine_id)
            row.state = "failed" if never_joined else "terminated"
            row.ended_at = row.updated_at = now
            s.add(row)
            if row.token_id:
                queries.revoke_token(s, row.token_id)  # a join still on its way is refused
            if never_joined and row.job_id:
                self._event(s, "cloud", job_id=row.job_id, message=f"{_scope(row)}: {machine_id} {reason}; terminated")
        self.tokens.forget()
        if row.worker_id:
            worker = self.get_worker(row.worker_id)
            if worker.online:
                self.deregister_worker(row.worker_id)

    def sweep_orphans(self, *, after_start: bool = False) -> list[str]:
        """Ask every enabled provider for the machines with our label; terminate those the
        records do not know or know as ended. ``after_start``: also settle the launches a
        previous server process left half-way (requested or launching). Returns the ids
        terminated."""
        ps = self.providers
        assert ps is not None
        label = self.machine_label()
        ended: list[str] = []
        now = self.clock()
        for name in ps.enabled():
            try:
                live: list[LiveMachine] = ps.call(name, "list", label)
            except ProviderError as exc:  # (the other providers are swept as usual)
                log.warning("%s; listing again in %g s", ps.describe(name, "list", exc), SWEEP_SECONDS)
                continue
            with self.store.read() as s:
                rows = {r.id: r for r in queries.machines(s, provider=name)}
                # The label is the control plane's, not the section's: two sections on one
                # account (one EC2 region, one pool) list each other's machines. One that
                # another configured section keeps is that section's, not an orphan.
                known = {r.id: r.state for r in queries.machines(s, live_only=True)
                         if r.provider != name and r.provider in ps.configured}
            known.update((mid, r.state) for mid, r in rows.items())
            for m in provisioning.orphans(live, known):
                try:
                    ps.call(name, "terminate", m.machine_id, m.provider_id)
                    ps.machine_ended(name)
                    ended.append(m.machine_id)
                    with self.store.write() as s:
                        self._event(s, "machine_orphan", message=f"{name}: terminated orphan {m.machine_id} "
                                                                 f"({m.provider_id})")
                        gone = self._ended_elsewhere(s, m.machine_id, name)
                    if gone is not None:
                        self.worker_gone(gone, "its machine was terminated as an orphan")
                except ProviderError as exc:
                    log.warning("terminate orphan %s failed (%s)", m.machine_id, ps.describe(name, "terminate", exc))
            if after_start:
                listed = {m.machine_id: m for m in live}
                for r in rows.values():
                    if r.state not in ("requested", "launching"):
                        continue
                    if r.id in listed:  # it came up: wait for its join as usual
                        with self.store.write() as s:
                            row = queries.machine(s, r.id)
                            row.state, row.provider_id = "booting", listed[r.id].provider_id
                            row.launched_at = row.launched_at or now
                            s.add(row)
                    else:
                        self._end_machine(r.id, "the server restarted before its launch was answered", failed=True)
        ps.reconciled = True
        ps.last_sweep = now
        return ended

    def _set_state(self, s: Any, machine_id: str, state: str, *, from_: Sequence[str]) -> None:
        row = queries.machine(s, machine_id)
        if row.state in from_:
            row.state, row.updated_at = state, self.clock()
            s.add(row)


def _scope(row: MachineRow) -> str:
    return "/".join(p for p in (row.provider, row.region, row.shape) if p)


def offer_sort_key(o: MachineOffer) -> tuple[bool, float, float]:
    """Cheapest first, capacity you own (priced None) after the priced, then fastest to boot."""
    return (o.price_per_hour is None, o.price_per_hour or 0.0, o.boot_seconds or 0.0)


def cloud_only(targets: Sequence[str]) -> bool:
    return list(targets) == ["cloud"]


def _unwanted(job_id: str | None, jobs: dict[str, JobRow]) -> str | None:
    """Why the job a machine was launched for no longer wants it (None: it is queued still)."""
    if job_id is None:
        return None
    job = jobs.get(job_id)
    if job is None:  # (a job that ended may be deleted: gpulayer jobs delete, prune)
        return f"withdrawn: its job {job_id} was deleted (before the machine joined)"
    if job.state == JobState.QUEUED.value:
        return None
    return f"withdrawn: its job {job.id} is {job.state} (before the machine joined)"


__all__ = ["SWEEP_SECONDS", "MachineOps", "ProviderSet", "cloud_only", "offer_sort_key"]
