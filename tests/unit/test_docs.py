"""The plugin authoring guide covers every hook and every name of the plugin API (as
datasette and llm check theirs), and its examples use only that API."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpulayer import hookspecs, plugin
from gpulayer.plugins import hook_names

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
API_HEADING = "## The `gpulayer.plugin` API"


def api_section() -> str:
    text = GUIDE.read_text()
    assert API_HEADING in text, f"docs/plugins.md has no '{API_HEADING}' section"
    section = text.split(API_HEADING, 1)[1]
    return re.split(r"^## ", section, maxsplit=1, flags=re.M)[0]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def gpulayer_imports(code: str) -> set[str]:
    return set(re.findall(r"^\s*((?:from|import) gpulayer\b.*)$", code, flags=re.M))


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


@pytest.mark.parametrize("hook", hook_names())
def test_every_hookspec_example_imports_only_the_plugin_api(hook):
    example = (getattr(hookspecs, hook).__doc__ or "").split("**Example**", 1)[1]
    assert gpulayer_imports(example) == {"from gpulayer import plugin"}, hook
    used = set(re.findall(r"\bplugin\.(\w+)", example))
    assert used <= set(plugin.__all__), f"{hook}'s example uses {sorted(used - set(plugin.__all__))}"


def test_the_guide_documents_exactly_the_plugin_api():
    documented = re.findall(r"^\|\s*`(\w+)`\s*\|", api_section(), flags=re.M)
    assert len(documented) == len(set(documented)), "a name is documented twice"
    assert set(documented) == set(plugin.__all__)


def test_the_guides_examples_use_only_the_plugin_api():
    blocks = python_blocks(GUIDE.read_text())
    assert len(blocks) >= 2
    for code in blocks:
        assert gpulayer_imports(code) <= {"from gpulayer import plugin"}, code
        used = set(re.findall(r"\bplugin\.(\w+)", code))
        assert used <= set(plugin.__all__), sorted(used - set(plugin.__all__))
