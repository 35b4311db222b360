"""The ``ssh`` provider's known_hosts file: OpenSSH's format, read with paramiko's parser.

paramiko's own ``HostKeys.load`` gives up on a whole file at a line it cannot decode, and
OpenSSH's marker lines are such lines: ``@cert-authority`` (paramiko does not check host
certificates) and ``@revoked`` (paramiko has no notion of one). :func:`read` sets those
lines aside, keeps the keys listed ``@revoked`` so that the provider refuses a host that
presents one, and notes each line that is malformed (file and line number) instead of
failing; :func:`append` adds a key accepted under ``strict_host_key_checking =
"accept-new"`` as one line, as OpenSSH does. The file is never rewritten (paramiko's
``HostKeys.save`` would drop its comments and blank lines and split lines that name
several hosts).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import paramiko
from paramiko.hostkeys import HostKeyEntry

MARKERS = ("@cert-authority", "@revoked")


@dataclass
class KnownHosts:
    """What a known_hosts file says, as far as paramiko can use it."""

    path: str
    #: host keys to trust (one entry per line; a key also listed @revoked is left out)
    entries: list[HostKeyEntry] = field(default_factory=list)
    #: keys of @revoked lines: refused whatever host presents them
    revoked: list[paramiko.PKey] = field(default_factory=list)
    #: how many @cert-authority lines were set aside
    cert_authorities: int = 0
    #: ``PATH line N: what is wrong (the line)`` for each line that could not be read
    problems: list[str] = field(default_factory=list)

    def is_revoked(self, key: paramiko.PKey) -> bool:
        return any(k.get_name() == key.get_name() and k.asbytes() == key.asbytes() for k in self.revoked)

    def fill(self, keys: paramiko.HostKeys) -> None:
        """Add the trusted keys to ``keys`` (an ``SSHClient``'s ``get_host_keys()``)."""
        for entry in self.entries:
            for name in entry.hostnames:
                keys.add(name, entry.key.get_name(), entry.key)

    def knows(self, name: str, key: paramiko.PKey) -> bool:
        keys = paramiko.HostKeys()
        self.fill(keys)
        return keys.check(name, key)


def read(path: str) -> KnownHosts:
    """The file at ``path`` (none there: an empty one). ``OSError`` when it cannot be read."""
    known = KnownHosts(path)
    if not os.path.exists(path):
        return known
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    trusted = []
    for number, text in enumerate(lines, 1):
        fields = text.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = fields.pop(0) if fields[0].startswith("@") else None
        if marker is not None and marker not in MARKERS:
            known.problems.append(f"{path} line {number}: unknown marker {marker!r} ({text.strip()[:120]})")
            continue
        if len(fields) < 3:
            known.problems.append(f"{path} line {number}: expected HOSTS KEYTYPE KEY ({text.strip()[:120]})")
            continue
        if marker == "@cert-authority":
            known.cert_authorities += 1
            continue
        try:
            entry = HostKeyEntry.from_line(" ".join(fields[:3]), number)
        except Exception as exc:  # paramiko's key classes raise several kinds for undecodable key data
            known.problems.append(f"{path} line {number}: its key does not decode "
                                  f"({type(exc).__name__}: {exc.args[-1] if exc.args else exc}) ({text.strip()[:120]})")
            continue
        if entry is None:  # a key type paramiko does not know (sk-..., newer ones): not ours to use
            continue
        if marker == "@revoked":
            known.revoked.append(entry.key)
        else:
            trusted.append(entry)
    # OpenSSH refuses a revoked key even where another line lists it for the host
    known.entries = [e for e in trusted if not known.is_revoked(e.key)]
    return known


def append(path: str, name: str, key: paramiko.PKey) -> None:
    """Add ``name KEYTYPE BASE64`` as the file's last line (the file is made, 0600, when
    missing); ``name`` is what paramiko looked the host up by: ``host``, or ``[host]:port``
    off port 22, as OpenSSH writes it. ``OSError`` when it cannot be written."""
    line = f"{name} {key.get_name()} {key.get_base64()}\n"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size:
            f.seek(size - 1)
            if f.read(1) != b"\n":  # a last line without its newline stays a line of its own
                line = "\n" + line
        f.write(line.encode())
