"""The process's clients: :func:`connect` (what the SDK, the CLI and the PyTorch API call),
one client per control plane and settings, and the default a ``gl.connect(url=..., token=...)``
chose (as ``ray.init(address=...)`` does); :func:`reset` forgets them. Re-exported by
:mod:`gpulayer.client`, which defines :class:`~gpulayer.client.Client` (imported here when a
client is made, so that either module may be imported first)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from gpulayer import config
from gpulayer.errors import DatabaseFailed

if TYPE_CHECKING:
    from gpulayer.client import Client

__all__ = ["connect", "embedded_client", "http_client", "reset"]


def embedded_client(database_url: str | None = None) -> Client:
    """A client of the embedded control plane of this home (its database: ``database_url``)."""
    from gpulayer.client import Client
    from gpulayer.control import ControlPlane
    from gpulayer.store import Store

    control = ControlPlane(Store(database_url))
    # a worker of this home that died (killed with -9: its pid is gone) is noticed now, so
    # its tasks are lost and retried at once instead of after a heartbeat timeout; a
    # database that cannot be written now (a full disk) still answers what only reads it
    # (`jobs list`, `jobs logs`), and the next process notices the worker instead
    try:
        control.expire_workers()
    except DatabaseFailed as exc:
        import logging

        logging.getLogger(__name__).warning("could not mark the workers that are gone offline: %s", exc)
    return Client(control, location="embedded", default_target="local", control=control)


def http_client(url: str, *, token: str | None = None, ca: str | None = None,
                retry_for: float | None = None) -> Client:
    """A client of the control plane served at ``url``."""
    from gpulayer.client import Client
    from gpulayer.http_client import connect_http

    remote = connect_http(url, token=token, ca=ca, retry_for=retry_for)
    return Client(remote, location=remote.url, default_target="remote")


_clients: dict[tuple[str | None, str | None, str], Client] = {}
_clients_lock = threading.Lock()
#: the ``url`` and ``token`` the last :func:`connect` that named one of them was given: what a
#: call naming neither (``.remote()``, ``gl.submit``, ``gl.get_job``) connects to since
_chosen: tuple[str | None, str | None] | None = None


def connect(url: str | None = None, token: str | None = None) -> Client:
    """The client for ``url`` (default ``$GPULAYER_URL``; none means embedded).

    A call that names ``url`` or ``token`` also makes that control plane the process's
    default, as ``ray.init(address=...)`` does: ``.remote()``, ``gl.submit``, ``gl.get_job``
    and every later ``connect()`` naming neither use it (until another such call, or
    :func:`reset`), where before they kept to ``$GPULAYER_URL``, or the embedded one, and a
    script's jobs ran on its own machine. Calls with the same settings return the same
    client, so the SDK keeps one in-process worker and one connection pool per process. A
    client made for other settings stays open for the job handles that use it; :func:`reset`
    (and the end of the process) closes them all.
    """
    global _chosen
    env = config.settings()
    if url is not None or token is not None:
        _chosen = (url, token)
    elif _chosen is not None:
        url, token = _chosen
    given = _chosen is not None and (url, token) == _chosen  # (the program named them: its errors say so)
    url = url if url is not None else env.url
    token = token if token is not None else env.token
    key = (url, token, str(config.home()) if url is None else "")
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            if url is None:
                client = embedded_client(env.database_url)
            else:
                client = http_client(url, token=token, ca=env.ca)
            _clients[key] = client
        if given and client.control is None:  # (the HTTP client's)
            client.api.given_in = "gl.connect"  # type: ignore[attr-defined]
            client.api.token_given = _chosen is not None and _chosen[1] is not None  # type: ignore[attr-defined]
        return client


def reset() -> None:
    """Close and forget every client of this process, and the default :func:`connect` was
    given (tests)."""
    global _chosen
    with _clients_lock:
        _chosen = None
        clients = list(_clients.values())
        _clients.clear()
    for c in clients:
        c.close()
