"""Source bundles, checking and extracting: the address, the limits, safe extraction into a
worker's cache (kept within its limits by :mod:`.cache`).

Every path that takes a bundle goes through :func:`check_archive` (an upload, before it is
stored; ``gpulayer bundle inspect`` of an archive) or :func:`extract_bundle` (a worker, before
it writes anything), so each refuses the same archives with the same message. The limits
(:class:`Limits`) come from the settings ``GPULAYER_MAX_BUNDLE_UNPACKED_MB``,
``GPULAYER_MAX_BUNDLE_RATIO`` and ``GPULAYER_MAX_BUNDLE_FILES``. The number of entries is read
from the archive's end record, and counted in its directory (the end record may understate
it), before ``zipfile`` reads that directory, so an archive of a million empty entries costs
no memory to refuse.

The cache (``$GPULAYER_HOME/bundles``) keeps one folder per digest, extracted once under a
lock (:class:`_DigestLock`).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import os
import re
import shutil
import stat
import struct
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from gpulayer import config
from gpulayer.errors import BundleError

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "MAX_DEPTH",
    "RATIO_FLOOR",
    "Limits",
    "check_archive",
    "compute_digest",
    "extract_bundle",
    "extract_into",
    "format_size",
    "is_digest",
    "verify_digest",
]

#: Most entries an archive may hold by default (``GPULAYER_MAX_BUNDLE_FILES``).
DEFAULT_MAX_ENTRIES = 100_000
#: Most folders an entry may lie in: far more than any source tree, and few enough for the
#: tools that walk a tree by recursion (``shutil.rmtree`` as a worker evicts the bundle,
#: ``os.walk``) to handle it
MAX_DEPTH = 256
#: a file smaller than this is not held to the compression ratio (a few KB of zeros or a
#: repetitive small file compresses far better than any code, harmlessly)
RATIO_FLOOR = 1024 * 1024

_CHUNK = 1024 * 1024
_DIGEST_RE = re.compile(r"[0-9a-f]{64}")
_DRIVE_RE = re.compile(r"^[A-Za-z]:")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@dataclass(frozen=True)
class Limits:
    """What an archive may hold: entries, bytes once extracted, compression ratio."""

    max_entries: int
    max_unpacked: int
    max_ratio: float

    @classmethod
    def from_settings(cls, *, max_entries: int | None = None, max_unpacked: int | None = None,
                      max_ratio: float | None = None) -> Limits:
        env = config.settings()
        return cls(
            max_entries=env.max_bundle_files if max_entries is None else int(max_entries),
            max_unpacked=int(env.max_bundle_unpacked_mb * 1024 * 1024) if max_unpacked is None
            else int(max_unpacked),
            max_ratio=env.max_bundle_ratio if max_ratio is None else float(max_ratio),
        )


# --------------------------------------------------------------------------------------------
# addresses


def format_size(n: int) -> str:
    """``n`` bytes for people: ``512 B``, ``1.5 KB``, ``100.0 MB`` (1 KB = 1024 B)."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(value) < 1024 or unit == "GB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def compute_digest(data: bytes) -> str:
    """The address of a bundle: the SHA-256 of its bytes, 64 lowercase hex characters."""
    return hashlib.sha256(data).hexdigest()


def is_digest(value: object) -> bool:
    """Whether ``value`` is a well-formed bundle address (64 lowercase hex characters)."""
    return isinstance(value, str) and _DIGEST_RE.fullmatch(value) is not None


def _check_digest_format(digest: object) -> str:
    if not is_digest(digest):
        raise BundleError(
            f"bundle digest {digest!r} is not a SHA-256 address: expected 64 lowercase hex "
            "characters"
        )
    return digest  # type: ignore[return-value]


def verify_digest(data: bytes, digest: str) -> None:
    """Raise :class:`BundleError` unless ``data`` is what address ``digest`` names."""
    _check_digest_format(digest)
    actual = compute_digest(data)
    if actual != digest:
        raise BundleError(
            f"bundle content does not match its address: expected sha256 {digest}, "
            f"got {actual} ({len(data)} bytes); the bundle is corrupt or was tampered with"
        )




# --------------------------------------------------------------------------------------------
# limits


def _check_count(count: int, limits: Limits) -> None:
    if count > limits.max_entries:
        raise BundleError(
            f"bundle has {count} entries, more than the {limits.max_entries} allowed "
            "(GPULAYER_MAX_BUNDLE_FILES)"
        )


def _check_ratio(what: str, unpacked: int, packed: int, limits: Limits) -> None:
    if unpacked > RATIO_FLOOR and unpacked > limits.max_ratio * max(packed, 1):
        raise BundleError(
            f"{what} would extract {format_size(unpacked)} from {format_size(packed)}, a "
            f"compression ratio of {unpacked / max(packed, 1):.0f}:1, over the {limits.max_ratio:g}:1 allowed "
            "(GPULAYER_MAX_BUNDLE_RATIO); refusing a possible compression bomb"
        )


def _declared_entries(data: bytes) -> int | None:
    """The entry count of the zip's end-of-central-directory record (zip64 too), or None
    when there is no such record (``zipfile`` then says what is wrong)."""
    at = data.rfind(b"PK\x05\x06", max(0, len(data) - 22 - 0xFFFF))
    if at < 0 or len(data) < at + 22:
        return None
    count: int = struct.unpack_from("<H", data, at + 10)[0]
    if count == 0xFFFF and at >= 20 and data[at - 20:at - 16] == b"PK\x06\x07":
        offset = struct.unpack_from("<Q", data, at - 20 + 8)[0]
        if data[offset:offset + 4] == b"PK\x06\x06" and len(data) >= offset + 40:
            count = struct.unpack_from("<Q", data, offset + 32)[0]
    return count


#: zipfile's own reading of the end record (where the central directory starts, and its
#: size), so that the directory counted is the one zipfile reads; absent from a Python that
#: no longer has it, where only the count the end record declares is checked first
_END_RECORD = getattr(zipfile, "_EndRecData", None)
#: a central directory record's fixed part; its name's, extra field's and comment's lengths
#: are three 16-bit numbers at byte 28 (PKWARE's APPNOTE 4.3.12)
_CENTRAL_SIZE = 46


def _directory_entries(data: bytes, stop: int) -> int | None:
    """The entries of the central directory that ``zipfile`` would read, counted (not read)
    up to ``stop``: the end record's count may lie, and ``zipfile`` reads the directory's
    bytes whatever it says. None where ``zipfile`` would find no directory (it says why)."""
    if _END_RECORD is None:
        return None
    try:
        end = _END_RECORD(io.BytesIO(data))
    except (OSError, zipfile.BadZipFile, struct.error):
        return None
    if not end:
        return None
    size, location = end[5], end[9]
    # where zipfile starts reading it (an archive may follow other bytes; zip64 records)
    start = location - size - (56 + 20 if end[0] == b"PK\x06\x06" else 0)
    if start < 0:
        return None
    at, last, count = start, min(start + size, len(data)), 0
    while at < start + size and count < stop:
        if at + _CENTRAL_SIZE > last:
            return None
        names, extra, comment = struct.unpack_from("<3H", data, at + 28)
        at += _CENTRAL_SIZE + names + extra + comment
        count += 1
    return count


def _open_checked(data: bytes, digest: str, limits: Limits) -> tuple[zipfile.ZipFile, list[_Member]]:
    declared = _declared_entries(data)
    if declared is not None:
        _check_count(declared, limits)  # before zipfile holds a record per entry in memory
    found = _directory_entries(data, limits.max_entries + 1)
    if found is not None and found > limits.max_entries:  # (an end record that understates)
        raise BundleError(
            f"bundle has more than {limits.max_entries} entries, the most allowed "
            "(GPULAYER_MAX_BUNDLE_FILES)"
        )
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
        raise BundleError(f"bundle {digest} is not a valid zip archive: {exc}") from None
    try:
        return zf, _check_members(zf, limits, len(data))
    except BaseException:
        zf.close()
        raise


def check_archive(data: bytes, digest: str | None = None, *, limits: Limits | None = None) -> list[str]:
    """Check that ``data`` is a bundle a worker would extract, writing nothing: its address
    (when ``digest`` is given), its entries' names and kinds, their number, their declared
    sizes and compression ratios. Returns the files' paths; raises :class:`BundleError`."""
    if digest is not None:
        verify_digest(data, digest)
    zf, members = _open_checked(data, digest or compute_digest(data), limits or Limits.from_settings())
    with zf:
        return ["/".join(m.parts) for m in members if not m.is_dir]


# --------------------------------------------------------------------------------------------
# extraction

class _Member(NamedTuple):
    info: zipfile.ZipInfo
    parts: tuple[str, ...]
    is_dir: bool
    executable: bool


def _check_members(zf: zipfile.ZipFile, limits: Limits, archive_size: int) -> list[_Member]:
    infos = zf.infolist()
    _check_count(len(infos), limits)
    max_total = limits.max_unpacked
    members: list[_Member] = []
    seen: set[tuple[str, ...]] = set()
    files = 0
    declared = 0
    for info in infos:
        name = info.filename
        shown = repr(name)
        if not name or "\x00" in name:
            raise BundleError(f"bundle entry {shown} has an empty or NUL name")
        if "\\" in name:
            raise BundleError(f"bundle entry {shown} contains a backslash")
        if name.startswith("/"):
            raise BundleError(f"bundle entry {shown} is an absolute path")
        if _DRIVE_RE.match(name):
            raise BundleError(f"bundle entry {shown} starts with a drive letter")
        is_dir = name.endswith("/")
        parts = tuple(name.rstrip("/").split("/")) if is_dir else tuple(name.split("/"))
        if len(parts) > MAX_DEPTH + 1:
            short = "/".join(parts[:3]) + "/.../" + parts[-1]
            raise BundleError(
                f"bundle entry {short!r} lies {len(parts) - 1} folders deep, more than the {MAX_DEPTH} allowed"
            )
        for part in parts:
            if part in ("", ".", ".."):
                raise BundleError(
                    f"bundle entry {shown} has a {part or 'empty'!r} path component "
                    "(entries must stay inside the bundle)"
                )
        if parts in seen:
            raise BundleError(f"bundle entry {shown} appears more than once")
        seen.add(parts)
        if info.flag_bits & 0x1:
            raise BundleError(f"bundle entry {shown} is encrypted")
        mode = info.external_attr >> 16
        kind = stat.S_IFMT(mode)
        if kind == stat.S_IFLNK:
            raise BundleError(f"bundle entry {shown} is a symlink; bundles may not hold symlinks")
        if info.is_dir() or kind == stat.S_IFDIR:
            is_dir = True
        elif kind not in (0, stat.S_IFREG):
            raise BundleError(f"bundle entry {shown} is not a regular file (mode {oct(mode)})")
        if not is_dir:
            files += 1
            declared += info.file_size
            if declared > max_total:
                raise BundleError(
                    f"bundle would extract to more than {format_size(max_total)} "
                    f"({max_total} bytes; {declared} bytes declared by the first "
                    f"{files} files); refusing a possible compression bomb "
                    "(GPULAYER_MAX_BUNDLE_UNPACKED_MB)"
                )
            _check_ratio(f"bundle entry {shown}", info.file_size, info.compress_size, limits)
        members.append(_Member(info, parts, is_dir, bool(mode & 0o111)))
    _check_no_file_is_a_folder(members)
    _check_ratio("bundle", declared, archive_size, limits)
    return members


def _check_no_file_is_a_folder(members: list[_Member]) -> None:
    """Refuse an entry that lies under another entry that is a file. One step per path
    component (a tree of the folders the entries make), so that an archive of deep paths
    costs no more than it takes to read their names."""
    root: dict[str, Any] = {}
    for member in members:
        node = root
        for i, part in enumerate(member.parts):
            last = i == len(member.parts) - 1
            child = node.get(part)
            if child is _A_FILE or (last and not member.is_dir and child is not None):
                under, above = (member.parts, member.parts[:i + 1]) if child is _A_FILE else \
                    (_an_entry_in(child, member.parts), member.parts)
                raise BundleError(
                    f"bundle entry {'/'.join(under)!r} lies under {'/'.join(above)!r}, which is a file"
                )
            if last and not member.is_dir:
                node[part] = _A_FILE
            else:
                node = node.setdefault(part, {})


#: a file's place in :func:`_check_no_file_is_a_folder`'s tree (a folder's is a dict)
_A_FILE = object()


def _an_entry_in(node: Any, prefix: tuple[str, ...]) -> tuple[str, ...]:
    """The path of an entry in a folder of :func:`_check_no_file_is_a_folder`'s tree."""
    path = list(prefix)
    while isinstance(node, dict) and node:
        name, node = next(iter(node.items()))
        path.append(name)
    return tuple(path)


def _extract_members(
    zf: zipfile.ZipFile, members: list[_Member], dest: Path, *, max_total: int,
) -> None:
    total = 0
    dest_str = str(dest)
    made = {dest_str}  # (folders made, or there: each is made once, not once a file)

    def folder(path: str) -> None:
        missing = []  # (from the deepest up: one step per folder, however deep the path)
        while path not in made:
            missing.append(path)
            path = os.path.dirname(path)
        for path in reversed(missing):
            try:
                os.mkdir(path)
            except FileExistsError:
                if not os.path.isdir(path):  # (a file of the same name on this file system)
                    raise BundleError(
                        f"bundle folder {os.path.relpath(path, dest_str)!r} collides with a file on this "
                        "file system (names that differ only in case or Unicode normalisation?)"
                    ) from None
            made.add(path)

    for member in members:
        target = os.path.join(dest_str, *member.parts)
        if not _within(os.path.normpath(target), dest_str):  # belt and braces
            raise BundleError(f"bundle entry {member.info.filename!r} escapes the bundle")
        if member.is_dir:
            folder(target)
            continue
        folder(os.path.dirname(target))
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(target, flags, 0o600)
        except FileExistsError:
            raise BundleError(
                f"bundle entry {member.info.filename!r} collides with another entry on this "
                "file system (names that differ only in case or Unicode normalisation?)"
            ) from None
        count = 0
        try:
            with os.fdopen(fd, "wb") as out, zf.open(member.info) as src:
                while chunk := src.read(_CHUNK):
                    count += len(chunk)
                    total += len(chunk)
                    if count > member.info.file_size:
                        raise BundleError(
                            f"bundle entry {member.info.filename!r} holds more than the "
                            f"{member.info.file_size} bytes it declares"
                        )
                    if total > max_total:
                        raise BundleError(
                            f"bundle extracts to more than {format_size(max_total)} "
                            f"({max_total} bytes); refusing a possible compression bomb"
                        )
                    out.write(chunk)
                # (its mode whatever this process's umask: 0644, or 0755 for an executable)
                os.fchmod(out.fileno(), 0o755 if member.executable else 0o644)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, RuntimeError,
                NotImplementedError) as exc:
            raise BundleError(
                f"bundle entry {member.info.filename!r} cannot be read: {exc}"
            ) from None
        if count != member.info.file_size:
            raise BundleError(
                f"bundle entry {member.info.filename!r} holds {count} bytes, not the "
                f"{member.info.file_size} it declares"
            )


class _DigestLock:
    """An exclusive ``flock`` on ``<cache>/.<digest>.lock``, removed when released.

    Removing a lock file is safe because a taker checks, once it holds the lock, that the file
    it locked is still the one at the path; if not (its holder removed it), it starts again.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def __enter__(self) -> _DigestLock:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
            except BaseException:
                os.close(fd)
                raise
            if same:
                self.fd = fd
                return self
            os.close(fd)

    def __exit__(self, *exc: object) -> None:
        if self.fd is None:  # pragma: no cover - __enter__ always sets it or raises
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:  # pragma: no cover - someone removed it by hand
            pass
        os.close(self.fd)
        self.fd = None


def extract_bundle(
    data: bytes,
    digest: str,
    cache_dir: str | os.PathLike[str],
    *,
    max_entries: int | None = None,
    max_uncompressed_bytes: int | None = None,
    max_ratio: float | None = None,
) -> Path:
    """Extract bundle ``data`` once into ``cache_dir/<digest>/`` and return that folder.

    Checks ``data`` against ``digest`` first. An existing ``cache_dir/<digest>/`` is reused: it
    only ever appears complete, because extraction happens in a temporary folder beside it that
    is renamed into place, under a lock, so concurrent callers (threads or processes) extract
    once and all get the same folder.

    Refuses with :class:`BundleError`, leaving nothing in ``cache_dir``: a digest mismatch, a
    malformed zip, absolute paths, ``..`` or empty components, drive letters, backslashes,
    symlink or special entries, duplicates, a file that is also a folder, more than
    ``max_entries`` entries, more than ``max_uncompressed_bytes`` of content and a compression
    ratio over ``max_ratio`` (defaults: :meth:`Limits.from_settings`), checked on the declared
    sizes before anything is written and again on the bytes actually read. Executable bits are
    restored; other modes become 0644/0755.
    """
    verify_digest(data, digest)
    cache = Path(cache_dir)
    final = cache / digest
    if final.is_dir():
        return final
    limits = Limits.from_settings(max_entries=max_entries, max_unpacked=max_uncompressed_bytes,
                                  max_ratio=max_ratio)
    # everything that can be checked without writing is checked before touching the cache
    zf, members = _open_checked(data, digest, limits)
    with zf:
        cache.mkdir(parents=True, exist_ok=True)
        with _DigestLock(cache / f".{digest}.lock"):
            if final.is_dir():
                return final
            tmp = Path(tempfile.mkdtemp(prefix=f".{digest}.tmp-", dir=cache))
            try:
                _extract_members(zf, members, tmp, max_total=limits.max_unpacked)
                os.chmod(tmp, 0o755)
                try:
                    os.rename(tmp, final)
                except OSError as exc:
                    # another extractor not using our lock won: use theirs
                    if exc.errno in (errno.EEXIST, errno.ENOTEMPTY) and final.is_dir():
                        shutil.rmtree(tmp, ignore_errors=True)
                        return final
                    raise
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    return final


def extract_into(data: bytes, digest: str, dest: str | os.PathLike[str], *, limits: Limits) -> list[str]:
    """Extract an archive checked as :func:`extract_bundle` checks one (under ``limits``) into
    the folder ``dest``, which exists; a file already there is not replaced (refused). Returns
    the files' paths. Not atomic: what was written before a refusal stays (the caller's folder)."""
    verify_digest(data, digest)
    zf, members = _open_checked(data, digest, limits)
    with zf:
        _extract_members(zf, members, Path(dest), max_total=limits.max_unpacked)
    return ["/".join(m.parts) for m in members if not m.is_dir]
