"""Source bundles, the zip: deterministic, and what a build reuses of the last one.

Entries sorted by path, no folder entries, the fixed date 1980-01-01, mode 0644 or 0755,
deflate at level 6 (see :mod:`gpulayer.bundles`). :func:`_write_deflated` writes it here, byte
for byte what :func:`_write_zipfile` (Python's ``zipfile``) writes of the same entries, so
that a file unchanged since the last build of the tree is not read and compressed again;
``zipfile`` writes the bundles too large for records without zip64 (:func:`deflated_fits`).
"""

from __future__ import annotations

import io
import stat
import struct
import zipfile
import zlib
from typing import TYPE_CHECKING, BinaryIO, NamedTuple

from gpulayer.errors import BundleError

if TYPE_CHECKING:
    from gpulayer.bundles.building import Bundle, BundleFile, Inspection

_FIXED_DATE = (1980, 1, 1, 0, 0, 0)
_COMPRESS_LEVEL = 6
_CHUNK = 1024 * 1024


class _Entry(NamedTuple):
    """One file of a built bundle: what it was built from (its stamp, size and mode), its
    CRC-32, and where its compressed bytes lie in the bundle's data."""

    stamp: tuple[int, int, int, int]
    size: int
    mode: int
    crc: int
    start: int
    length: int


#: the zip's records (PKWARE's APPNOTE 4.3.7, 4.3.12, 4.3.16), as Python's ``zipfile`` writes
#: them for an entry of this format: version 2.0, deflated, no extra field, no comment
_LOCAL = struct.Struct("<4s2B4HL2L2H")
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_END = struct.Struct("<4s4H2LH")
_VERSION = 20
_DEFLATED = 8
_UTF8_NAME = 0x800
_DOS_DATE = (_FIXED_DATE[0] - 1980) << 9 | _FIXED_DATE[1] << 5 | _FIXED_DATE[2]
_DOS_TIME = _FIXED_DATE[3] << 11 | _FIXED_DATE[4] << 5 | _FIXED_DATE[5] // 2
#: past these (a file of 2 GiB, an archive of 1 GiB, 65,535 entries) ``zipfile`` writes zip64
#: records: such a bundle is written by ``zipfile`` itself (:func:`_write_zipfile`)
_SMALL_FILE = int(((1 << 31) - 1) / 1.05)
_SMALL_ARCHIVE = 1 << 30
_SMALL_COUNT = 0xFFFF


def _name(path: str) -> tuple[bytes, int]:
    try:
        return path.encode("ascii"), 0
    except UnicodeEncodeError:
        return path.encode("utf-8"), _UTF8_NAME


def _write_deflated(
    out: io.BytesIO, inspection: Inspection, limit: int, previous: Bundle | None,
) -> tuple[list[BundleFile], bool, dict[str, _Entry]]:
    """:func:`_write_zipfile`'s archive, byte for byte, written here so that a file unchanged
    since ``previous`` (the same stamp, size and mode) is not read and compressed again: its
    compressed bytes are taken from ``previous``. Stops early (False) past ``limit``."""
    old = previous.entries if previous is not None else {}
    old_data = memoryview(previous.data) if previous is not None else memoryview(b"")
    written: list[BundleFile] = []
    entries: dict[str, _Entry] = {}
    central = []
    for file in inspection.included:
        stamp = inspection.stamps[file.path]
        was = old.get(file.path)
        name, flags = _name(file.path)
        offset = out.tell()
        if was is not None and was.stamp == stamp and was.size == file.size and was.mode == file.mode:
            crc, size, data = was.crc, was.size, old_data[was.start:was.start + was.length]
            out.write(_LOCAL.pack(b"PK\x03\x04", _VERSION, 0, flags, _DEFLATED, _DOS_TIME, _DOS_DATE,
                                  crc, was.length, file.size, len(name), 0))
            out.write(name)
            out.write(data)
            length = was.length
        else:
            source = inspection.source(file.path)
            out.write(_LOCAL.pack(b"PK\x03\x04", _VERSION, 0, flags, _DEFLATED, _DOS_TIME, _DOS_DATE,
                                  0, 0, file.size, len(name), 0))  # (CRC and length once known)
            out.write(name)
            crc, length, size = 0, 0, 0
            deflate = zlib.compressobj(_COMPRESS_LEVEL, zlib.DEFLATED, -15)
            try:
                with open(source, "rb") as src:
                    while chunk := src.read(_CHUNK):
                        size += len(chunk)
                        crc = zlib.crc32(chunk, crc)
                        part = deflate.compress(chunk)
                        length += len(part)
                        out.write(part)
                        if out.tell() > limit:
                            return written, False, entries
            except OSError as exc:
                raise BundleError(f"cannot read {source}: {exc.strerror or exc}") from None
            part = deflate.flush()
            length += len(part)
            out.write(part)
            end = out.tell()
            out.seek(offset)  # (the bytes read: a file written meanwhile is zipped as read)
            out.write(_LOCAL.pack(b"PK\x03\x04", _VERSION, 0, flags, _DEFLATED, _DOS_TIME, _DOS_DATE,
                                  crc, length, size, len(name), 0))
            out.seek(end)
        start = offset + _LOCAL.size + len(name)
        if size == file.size:  # (else written meanwhile: what was read is not what its stamp says)
            entries[file.path] = _Entry(stamp, size, file.mode, crc, start, length)
        central.append(_CENTRAL.pack(b"PK\x01\x02", _VERSION, 3, _VERSION, 0, flags, _DEFLATED, _DOS_TIME,
                                     _DOS_DATE, crc, length, size, len(name), 0, 0, 0, 0,
                                     (stat.S_IFREG | file.mode) << 16, offset) + name)
        written.append(file)
        if out.tell() > limit:
            return written, False, entries
    start_dir = out.tell()
    for record in central:
        out.write(record)
    out.write(_END.pack(b"PK\x05\x06", 0, 0, len(central), len(central), out.tell() - start_dir, start_dir, 0))
    return written, True, entries


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


def _write_zipfile(
    out: BinaryIO, inspection: Inspection, limit: int | None,
) -> tuple[list[BundleFile], bool]:
    """Write the zip into ``out`` with ``zipfile``; stop early (returning False) once it
    exceeds ``limit``."""
    written: list[BundleFile] = []
    with zipfile.ZipFile(out, "w", allowZip64=True) as zf:
        for file in inspection.included:
            info = _zip_info(file)
            source = inspection.source(file.path)
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


def deflated_fits(inspection: Inspection, limit: int) -> bool:
    """Whether :func:`_write_deflated` writes this bundle (no record of it needs zip64)."""
    return (limit <= _SMALL_ARCHIVE and len(inspection.included) <= _SMALL_COUNT
            and all(f.size <= _SMALL_FILE for f in inspection.included))
