"""Malicious and broken bundle archives: refused with a message that says why, and nothing
left in the extraction cache (traversal, links, duplicates, bombs, lying headers, corruption)."""

from __future__ import annotations

import io
import stat
import struct
import zipfile
from pathlib import Path

import pytest

from gpulayer.bundles import MAX_DEPTH, compute_digest, extract_bundle
from gpulayer.errors import BundleError
from tests.bundle_attacks import LINK, REG, cache_is_clean, make_zip

MALICIOUS = {
    "absolute path": ([("/tmp/evil.txt", b"x", REG)], "absolute path"),
    "dot-dot traversal": ([("ok.txt", b"x", REG), ("a/../../evil.txt", b"x", REG)], "'..'"),
    "leading dot-dot": ([("../evil.txt", b"x", REG)], "'..'"),
    "drive letter": ([("C:/evil.txt", b"x", REG)], "drive letter"),
    "backslash traversal": ([("..\\evil.txt", b"x", REG)], "backslash"),
    "symlink outside": ([("link", b"/etc/passwd", LINK)], "symlink"),
    "relative symlink outside": ([("link", b"../../../../etc", LINK)], "symlink"),
    "duplicate names": ([("a.txt", b"1", REG), ("a.txt", b"2", REG)], "more than once"),
    "file is also a folder": ([("a", b"1", REG), ("a/b", b"2", REG)], "which is a file"),
    "folder is also a file": ([("a/b/c", b"1", REG), ("a/b", b"2", REG)], "'a/b/c' lies under 'a/b', which is a file"),
    "empty component": ([("a//b", b"1", REG)], "'empty'"),
    "device node": ([("dev", b"", stat.S_IFCHR | 0o644)], "not a regular file"),
}


@pytest.mark.parametrize("case", sorted(MALICIOUS))
def test_malicious_archives_are_refused(tmp_path: Path, case: str) -> None:
    entries, expected = MALICIOUS[case]
    data = make_zip(entries)
    cache = tmp_path / "cache"
    with pytest.raises(BundleError, match=expected):
        extract_bundle(data, compute_digest(data), cache)
    assert cache_is_clean(cache)
    assert not (tmp_path / "evil.txt").exists()


def test_deep_paths_are_checked_one_folder_at_a_time_and_refused_past_the_depth_allowed(tmp_path: Path) -> None:
    # (checking that no entry lies under a file took a slice of every prefix of every path:
    # 3.6 s an entry 32,000 folders deep, and a 100 MB upload holds hundreds of them)
    deep = "d/" * MAX_DEPTH + "f.txt"
    data = make_zip([("ok.py", b"print('ok')\n", REG), (deep, b"deep", REG)])
    folder = extract_bundle(data, compute_digest(data), tmp_path / "cache")
    assert (folder / deep).read_bytes() == b"deep"
    data = make_zip([("ok.py", b"print('ok')\n", REG), ("d/" * (MAX_DEPTH + 1) + "f.txt", b"deep", REG)])
    with pytest.raises(BundleError, match=rf"entry 'd/d/d/.../f.txt' lies {MAX_DEPTH + 1} folders deep, more than "
                                          rf"the {MAX_DEPTH} allowed"):
        extract_bundle(data, compute_digest(data), tmp_path / "cache")


def test_too_many_entries(tmp_path: Path) -> None:
    data = make_zip([(f"f{i}.txt", b"x", REG) for i in range(20)])
    cache = tmp_path / "cache"
    with pytest.raises(BundleError, match="20 entries, more than the 10 allowed"):
        extract_bundle(data, compute_digest(data), cache, max_entries=10)
    assert cache_is_clean(cache)
    assert extract_bundle(data, compute_digest(data), cache, max_entries=20).is_dir()


def test_compression_bomb_with_honest_header(tmp_path: Path) -> None:
    data = make_zip([("zeros.bin", b"\0" * 20_000_000, REG)])
    assert len(data) < 100_000
    cache = tmp_path / "cache"
    with pytest.raises(BundleError, match="compression bomb"):
        extract_bundle(data, compute_digest(data), cache, max_uncompressed_bytes=1_000_000)
    assert cache_is_clean(cache)


def _lie_about_size(data: bytes, size: int) -> bytes:
    """Rewrite the uncompressed size of the only entry, in both its headers."""
    raw = bytearray(data)
    local = raw.index(b"PK\x03\x04")
    struct.pack_into("<I", raw, local + 22, size)
    central = raw.index(b"PK\x01\x02")
    struct.pack_into("<I", raw, central + 24, size)
    return bytes(raw)


def test_compression_bomb_with_lying_header(tmp_path: Path) -> None:
    data = _lie_about_size(make_zip([("zeros.bin", b"\0" * 20_000_000, REG)]), 100)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.getinfo("zeros.bin").file_size == 100  # the header lies
    cache = tmp_path / "cache"
    with pytest.raises(BundleError, match=r"zeros\.bin"):
        extract_bundle(data, compute_digest(data), cache, max_uncompressed_bytes=1_000_000)
    assert cache_is_clean(cache)


def test_bytes_read_are_counted_even_if_headers_lie(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # a reader that yields more than the header declared (zipfile itself stops at the declared
    # size, so simulate the worst case) is refused on the bytes actually read
    data = make_zip([("a.bin", b"\0" * 1000, REG), ("b.bin", b"\0" * 1000, REG)])
    real_open = zipfile.ZipFile.open

    class Flood(io.RawIOBase):
        def __init__(self) -> None:
            self.left = 10_000_000

        def readable(self) -> bool:
            return True

        def read(self, n: int = -1) -> bytes:
            n = min(self.left, 1 << 20 if n < 0 else n)
            self.left -= n
            return b"\0" * n

    def fake_open(self, name, mode="r", *args, **kwargs):
        if mode == "r":
            return Flood()
        return real_open(self, name, mode, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", fake_open)
    cache = tmp_path / "cache"
    with pytest.raises(BundleError, match="more than the 1000 bytes it declares"):
        extract_bundle(data, compute_digest(data), cache, max_uncompressed_bytes=1_000_000)
    assert cache_is_clean(cache)


def test_failed_extraction_leaves_no_partial_folder(tmp_path: Path) -> None:
    # valid names, but the second entry's data is corrupt: the first one must not survive
    data = bytearray(make_zip([("a.txt", b"hello " * 100, REG), ("b.txt", b"world " * 100, REG)]))
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as zf:
        info = zf.getinfo("b.txt")
    start = info.header_offset + 30 + len(b"b.txt") + 2
    data[start] ^= 0xFF
    data = bytes(data)
    cache = tmp_path / "cache"
    with pytest.raises(BundleError, match=r"b\.txt"):
        extract_bundle(data, compute_digest(data), cache)
    assert cache_is_clean(cache)


