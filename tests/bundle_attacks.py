"""Malicious bundles, generated (never committed): each a small zip that a safe extractor
must refuse, with the words its refusal must contain.

Paths that escape point at ``ESCAPE_NAME`` next to (or above) the extraction folder, or at
an absolute path under the test's own folder, so a test can check that nothing was written.
"""

from __future__ import annotations

import io
import stat
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

REG = stat.S_IFREG | 0o644
LINK = stat.S_IFLNK | 0o777
ESCAPE_NAME = "gpulayer-escaped.txt"
#: entries of the entry-count bomb; tests lower GPULAYER_MAX_BUNDLE_FILES below it
COUNT_BOMB_ENTRIES = 3000
COUNT_LIMIT = "1000"


def make_zip(entries: list[tuple[str, bytes, int]]) -> bytes:
    """A zip of (name, content, unix mode) entries, written as-is."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, content, mode in entries:
                info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                info.create_system = 3
                info.external_attr = mode << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, content)
    return buf.getvalue()


def cache_is_clean(cache: Path, allowed: set[str] = frozenset()) -> bool:
    """Whether the extraction cache holds nothing but ``allowed`` (a refused bundle leaves nothing)."""
    return not cache.exists() or {p.name for p in cache.iterdir()} <= set(allowed)


def ratio_bomb(mib: int = 32) -> bytes:
    """One file of ``mib`` MiB of zeros (about 1000:1), written in chunks (little memory)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        info = zipfile.ZipInfo("zeros.bin", date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        info.file_size = mib << 20
        with zf.open(info, "w") as out:
            chunk = bytes(1 << 20)
            for _ in range(mib):
                out.write(chunk)
    return buf.getvalue()


def attacks(absolute_target: Path) -> dict[str, tuple[Callable[[], bytes], str]]:
    """name -> (make the archive, a phrase its refusal must contain)."""
    ok = ("ok.py", b"print('ok')\n", REG)
    return {
        "dot-dot": (lambda: make_zip([ok, (f"../{ESCAPE_NAME}", b"x", REG)]), "'..'"),
        "nested dot-dot": (lambda: make_zip([ok, (f"a/b/../../../{ESCAPE_NAME}", b"x", REG)]), "'..'"),
        "absolute": (lambda: make_zip([ok, (str(absolute_target), b"x", REG)]), "absolute path"),
        "backslash": (lambda: make_zip([ok, (f"..\\{ESCAPE_NAME}", b"x", REG)]), "backslash"),
        "symlink out": (lambda: make_zip([ok, ("passwd", b"/etc/passwd", LINK)]), "symlink"),
        "symlink up": (lambda: make_zip([ok, ("up", b"../..", LINK)]), "symlink"),
        "ratio bomb": (ratio_bomb, "compression ratio"),
        "entry-count bomb": (lambda: make_zip([(f"f{i}", b"", REG) for i in range(COUNT_BOMB_ENTRIES)]),
                             f"{COUNT_BOMB_ENTRIES} entries, more than the {COUNT_LIMIT} allowed"),
        "duplicate names": (lambda: make_zip([ok, ("ok.py", b"import os\n", REG)]), "more than once"),
    }
