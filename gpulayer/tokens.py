"""API tokens: create, verify, list and revoke, stored only as SHA-256 hashes.

Scopes
======

``admin``      everything, including tokens and metrics
``client``     submit jobs and read its own jobs (``JobRow.owner`` is the token id)
``worker``     one worker's credential, bound to its ``worker_id``; issued by the server
``join``       exchanged by a worker for its worker credential; multi-use, expires
               (default 24 h), optionally limited to N uses
``bootstrap``  like ``join`` but single-use: handed to a machine a provider boots

A secret looks like ``glt_<43 url-safe characters>`` (256 random bits). Only
``sha256(secret)`` is stored, and a presented secret is found by the hash of what was
presented. That lookup is not a timing oracle worth guarding: what an attacker controls is
the input of SHA-256, so how fast the database matches the hash tells nothing about the
stored secret. Expired, used-up and revoked tokens are refused with
:class:`~gpulayer.errors.AuthError` (401) whose message says which.

The functions taking a ``Session`` run inside the caller's transaction, so a join spends its
token's use in the same transaction that creates the worker and its credential.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable, Mapping

from sqlmodel import Session

from gpulayer.api import SCOPES, TokenInfo
from gpulayer.errors import AuthError, InvalidInput
from gpulayer.store import Store, TokenRow, mapping, queries

PREFIX = "glt_"
DEFAULT_JOIN_TTL = 24 * 3600.0
#: how long a verified admin/client/worker token is trusted since the database last said it
#: is usable. A server re-confirms every remembered token in one query each
#: :data:`CONFIRM_EVERY` seconds (:meth:`TokenStore.confirm`), so tokens in use are answered
#: from memory, and a revocation made by another server on the same database takes effect
#: here within this bound (one made through this server at once).
CACHE_SECONDS = 2.0
#: how often the server re-confirms the tokens it remembers (well within CACHE_SECONDS)
CONFIRM_EVERY = 0.5
#: a confirmation reads one row (the revocation mark, see queries.revocation_mark) while no
#: token was revoked since the last one; every token is looked up again at least this often
FULL_CONFIRM_EVERY = 30.0
#: at most this many verified tokens are remembered; one unused for FORGET_UNUSED seconds is
#: dropped at the next confirmation
CACHE_SIZE = 100_000
FORGET_UNUSED = 300.0


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def new_token(s: Session, scope: str, *, now: float, ttl: float | None = None, uses: int | None = None,
              worker_id: str | None = None, description: str = "") -> tuple[TokenInfo, str]:
    """Add a token in ``s``'s transaction; returns its record and the secret (shown once)."""
    if scope not in SCOPES:
        raise InvalidInput(f"scope {scope!r}: expected one of {', '.join(SCOPES)}")
    if ttl is not None and not ttl > 0:
        raise InvalidInput(f"ttl {ttl}: expected more than 0 seconds")
    if uses is not None and uses < 1:
        raise InvalidInput(f"uses {uses}: expected 1 or more")
    if scope == "worker" and not worker_id:
        raise InvalidInput("worker_id: a worker token is bound to one worker id")
    if scope == "join" and ttl is None:
        ttl = DEFAULT_JOIN_TTL
    if scope == "bootstrap":
        uses = 1
        ttl = ttl if ttl is not None else DEFAULT_JOIN_TTL
    if len(description) > 500:
        raise InvalidInput("description: at most 500 characters")
    secret = PREFIX + secrets.token_urlsafe(32)
    row = TokenRow(id=f"tok-{secrets.token_hex(6)}", hash=hash_secret(secret), scope=scope,
                   created_at=now, expires_at=now + ttl if ttl is not None else None,
                   uses_left=uses, revoked=False, worker_id=worker_id, description=description)
    queries.add_token(s, row)
    return mapping.token_info(row), secret


def check(s: Session, secret: str | None, *, now: float, spend: bool = False) -> TokenInfo:
    """The token ``secret`` names if it may be used now, else :class:`AuthError`.

    ``spend=True`` spends one use of a counted (join, bootstrap) token in ``s``'s transaction.
    """
    if not secret:
        raise AuthError("missing token: send 'Authorization: Bearer <token>'")
    row = queries.find_token_by_hash(s, hash_secret(secret))
    if row is None:
        raise AuthError("invalid token: no such token (check GPULAYER_TOKEN / --token)")
    if row.revoked:
        raise AuthError(f"token {row.id} was revoked")
    if row.expires_at is not None and row.expires_at <= now:
        raise AuthError(f"token {row.id} expired at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(row.expires_at))}")
    if row.uses_left is not None and row.uses_left <= 0:
        raise AuthError(f"token {row.id} is used up")
    info = mapping.token_info(row)
    if spend and row.uses_left is not None:
        s.expunge(row)  # the decrement is SQL; no flush may write the stale count back
        if not queries.spend_token_use(s, info.id):
            raise AuthError(f"token {info.id} is used up")
        info = info.model_copy(update={"uses_left": row.uses_left - 1})
    return info


class _Verified:
    __slots__ = ("confirmed", "info", "used")

    def __init__(self, info: TokenInfo, now: float) -> None:
        self.info = info
        #: when the database last said it is usable (the time before that read began)
        self.confirmed = now
        self.used = now


class TokenStore:
    """Token operations on one :class:`Store`, with a bounded cache of verified tokens
    (admin, client, worker: the ones every request presents), keyed by the secret's hash.

    An entry is trusted for :data:`CACHE_SECONDS` after the database last confirmed it;
    :meth:`confirm` (the server runs it every :data:`CONFIRM_EVERY` seconds) confirms all of
    them in one query, or drops those revoked, expired or gone."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self._cache: dict[str, _Verified] = {}
        self._lock = threading.Lock()
        #: the revocation mark at the last full confirmation, and when that was
        self._mark: str | None = None
        self._full_at = float("-inf")
        #: when every entry then remembered was last confirmed at once (an entry added
        #: later was read from the database later still)
        self._all_confirmed = float("-inf")

    def create(self, scope: str, *, ttl: float | None = None, uses: int | None = None,
               worker_id: str | None = None, description: str = "") -> tuple[TokenInfo, str]:
        with self.store.write(lock=False) as s:
            return new_token(s, scope, now=self.clock(), ttl=ttl, uses=uses, worker_id=worker_id,
                             description=description)

    def verify(self, secret: str | None) -> TokenInfo:
        """The token ``secret`` names, if it may be used now; else :class:`AuthError` (401).
        Join and bootstrap tokens are only checked here; joining spends them."""
        hit = self.cached(secret)
        if hit is not None:
            return hit
        now = self.clock()
        with self.store.read() as s:
            info = check(s, secret, now=now)
        self.remember(secret, info, now)
        return info

    def verify_many(self, presented: Mapping[str, object]) -> dict[str, TokenInfo | AuthError]:
        """:meth:`verify` for many secrets in one transaction (a server gathers the requests
        that arrive together); each answer is the token or the error it would raise."""
        now = self.clock()
        out: dict[str, TokenInfo | AuthError] = {}
        with self.store.read() as s:
            for secret in presented:
                hit = self.cached(secret)
                if hit is not None:
                    out[secret] = hit
                    continue
                try:
                    out[secret] = check(s, secret or None, now=now)
                except AuthError as exc:
                    out[secret] = exc
        for secret, info in out.items():
            if isinstance(info, TokenInfo):
                self.remember(secret, info, now)
        return out

    def remember(self, secret: str | None, info: TokenInfo, now: float | None = None) -> None:
        """Remember a token the database said is usable at ``now`` (default: now; a join
        remembers the credential it just issued, so the worker's first calls need no read)."""
        if info.scope not in ("admin", "client", "worker") or not secret:
            return
        now = self.clock() if now is None else now
        with self._lock:
            if len(self._cache) >= CACHE_SIZE:  # the least recently confirmed go first
                for digest in sorted(self._cache, key=lambda d: self._cache[d].confirmed)[:CACHE_SIZE // 10]:
                    del self._cache[digest]
            self._cache[hash_secret(secret)] = _Verified(info, now)

    def cached(self, secret: str | None) -> TokenInfo | None:
        """The token ``secret`` names if the cache may answer for it now (no database read:
        safe on an event loop); None when :meth:`verify` must look."""
        if not secret:
            return None
        now = self.clock()
        with self._lock:
            hit = self._cache.get(hash_secret(secret))
            if hit is None or now - self._confirmed(hit) >= CACHE_SECONDS:
                return None
            hit.used = now
        info = hit.info
        return info if info.expires_at is None or info.expires_at > now else None

    def _confirmed(self, entry: _Verified) -> float:
        """When the database last said the entry is usable. A confirmation that found no
        revocation since the last full one speaks for the entries known usable at or after
        that one began: not for one whose own read began before it and that it did not see."""
        if entry.confirmed < self._full_at:
            return entry.confirmed
        return max(entry.confirmed, self._all_confirmed)

    def confirm(self) -> int:
        """Confirm the remembered tokens (as of now) and drop those no longer usable, and any
        unused for FORGET_UNUSED seconds; returns how many were dropped.

        Only a revocation makes a remembered token unusable before it expires (expiry is
        checked on each use; the scopes remembered spend no uses; tokens are never deleted),
        and each writes a new revocation mark: while the mark is the one last seen, one
        row read confirms them all. Otherwise (and every FULL_CONFIRM_EVERY seconds) one
        query looks them all up."""
        now = self.clock()  # before the read: a confirmation is as old as the read's start
        if not self._cache:
            return 0
        with self.store.read() as s:
            mark = queries.revocation_mark(s)
            if mark == self._mark and now - self._full_at < FULL_CONFIRM_EVERY:
                # nothing revoked since the last full confirmation: all still usable (entries
                # forgotten meanwhile are gone, entries added meanwhile were read after now)
                with self._lock:
                    self._all_confirmed = max(self._all_confirmed, now)
                return 0
            with self._lock:
                for digest in [d for d, e in self._cache.items() if now - e.used > FORGET_UNUSED]:
                    del self._cache[digest]
                digests = list(self._cache)
            usable = queries.usable_token_hashes(s, digests, now)
        dropped = 0
        with self._lock:
            for digest in digests:
                entry = self._cache.get(digest)
                if entry is None:  # forgotten meanwhile (a revocation here): stays forgotten
                    continue
                if digest in usable:
                    entry.confirmed = max(entry.confirmed, now)
                else:
                    del self._cache[digest]
                    dropped += 1
            self._mark, self._full_at, self._all_confirmed = mark, now, now
        return dropped

    def forget(self, *, token_id: str | None = None, worker_id: str | None = None) -> None:
        """Drop remembered tokens after a revocation: the one ``token_id`` names, those of
        ``worker_id``, or (neither given) all."""
        with self._lock:
            if token_id is None and worker_id is None:
                self._cache.clear()
                return
            for digest in [d for d, e in self._cache.items()
                           if e.info.id == token_id or (worker_id is not None and e.info.worker_id == worker_id)]:
                del self._cache[digest]

    def list(self, *, include_revoked: bool = True) -> list[TokenInfo]:
        with self.store.read() as s:
            return [mapping.token_info(r) for r in queries.tokens(s, include_revoked=include_revoked)]

    def get(self, token_id: str) -> TokenInfo:
        with self.store.read() as s:
            return mapping.token_info(queries.token(s, token_id))

    def revoke(self, token_id: str) -> TokenInfo:
        with self.store.write(lock=False) as s:
            queries.token(s, token_id)
            queries.revoke_token(s, token_id)
        self.forget(token_id=token_id)
        return self.get(token_id)

    def revoke_worker_tokens(self, worker_id: str) -> None:
        with self.store.write(lock=False) as s:
            queries.revoke_worker_tokens(s, worker_id)
        self.forget(worker_id=worker_id)

    def has_admin(self) -> bool:
        now = self.clock()
        return any(t.scope == "admin" and (t.expires_at is None or t.expires_at > now)
                   for t in self.list(include_revoked=False))
