"""Every TOML example of the docs parses, and every providers.toml example loads.

The ```toml blocks of README.md, docs/ and the examples' READMEs, and the TOML a shell
snippet writes with a heredoc (``cat > providers.toml <<EOF``), are read with tomllib (TOML
1.0, as GPUlayer reads them): an inline table split over lines, for one, is refused there.
A block that is a fragment on purpose says so on the line before its fence:
``<!-- toml fragment: REASON -->``. Each one that has a ``type = ...`` line is a
providers.toml and is loaded by gpulayer.provider_config with the adapter it names (the
adapter's ``create`` is not called: it may connect somewhere).
"""

from __future__ import annotations

import importlib
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpulayer import plugins, provider_config
from gpulayer.hookrecords import ProviderAdapter
from tests.docsnippets import PAGES, ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

TOML_PAGES = sorted({*PAGES, *ROOT.glob("examples/*/README.md")})

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_FRAGMENT = re.compile(r"<!--\s*toml fragment\s*:((?:(?!-->).)*)-->\s*\Z", re.S)
# cat > FILE.toml <<EOF ... EOF (the delimiter quoted or not: quoted, nothing is expanded)
_HEREDOC = re.compile(r"""^.*?\S+\.toml["']?\s*<<-?\s*(["']?)(\w+)\1[^\n]*\n(.*?)^\2$""", re.M | re.S)
# what a shell expands in an unquoted heredoc: $(command), ${NAME}, $NAME
_EXPANSION = re.compile(r"\$\([^)]*\)|\$\{\w+\}|\$\w+")


@dataclass
class TomlBlock:
    page: str
    line: int
    body: str
    fragment: str | None = None  # the reason, for a block marked as a fragment

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def toml_blocks(pages: list[Path] | None = None) -> list[TomlBlock]:
    found = []
    for page in pages or TOML_PAGES:
        text = page.read_text()
        name = page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else str(page)
        for m in _FENCE.finditer(text):
            tag, body = m.group(1), m.group(2)
            line = text[:m.start()].count("\n") + 1
            if tag == "toml":
                marker = _FRAGMENT.search(text[:m.start()].rstrip()[-2000:])
                found.append(TomlBlock(name, line, body, marker.group(1).strip() if marker else None))
            elif tag in ("sh", "bash", "shell", "console", ""):
                for h in _HEREDOC.finditer(body):
                    # an expanded value stands for a word of the user's: 1 is a valid string inside
                    # quotes and a valid number outside them
                    toml = h.group(3) if h.group(1) else _EXPANSION.sub("1", h.group(3))
                    found.append(TomlBlock(name, line + body[:h.start(3)].count("\n") + 1, toml))
    return found


def _providers_tomls() -> list[TomlBlock]:
    return [b for b in toml_blocks() if b.fragment is None and re.search(r"^type\s*=", b.body, re.M)]


#: the adapters GPUlayer ships (this suite loads their examples); a third party's examples
#: are loaded by its own package's tests (examples/gpulayer-provider-ec2/tests/test_config_files.py
#: reads GPUlayer's docs too), where its adapter is installed
BUNDLED = {"ssh", "slurm", "local-process"}
THIRD_PARTY = {"ec2": "examples/gpulayer-provider-ec2/tests/test_config_files.py"}


def _kinds(block: TomlBlock) -> set[str]:
    return set(re.findall(r'^type\s*=\s*"([^"]*)"', block.body, re.M))


def _bundled_providers_tomls() -> list[TomlBlock]:
    return [b for b in _providers_tomls() if _kinds(b) <= BUNDLED]


def test_the_docs_have_toml_examples_and_heredocs() -> None:
    found = toml_blocks()
    assert {b.page for b in found} >= {"docs/providers.md", "docs/plugins.md", "examples/gpulayer-provider-ec2/README.md"}
    assert any("<<" not in b.body and b.page == "docs/providers.md" and "localbox" in b.body for b in found)
    assert {'type = "ssh"', 'type = "slurm"', 'type = "ec2"'} <= {
        m for b in _providers_tomls() for m in re.findall(r'^type = "\w+"', b.body, re.M)}


@pytest.mark.parametrize("block", toml_blocks(), ids=lambda b: b.id)
def test_every_toml_example_is_valid_toml(block: TomlBlock) -> None:
    if block.fragment is not None:
        assert len(block.fragment) >= 10, f"{block.id}: '<!-- toml fragment: REASON -->' needs a reason"
        return
    try:
        tomllib.loads(block.body)
    except tomllib.TOMLDecodeError as exc:
        pytest.fail(f"{block.id}: not valid TOML ({exc}); mark a fragment with <!-- toml fragment: REASON -->")


def test_every_providers_toml_example_is_loaded_by_one_suite_or_another() -> None:
    others = [b for b in _providers_tomls() if not _kinds(b) <= BUNDLED]
    assert others, "the EC2 example's blocks are found"
    for block in others:
        assert _kinds(block) - BUNDLED <= set(THIRD_PARTY), f"{block.id}: no suite loads {_kinds(block) - BUNDLED}"
    for suite in THIRD_PARTY.values():
        assert "docs" in (ROOT / suite).read_text()  # (it reads GPUlayer's docs, not only its README)


@pytest.mark.parametrize("block", _bundled_providers_tomls(), ids=lambda b: b.id)
def test_every_providers_toml_example_loads(block: TomlBlock) -> None:
    installed = plugins.providers()
    kinds = _kinds(block)
    adapters = {name: ProviderAdapter(name=name, config=a.config, create=lambda name, config: object())
                for name, a in installed.items()}
    configured = provider_config.parse(block.body, block.id, adapters=adapters)
    assert configured and {c.type for c in configured} == kinds


def test_a_fragment_marker_and_a_heredoc_are_read(tmp_path: Path) -> None:
    page = tmp_path / "probe.md"
    page.write_text('<!-- toml fragment: one key of a larger file -->\n```toml\nhosts = [\n  { a = 1,\n b = 2 },\n]\n'
                    '```\n\n```toml\na = 1\n```\n\n```sh\nx=1\ncat > "$HOME/p.toml" <<EOF\n[s]\nport = $PORT\n'
                    'python = "$(command -v python)"\nEOF\ncat > q.toml <<\'EOF\'\nv = "$NOT"\nEOF\n```\n')
    fragment, whole, expanded, quoted = toml_blocks([page])
    assert (fragment.fragment, whole.fragment, whole.body) == ("one key of a larger file", None, "a = 1\n")
    assert tomllib.loads(expanded.body) == {"s": {"port": 1, "python": "1"}} and expanded.line == 16
    assert tomllib.loads(quoted.body) == {"v": "$NOT"}


def test_a_split_inline_table_is_what_this_catches() -> None:
    with pytest.raises(tomllib.TOMLDecodeError):
        tomllib.loads('hosts = [\n  { host = "a", port = 2,\n    name = "b" },\n]\n')


def docstring_toml(doc: str) -> str:
    """The first literal block (``::`` then an indented block) of a module's docstring."""
    lines = doc.split("::\n", 1)[1].splitlines()
    body = []
    for line in lines:
        if line.strip() and not line.startswith(" "):
            break
        body.append(line)
    return textwrap.dedent("\n".join(body)).strip() + "\n"


@pytest.mark.parametrize("module", ["gpulayer_ssh.config", "gpulayer.testprovider"])
def test_the_providers_toml_in_a_config_docstring_loads(module: str) -> None:
    mod = importlib.import_module(module)
    plugin_module = importlib.import_module(module.rsplit(".", 1)[0] if module.endswith(".config") else module)
    adapters = {a.name: ProviderAdapter(name=a.name, config=a.config, create=lambda name, config: object())
                for a in plugin_module.gpulayer_provider_adapters()}
    [configured] = provider_config.parse(docstring_toml(mod.__doc__ or ""), module, adapters=adapters)
    assert configured.type in adapters
