"""The configured providers of a control plane, and every call made to them.

:class:`ProviderSet` holds the provider instances of providers.toml
(:mod:`gpulayer.provider_config`), what is known about each (credentials checked, disabled
with a reason, the last error), the offers cache, and the blocked scopes. Every call to a
provider goes through :meth:`ProviderSet.call`, on a small thread pool and bounded by a
timeout, so a provider that hangs can hold up neither a request handler (they never call a
provider) nor the provisioning pass for long. Calls are counted (``calls``) for the bench.

:meth:`ProviderSet.call` is also where an adapter's answer is checked, once per call, against
what the call accepts (:data:`ANSWERS`: ``offers`` and ``list`` a list of records, ``launch``
one record). An answer of another type or shape takes the path a raised error takes: it is
a :class:`ProviderCallFailed` (a ``ProviderTransient``) whose text names the provider, its
plugin, the call, what it returned and what is accepted, so one misbehaving adapter is
reported by name and never breaks the pass, or another provider.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pydantic import BaseModel

from gpulayer import provisioning
from gpulayer.errors import ProviderAuthFailed, ProviderError, ProviderTransient, one_line
from gpulayer.hookrecords import LaunchedMachine, LiveMachine, MachineOffer
from gpulayer.plugins import PLUGIN_FAULTS
from gpulayer.provider_config import ConfiguredProvider
from gpulayer.specs import Requirements

log = logging.getLogger("gpulayer.provisioning")

#: seconds a provider gets to answer check, offers, list and terminate
CALL_TIMEOUT = 30.0
#: seconds it gets to accept a launch (not to boot the machine: that is the join timeout)
LAUNCH_TIMEOUT = 120.0


#: seconds before a check that failed for a transient reason is tried again
CHECK_RETRY = 30.0


class ProviderCallFailed(ProviderTransient):
    """A call that raised something other than a typed provider error, gave no answer in
    time, or answered with something it does not accept. Its text names the provider, its
    plugin and the call (``provider 'aws' (plugin 'ec2'): list() returned ...``); ``detail``
    is the same without the provider (``list() returned ...``)."""

    def __init__(self, who: str, detail: str) -> None:
        super().__init__(f"{who}: {detail}")
        self.detail = detail


class _Refused(Exception):
    """An answer a call does not accept; the text says what it was."""


def _kind(value: Any) -> str:
    """``None``, ``a dict``, ``a str``: what a value is, by its type only (an answer may hold
    secrets, so its value is never shown)."""
    return "None" if value is None else f"a {type(value).__name__}"


def _json_data(record: Any) -> None:
    """Refuse a record whose ``data`` (the adapter's own facts, stored by the core) is not JSON."""
    try:
        json.dumps(record.data)
    except (TypeError, ValueError) as exc:
        raise _Refused(f"a {type(record).__name__} whose data is not JSON ({one_line(exc)})") from None


def _one(kind: type[BaseModel], *, json_data: bool = False) -> Callable[[Any], Any]:
    def check(answer: Any) -> Any:
        if not isinstance(answer, kind):
            raise _Refused(_kind(answer))
        if json_data:
            _json_data(answer)
        return answer
    return check


def _many(kind: type[BaseModel], *, json_data: bool = False) -> Callable[[Any], list[Any]]:
    def check(answer: Any) -> list[Any]:
        if isinstance(answer, kind):
            raise _Refused(f"one {kind.__name__}, not a list of them")
        if answer is None or isinstance(answer, (str, bytes, Mapping, BaseModel)) or not isinstance(answer, Iterable):
            raise _Refused(_kind(answer))
        items = list(answer)  # a generator runs here, within the call's timeout
        for i, item in enumerate(items):
            try:
                if not isinstance(item, kind):
                    raise _Refused(_kind(item))
                if json_data:
                    _json_data(item)
            except _Refused as exc:
                raise _Refused(f"a {type(answer).__name__} whose item {i} is {exc}") from None
        return items
    return check


def _raised(method: str, exc: ProviderError) -> str:
    return f"{method}() failed: {one_line(exc)}"


class Answer(NamedTuple):
    """What one call of a provider accepts as its answer."""

    #: in words, for the error that refuses anything else
    accepted: str
    #: the answer to use, or :class:`_Refused`
    check: Callable[[Any], Any]


#: what each call accepts; ``check`` and ``terminate`` answer nothing the core reads
ANSWERS: dict[str, Answer] = {
    "offers": Answer("a list of gpulayer.plugin.MachineOffer records (an empty list for none)", _many(MachineOffer, json_data=True)),
    "launch": Answer("a gpulayer.plugin.LaunchedMachine record", _one(LaunchedMachine, json_data=True)),
    "list": Answer("a list of gpulayer.plugin.LiveMachine records (an empty list for none)", _many(LiveMachine)),
}


@dataclass
class ProviderStatus:
    credentials_ok: bool | None = None
    checked_at: float | None = None
    disabled: str | None = None
    last_error: str | None = None
    #: the call ``last_error`` is about: only that call's next success clears it (offers that
    #: keep failing are not hidden by a list that works)
    error_of: str | None = None
    offers: list[MachineOffer] = field(default_factory=list)
    offers_at: float | None = None


class ProviderSet:
    """The providers of one control plane (see the module doc)."""

    def __init__(self, configured: list[ConfiguredProvider], *, control_url: str | None = None,
                 ca: str | None = None, call_timeout: float = CALL_TIMEOUT,
                 launch_timeout: float = LAUNCH_TIMEOUT, offer_ttl: float = provisioning.OFFER_TTL,
                 clock: Callable[[], float] = time.time) -> None:
        self.configured = {c.name: c for c in configured}
        #: the URL booted machines reach the control plane at (None: not known yet, no launches)
        self.control_url = control_url
        self.ca = ca
        self.call_timeout = call_timeout
        self.launch_timeout = launch_timeout
        self.offer_ttl = offer_ttl
        self.clock = clock
        self.status = {name: ProviderStatus() for name in self.configured}
        self.blocks = provisioning.Blocks()
        #: machine id -> when a terminate that failed is tried again (not at every pass)
        self.terminate_after: dict[str, float] = {}
        #: calls made, by ``provider.method`` and in all (``total``)
        self.calls: Counter[str] = Counter()
        self._pool = ThreadPoolExecutor(max_workers=max(4, 2 * len(configured)),
                                        thread_name_prefix="gpulayer-provider")
        self._lock = threading.Lock()
        #: the specs of the queued jobs, by job id, as the last pass parsed them
        self.specs: dict[str, Any] = {}
        #: whether the orphan sweep after a start has run
        self.reconciled = False
        self.last_sweep = 0.0

    # ------------------------------------------------------------------ calls

    def who(self, name: str) -> str:
        """``provider 'aws' (plugin 'ec2')``: a provider as errors and the log name it."""
        c = self.configured[name]
        return f"provider {name!r} (plugin {c.plugin!r})" if c.plugin else f"provider {name!r} (type {c.type!r})"

    def describe(self, name: str, method: str, exc: ProviderError) -> str:
        """A failed call as one line that names the provider, its plugin and the call once."""
        if isinstance(exc, ProviderCallFailed):
            return str(exc)
        return f"{self.who(name)}: {_raised(method, exc)}"

    def call(self, name: str, method: str, *args: Any, timeout: float | None = None) -> Any:
        """``provider.method(*args)`` with a timeout, its answer checked against
        :data:`ANSWERS` (a list's items come back as a list). A typed :class:`ProviderError`
        is raised as it is; any other exception, no answer in time, or an answer the call
        does not accept comes back as :class:`ProviderCallFailed` (a transient error)."""
        fn = getattr(self.configured[name].provider, method)
        answer = ANSWERS.get(method)
        limit = self.call_timeout if timeout is None else timeout
        with self._lock:
            self.calls[f"{name}.{method}"] += 1
            self.calls["total"] += 1

        def run() -> Any:  # on the pool: a generator's items are read within the timeout too
            result = fn(*args)
            return result if answer is None else answer.check(result)

        future = self._pool.submit(run)
        try:
            result = future.result(timeout=limit)
        except FutureTimeout:
            raise self._failed(name, method, f"{method}() did not answer within {limit:g} s") from None
        except _Refused as exc:
            assert answer is not None
            raise self._failed(name, method, f"{method}() returned {exc}; accepted: {answer.accepted}") from None
        except ProviderError as exc:
            self._error(name, method, _raised(method, exc))
            if isinstance(exc, ProviderAuthFailed):
                self.disable(name, str(exc))
            raise
        except PLUGIN_FAULTS as exc:  # (sys.exit() in an adapter too: it must not end the pass)
            raise self._failed(name, method, f"{method}() raised {one_line(exc)}") from exc
        st = self.status[name]
        if st.error_of == method:
            st.last_error = st.error_of = None
        return result

    def _error(self, name: str, method: str, text: str) -> None:
        st = self.status[name]
        st.last_error, st.error_of = text, method

    def _failed(self, name: str, method: str, detail: str) -> ProviderCallFailed:
        self._error(name, method, detail)
        return ProviderCallFailed(self.who(name), detail)

    def disable(self, name: str, reason: str) -> None:
        st = self.status[name]
        st.credentials_ok = False
        was, st.disabled = st.disabled, f"credentials failed: {reason}"
        st.offers = []
        if st.disabled != was:  # (a call made while disabled, a terminate, may fail so again)
            log.warning("provider %s disabled: %s", name, reason)

    def down(self) -> list[str]:
        """The providers that offer nothing now, each with why (``q: credentials failed:
        ...``): disabled ones, and those whose offers() failed with none cached. ``explain``
        lists them, and so does the error of a cloud job that fails as unschedulable."""
        out = []
        for name, st in self.status.items():
            if st.disabled:
                out.append(f"{name}: {st.disabled}")
            elif not st.offers and st.last_error:
                out.append(f"{name}: {st.last_error}")
        return out

    def enabled(self) -> list[str]:
        return [n for n, st in self.status.items() if st.disabled is None]

    def check(self) -> None:
        """Check the credentials of every provider not checked yet."""
        now = self.clock()
        for name in self.enabled():
            st = self.status[name]
            if st.credentials_ok is not None or (st.checked_at is not None and now - st.checked_at < CHECK_RETRY):
                continue
            st.checked_at = now
            try:
                self.call(name, "check")
                st.credentials_ok = True
            except ProviderAuthFailed:
                pass
            except ProviderError as exc:
                log.warning("%s; checking again in %g s", self.describe(name, "check", exc), CHECK_RETRY)

    # ------------------------------------------------------------------ offers

    def refresh_offers(self, *, force: bool = False) -> None:
        """Ask every enabled provider whose cached offers are older than the TTL, all at once."""
        now = self.clock()
        stale = [n for n in self.enabled()
                 if force or self.status[n].offers_at is None or now - (self.status[n].offers_at or 0) >= self.offer_ttl]
        threads = [threading.Thread(target=self._refresh_one, args=(n, now), daemon=True) for n in stale]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.call_timeout + 1)

    def _refresh_one(self, name: str, now: float) -> None:
        st = self.status[name]
        try:
            found = self.call(name, "offers", Requirements())
        except ProviderError as exc:
            # the offers cached before are kept; ask again after the TTL, not at every pass
            log.warning("%s; asking again in %g s", self.describe(name, "offers", exc), self.offer_ttl)
            st.offers_at = now
            return
        st.offers = [o.model_copy(update={"provider": name}) for o in found]
        st.offers_at = now

    def machine_ended(self, name: str) -> None:
        """One of ``name``'s machines was terminated: what it offers may have been taken by
        that machine (a host of an SSH pool is unavailable while a worker runs there), so its
        offers are asked again at the next pass, not when the TTL runs out."""
        if name in self.status:
            self.status[name].offers_at = None

    def cached_offers(self, *, barred: bool = False) -> list[MachineOffer]:
        """The offers of every enabled provider, as last fetched, that its section's limits
        let be launched (with ``barred``: those that they never let be, too)."""
        return [o for n in self.enabled() for o in self.status[n].offers
                if barred or provisioning.never_launched(o, self.configured[n].limits) is None]

    def placement_offers(self, now: float) -> list[MachineOffer]:
        """:meth:`cached_offers` in the order a job that prefers none has them tried
        (:func:`provisioning.order_offers`), those of a blocked scope last (a launch skips
        them), so that a job waiting for a machine names the offer provisioning picks."""
        return provisioning.waited_for(self.cached_offers(), self.blocks.active(now), now)

    def offer_rooms(self) -> dict[str, float]:
        """The most machines each enabled provider brings up at once (its ``max_machines``);
        placement bounds it further by the capacities of the offers that fit a job."""
        return {name: float(self.configured[name].limits.max_machines) for name in self.enabled()}

    def barred(self, offer: MachineOffer) -> str | None:
        """Why ``offer`` is never launched (:func:`provisioning.never_launched`), or None."""
        configured = self.configured.get(offer.provider)
        return None if configured is None else provisioning.never_launched(offer, configured.limits)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["ANSWERS", "CALL_TIMEOUT", "LAUNCH_TIMEOUT", "Answer", "ProviderCallFailed", "ProviderSet", "ProviderStatus"]
