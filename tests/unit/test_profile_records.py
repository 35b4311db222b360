"""A runtime profile a plugin offers is checked when the plugin makes it, as a job's own
requirements are: one a job could never use fails that plugin's hook, naming it, instead of
every submit that names the profile ending in a traceback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpulayer import plugin, plugins
from gpulayer.errors import InvalidRequirement
from gpulayer.profiles import resolve_requirements
from gpulayer.specs import Requirements

pytestmark = pytest.mark.usefixtures("gpulayer_isolated")


class Profiles:
    def __init__(self, **fields: object) -> None:
        self.fields = fields

    @plugin.hookimpl
    def gpulayer_runtime_profiles(self) -> Iterator[plugin.RuntimeProfile]:
        yield plugin.RuntimeProfile(name="zed", **self.fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("fields", "said"), [
    ({"frameworks": {"zed-runtime": ">>1"}},
     "frameworks: Value error, framework 'zed-runtime': '>>1' is not a PEP 440 version specifier"),
    ({"frameworks": {"zed runtime": ""}},
     "frameworks: Value error, framework name 'zed runtime': not a framework name"),
    ({"accelerator": "z p u"},
     "accelerator: Value error, accelerator kind 'z p u': accepted: lowercase letters, digits"),
])
def test_a_profile_no_job_could_use_fails_its_plugin_naming_it(plugin_manager: plugins.PluginManager,
                                                              fields: dict[str, object], said: str) -> None:
    plugin_manager.register(Profiles(**fields), name="zed-profile")
    with pytest.warns(plugins.PluginWarning) as caught:
        assert "zed" not in plugins.profiles() and "cpu" in plugins.profiles()
    [message] = [str(w.message) for w in caught]
    assert message.startswith("gpulayer plugin 'zed-profile' failed in gpulayer_runtime_profiles, which leaves it "
                              "out: ValidationError for RuntimeProfile: " + said), message
    # a submit naming it is told the profile is unknown, not handed pydantic's traceback
    with pytest.raises(InvalidRequirement, match="unknown runtime profile 'zed'; known profiles: "):
        resolve_requirements(Requirements(profile="zed"))


def test_a_profile_is_read_as_a_job_reads_the_same_words(plugin_manager: plugins.PluginManager) -> None:
    plugin_manager.register(Profiles(accelerator="ZPU", frameworks={"zed-runtime": ">=1.2"}), name="zed-profile")
    profile = plugins.profiles()["zed"]
    assert (profile.accelerator, profile.frameworks) == ("zpu", {"zed-runtime": ">=1.2"})
    assert plugin.RuntimeProfile(name="none-at-all", accelerator="cpu").accelerator is None
    req = resolve_requirements(Requirements(profile="zed"))
    assert (req.accelerator, req.frameworks) == ("zpu", {"zed-runtime": ">=1.2"})
