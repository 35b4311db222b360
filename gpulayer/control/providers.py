"""The configured providers of a control plane, and every call made to them.

:class:`ProviderSet` holds the provider instances of providers.toml
(:mod:`gpulayer.provider_config`), what is known about each (credentials checked, disabled
with a reason, the last error), the offers cache, and the blocked scopes. Every call to a
provider goes through :meth:`ProviderSet.call`, on a small thread pool and bounded by a
timeout, so a provider that hangs can hold up neither a request handler (they never call a
provider) nor the provisioning pass for long. Calls are counted (``calls``) for the bench.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from gpulayer import provisioning
from gpulayer.errors import ProviderAuthFailed, ProviderError, ProviderTransient
from gpulayer.hookrecords import MachineOffer
from gpulayer.provider_config import ConfiguredProvider
from gpulayer.specs import Requirements

log = logging.getLogger("gpulayer.provisioning")

#: seconds a provider gets to answer check, offers, list and terminate
CALL_TIMEOUT = 30.0
#: seconds it gets to accept a launch (not to boot the machine: that is the join timeout)
LAUNCH_TIMEOUT = 120.0


#: seconds before a check that failed for a transient reason is tried again
CHECK_RETRY = 30.0


@dataclass
class ProviderStatus:
    credentials_ok: bool | None = None
    checked_at: float | None = None
    disabled: str | None = None
    last_error: str | None = None
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
        #: calls made, by ``provider.method`` and in all (``total``)
        self.calls: Counter[str] = Counter()
        self._pool = ThreadPoolExecutor(max_workers=max(4, 2 * len(configured)),
                                        thread_name_prefix="gpulayer-provider")
        self._lock = threading.Lock()
        #: whether the orphan sweep after a start has run
        self.reconciled = False
        self.last_sweep = 0.0

    # ------------------------------------------------------------------ calls

    def call(self, name: str, method: str, *args: Any, timeout: float | None = None) -> Any:
        """``provider.method(*args)`` with a timeout; an error that is not a
        :class:`ProviderError` (or a timeout) comes back as :class:`ProviderTransient`."""
        fn = getattr(self.configured[name].provider, method)
        limit = self.call_timeout if timeout is None else timeout
        with self._lock:
            self.calls[f"{name}.{method}"] += 1
            self.calls["total"] += 1
        future = self._pool.submit(fn, *args)
        try:
            result = future.result(timeout=limit)
        except FutureTimeout:
            raise ProviderTransient(f"{name}: {method} did not answer within {limit:g} s") from None
        except ProviderError as exc:
            self.status[name].last_error = f"{method}: {exc}"
            if isinstance(exc, ProviderAuthFailed):
                self.disable(name, str(exc))
            raise
        except Exception as exc:
            self.status[name].last_error = f"{method}: {type(exc).__name__}: {exc}"
            raise ProviderTransient(f"{name}: {method} failed: {type(exc).__name__}: {exc}") from exc
        self.status[name].last_error = None
        return result

    def disable(self, name: str, reason: str) -> None:
        st = self.status[name]
        st.credentials_ok = False
        st.disabled = f"credentials failed: {reason}"
        st.offers = []
        log.warning("provider %s disabled: %s", name, reason)

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
                log.warning("provider %s: check failed: %s", name, exc)

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
            log.warning("provider %s: offers failed: %s", name, exc)
            st.offers_at = now  # ask again after the TTL, not at every pass
            return
        st.offers = [o.model_copy(update={"provider": name}) for o in found or []]
        st.offers_at = now

    def cached_offers(self) -> list[MachineOffer]:
        """The offers of every enabled provider, as last fetched."""
        return [o for n in self.enabled() for o in self.status[n].offers]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["CALL_TIMEOUT", "LAUNCH_TIMEOUT", "ProviderSet", "ProviderStatus"]
