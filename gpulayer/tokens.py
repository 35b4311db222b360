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
``sha256(secret)`` is stored; a presented secret is hashed, looked up by that hash and
compared with :func:`hmac.compare_digest`. Expired, used-up and revoked tokens are refused
with :class:`~gpulayer.errors.AuthError` (401) whose message says which.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlmodel import col, select

from gpulayer.errors import AuthError, InvalidInput, NotFound
from gpulayer.store import Store, TokenRow

PREFIX = "glt_"
SCOPES = ("admin", "client", "worker", "join", "bootstrap")
DEFAULT_JOIN_TTL = 24 * 3600.0
#: how long a verified admin/client/worker token is trusted without a database read
CACHE_SECONDS = 2.0


@dataclass(frozen=True)
class TokenInfo:
    """A token as the server sees it; never carries the secret."""

    id: str
    scope: str
    created_at: float
    expires_at: float | None = None
    uses_left: int | None = None
    revoked: bool = False
    worker_id: str | None = None
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "scope": self.scope, "created_at": self.created_at,
                "expires_at": self.expires_at, "uses_left": self.uses_left,
                "revoked": self.revoked, "worker_id": self.worker_id,
                "description": self.description}


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def _info(row: TokenRow) -> TokenInfo:
    return TokenInfo(id=row.id, scope=row.scope, created_at=row.created_at, expires_at=row.expires_at,
                     uses_left=row.uses_left, revoked=row.revoked, worker_id=row.worker_id,
                     description=row.description)


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``24h``, ``7d`` -> seconds."""
    raw = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    mult = 1.0
    if raw and raw[-1] in units:
        mult, raw = units[raw[-1]], raw[:-1]
    try:
        value = float(raw) * mult
    except ValueError:
        raise InvalidInput(f"duration {text!r}: expected a number with an optional unit s, m, h or d (e.g. 24h)") from None
    if value <= 0:
        raise InvalidInput(f"duration {text!r}: expected more than 0 seconds")
    return value


class TokenStore:
    """Token operations on one :class:`Store` (with a short verification cache)."""

    def __init__(self, store: Store, clock: Any = time.time) -> None:
        self.store = store
        self.clock = clock
        self._cache: dict[str, tuple[TokenInfo, float]] = {}
        self._lock = threading.Lock()

    def create(
        self, scope: str, *, ttl: float | None = None, uses: int | None = None,
        worker_id: str | None = None, description: str = "",
    ) -> tuple[TokenInfo, str]:
        """A new token; returns its record and the secret (shown once, never stored)."""
        if scope not in SCOPES:
            raise InvalidInput(f"scope {scope!r}: expected one of {', '.join(SCOPES)}")
        if ttl is not None and ttl <= 0:
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
        now = self.clock()
        row = TokenRow(id=f"tok-{secrets.token_hex(6)}", hash=hash_secret(secret), scope=scope,
                       created_at=now, expires_at=now + ttl if ttl is not None else None,
                       uses_left=uses, revoked=False, worker_id=worker_id, description=description)
        with self.store.write(lock=False) as s:
            s.add(row)
        return _info(row), secret

    def verify(self, secret: str | None, *, consume: bool = False) -> TokenInfo:
        """The token ``secret`` names, if it may be used now; else :class:`AuthError` (401).

        ``consume=True`` spends one use (join and bootstrap tokens), atomically.
        """
        if not secret:
            raise AuthError("missing token: send 'Authorization: Bearer <token>'")
        digest = hash_secret(secret)
        now = self.clock()
        if not consume:
            with self._lock:
                hit = self._cache.get(digest)
            if hit is not None and now - hit[1] < CACHE_SECONDS:
                info = hit[0]
                if info.expires_at is None or info.expires_at > now:
                    return info
        ctx = self.store.write(lock=False) if consume else self.store.read()
        with ctx as s:
            row = s.exec(select(TokenRow).where(TokenRow.hash == digest)).first()
            if row is None or not hmac.compare_digest(row.hash, digest):
                raise AuthError("invalid token: no such token (check GPULAYER_TOKEN / --token)")
            if row.revoked:
                raise AuthError(f"token {row.id} was revoked")
            if row.expires_at is not None and row.expires_at <= now:
                raise AuthError(f"token {row.id} expired at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(row.expires_at))}")
            if row.uses_left is not None and row.uses_left <= 0:
                raise AuthError(f"token {row.id} is used up")
            info = _info(row)
            if consume and row.uses_left is not None:
                # a conditional decrement in SQL, never a value computed here and written
                # back: two joins racing on the last use cannot both get it (PostgreSQL
                # writers here take no shared lock). The ORM row is left untouched so that
                # no flush writes a stale count over it.
                s.expunge(row)
                spent = s.execute(
                    text("UPDATE gl_tokens SET uses_left = uses_left - 1 WHERE id = :id AND uses_left > 0"),
                    {"id": info.id},
                )
                if spent.rowcount != 1:  # type: ignore[attr-defined]
                    raise AuthError(f"token {info.id} is used up")
                info = dataclasses.replace(info, uses_left=(info.uses_left or 1) - 1)
        if not consume and info.scope in ("admin", "client", "worker"):
            with self._lock:
                if len(self._cache) > 10_000:
                    self._cache.clear()
                self._cache[digest] = (info, now)
        return info

    def list(self, *, include_revoked: bool = True) -> list[TokenInfo]:
        with self.store.read() as s:
            q = select(TokenRow).order_by(col(TokenRow.created_at))
            if not include_revoked:
                q = q.where(TokenRow.revoked == False)  # noqa: E712
            return [_info(r) for r in s.exec(q).all()]

    def get(self, token_id: str) -> TokenInfo:
        with self.store.read() as s:
            row = s.get(TokenRow, token_id)
            if row is None:
                raise NotFound(f"token {token_id!r}: no such token")
            return _info(row)

    def revoke(self, token_id: str) -> TokenInfo:
        with self.store.write(lock=False) as s:
            row = s.get(TokenRow, token_id)
            if row is None:
                raise NotFound(f"token {token_id!r}: no such token")
            row.revoked = True
            s.add(row)
            info = _info(row)
        with self._lock:
            self._cache.clear()
        return info

    def revoke_worker_tokens(self, worker_id: str) -> None:
        with self.store.write(lock=False) as s:
            for row in s.exec(select(TokenRow).where(TokenRow.worker_id == worker_id,
                                                     TokenRow.scope == "worker")).all():
                row.revoked = True
                s.add(row)
        with self._lock:
            self._cache.clear()

    def has_admin(self) -> bool:
        now = self.clock()
        return any(t.scope == "admin" and not t.revoked and (t.expires_at is None or t.expires_at > now)
                   for t in self.list(include_revoked=False))
