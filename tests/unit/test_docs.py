"""The plugin authoring guide covers every hook (as datasette and llm check theirs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpulayer import hookspecs
from gpulayer.plugins import hook_names

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def test_there_are_hooks():
    assert "gpulayer_accelerator_detectors" in hook_names()


@pytest.mark.parametrize("hook", hook_names())
def test_every_hook_has_a_section_in_the_guide(hook):
    headings = re.findall(r"^###\s+(\S+)\s*$", GUIDE.read_text(), flags=re.M)
    assert hook in headings, f"docs/plugins.md has no '### {hook}' section"


@pytest.mark.parametrize("hook", hook_names())
def test_every_hookspec_has_a_docstring_with_an_example(hook):
    doc = getattr(hookspecs, hook).__doc__ or ""
    assert "**Example**" in doc, hook
