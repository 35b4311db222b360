"""Who is logged in to the dashboard: logins, sessions and CSRF tokens.

A login exchanges a token for a session. The browser holds only the session's random id, in
an HttpOnly, SameSite=Strict cookie (Secure over HTTPS), so the token itself never reaches
JavaScript, a URL or the browser's storage; the server keeps the session in memory (a
restart logs everybody out) and drops it at logout, after :data:`LIFETIME`, when its token
expires, or within :data:`RECHECK_TOKEN` seconds of the token's revocation.

Every form that changes something carries the session's CSRF token, compared in constant
time: SameSite=Strict already keeps other sites' requests from carrying the cookie, and the
CSRF token still holds where a browser does not honour SameSite.

Only admin and client tokens may log in; they see what they see through the API (a client
token its own jobs). ``gpulayer dashboard`` adds a login token of its own (see
:class:`Login`), because the embedded control plane has no tokens.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpulayer.errors import AuthError, Forbidden, NotFound
from gpulayer.tokens import TokenStore

COOKIE = "gpulayer_session"
#: how long a session lasts at most, seconds (a working day)
LIFETIME = 8 * 3600.0
#: how often a session's token is looked at again (revoked? expired?), seconds
RECHECK_TOKEN = 5.0
#: sessions kept at most; the oldest go first (each login adds one)
MAX_SESSIONS = 10_000
#: sessions of one token kept at most; its own oldest go first (so that the logins of one
#: token, a client's, cannot push everybody else's sessions out of :data:`MAX_SESSIONS`)
MAX_SESSIONS_PER_TOKEN = 100
LOGIN_SCOPES = ("admin", "client")
#: the prefix of ``gpulayer dashboard``'s own login tokens (API tokens start ``glt_``)
RUN_TOKEN_PREFIX = "gld_"


@dataclass(frozen=True)
class Identity:
    """Whom a session acts for."""

    scope: str
    #: the token that logged in; None for ``gpulayer dashboard``'s login token
    token_id: str | None
    #: when that token expires (None: never)
    expires_at: float | None = None

    @property
    def owner(self) -> str | None:
        """The owner filter of the control plane's job queries, as the API applies it: an
        admin sees every job (None), a client token the jobs it submitted."""
        return None if self.scope == "admin" else self.token_id

    @property
    def admin(self) -> bool:
        return self.scope == "admin"

    def may_see(self, job_owner: str | None) -> bool:
        return self.admin or job_owner == self.token_id

    @property
    def label(self) -> str:
        return f"{self.scope} token {self.token_id}" if self.token_id else "this dashboard's login token"


@dataclass
class Session:
    id: str
    identity: Identity
    csrf: str
    expires_at: float
    checked_at: float
    #: a message for the next page (e.g. "cancel requested"), shown once
    notice: str | None = None

    def csrf_ok(self, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(str(presented).encode(), self.csrf.encode())

    def take_notice(self) -> str | None:
        notice, self.notice = self.notice, None
        return notice


class Sessions:
    """Sessions in this process's memory. Used on the event loop only (no lock)."""

    def __init__(self, clock: Callable[[], float] = time.time, lifetime: float = LIFETIME) -> None:
        self.clock = clock
        self.lifetime = lifetime
        self._by_id: dict[str, Session] = {}

    def create(self, identity: Identity) -> Session:
        now = self.clock()
        self._sweep(now)
        same = [sid for sid, s in self._by_id.items() if s.identity.token_id == identity.token_id]
        for sid in same[:max(0, len(same) - MAX_SESSIONS_PER_TOKEN + 1)]:  # (in login order: the oldest)
            del self._by_id[sid]
        expires = now + self.lifetime
        if identity.expires_at is not None:
            expires = min(expires, identity.expires_at)
        session = Session(id=secrets.token_urlsafe(32), identity=identity, csrf=secrets.token_urlsafe(32),
                          expires_at=expires, checked_at=now)
        self._by_id[session.id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session with that id, or None (an expired one is dropped)."""
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        if session is None:
            return None
        if session.expires_at <= self.clock():
            self.drop(session_id)
            return None
        return session

    def drop(self, session_id: str) -> None:
        self._by_id.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._by_id)

    def _sweep(self, now: float) -> None:
        for sid in [sid for sid, s in self._by_id.items() if s.expires_at <= now]:
            del self._by_id[sid]
        while len(self._by_id) >= MAX_SESSIONS:  # dicts keep insertion order: the oldest first
            del self._by_id[next(iter(self._by_id))]


class Login:
    """Turns a token typed into the login form into an :class:`Identity` (in the thread
    pool: it reads the database).

    ``run_token`` is ``gpulayer dashboard``'s own login token: made at start, printed once,
    kept only in this process's memory (never in the database, so it cannot reach the API
    and nothing is left behind when the command stops), and good for an admin session on
    the embedded control plane until the command stops. Tokens of the database's token
    store are accepted too, exactly as the API accepts them.
    """

    def __init__(self, tokens: TokenStore, run_token: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.tokens = tokens
        self.run_token = run_token
        self.clock = clock

    def verify(self, secret: str) -> Identity:
        """The identity ``secret`` logs in as; :class:`AuthError` (401) for a token that is
        not valid, :class:`Forbidden` (403) for a valid one of a scope that may not log in."""
        if self.run_token is not None and hmac.compare_digest(secret.encode(), self.run_token.encode()):
            return Identity(scope="admin", token_id=None)
        if secret.startswith(RUN_TOKEN_PREFIX):
            raise AuthError("that login token is not this dashboard's: each start of 'gpulayer dashboard' "
                            "prints a new one" if self.run_token is not None else
                            "that is a login token of 'gpulayer dashboard', which works only there; "
                            "log in here with an admin or a client token")
        info = self.tokens.verify(secret)
        if info.scope not in LOGIN_SCOPES:
            raise Forbidden(f"token {info.id} has scope {info.scope!r}; the dashboard takes an admin or a client "
                            "token (create one with 'gpulayer token create --client')")
        return Identity(scope=info.scope, token_id=info.id, expires_at=info.expires_at)

    def still_valid(self, identity: Identity) -> bool:
        """Whether the identity's token may still be used (not revoked, not expired)."""
        if identity.token_id is None:
            return True
        try:
            info = self.tokens.get(identity.token_id)
        except NotFound:
            return False
        return not info.revoked and (info.expires_at is None or info.expires_at > self.clock())


def new_run_token() -> str:
    return RUN_TOKEN_PREFIX + secrets.token_urlsafe(32)


def safe_next(target: str | None, root: str = "") -> str:
    """Where to go after logging in: a path on this site only (never ``//host`` or a URL
    with a scheme: an open redirect would make the login page a phishing tool), under the
    dashboard's ``root`` path; else the overview."""
    home = root + "/"
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return home
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in target):
        return home
    if root and target != root and not target.startswith(home):
        return home
    return target
