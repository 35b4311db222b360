"""Source bundles: how a job's code travels to a worker.

A directory becomes a **deterministic zip** addressed by the SHA-256 of its bytes (64 lowercase
hex characters). The same tree always gives the same address, whatever the files' mtimes, the
order they were created in or the user's umask, so a bundle is uploaded once and extracted once
per worker. See ``docs/bundles.md`` (for users) and ``docs/adr/0001-source-bundles.md`` (why).

What goes in
    Every regular file under the directory, except what the rules exclude:

    * defaults: ``.git``, ``.venv/``, ``venv/``, ``__pycache__/``, ``*.pyc``, ``node_modules/``;
    * ``.gitignore`` and ``.gpulayerignore`` files, at the top and in any subdirectory, with git's
      semantics (pathspec): patterns are relative to the folder of the file that holds them, a
      deeper file overrides a shallower one, ``.gpulayerignore`` overrides the ``.gitignore``
      beside it, and the last matching pattern wins, so ``!pattern`` re-includes what an earlier
      rule (a default included) excluded. As in git, nothing inside an excluded directory can be
      re-included: the directory is never entered.

Symlinks
    A symlink to a regular file *inside* the directory is stored as a regular file holding the
    target's content and executable bit. Symlinks to directories, to anything outside the
    directory, and broken ones are never followed: they are excluded, and the inspection says so.
    Bundles therefore never contain symlink entries, and extraction refuses any.

The zip
    Entries sorted by path (``/`` separated), no directory entries, timestamps fixed at
    1980-01-01, permissions normalised to ``0644`` or ``0755`` (only the executable bit is kept,
    as in git), deflate at a fixed level. The address depends on zlib's output, so two machines
    with different zlib builds may give the same tree different addresses; that costs one extra
    upload, never a wrong result, since every extraction checks the bytes against the address.

Extraction
    :func:`extract_bundle` checks the SHA-256 first, refuses unsafe archives (absolute paths,
    ``..``, drive letters, backslashes, symlinks, duplicates, too many entries, compression
    bombs) and extracts once per cache directory, atomically, under a lock.
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
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

import pathspec

from gpulayer import config
from gpulayer.errors import BundleError

__all__ = [
    "DEFAULT_EXCLUDES",
    "DEFAULT_MAX_ENTRIES",
    "IGNORE_FILES",
    "Bundle",
    "BundleFile",
    "BundleTooLarge",
    "Excluded",
    "Inspection",
    "build_bundle",
    "build_from_inspection",
    "compute_digest",
    "extract_bundle",
    "format_size",
    "inspect_directory",
    "is_digest",
    "verify_digest",
]

#: Excluded from every bundle (gitignore syntax); a ``!pattern`` in an ignore file re-includes.
DEFAULT_EXCLUDES: tuple[str, ...] = (
    ".git",
    ".venv/",
    "venv/",
    "__pycache__/",
    "*.pyc",
    "node_modules/",
)

#: Ignore files read in every directory, in this order (a later one overrides an earlier one).
IGNORE_FILES: tuple[str, ...] = (".gitignore", ".gpulayerignore")

#: Most entries an archive may hold before extraction refuses it.
DEFAULT_MAX_ENTRIES = 100_000

_FIXED_DATE = (1980, 1, 1, 0, 0, 0)
_COMPRESS_LEVEL = 6
_CHUNK = 1024 * 1024
_DIGEST_RE = re.compile(r"[0-9a-f]{64}")
_DRIVE_RE = re.compile(r"^[A-Za-z]:")


# --------------------------------------------------------------------------------------------
# records


@dataclass(frozen=True)
class BundleFile:
    """One file of a bundle: its ``/`` separated path inside the bundle, size in bytes, and
    mode (``0o644`` or ``0o755``)."""

    path: str
    size: int
    mode: int

    @property
    def executable(self) -> bool:
        return bool(self.mode & 0o111)


class Excluded(NamedTuple):
    """A path left out of a bundle (directories end in ``/``) and the rule that left it out,
    e.g. ``default: __pycache__/`` or ``.gitignore:3: *.log``."""

    path: str
    rule: str


@dataclass
class Inspection:
    """What :func:`build_bundle` would put in a bundle of ``root``, and what it would leave out."""

    root: Path
    included: list[BundleFile] = field(default_factory=list)
    excluded: list[Excluded] = field(default_factory=list)
    #: absolute path each included file's bytes are read from (a symlink's target)
    sources: dict[str, Path] = field(default_factory=dict, repr=False)

    @property
    def total_size(self) -> int:
        """Bytes of all included files, before compression."""
        return sum(f.size for f in self.included)

    def largest(self, n: int = 10) -> list[BundleFile]:
        """The ``n`` largest included files, largest first (ties by path)."""
        return sorted(self.included, key=lambda f: (-f.size, f.path))[: max(n, 0)]


@dataclass
class Bundle:
    """A built source bundle: the zip's bytes and their SHA-256 address."""

    digest: str
    data: bytes = field(repr=False)
    files: list[BundleFile]

    @property
    def size(self) -> int:
        return len(self.data)


class BundleTooLarge(BundleError):
    """The bundle would be larger than the limit. Carries the numbers the message names."""

    code = "bundle_too_large"

    def __init__(
        self, message: str, *, limit: int, size: int, total_size: int,
        largest: list[BundleFile],
    ) -> None:
        super().__init__(message)
        self.limit = limit
        #: compressed bytes written when the limit was crossed (the bundle is at least this big)
        self.size = size
        #: bytes of all included files before compression
        self.total_size = total_size
        self.largest = largest


# --------------------------------------------------------------------------------------------
# helpers


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
# inspection: what goes in


class _Layer:
    """The rules of one ignore source, anchored at a folder (``base``, "" or ``"a/b/"``)."""

    def __init__(self, base: str, label: str, lines: list[str], *, numbered: bool) -> None:
        self.base = base
        self.label = label
        self.lines = lines
        self.numbered = numbered
        # blank lines give no pattern in pathspec; a comment keeps indexes equal to lines
        self.spec = pathspec.GitIgnoreSpec.from_lines([ln if ln else "#" for ln in lines])
        if len(self.spec.patterns) != len(lines):  # pragma: no cover - pathspec changed
            raise BundleError(f"cannot read ignore rules from {label}")

    def check(self, rel: str) -> tuple[bool, str] | None:
        """``(excluded, rule)`` when a rule of this layer matches ``rel``, else None."""
        if not rel.startswith(self.base):
            return None
        result = self.spec.check_file(rel[len(self.base):])
        if result.include is None or result.index is None:
            return None
        line = self.lines[result.index].strip()
        where = f"{self.label}:{result.index + 1}" if self.numbered else self.label
        rule = f"{where}: {line}"
        return bool(result.include), rule


def _default_layer() -> _Layer:
    return _Layer("", "default", list(DEFAULT_EXCLUDES), numbered=False)


def _read_layers(directory: Path, base: str) -> list[_Layer]:
    layers = []
    for name in IGNORE_FILES:
        path = directory / name
        try:
            if not path.is_file():
                continue
            text = path.read_bytes().decode("utf-8", errors="surrogateescape")
        except OSError as exc:
            raise BundleError(f"cannot read ignore file {path}: {exc.strerror or exc}") from None
        layers.append(_Layer(base, base + name, text.splitlines(), numbered=True))
    return layers


def _verdict(layers: list[_Layer], rel: str) -> str | None:
    """The rule that excludes ``rel`` (a directory ends in ``/``), or None if it is included."""
    excluded_by: str | None = None
    for layer in layers:
        hit = layer.check(rel)
        if hit is not None:
            excluded, rule = hit
            excluded_by = rule if excluded else None
    return excluded_by


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _resolve_root(directory: str | os.PathLike[str]) -> Path:
    given = Path(directory).expanduser()
    if not given.exists():
        raise BundleError(f"source directory {str(directory)!r} does not exist")
    if not given.is_dir():
        raise BundleError(f"source directory {str(directory)!r} is not a directory")
    return given.resolve()


def inspect_directory(directory: str | os.PathLike[str]) -> Inspection:
    """List what a bundle of ``directory`` holds and what the rules leave out, and why.

    Raises :class:`BundleError` naming ``directory`` when it is missing or not a directory.
    """
    root = _resolve_root(directory)
    root_str = str(root)
    inspection = Inspection(root=root)

    def walk(abs_dir: Path, rel_dir: str, layers: list[_Layer]) -> None:
        try:
            with os.scandir(abs_dir) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            raise BundleError(
                f"cannot list {abs_dir} (in source directory {root_str}): {exc.strerror or exc}"
            ) from None
        for entry in entries:
            rel = rel_dir + entry.name
            abs_path = Path(entry.path)
            source = abs_path
            link_problem: str | None = None
            try:
                is_link = entry.is_symlink()
                if is_link:
                    target = os.path.realpath(abs_path)
                    if not _within(target, root_str):
                        link_problem = "symlink to outside the directory (not followed)"
                        is_dir = False
                    elif not os.path.exists(target):
                        link_problem = "broken symlink"
                        is_dir = False
                    elif os.path.isdir(target):
                        link_problem = "symlink to a directory (not followed)"
                        is_dir = True
                    else:
                        source = Path(target)
                        is_dir = False
                else:
                    is_dir = entry.is_dir(follow_symlinks=False)
                st = os.stat(source) if link_problem is None else None
            except OSError as exc:
                raise BundleError(f"cannot read {abs_path}: {exc.strerror or exc}") from None

            shown = rel + "/" if is_dir else rel
            rule = _verdict(layers, shown)
            if rule is not None:
                inspection.excluded.append(Excluded(shown, rule))
                continue
            if link_problem is not None:
                inspection.excluded.append(Excluded(shown, link_problem))
                continue
            if "\\" in entry.name:
                inspection.excluded.append(
                    Excluded(shown, "unsupported name: contains a backslash")
                )
                continue
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                inspection.excluded.append(Excluded(shown, "unsupported name: not valid UTF-8"))
                continue
            if is_dir:
                walk(abs_path, rel + "/", layers + _read_layers(abs_path, rel + "/"))
                continue
            if st is None or not stat.S_ISREG(st.st_mode):
                inspection.excluded.append(Excluded(shown, "not a regular file"))
                continue
            mode = 0o755 if st.st_mode & 0o111 else 0o644
            inspection.included.append(BundleFile(rel, st.st_size, mode))
            inspection.sources[rel] = source

    walk(root, "", [_default_layer(), *_read_layers(root, "")])
    inspection.included.sort(key=lambda f: f.path)
    inspection.excluded.sort(key=lambda e: e.path)
    return inspection


# --------------------------------------------------------------------------------------------
# building


def _zip_info(file: BundleFile) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(file.path, date_time=_FIXED_DATE)
    info.create_system = 3  # Unix, so that the mode in external_attr is honoured
    info.external_attr = (stat.S_IFREG | file.mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    # ``compress_level`` since Python 3.13, ``_compresslevel`` before
    setattr(info, "compress_level" if hasattr(info, "compress_level") else "_compresslevel",
            _COMPRESS_LEVEL)
    info.file_size = file.size  # lets zipfile choose zip64 deterministically
    return info


def _too_large(
    root: Path, inspection: Inspection, limit: int, written: int, finished: bool,
) -> BundleTooLarge:
    largest = inspection.largest(5)
    listing = ", ".join(f"{f.path} ({format_size(f.size)})" for f in largest)
    size_text = (
        f"{format_size(written)} ({written} bytes) compressed" if finished
        else f"more than {format_size(limit)} compressed (building stopped at {written} bytes)"
    )
    return BundleTooLarge(
        f"source bundle of {root} is too large: {size_text}, from "
        f"{len(inspection.included)} files of {format_size(inspection.total_size)}; the limit is "
        f"{format_size(limit)} ({limit} bytes; set GPULAYER_MAX_BUNDLE_MB to change it). "
        f"Largest files: {listing}. Exclude what the job does not need with a .gpulayerignore "
        f"file, and check with `gpulayer bundle inspect {root}`.",
        limit=limit, size=written, total_size=inspection.total_size, largest=largest,
    )


def _write_zip(
    out: BinaryIO, inspection: Inspection, limit: int | None,
) -> tuple[list[BundleFile], bool]:
    """Write the zip into ``out``; stop early (returning False) once it exceeds ``limit``."""
    written: list[BundleFile] = []
    with zipfile.ZipFile(out, "w", allowZip64=True) as zf:
        for file in inspection.included:
            info = _zip_info(file)
            source = inspection.sources[file.path]
            try:
                with open(source, "rb") as src, zf.open(info, "w") as dst:
                    while chunk := src.read(_CHUNK):
                        dst.write(chunk)
                        if limit is not None and out.tell() > limit:
                            return written, False
            except OSError as exc:
                raise BundleError(f"cannot read {source}: {exc.strerror or exc}") from None
            written.append(file)
            if limit is not None and out.tell() > limit:
                return written, False
    return written, True


def build_bundle(directory: str | os.PathLike[str], *, max_bytes: int | None = None) -> Bundle:
    """Zip ``directory`` deterministically and address it by SHA-256.

    ``max_bytes`` is the largest bundle accepted (default :func:`gpulayer.config.max_bundle_bytes`,
    from ``GPULAYER_MAX_BUNDLE_MB``). A bigger bundle raises :class:`BundleTooLarge` naming the
    limit, the size and the largest files; a missing directory raises :class:`BundleError`.
    """
    return build_from_inspection(inspect_directory(directory), max_bytes=max_bytes)


def build_from_inspection(inspection: Inspection, *, max_bytes: int | None = None) -> Bundle:
    """:func:`build_bundle` for a directory already inspected: zips exactly
    ``inspection.included``, so what was shown is what is built."""
    limit = config.max_bundle_bytes() if max_bytes is None else int(max_bytes)
    buf = io.BytesIO()
    _, complete = _write_zip(buf, inspection, limit)
    size = buf.seek(0, io.SEEK_END)
    if not complete or size > limit:
        raise _too_large(inspection.root, inspection, limit, size, complete)
    data = buf.getvalue()
    return Bundle(digest=compute_digest(data), data=data, files=list(inspection.included))


# --------------------------------------------------------------------------------------------
# extraction


class _Member(NamedTuple):
    info: zipfile.ZipInfo
    parts: tuple[str, ...]
    is_dir: bool
    executable: bool


def _check_members(
    zf: zipfile.ZipFile, *, max_entries: int, max_total: int,
) -> list[_Member]:
    infos = zf.infolist()
    if len(infos) > max_entries:
        raise BundleError(
            f"bundle has {len(infos)} entries, more than the {max_entries} allowed"
        )
    members: list[_Member] = []
    seen: set[tuple[str, ...]] = set()
    files: set[tuple[str, ...]] = set()
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
            files.add(parts)
            declared += info.file_size
            if declared > max_total:
                raise BundleError(
                    f"bundle would extract to more than {format_size(max_total)} "
                    f"({max_total} bytes; {declared} bytes declared by the first "
                    f"{len(files)} files); refusing a possible compression bomb"
                )
        members.append(_Member(info, parts, is_dir, bool(mode & 0o111)))
    # a file may not also be a folder of another entry
    for parts in seen:
        for i in range(1, len(parts)):
            if parts[:i] in files:
                raise BundleError(
                    f"bundle entry {'/'.join(parts)!r} lies under {'/'.join(parts[:i])!r}, "
                    "which is a file"
                )
    return members


def _extract_members(
    zf: zipfile.ZipFile, members: list[_Member], dest: Path, *, max_total: int,
) -> None:
    total = 0
    dest_str = str(dest)
    for member in members:
        target = dest.joinpath(*member.parts)
        if not _within(os.path.normpath(target), dest_str):  # belt and braces
            raise BundleError(f"bundle entry {member.info.filename!r} escapes the bundle")
        if member.is_dir:
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        mode = 0o755 if member.executable else 0o644
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
        os.chmod(target, mode)


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
    max_entries: int = DEFAULT_MAX_ENTRIES,
    max_uncompressed_bytes: int | None = None,
) -> Path:
    """Extract bundle ``data`` once into ``cache_dir/<digest>/`` and return that folder.

    Checks ``data`` against ``digest`` first. An existing ``cache_dir/<digest>/`` is reused: it
    only ever appears complete, because extraction happens in a temporary folder beside it that
    is renamed into place, under a lock, so concurrent callers (threads or processes) extract
    once and all get the same folder.

    Refuses with :class:`BundleError`, leaving nothing in ``cache_dir``: a digest mismatch, a
    malformed zip, absolute paths, ``..`` or empty components, drive letters, backslashes,
    symlink or special entries, duplicates, a file that is also a folder, more than
    ``max_entries`` entries, and more than ``max_uncompressed_bytes`` of content (default ten
    times :func:`gpulayer.config.max_bundle_bytes`), checked on the declared sizes and again on
    the bytes actually read. Executable bits are restored; other modes become 0644/0755.
    """
    verify_digest(data, digest)
    cache = Path(cache_dir)
    final = cache / digest
    if final.is_dir():
        return final
    max_total = (
        10 * config.max_bundle_bytes() if max_uncompressed_bytes is None
        else int(max_uncompressed_bytes)
    )
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
        raise BundleError(f"bundle {digest} is not a valid zip archive: {exc}") from None
    with zf:
        # everything that can be checked without writing is checked before touching the cache
        members = _check_members(zf, max_entries=max_entries, max_total=max_total)
        cache.mkdir(parents=True, exist_ok=True)
        with _DigestLock(cache / f".{digest}.lock"):
            if final.is_dir():
                return final
            tmp = Path(tempfile.mkdtemp(prefix=f".{digest}.tmp-", dir=cache))
            try:
                _extract_members(zf, members, tmp, max_total=max_total)
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
