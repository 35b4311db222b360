"""The ``ssh`` provider's known_hosts file: OpenSSH's format, read with paramiko's parser.

A key accepted under ``strict_host_key_checking = "accept-new"`` is appended as one line,
as OpenSSH does; the file is never rewritten (paramiko's ``HostKeys.save`` would drop its
comments and blank lines and split lines that name several hosts).
"""

from __future__ import annotations

import os

import paramiko


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
