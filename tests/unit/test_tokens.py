"""The verified-token cache: a revocation made through another server on the same database
takes effect at the next confirmation (:data:`gpulayer.tokens.CACHE_SECONDS` at most), one
made here at once; nothing is trusted longer than that bound without the database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer import tokens
from gpulayer.errors import AuthError
from gpulayer.store import Store
from gpulayer.tokens import TokenStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":
        return str(request.getfixturevalue("postgres_url"))
    return f"sqlite:///{tmp_path / 'gl.db'}"


@pytest.fixture
def two(url: str) -> Iterator[tuple[TokenStore, TokenStore, Clock]]:
    """Two servers' token stores on one database, on one clock."""
    clock = Clock()
    a, b = Store(url), Store(url)
    try:
        yield TokenStore(a, clock=clock), TokenStore(b, clock=clock), clock
    finally:
        a.dispose()
        b.dispose()


def test_a_revocation_elsewhere_takes_effect_at_the_next_confirmation(two: tuple[TokenStore, TokenStore, Clock]) -> None:
    here, there, clock = two
    info, secret = here.create("worker", worker_id="wkr-1")
    _, other_secret = here.create("worker", worker_id="wkr-2")
    assert here.verify(secret).id == info.id
    here.verify(other_secret)
    there.revoke(info.id)
    assert here.cached(secret) is not None  # remembered, within the bound
    clock.now += tokens.CONFIRM_EVERY
    assert here.confirm() == 1
    assert here.cached(secret) is None
    with pytest.raises(AuthError, match=f"token {info.id} was revoked"):
        here.verify(secret)
    assert here.cached(other_secret) is not None  # the others stay remembered


def test_nothing_is_trusted_past_the_bound_without_a_confirmation(two: tuple[TokenStore, TokenStore, Clock]) -> None:
    here, there, clock = two
    info, secret = here.create("client")
    here.verify(secret)
    clock.now += tokens.CACHE_SECONDS * 0.75
    here.confirm()  # no revocation since: one row read confirms it
    clock.now += tokens.CACHE_SECONDS * 0.75
    assert here.cached(secret) is not None
    there.revoke(info.id)
    clock.now += tokens.CACHE_SECONDS  # no confirmation this time: the entry ages out
    assert here.cached(secret) is None
    with pytest.raises(AuthError, match="revoked"):
        here.verify(secret)


def test_a_revocation_here_takes_effect_at_once_and_forgets_only_that_token(
        two: tuple[TokenStore, TokenStore, Clock]) -> None:
    here, _, _ = two
    info, secret = here.create("worker", worker_id="wkr-1")
    _, kept = here.create("worker", worker_id="wkr-2")
    here.verify(secret)
    here.verify(kept)
    here.revoke_worker_tokens("wkr-1")
    assert here.cached(secret) is None
    assert here.cached(kept) is not None
    with pytest.raises(AuthError, match=f"token {info.id} was revoked"):
        here.verify(secret)


def test_an_expired_token_is_refused_even_when_remembered(two: tuple[TokenStore, TokenStore, Clock]) -> None:
    here, _, clock = two
    _, secret = here.create("client", ttl=1.0)
    here.verify(secret)
    clock.now += 1.0
    assert here.cached(secret) is None
    with pytest.raises(AuthError, match="expired"):
        here.verify(secret)


def test_join_tokens_are_never_remembered(two: tuple[TokenStore, TokenStore, Clock]) -> None:
    here, _, _ = two
    _, secret = here.create("join", uses=1)
    here.verify(secret)
    assert here.cached(secret) is None


def test_a_token_read_before_a_confirmation_it_did_not_see_is_not_vouched_for(
        two: tuple[TokenStore, TokenStore, Clock]) -> None:
    """A verification whose read began before a full confirmation, and that the confirmation
    did not see, may name a token revoked in between: later quick confirmations (no new
    revocation) must not extend it past the bound."""
    here, there, clock = two
    info, secret = here.create("worker", worker_id="wkr-1")
    _, warm = here.create("worker", worker_id="wkr-2")
    here.verify(warm)  # something to confirm
    read_at = clock.now
    late = here.verify_many({secret: None})[secret]  # read now ...
    assert not isinstance(late, AuthError)
    here.forget(token_id=info.id)  # ... as if remembered only after the confirmation below
    there.revoke(info.id)
    clock.now += 0.1
    here.confirm()  # full: a revocation happened (it does not know of the late entry)
    here.remember(secret, late, read_at)
    for _ in range(6):  # quick confirmations: no revocation since the full one
        clock.now += tokens.CONFIRM_EVERY
        here.confirm()
    assert clock.now - read_at >= tokens.CACHE_SECONDS
    assert here.cached(secret) is None
