"""A task's artifacts on its worker: the folder it may leave files in
(``GPULAYER_ARTIFACTS_DIR``, made for each task by :class:`~gpulayer.worker.task_files.TaskFiles`),
zipped and stored with the control plane when the task ends, before its final report
(:func:`keep`; see :mod:`gpulayer.control.artifacts`).

Regular files are kept, at any depth, with their modification times; a link, a device or
a socket in the folder is left out, and the task's output says so (a link may point
anywhere on the worker's machine: following it could send what the task never meant to;
a file is opened without following one, and without waiting, as one may be swapped in
after the look). So is what cannot be read, a file whose reading fails partway (an I/O
error: its entry, half written, is taken out again), and a name the control plane would
refuse the whole zip for (a backslash, ...): each costs only itself. A name that is not
UTF-8, which a zip cannot hold, is kept written as a URL writes it (``caf%E9.txt``), and the
output says so. A file removed while they are zipped
(the task's own process, still at it) is not there to keep; one still written is kept as
large as it was when it was seen. The zip is built in memory, and its size checked as each
megabyte goes in, so it never holds much more than the limit.
What a task leaves is refused before a byte is sent when it is more than the control plane
keeps (``GPULAYER_MAX_ARTIFACTS_MB`` zipped, as this worker reads it; the bundle limits'
number of files): its output says why, and the task's outcome is what it was.
"""

from __future__ import annotations

import errno
import hashlib
import io
import logging
import os
import re
import stat
import time
import zipfile
import zlib
from pathlib import Path
from typing import NamedTuple

from gpulayer import bundles, config
from gpulayer.api import TaskAssignment, WorkerAPI
from gpulayer.artifacts import limits, older_server, too_large
from gpulayer.errors import ConnectionFailed, DatabaseFailed, GpulayerError, NotFound
from gpulayer.worker.logbuffer import LogBuffer

__all__ = ["Packed", "Refused", "keep", "pack"]

log = logging.getLogger("gpulayer.worker")

#: zlib's fastest level: text compresses well even so
_LEVEL = 1
#: bytes of a large file compressed to tell whether it compresses at all (see _how)
_SAMPLE = 64 * 1024
#: bytes read at a time: the zip's size is checked after each
_CHUNK = 1 << 20
#: the longest wait between two tries to send them through an outage
_RETRY_MAX = 2.0
#: a path the control plane refuses: one that starts with a drive letter
_DRIVE = re.compile(r"^[A-Za-z]:")


class Refused(Exception):
    """What a task left cannot be kept (why, in the product's words)."""


class Packed(NamedTuple):
    data: bytes
    digest: str
    files: int
    unpacked: int
    #: what was left out (links, devices), as paths inside the folder
    left_out: list[str]
    #: what could not be read (a folder's path ends with ``/``)
    unreadable: list[str]
    #: what is named in a way the control plane does not store (a backslash, ...)
    misnamed: list[str]
    #: what was opened but whose reading failed (an I/O error, perhaps partway), with the error
    failed: list[tuple[str, str]]
    #: what is kept under another name, as (its name, the name kept): one not UTF-8, escaped
    renamed: list[tuple[str, str]]


class _Found(NamedTuple):
    #: (path in the zip, path on disk, size)
    files: list[tuple[str, str, int]]
    left_out: list[str]
    unreadable: list[str]
    misnamed: list[str]
    #: (path, path in the zip) of a file or folder (``/`` at its end) whose name is escaped
    renamed: list[tuple[str, str]]


def pack(folder: Path) -> Packed | None:
    """The zip of what is in ``folder`` (None: nothing, or no folder). What cannot be kept is
    left out, each kind in its own list: a file that is gone by the time it is read (the
    task's own process removed it) is not there to keep, and one that cannot be read (or
    whose reading fails partway), or whose name cannot be stored, costs only itself, not
    the others."""
    found = _look(str(folder))
    if found is None:
        return None
    files, left_out, unreadable, misnamed, _ = found
    if not files:
        return Packed(b"", "", 0, 0, left_out, unreadable, misnamed, [], []) \
            if left_out or unreadable or misnamed else None
    most = limits()
    unpacked = sum(size for _, _, size in files)
    if len(files) > most.max_entries:
        raise Refused(f"{len(files)} files, more than the {most.max_entries} allowed (GPULAYER_MAX_BUNDLE_FILES)")
    if unpacked > most.max_unpacked:
        raise Refused(f"{bundles.format_size(unpacked)} of files, more than the {bundles.format_size(most.max_unpacked)} "
                      "allowed (GPULAYER_MAX_ARTIFACTS_MB, GPULAYER_MAX_BUNDLE_UNPACKED_MB)")
    limit = config.max_artifacts_bytes()
    buf = io.BytesIO()
    kept: list[tuple[str, int]] = []
    failed: list[tuple[str, str]] = []
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=_LEVEL) as zf:
        for rel, path, size in files:
            try:
                got = _add(zf, buf, rel, path, size, limit)
            except OSError as exc:  # (its entry, begun, was taken out again)
                log.warning("artifacts: reading %s failed: %s", path, exc)
                failed.append((rel, exc.strerror or str(exc)))
                continue
            if got is None:
                continue  # gone: removed since it was seen
            if isinstance(got, str):
                (left_out if got == "left out" else unreadable).append(rel)
            else:
                kept.append((rel, got))
    if not kept:
        return Packed(b"", "", 0, 0, sorted(left_out), sorted(unreadable), misnamed, failed, []) \
            if left_out or unreadable or misnamed or failed else None
    data = buf.getvalue()
    if len(data) > limit:
        raise Refused(too_large(len(data)))
    renamed = found.renamed
    if renamed:  # (a renaming is said only of what was kept: a file, or a folder holding one)
        names = {rel for rel, _ in kept}
        names |= {rel[:i + 1] for rel in list(names) for i, c in enumerate(rel) if c == "/"}
        renamed = [(was, now) for was, now in renamed if now in names]
    return Packed(data, hashlib.sha256(data).hexdigest(), len(kept), sum(n for _, n in kept), sorted(left_out),
                  sorted(unreadable), misnamed, failed, renamed)


def _look(folder: str) -> _Found | None:
    """The regular files under ``folder``, by path, and what is left out (None: no folder).
    Each entry's kind is its directory entry's (no system call for most); a file's size is
    read once, here."""
    found = _Found([], [], [], [], [])
    below: list[tuple[str, str]] = [("", folder)]
    while below:
        prefix, path = below.pop()
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except FileNotFoundError:
            if not prefix:
                return None
            continue  # (removed since it was seen)
        except OSError:
            if not prefix:
                raise
            found.unreadable.append(prefix)
            continue
        names = {entry.name for entry in entries}
        for entry in entries:
            name = _escaped(entry.name)
            if name != entry.name and name in names:  # (its escape is another's name: that one is kept)
                found.misnamed.append(prefix + entry.name)
                continue
            rel = prefix + name
            try:
                if entry.is_dir(follow_symlinks=False):
                    if _misnamed(rel + "/"):
                        found.misnamed.append(rel + "/")
                        continue
                    below.append((rel + "/", entry.path))
                    renamed = (prefix + entry.name + "/", rel + "/")
                elif not entry.is_file(follow_symlinks=False):
                    found.left_out.append(rel)
                    continue
                elif _misnamed(rel):
                    found.misnamed.append(rel)
                    continue
                else:
                    found.files.append((rel, entry.path, entry.stat(follow_symlinks=False).st_size))
                    renamed = (prefix + entry.name, rel)
                if name != entry.name:
                    found.renamed.append(renamed)
            except FileNotFoundError:
                continue
            except OSError:
                found.unreadable.append(rel)
    for kept in found:
        kept.sort()  # (by path: a listing reads as a tree)
    return found


def _escaped(name: str) -> str:
    """``name`` as a zip can hold it: as it is when it is UTF-8; else each byte that is not
    (a surrogate, as os.fsdecode gives it) and each ``%`` written ``%XX``, as a URL writes
    them, so that ``urllib.parse.unquote_to_bytes`` gives the name's bytes back."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return "".join(f"%{ord(c) - 0xDC00:02X}" if "\udc80" <= c <= "\udcff" else "%25" if c == "%" else c
                       for c in name)


def _misnamed(rel: str) -> bool:
    """Whether the control plane refuses a zip holding this path (see
    :func:`gpulayer.bundles.check_archive`): a backslash, a leading drive letter, deeper than
    it allows, a name that is still not UTF-8 (it cannot even be written in a zip; escaped,
    only a surrogate that no file system name decodes to is left)."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return "\\" in rel or _DRIVE.match(rel) is not None or rel.rstrip("/").count("/") > bundles.MAX_DEPTH


def _add(zf: zipfile.ZipFile, buf: io.BytesIO, rel: str, path: str, size: int, limit: int) -> int | str | None:
    """Zip the file at ``path`` as ``rel``: its first ``size`` bytes (its size when it was
    seen: what the limits were checked against; a file the task still writes is kept as it
    was then). Returns the bytes kept, None for a file gone, or why it was left out ("left
    out": no longer a regular file; "unreadable"). Opened without following a link and
    without waiting (what was a file may have been replaced by a link or a pipe since).
    A read that fails (an I/O error, a network file system's file gone stale) raises its
    OSError, its entry taken out of the zip again if it was begun."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return "left out" if exc.errno in (errno.ELOOP, errno.ENXIO) else "unreadable"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "left out"
        size = min(size, st.st_size)
        info = zipfile.ZipInfo(rel, date_time=_date_time(st.st_mtime))
        info.create_system = 3  # Unix, so that the mode in external_attr is honoured
        info.external_attr = (st.st_mode & 0xFFFF) << 16
        info.compress_type = _how(fd, size)
        # ``compress_level`` since Python 3.13, ``_compresslevel`` before
        setattr(info, "compress_level" if hasattr(info, "compress_level") else "_compresslevel", _LEVEL)
        info.file_size = size  # (zip64 chosen by it)
        left = size
        try:
            with zf.open(info, "w") as dst:
                while left > 0 and (chunk := os.read(fd, min(_CHUNK, left))):
                    dst.write(chunk)
                    left -= len(chunk)
                    if buf.tell() > limit:  # (checked as it goes: the zip is held in memory)
                        raise Refused(too_large())
        except OSError:
            _drop(zf, buf, info)
            raise
        return size - left
    finally:
        os.close(fd)


def _drop(zf: zipfile.ZipFile, buf: io.BytesIO, info: zipfile.ZipInfo) -> None:
    """Take the entry last written, ``info``'s, out of the zip as if it had never been begun:
    a read that failed partway leaves it half written, and the whole zip was lost with it.
    zipfile has no way to remove an entry: what it keeps of the entries written, and where
    it writes the next (``filelist``, ``NameToInfo``, ``start_dir``: unchanged from Python
    3.10 to 3.13), are put back as they were before it, and the bytes written since are cut
    off. No copy is made (the zip may hold hundreds of megabytes); the tests of a read that
    fails partway check that the zip left is whole."""
    if zf.filelist and zf.filelist[-1] is info:  # (closing it added it, unless its close failed)
        zf.filelist.pop()
        zf.NameToInfo.pop(info.filename, None)
    zf.start_dir = info.header_offset
    buf.seek(info.header_offset)
    buf.truncate()


def _how(fd: int, size: int) -> int:
    """How a file goes into the zip: deflated, unless a sample of a large one shows it does
    not compress (a checkpoint's floats, an image, an archive): then stored as it is, at the
    cost of a copy (deflating 1 MB of random bytes took 18 ms for nothing)."""
    if size < _SAMPLE:
        return zipfile.ZIP_DEFLATED
    sample = os.pread(fd, _SAMPLE, 0)
    return zipfile.ZIP_STORED if len(zlib.compress(sample, _LEVEL)) > 0.9 * len(sample) else zipfile.ZIP_DEFLATED


def _date_time(mtime: float) -> tuple[int, int, int, int, int, int]:
    """A zip entry's date and time: a zip has none before 1980 or after 2107, and the clock
    none for a time of billions of years (tmpfs keeps one)."""
    first, last = (1980, 1, 1, 0, 0, 0), (2107, 12, 31, 23, 59, 59)
    try:
        t = time.localtime(mtime)[:6]
    except (OverflowError, OSError, ValueError):
        return first if mtime < 0 else last
    return max(min(t, last), first)


def keep(api: WorkerAPI, a: TaskAssignment, worker_id: str, folder: Path | None, logbuf: LogBuffer,
         retry_for: float = 600.0) -> None:
    """Store what the task left in ``folder`` (None: it has none) with the control plane;
    what was left out, or why nothing was kept, is added to the task's output (``logbuf``).
    An empty folder, most tasks', is removed here: one system call, where a listing takes four.
    They are sent again through an outage of the control plane (it cannot be reached, its
    database failed) for ``retry_for`` seconds, as the task's report is after them."""

    def note(text: str) -> None:
        logbuf.add("stderr", text)

    if folder is None:
        return
    try:
        os.rmdir(folder)
        return
    except FileNotFoundError:
        return
    except OSError:
        pass  # (not empty: what it holds is kept)
    if os.path.islink(folder):  # (the task put a link in its place: not followed, as no link in it is)
        note("gpulayer: artifacts not kept: $GPULAYER_ARTIFACTS_DIR was replaced by a link (only a folder's "
             "regular files are kept)\n")
        return
    try:
        packed = pack(folder)
    except Refused as exc:
        note(f"gpulayer: artifacts not kept: {exc}\n")
        return
    except OSError as exc:
        note(f"gpulayer: artifacts not kept: {exc.strerror or exc}" + (f": {exc.filename}\n" if exc.filename else "\n"))
        return
    if packed is None:
        return
    failed: dict[str, list[str]] = {}  # (by the error: a failing disk fails many alike)
    for path, error in packed.failed:
        failed.setdefault(error, []).append(path)
    for paths, why in ((packed.left_out, "only regular files are kept, not links or devices"),
                       (packed.unreadable, "they cannot be read"),
                       (packed.misnamed, "names a zip does not keep: a backslash, a drive letter, too deep, "
                                         "not UTF-8 with its %XX name taken"),
                       *((paths, f"reading them failed: {error}") for error, paths in failed.items())):
        if paths:
            shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
            note(f"gpulayer: artifacts: left out {shown} ({why})\n")
    if packed.renamed:
        pairs = [f"{was} as {now}" for was, now in packed.renamed]
        shown = ", ".join(pairs[:5]) + (f" and {len(pairs) - 5} more" if len(pairs) > 5 else "")
        note(f"gpulayer: artifacts: kept {shown} (names that are not UTF-8, which a zip cannot hold: each byte "
             "that is not, and each %, written %XX)\n")
    if not packed.files:
        return
    what = f"{packed.files} file(s), {bundles.format_size(packed.unpacked)}"
    deadline = time.monotonic() + retry_for
    delay = 0.5
    while True:
        try:
            api.put_artifacts(a.task_id, packed.digest, packed.data, worker_id=worker_id)
            return
        except (ConnectionFailed, DatabaseFailed) as exc:
            if time.monotonic() + delay > deadline:
                note(f"gpulayer: artifacts not kept ({what}): {exc}\n")
                return
            log.warning("storing the artifacts of %s failed (%s); retrying in %.1f s", a.task_id, exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX)
        except GpulayerError as exc:
            why = str(exc)
            if isinstance(exc, NotFound):  # (a server from before them: said as its readers are told)
                why = older_server(exc, str(getattr(api, "url", ""))) or why
            note(f"gpulayer: artifacts not kept ({what}): {why}\n")
            return
