"""A task's artifacts on its worker: the folder it may leave files in
(``GPULAYER_ARTIFACTS_DIR``, made for each task by :class:`~gpulayer.worker.task_files.TaskFiles`),
zipped and stored with the control plane when the task ends, before its final report
(:func:`keep`; see :mod:`gpulayer.control.artifacts`).

Regular files are kept, at any depth, with their modification times; a link, a device or
a socket in the folder is left out, and the task's output says so (a link may point
anywhere on the worker's machine: following it could send what the task never meant to).
What a task leaves is refused before a byte is sent when it is more than the control plane
keeps (``GPULAYER_MAX_ARTIFACTS_MB`` zipped, as this worker reads it; the bundle limits'
number of files): its output says why, and the task's outcome is what it was.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import zipfile
import zlib
from pathlib import Path
from typing import NamedTuple

from gpulayer import bundles, config
from gpulayer.api import TaskAssignment, WorkerAPI
from gpulayer.artifacts import limits, too_large
from gpulayer.errors import GpulayerError
from gpulayer.worker.logbuffer import LogBuffer

__all__ = ["Packed", "Refused", "keep", "pack"]

#: zlib's fastest level: text compresses well even so
_LEVEL = 1
#: bytes of a large file compressed to tell whether it compresses at all (see _how)
_SAMPLE = 64 * 1024


class Refused(Exception):
    """What a task left cannot be kept (why, in the product's words)."""


class Packed(NamedTuple):
    data: bytes
    digest: str
    files: int
    unpacked: int
    #: what was left out (links, devices), as paths inside the folder
    left_out: list[str]


def pack(folder: Path) -> Packed | None:
    """The zip of what is in ``folder`` (None: nothing, or no folder)."""
    found: list[tuple[str, str, int]] = []  # (path in the zip, path on disk, size)
    left_out: list[str] = []
    try:
        for top, dirs, files in os.walk(folder, onerror=_raise):
            for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
                path = os.path.join(top, name)
                rel = os.path.relpath(path, folder).replace(os.sep, "/")
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode):
                    found.append((rel, path, st.st_size))
                else:
                    left_out.append(rel)
    except FileNotFoundError:
        return None
    found.sort()  # (by path: a listing reads as a tree)
    left_out.sort()
    if not found:
        return None if not left_out else Packed(b"", "", 0, 0, left_out)
    most = limits()
    unpacked = sum(size for _, _, size in found)
    if len(found) > most.max_entries:
        raise Refused(f"{len(found)} files, more than the {most.max_entries} allowed (GPULAYER_MAX_BUNDLE_FILES)")
    if unpacked > most.max_unpacked:
        raise Refused(f"{bundles.format_size(unpacked)} of files, more than the {bundles.format_size(most.max_unpacked)} "
                      "allowed (GPULAYER_MAX_ARTIFACTS_MB, GPULAYER_MAX_BUNDLE_UNPACKED_MB)")
    limit = config.max_artifacts_bytes()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=_LEVEL, strict_timestamps=False) as zf:
        for rel, path, size in found:
            zf.write(path, rel, compress_type=_how(path, size))
            if buf.tell() > limit:
                raise Refused(too_large())
    data = buf.getvalue()
    if len(data) > limit:
        raise Refused(too_large(len(data)))
    return Packed(data, hashlib.sha256(data).hexdigest(), len(found), unpacked, left_out)


def _how(path: str, size: int) -> int:
    """How a file goes into the zip: deflated, unless a sample of a large one shows it does
    not compress (a checkpoint's floats, an image, an archive): then stored as it is, at the
    cost of a copy (deflating 1 MB of random bytes took 18 ms for nothing)."""
    if size < _SAMPLE:
        return zipfile.ZIP_DEFLATED
    with open(path, "rb") as f:
        sample = f.read(_SAMPLE)
    return zipfile.ZIP_STORED if len(zlib.compress(sample, _LEVEL)) > 0.9 * len(sample) else zipfile.ZIP_DEFLATED


def _raise(exc: OSError) -> None:
    raise exc


def keep(api: WorkerAPI, a: TaskAssignment, worker_id: str, folder: Path, logbuf: LogBuffer) -> None:
    """Store what the task left in ``folder`` with the control plane; what was left out, or
    why nothing was kept, is added to the task's output (``logbuf``)."""

    def note(text: str) -> None:
        logbuf.add("stderr", text)

    try:
        packed = pack(folder)
    except Refused as exc:
        note(f"gpulayer: artifacts not kept: {exc}\n")
        return
    except OSError as exc:
        note(f"gpulayer: artifacts not kept: {exc.strerror or exc}: {exc.filename}\n")
        return
    if packed is None:
        return
    if packed.left_out:
        shown = ", ".join(packed.left_out[:5]) + (f" and {len(packed.left_out) - 5} more" if len(packed.left_out) > 5 else "")
        note(f"gpulayer: artifacts: left out {shown} (only regular files are kept, not links or devices)\n")
    if not packed.files:
        return
    try:
        api.put_artifacts(a.task_id, packed.digest, packed.data, worker_id=worker_id)
    except GpulayerError as exc:
        note(f"gpulayer: artifacts not kept ({packed.files} file(s), {bundles.format_size(packed.unpacked)}): {exc}\n")
