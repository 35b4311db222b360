"""Source bundles, building: what goes into a directory's bundle, and the deterministic zip.

See :mod:`gpulayer.bundles` for the rules (what goes in, symlinks, the zip's format).
"""

from __future__ import annotations

import errno
import io
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from gpulayer import config
from gpulayer.bundles.archive import Limits, _within, check_archive, compute_digest, format_size
from gpulayer.bundles.ignoring import DEFAULT_EXCLUDES, IGNORE_FILES, _default_layer, _Layer, _verdict
from gpulayer.bundles.zipping import _Entry, _write_deflated, _write_zipfile, deflated_fits
from gpulayer.errors import BundleError

__all__ = [
    "DEFAULT_EXCLUDES",
    "IGNORE_FILES",
    "Bundle",
    "BundleFile",
    "BundleTooLarge",
    "Excluded",
    "Inspection",
    "build_bundle",
    "build_from_inspection",
    "inspect_directory",
]

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
    #: the included files that are symlinks, and their targets (see :meth:`source`)
    links: dict[str, Path] = field(default_factory=dict, repr=False)
    #: each included file's (device, inode, mtime_ns, ctime_ns): what says it changed
    stamps: dict[str, tuple[int, int, int, int]] = field(default_factory=dict, repr=False)

    def source(self, path: str) -> Path:
        """The absolute path the bytes of the included file ``path`` are read from."""
        return self.links.get(path) or self.root / path

    @property
    def sources(self) -> dict[str, Path]:
        """Each included file's :meth:`source` (a new mapping at each use: for one file, call
        :meth:`source`)."""
        return {f.path: self.source(f.path) for f in self.included}

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
    #: where each file's compressed bytes lie in ``data``, for the next build of the same
    #: tree to reuse those of the files that did not change (see :func:`build_bundle`)
    entries: dict[str, _Entry] = field(default_factory=dict, repr=False, compare=False)

    @property
    def size(self) -> int:
        return len(self.data)


class BundleRefused(BundleError):
    """The bundle would be refused by every receiver (too many files, too much unpacked,
    too compressible); ``reason`` says which, without the advice the message adds."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


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
# inspection: what goes in


#: why GPULAYER_HOME is left out of a bundle of a directory that holds it
HOME_EXCLUDED = "GPULAYER_HOME: this machine's GPUlayer state (its database, bundles, caches)"


def _state_directory() -> tuple[int, int] | None:
    """GPULAYER_HOME's (device, inode), where it exists (not created here): the same folder
    however it is reached (a case-insensitive file system, a bind mount, a ``..``)."""
    raw = config.settings().home or "~/.gpulayer"
    try:
        st = os.stat(Path(raw).expanduser())
    except (OSError, RuntimeError):
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def _resolve_root(directory: str | os.PathLike[str]) -> Path:
    given = Path(directory).expanduser()
    if not given.exists():
        raise BundleError(f"bundle directory {str(directory)!r} does not exist; accepted: the path of a directory")
    if not given.is_dir():
        raise BundleError(f"bundle directory {str(directory)!r} is not a directory; accepted: the path of a directory")
    return given.resolve()


def _ignore_stamps(folder: str) -> tuple[tuple[int, int, int, int, int] | None, ...]:
    """Each of :data:`IGNORE_FILES` in ``folder``: its (device, inode, size, mtime_ns,
    ctime_ns) where it is a file (a link to one counts), else None."""
    out: list[tuple[int, int, int, int, int] | None] = []
    for name in IGNORE_FILES:
        path = os.path.join(folder, name)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            out.append(None)
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                out.append(None)
                continue
            raise BundleError(f"cannot read ignore file {path}: {exc.strerror or exc}") from None
        out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                   if stat.S_ISREG(st.st_mode) else None)
    return tuple(out)


def _read_layers(folder: str, base: str, stamps: tuple[Any, ...]) -> list[_Layer]:
    """The rules of the ignore files that ``stamps`` (:func:`_ignore_stamps`) found."""
    layers = []
    for name, found in zip(IGNORE_FILES, stamps, strict=True):
        if found is None:
            continue
        path = os.path.join(folder, name)
        try:
            with open(path, "rb") as f:
                # (a byte order mark first is skipped, as git skips it)
                text = f.read().removeprefix(b"\xef\xbb\xbf").decode("utf-8", errors="surrogateescape")
        except OSError as exc:
            raise BundleError(f"cannot read ignore file {path}: {exc.strerror or exc}") from None
        layers.append(_Layer(base, base + name, text.splitlines(), numbered=True))
    return layers


#: A folder's listing or an ignore file read less than this long after it last changed is
#: not remembered: a change within the same tick of the file system's clock (a few
#: milliseconds on Linux, 2 s on FAT) would leave its timestamps as they were (git's "racy"
#: entries). The next walk reads it again.
RACY_SECONDS = 2.0

#: the kinds of a listing's entries
_DIR, _FILE, _OUT = 0, 1, 2
#: why an entry that is neither a folder nor a regular file is left out
_SPECIAL = "not a regular file"


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def _settled(stamps: Iterable[tuple[int, ...] | None], read_ns: int) -> bool:
    """Whether each time of these stamps (their last two fields: mtime_ns, ctime_ns) lies
    further than :data:`RACY_SECONDS` from ``read_ns``, when they were read: a change after
    that read would set a time of now, which differs from each of them. (A time far in the
    future, from a skewed clock or an archive, is as good as an old one.)"""
    racy = int(RACY_SECONDS * 1e9)
    return all(s is None or all(abs(t - read_ns) > racy for t in (s[-2], s[-1])) for s in stamps)


class _Listing(NamedTuple):
    """What a walk found in one folder, for the next walk of the same tree. It holds while the
    folder's stamp is the same (adding, removing or renaming an entry moves its mtime) and so
    are the ignore files in force (``context``: their stamps, here and in every folder above,
    and GPULAYER_HOME's identity); each file it keeps is still looked at (a stat) for its
    size, mode and stamp, so an edit is always seen."""

    stamp: tuple[int, int, int, int]
    context: tuple[Any, ...]
    #: the rules of its own ignore files
    layers: list[_Layer]
    #: (name, kind, what, ident): ``what`` is the rule or problem that left a :data:`_OUT`
    #: entry out (whose name ends in ``/`` for a folder), a :data:`_FILE` symlink's target,
    #: else None; ``ident`` the (device, inode) of an entry whose verdict came from what it is
    #: (a folder: GPULAYER_HOME or not; a special file), looked at again at each reuse (a
    #: mount on it changes neither the folder's stamp nor its name), else None
    entries: list[tuple[str, int, str | None, tuple[int, int] | None]]
    #: the record last made of each file (the same object while its size and mode are, so
    #: that the lists of two walks compare quickly)
    made: dict[str, BundleFile]


#: per tree walked lately (by its root, the latest last), its folders' listings by path
_listings: OrderedDict[str, dict[str, _Listing]] = OrderedDict()
_listings_lock = threading.Lock()


#: what a look at a folder's entries found: its files' stats, and its subfolders' by name
_Looked = tuple[list[tuple[str, os.stat_result]], dict[str, os.stat_result]]


def _look_again(prefix: str, listing: _Listing) -> _Looked | None:
    """The entries of a remembered listing of the folder ``prefix`` (ending in the separator)
    that are looked at each time, looked at now: None when one is gone, a file is not a
    regular one any more, or an entry with an ``ident`` has another (the folder is listed
    again)."""
    files = []
    folders = {}
    for name, kind, what, ident in listing.entries:
        if kind != _FILE and ident is None:
            continue
        try:
            st = os.stat(what if kind == _FILE and what else prefix + name.rstrip("/"))
        except OSError:
            return None
        if kind == _FILE:
            if not stat.S_ISREG(st.st_mode):
                return None
            files.append((name, st))
            continue
        if (st.st_dev, st.st_ino) != ident:
            return None
        if kind == _DIR:
            folders[name] = st
    return files, folders


def inspect_directory(directory: str | os.PathLike[str]) -> Inspection:
    """List what a bundle of ``directory`` holds and what the rules leave out, and why.

    A folder of a tree walked lately in this process is not listed again while it and the
    ignore files in force there are unchanged (see :class:`_Listing`); every included file
    is still looked at. Raises :class:`BundleError` naming ``directory`` when it is missing or
    not a directory.
    """
    root = _resolve_root(directory)
    root_str = str(root)
    inspection = Inspection(root=root)
    home = _state_directory()
    with _listings_lock:
        known = _listings.get(root_str, {})
    fresh: dict[str, _Listing] = {}
    started = time.time_ns()

    def listed(folder: str, rel_dir: str, layers: list[_Layer], context: tuple[Any, ...],
               st: os.stat_result, own: tuple[Any, ...],
               settled: bool) -> tuple[_Listing, _Looked]:
        """The folder listed now, and the stat of each file and subfolder it keeps."""
        listed_at = time.time_ns()
        own_layers = _read_layers(folder, rel_dir, own)
        rules = layers + own_layers
        try:
            with os.scandir(folder) as it:
                found = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            raise BundleError(
                f"cannot list {folder} (in source directory {root_str}): {exc.strerror or exc}"
            ) from None
        entries: list[tuple[str, int, str | None, tuple[int, int] | None]] = []
        files: list[tuple[str, os.stat_result]] = []
        folders: dict[str, os.stat_result] = {}
        links = False
        for entry in found:
            target: str | None = None
            link_problem: str | None = None
            try:
                if entry.is_symlink():
                    links = True
                    target = os.path.realpath(entry.path)
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
                        is_dir = False
                else:
                    is_dir = entry.is_dir(follow_symlinks=False)
                est = os.stat(target or entry.path) if link_problem is None else None
            except OSError as exc:
                raise BundleError(f"cannot read {entry.path}: {exc.strerror or exc}") from None

            shown = entry.name + "/" if is_dir else entry.name
            ident = None if est is None else (est.st_dev, est.st_ino)
            why: str | None = None
            if is_dir and ident is not None and home == ident:  # (whatever the ignore files say)
                why = HOME_EXCLUDED
            else:
                why = _verdict(rules, rel_dir + shown) or link_problem
            if why is None and "\\" in entry.name:
                why = "unsupported name: contains a backslash"
            if why is None:
                try:
                    entry.name.encode("utf-8")
                except UnicodeEncodeError:
                    why = "unsupported name: not valid UTF-8"
            if why is None and not is_dir and (est is None or not stat.S_ISREG(est.st_mode)):
                why = _SPECIAL
            if why is not None:  # (left out by a rule: whatever it is; else for what it is)
                entries.append((shown, _OUT, why, ident if why in (HOME_EXCLUDED, _SPECIAL) else None))
            elif is_dir:
                assert est is not None and ident is not None
                entries.append((entry.name, _DIR, None, ident))
                folders[entry.name] = est
            else:
                assert est is not None
                entries.append((entry.name, _FILE, target, None))
                files.append((entry.name, est))
        listing = _Listing(_stamp(st), context, own_layers, entries, {})
        if settled and not links and _settled([listing.stamp], listed_at):
            fresh[folder] = listing
        return listing, (files, folders)

    def walk(folder: str, rel_dir: str, layers: list[_Layer], context: tuple[Any, ...],
             st: os.stat_result, settled: bool) -> list[tuple[Any, ...]]:
        """One folder's files and what it leaves out; returns its subfolders' walks, to be
        made (a loop, not a recursion: a tree may be deeper than Python's stack)."""
        own = _ignore_stamps(folder)
        context = (*context, own)
        settled = settled and _settled(own, started)
        prefix = folder if folder.endswith(os.sep) else folder + os.sep
        listing = known.get(folder)
        looked = None
        if listing is not None and listing.stamp == _stamp(st) and listing.context == context:
            looked = _look_again(prefix, listing)
            if looked is not None and settled:
                fresh[folder] = listing
        if listing is None or looked is None:  # (not known, changed, or an entry is not what it was)
            listing, looked = listed(folder, rel_dir, layers, context, st, own, settled)
        files, folders = looked
        made = listing.made
        for name, fst in files:
            mode = 0o755 if fst.st_mode & 0o111 else 0o644
            file = made.get(name)
            if file is None or file.size != fst.st_size or file.mode != mode:
                file = made[name] = BundleFile(rel_dir + name, fst.st_size, mode)
            inspection.included.append(file)
            inspection.stamps[file.path] = (fst.st_dev, fst.st_ino, fst.st_mtime_ns, fst.st_ctime_ns)
        for name, kind, what, _ in listing.entries:
            if kind == _FILE and what is not None:  # (a symlink's target)
                inspection.links[rel_dir + name] = Path(what)
        rules = layers + listing.layers
        below = []
        for name, kind, what, _ in listing.entries:
            if kind == _OUT:
                assert what is not None
                inspection.excluded.append(Excluded(rel_dir + name, what))
            elif kind == _DIR:
                below.append((prefix + name, rel_dir + name + "/", rules, context, folders[name], settled))
        return below

    try:
        root_st = os.stat(root_str)
    except OSError as exc:
        raise BundleError(f"cannot read source directory {str(directory)!r}: {exc.strerror or exc}") from None
    walks: list[tuple[Any, ...]] = [(root_str, "", [_default_layer()], (home,), root_st, True)]
    while walks:
        walks.extend(walk(*walks.pop()))
    with _listings_lock:
        _listings[root_str] = fresh
        _listings.move_to_end(root_str)
        while len(_listings) > _BUILT_KEPT:
            _listings.popitem(last=False)
    inspection.included.sort(key=lambda f: f.path)
    inspection.excluded.sort(key=lambda e: e.path)
    return inspection


# --------------------------------------------------------------------------------------------
# building


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


def build_bundle(directory: str | os.PathLike[str], *, max_bytes: int | None = None) -> Bundle:
    """Zip ``directory`` deterministically and address it by SHA-256.

    ``max_bytes`` is the largest bundle accepted (default :func:`gpulayer.config.max_bundle_bytes`,
    from ``GPULAYER_MAX_BUNDLE_MB``). A bigger bundle raises :class:`BundleTooLarge` naming the
    limit, the size and the largest files; a missing directory raises :class:`BundleError`.

    The directory is walked every time (its rules and files as they are now, see
    :func:`inspect_directory`), but a bundle whose files all have the same size, mode,
    inode, mtime and ctime as when it was last built in this process is not zipped and
    hashed again: a loop of ``.remote()`` calls pays for a stat of each file, not for reading
    it. A bundle with a file changed within :data:`RACY_SECONDS` of its build is not kept
    (a second change in the same tick of the file system's clock would not show).
    """
    started = time.time_ns()
    inspection = inspect_directory(directory)
    limit = config.max_bundle_bytes() if max_bytes is None else int(max_bytes)
    key = (str(inspection.root), limit)
    # (the records are the same objects while unchanged: the lists compare quickly)
    stamp = (inspection.included, inspection.stamps)
    with _built_lock:
        known = _built.get(key)
    if known is not None and known[0] == stamp:
        return known[1]
    bundle = build_from_inspection(inspection, max_bytes=limit, previous=known[1] if known else None)
    if not _settled(inspection.stamps.values(), started):
        return bundle
    with _built_lock:
        _built[key] = (stamp, bundle)
        _built.move_to_end(key)
        while len(_built) > _BUILT_KEPT:
            _built.popitem(last=False)
    return bundle


#: the bundles this process built last, by (root, limit), with the stamp of their files
_built: OrderedDict[tuple[str, int], tuple[tuple[list[BundleFile], dict[str, Any]], Bundle]] = OrderedDict()
_built_lock = threading.Lock()
_BUILT_KEPT = 8


def build_from_inspection(inspection: Inspection, *, max_bytes: int | None = None,
                          previous: Bundle | None = None) -> Bundle:
    """:func:`build_bundle` for a directory already inspected: zips exactly
    ``inspection.included``, so what was shown is what is built. ``previous``: a bundle of
    the same tree built earlier in this process, whose files' compressed bytes are reused
    where they did not change."""
    limit = config.max_bundle_bytes() if max_bytes is None else int(max_bytes)
    _refuse_what_the_sizes_say(inspection)
    buf = io.BytesIO()
    entries: dict[str, _Entry] = {}
    if deflated_fits(inspection, limit):
        _, complete, entries = _write_deflated(buf, inspection, limit, previous)
    else:
        _, complete = _write_zipfile(buf, inspection, limit)
    size = buf.seek(0, io.SEEK_END)
    if not complete or size > limit:
        raise _too_large(inspection.root, inspection, limit, size, complete)
    data = buf.getvalue()
    try:  # what every receiver would refuse (too many files, too much, too compressible)
        check_archive(data)
    except BundleError as exc:
        raise _refused(inspection.root, str(exc)) from None
    return Bundle(digest=compute_digest(data), data=data, files=list(inspection.included), entries=entries)


def _refused(root: Path, why: str) -> BundleRefused:
    return BundleRefused(
        f"source bundle of {root} would be refused: {why}. Exclude what the job does not need with a "
        f".gpulayerignore file, and check with `gpulayer bundle inspect {root}`.",
        reason=f"source bundle of {root} would be refused: {why}")


def _refuse_what_the_sizes_say(inspection: Inspection) -> None:
    """Refuse, before a file is read, a bundle whose files' number or sizes (their stat)
    are more than every receiver allows: a large file of zeros, which compresses 1000:1, is
    not read and compressed to the compressed limit (100 GB) to learn it."""
    limits = Limits.from_settings()
    count, total = len(inspection.included), inspection.total_size
    if count > limits.max_entries:
        raise _refused(inspection.root, f"it has {count} files, more than the {limits.max_entries} entries allowed "
                                        "(GPULAYER_MAX_BUNDLE_FILES)")
    if total > limits.max_unpacked:
        largest = ", ".join(f"{f.path} ({format_size(f.size)})" for f in inspection.largest(5))
        raise _refused(inspection.root, f"its files come to {format_size(total)} ({total} bytes), more than the "
                                        f"{format_size(limits.max_unpacked)} a bundle may extract to "
                                        f"(GPULAYER_MAX_BUNDLE_UNPACKED_MB); largest files: {largest}")


