"""What the docs cite exists: every test a page names, and every repository path it links."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])


def _refs() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for ref in sorted(set(re.findall(r"\btests/[\w/]+\.py(?:::\w+)?", page.read_text()))):
            out.append((page.relative_to(ROOT).as_posix(), ref))
    return out


@pytest.mark.parametrize(("page", "ref"), _refs())
def test_a_cited_test_exists(page: str, ref: str) -> None:
    path, _, name = ref.partition("::")
    # a guide may show the layout of a plugin package of its own (tests/ inside it)
    candidates = [ROOT / path, *(p / path for p in (ROOT / "examples").iterdir() if p.is_dir())]
    found = next((c for c in candidates if c.is_file()), None)
    assert found is not None, f"{page} cites {path}, which does not exist"
    if name:
        assert re.search(rf"^\s*(async )?def {name}\b", found.read_text(), re.M), f"{page} cites {ref}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if re.match(r"^[a-z]+://|^mailto:", target):
            continue
        assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"
