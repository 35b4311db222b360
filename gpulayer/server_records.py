"""What a local ``gpulayer server start`` records of itself for the clients on its machine
(``$GPULAYER_HOME/server.json`` and ``servers/HASH.json``: its URL, pid, CA and admin
token), and TLS certificate fingerprints (``sha256:AB:CD:...``, what ``--self-signed``
prints and ``GPULAYER_CA`` pins).

Standard library only (psutil where a record is read): the server writes these at its start
without importing the HTTP client, and :mod:`gpulayer.http_client` reads them.
"""

from __future__ import annotations

import hashlib
import json
import re
import ssl
from pathlib import Path
from typing import Any

from gpulayer import config

__all__ = ["fingerprint_of_der", "fingerprint_of_pem", "first_certificate", "norm_url", "server_info",
           "server_record"]


def norm_url(url: str) -> str:
    return url.rstrip("/")


def server_record(home: Path, url: str) -> Path:
    """Where a ``gpulayer server start`` on ``home`` records itself for ``url`` besides
    ``server.json`` (which names the server that started last): ``servers/HASH.json``, named
    after the URL, so that each of several servers on one home (one per database) is found."""
    return home / "servers" / f"{hashlib.sha256(norm_url(url).encode()).hexdigest()[:12]}.json"


def server_info(url: str) -> dict[str, Any] | None:
    """What a local ``gpulayer server start`` recorded for ``url``, if it was this URL and
    that server still runs: once it has stopped, whatever listens there next is not sent its
    admin token (the process is told by its pid and its start time)."""
    home = config.home()
    for path in (home / "server.json", server_record(home, url)):
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(info, dict) or norm_url(str(info.get("url", ""))) != norm_url(url):
            continue
        pid, started = info.get("pid"), info.get("started")
        if type(pid) is not int or not _runs(pid, started):
            continue
        return info
    return None


def _runs(pid: int, started: Any) -> bool:
    import psutil

    try:
        proc = psutil.Process(pid)
        alive = proc.status() != psutil.STATUS_ZOMBIE
        return alive and (not isinstance(started, (int, float)) or abs(proc.create_time() - started) < 1.0)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def fingerprint_of_der(der: bytes) -> str:
    digest = hashlib.sha256(der).hexdigest().upper()
    return "sha256:" + ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


#: one PEM certificate block (a file may hold a chain, and text around its blocks)
_PEM_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----\s.*?-----END CERTIFICATE-----", re.S)


def fingerprint_of_pem(pem: str) -> str:
    """The fingerprint of the first certificate in ``pem``: the server's own in a chain file
    (the one a TLS server presents, as ``load_cert_chain`` takes it); the text around the
    blocks (``Bag Attributes`` of an exported PKCS#12, comments) is not part of it. The
    whole file was decoded as one certificate: a chain gave the hash of none of them, and
    every client pinned to it was refused."""
    return fingerprint_of_der(ssl.PEM_cert_to_DER_cert(first_certificate(pem)))


def first_certificate(pem: str) -> str:
    """The first PEM certificate block of ``pem`` (ValueError where there is none)."""
    first = _PEM_CERTIFICATE.search(pem)
    if first is None:
        raise ValueError("no PEM certificate in it (-----BEGIN CERTIFICATE-----)")
    return first.group(0)
