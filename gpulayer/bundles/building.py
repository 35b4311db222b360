"""Source bundles, building: what goes into a directory's bundle, and the deterministic zip.

See :mod:`gpulayer.bundles` for the rules (what goes in, symlinks, the zip's format).
"""

from __future__ import annotations

import functools
import io
import os
import stat
import threading
import zipfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import pathspec

from gpulayer import config
from gpulayer.bundles.archive import _within, check_archive, compute_digest, format_size
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

_FIXED_DATE = (1980, 1, 1, 0, 0, 0)
_COMPRESS_LEVEL = 6
_CHUNK = 1024 * 1024


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
    #: each included file's (device, inode, mtime_ns, ctime_ns): what says it changed
    stamps: dict[str, tuple[int, int, int, int]] = field(default_factory=dict, repr=False)

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


@functools.cache
def _default_layer() -> _Layer:
    """The built-in rules, compiled once (a layer is not changed after it is made; compiling
    these was most of a ``.remote()``'s walk of an unchanged directory)."""
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
    home = _state_directory()

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
            if is_dir and st is not None and home == (st.st_dev, st.st_ino):  # (whatever the ignore files say)
                inspection.excluded.append(Excluded(shown, HOME_EXCLUDED))
                continue
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
            inspection.stamps[rel] = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)

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

    The directory is walked every time (its rules and files as they are now), but a bundle
    whose files all have the same size, mode, inode, mtime and ctime as when it was last
    built in this process is not zipped and hashed again: a loop of ``.remote()`` calls pays
    for a stat of each file, not for reading it.
    """
    inspection = inspect_directory(directory)
    limit = config.max_bundle_bytes() if max_bytes is None else int(max_bytes)
    key = (str(inspection.root), limit)
    stamp = tuple((f, inspection.stamps[f.path]) for f in inspection.included)
    with _built_lock:
        known = _built.get(key)
    if known is not None and known[0] == stamp:
        return known[1]
    bundle = build_from_inspection(inspection, max_bytes=limit)
    with _built_lock:
        _built[key] = (stamp, bundle)
        _built.move_to_end(key)
        while len(_built) > _BUILT_KEPT:
            _built.popitem(last=False)
    return bundle


#: the bundles this process built last, by (root, limit), with the stamp of their files
_built: OrderedDict[tuple[str, int], tuple[tuple[Any, ...], Bundle]] = OrderedDict()
_built_lock = threading.Lock()
_BUILT_KEPT = 8


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
    try:  # what every receiver would refuse (too many files, too much, too compressible)
        check_archive(data)
    except BundleError as exc:
        raise BundleError(
            f"source bundle of {inspection.root} would be refused: {exc}. Exclude what the job does "
            f"not need with a .gpulayerignore file, and check with `gpulayer bundle inspect {inspection.root}`."
        ) from None
    return Bundle(digest=compute_digest(data), data=data, files=list(inspection.included))


