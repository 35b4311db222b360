"""The plugin authoring guide covers every hook and every name of the plugin API (as
datasette and llm check theirs), and its examples use only that API."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpulayer import hookspecs, plugin
from gpulayer.plugins import hook_names
from tests.docsnippets import ROOT, RUN_OPTIONS, Snippet, snippets

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


# --------------------------------------------------------------------------- snippets
# Every snippet of README.md and docs/ is run by tests/integration/test_doc_snippets.py;
# these check, without running anything, that each one that is not run says why and that
# every marker is one the runner understands (tests/docsnippets.py has the syntax).


def _snippets() -> list[Snippet]:
    return snippets()


def test_the_pages_have_snippets() -> None:
    found = _snippets()
    assert {s.page for s in found} >= {"README.md", "docs/cli.md", "docs/server.md"}
    assert any(s.marker != "not run" for s in found)


@pytest.mark.parametrize("snippet", _snippets(), ids=lambda s: s.id)
def test_every_snippet_is_run_or_says_why_not(snippet: Snippet) -> None:
    if snippet.marker == "not run":
        assert len(snippet.argument) >= 10, f"{snippet.id}: '<!-- not run: REASON -->' needs a reason"
        return
    unknown = set(snippet.options) - RUN_OPTIONS
    assert not unknown, f"{snippet.id}: unknown run option(s) {sorted(unknown)}; accepted: {sorted(RUN_OPTIONS)}"
    if "output" in snippet.options:
        assert snippet.transcript, f"{snippet.id}: 'output' compares a transcript's lines ($ COMMAND, then output)"
        assert "until" not in snippet.options, f"{snippet.id}: 'until' and 'output' do not go together"
    if "exit" in snippet.options:
        assert snippet.options["exit"].lstrip("-").isdigit(), f"{snippet.id}: exit=N takes a number"
    if "timeout" in snippet.options:
        assert float(snippet.options["timeout"]) > 0, f"{snippet.id}: timeout=S takes seconds"
    if "by" in snippet.options:
        assert (ROOT / snippet.options["by"]).is_file(), f"{snippet.id}: by={snippet.options['by']} does not exist"


def test_a_marker_is_read_from_the_line_before_the_fence(tmp_path: Path) -> None:
    page = tmp_path / "probe.md"
    page.write_text("text\n\n<!-- not run: needs a GPU -->\n```sh\nnvidia-smi\n```\n\n"
                    "<!-- a comment of another kind -->\n```python\nprint(1)\n```\n\n"
                    '<!-- run: exit=2 until="ready" -->\n\n```console\n$ gpulayer nosuch\n```\n\n'
                    "```\n$ gpulayer --version\ngpulayer 0.1.0\n```\n\n```\njust output\n```\n")
    a, b, c, d = snippets([page])
    assert (a.marker, a.argument, a.lang) == ("not run", "needs a GPU", "console")
    assert (b.marker, b.lang) == (None, "python")
    assert (c.marker, c.options) == ("run", {"exit": "2", "until": "ready"})
    assert d.transcript and d.commands() == [("gpulayer --version", ["gpulayer 0.1.0"])]
