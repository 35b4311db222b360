from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpulayer import hookimpl, plugin, plugins
from gpulayer.errors import GpulayerError, PluginError
from gpulayer.fakes import FakeAcceleratorPlugin
from gpulayer.hookrecords import (
    AcceleratorDetector,
    DetectionResult,
    FrameworkProbe,
    HookRecord,
    RuntimeProfile,
    SubProbe,
)

pytestmark = pytest.mark.usefixtures("gpulayer_isolated")

ROOT = Path(__file__).resolve().parents[2]


def write_module(tmp_path: Path, name: str, source: str, monkeypatch) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))


def write_distribution(site: Path, dist: str, version: str, entry_points: str, modules: dict[str, str]) -> None:
    """What pip would leave on sys.path: a dist-info with entry_points.txt, and the modules."""
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[gpulayer]\n{entry_points}\n")
    for name, source in modules.items():
        (site / f"{name}.py").write_text(textwrap.dedent(source))


def gpulayer_cli(*args: str, pythonpath: list[Path],
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    full = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([*map(str, pythonpath), *inherited])}
    return subprocess.run([sys.executable, "-m", "gpulayer.cli", *args], capture_output=True, text=True,
                          env=full, timeout=60)


class Profiles:
    """A throwaway plugin offering the given runtime profiles."""

    def __init__(self, *names: str) -> None:
        self.names = names

    @hookimpl
    def gpulayer_runtime_profiles(self):
        for name in self.names:
            yield RuntimeProfile(name=name, accelerator="npu")


class Detectors:
    """A throwaway plugin offering real (not stand-in) detectors of the given kinds."""

    def __init__(self, *kinds: str) -> None:
        self.kinds = kinds

    @hookimpl
    def gpulayer_accelerator_detectors(self):
        for kind in self.kinds:
            yield AcceleratorDetector(name=kind, detect=lambda timeout: DetectionResult())


# --------------------------------------------------------------------------- loading


def test_bundled_plugins_load_through_entry_points():
    infos = {i.name: i for i in plugins.get_manager().list_plugins()}
    for name in ("cuda", "rocm", "mps", "frameworks", "profiles"):
        assert infos[name].status == "loaded"
        assert infos[name].distribution == "gpulayer"
    assert infos["cuda"].hooks == ["gpulayer_accelerator_detectors", "gpulayer_device_environment"]
    assert {"cuda", "rocm", "mps"} <= set(plugins.detectors())


def test_disabled_plugins_are_not_imported(monkeypatch):
    monkeypatch.setenv("GPULAYER_DISABLE_PLUGINS", "cuda, rocm")
    monkeypatch.delitem(sys.modules, "gpulayer_rocm", raising=False)
    infos = {i.name: i for i in plugins.get_manager().list_plugins()}
    assert infos["cuda"].status == infos["rocm"].status == "disabled"
    assert "gpulayer_rocm" not in sys.modules
    assert "cuda" not in plugins.detectors() and "mps" in plugins.detectors()


def test_unknown_name_in_disable_list_is_reported(monkeypatch):
    monkeypatch.setenv("GPULAYER_DISABLE_PLUGINS", "cuda,cdua")
    with pytest.warns(plugins.PluginWarning, match="names no installed plugin: cdua"):
        manager = plugins.get_manager()
    assert manager.unknown_disabled == ["cdua"]


def test_a_plugin_named_in_gpulayer_plugins_that_fails_to_import_is_an_error_with_its_traceback(
        tmp_path, monkeypatch):
    write_module(tmp_path, "gl_broken", """\
        import os

        def _load_driver():
            raise ImportError('libacme.so not found')

        _load_driver()
        """, monkeypatch)
    monkeypatch.setenv("GPULAYER_PLUGINS", "gl_broken")
    with pytest.raises(PluginError) as err:
        plugins.get_manager()
    message = str(err.value)
    assert message.startswith("plugin 'gl_broken' named in GPULAYER_PLUGINS failed to import:\n"
                              "Traceback (most recent call last):\n")
    assert f'File "{tmp_path / "gl_broken.py"}", line 6, in <module>' in message
    assert "in _load_driver\n    raise ImportError('libacme.so not found')" in message
    assert message.endswith("ImportError: libacme.so not found")
    assert "importlib" not in message  # only the plugin's own frames
    with pytest.raises(PluginError, match="'gl_broken' named in GPULAYER_PLUGINS"):
        plugins.detectors()  # every later use fails too, not only the first
    # listing still shows it, as broken
    info = {i.name: i for i in plugins.get_manager(strict=False).list_plugins()}["gl_broken"]
    assert (info.status, info.error) == ("broken", "ImportError: libacme.so not found")


def test_broken_entry_point_names_its_distribution(tmp_path):
    """A real entry point (dist-info on sys.path) whose module raises on import: found by
    scanning, so it is skipped with a warning and the rest keeps working."""
    write_distribution(tmp_path, "gpulayer-broken", "0.3.1", "broken = gpulayer_broken",
                       {"gpulayer_broken": "1 / 0\n"})
    proc = gpulayer_cli("plugins", "list", pythonpath=[tmp_path])
    assert proc.returncode == 0, proc.stderr
    assert ("warning: gpulayer plugin 'broken' (distribution gpulayer-broken) failed to load "
            "and was skipped: ZeroDivisionError: division by zero") in proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("broken "))
    assert "broken" in line.split()[1] and "gpulayer-broken 0.3.1" in line
    assert "error: ZeroDivisionError: division by zero" in proc.stdout
    assert any(ln.split()[:2] == ["cuda", "loaded"] for ln in proc.stdout.splitlines())


def test_an_entry_point_that_calls_sys_exit_is_a_broken_plugin_not_the_end_of_the_command(tmp_path):
    """sys.exit() at import (a vendor SDK that gives up) or in a hook would end every command
    that loads plugins, with no word of the plugin: it is that plugin's failure instead."""
    write_distribution(tmp_path, "gpulayer-quits", "1.0", "quits = gpulayer_quits\nquits-later = gpulayer_quits_later",
                       {"gpulayer_quits": "import sys\nsys.exit('acme: driver not found')\n",
                        "gpulayer_quits_later": """\
                            import sys
                            from gpulayer import plugin

                            @plugin.hookimpl
                            def gpulayer_runtime_profiles():
                                sys.exit(3)
                            """})
    proc = gpulayer_cli("plugins", "list", pythonpath=[tmp_path])
    assert proc.returncode == 0, proc.stderr
    assert ("warning: gpulayer plugin 'quits' (distribution gpulayer-quits) failed to load and was skipped: "
            "SystemExit: acme: driver not found") in proc.stderr
    assert ("warning: gpulayer plugin 'quits-later' failed in gpulayer_runtime_profiles, which leaves it out: "
            "SystemExit: 3 (to stop loading it: GPULAYER_DISABLE_PLUGINS=quits-later)") in proc.stderr
    status = {ln.split()[0]: ln.split()[1] for ln in proc.stdout.splitlines() if not ln.startswith(" ")}
    assert (status["quits"], status["quits-later"], status["cuda"]) == ("broken", "failed", "loaded")
    assert gpulayer_cli("profiles", "list", pythonpath=[tmp_path]).returncode == 0


def test_a_launcher_or_device_environment_that_calls_sys_exit_is_named(plugin_manager):
    import sys as _sys

    from gpulayer.launchers import launch_command
    from gpulayer.specs import DistributedJob

    class Quits:
        @hookimpl
        def gpulayer_distributed_launchers(self):
            yield plugin.DistributedLauncher(name="quitter", build=lambda *_: _sys.exit(2))

        @hookimpl
        def gpulayer_device_environment(self, kind, devices):
            _sys.exit(5)

    plugin_manager.register(Quits(), name="quits")
    rdzv = plugin.Rendezvous(master_addr="127.0.0.1", master_port=29500, nnodes=1, run_id="r-1")
    with pytest.raises(PluginError, match=r"^launcher 'quitter' \(plugin 'quits'\): build\(\) raised SystemExit: 2$"):
        launch_command(DistributedJob(entry="train.py", launcher="quitter"), rdzv, 0, _sys.executable)
    npu = plugin.Device(kind="npu", index=0, name="NPU")
    with pytest.warns(plugins.PluginWarning, match="'quits' failed in gpulayer_device_environment, which leaves it "
                                                   "out: SystemExit: 5"), \
            pytest.raises(PluginError, match="no environment for the granted npu device"):
        plugin.device_environment("npu", [npu])


def test_an_entry_point_name_claimed_by_two_distributions_is_reported_naming_both(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    source = """\
        from gpulayer import plugin

        @plugin.hookimpl
        def gpulayer_runtime_profiles():
            yield plugin.RuntimeProfile(name=__name__ + "-profile")
        """
    write_distribution(first, "gpulayer-acme", "1.0", "acme = acme_one", {"acme_one": source})
    write_distribution(second, "acme-tools", "2.5", "acme = acme_two", {"acme_two": source})
    proc = gpulayer_cli("plugins", "list", "--json", pythonpath=[first, second])
    assert proc.returncode == 0, proc.stderr
    warning = ("warning: gpulayer plugin name 'acme' is claimed by two distributions: "
               "gpulayer-acme 1.0 (acme_one) and acme-tools 2.5 (acme_two); loaded the first "
               "(earlier on sys.path) and skipped the second: uninstall one of them")
    assert warning in proc.stderr
    data = json.loads(proc.stdout)
    acme = next(p for p in data["plugins"] if p["name"] == "acme")
    assert (acme["distribution"], acme["module"], acme["status"]) == ("gpulayer-acme", "acme_one", "loaded")
    assert data["clashes"] == [warning.removeprefix("warning: ")]
    profiles = gpulayer_cli("profiles", "list", pythonpath=[first, second]).stdout
    assert "acme_one-profile" in profiles and "acme_two-profile" not in profiles


# --------------------------------------------------------------------------- the registry


def test_conflicting_detectors_name_both_plugins(plugin_manager):
    plugin_manager.register(Detectors("npu"), name="acme")
    plugin_manager.register(Detectors("npu"), name="initech")
    with pytest.raises(PluginError) as err:
        plugins.detectors()
    assert str(err.value) == ("Conflicting plugins found for accelerator detector 'npu': 'acme' and 'initech' "
                              "(to use one of them: GPULAYER_DISABLE_PLUGINS=acme or GPULAYER_DISABLE_PLUGINS=initech)")


def test_a_plugin_that_offers_one_name_twice_is_told_so(plugin_manager):
    class Twice:
        @hookimpl
        def gpulayer_accelerator_detectors(self):
            yield from (AcceleratorDetector(name="npu", detect=lambda t: DetectionResult()) for _ in range(2))

    plugin_manager.register(Twice(), name="acme")
    with pytest.raises(PluginError) as err:
        plugins.detectors()
    assert str(err.value) == "plugin 'acme' offers two accelerator detectors named 'npu'"


def test_a_plugin_in_conflict_is_loaded_again_once_the_other_is_gone(plugin_manager):
    plugin_manager.register(Detectors("npu"), name="acme")
    plugin_manager.register(Detectors("npu"), name="initech")
    with pytest.raises(PluginError):
        plugins.detectors()
    assert {i.name: i.status for i in plugin_manager.list_plugins()}["acme"] == "failed"
    plugin_manager.unregister("initech")
    assert "npu" in plugins.detectors()
    info = {i.name: i for i in plugin_manager.list_plugins()}["acme"]
    assert (info.status, info.error) == ("loaded", None)


def test_two_fakes_of_one_kind_conflict_too(plugin_manager):
    plugin_manager.register(FakeAcceleratorPlugin("npu"), name="fake-a")
    plugin_manager.register(FakeAcceleratorPlugin("npu"), name="fake-b")
    with pytest.raises(PluginError, match="Conflicting plugins found for accelerator detector 'npu': 'fake-a' and 'fake-b'"):
        plugins.detectors()


def test_a_fake_does_not_hide_a_conflict_between_two_real_detectors(plugin_manager):
    plugin_manager.register(FakeAcceleratorPlugin("cuda"), name="fake-cuda")
    plugin_manager.register(Detectors("cuda"), name="other-cuda")
    with pytest.raises(PluginError, match="accelerator detector 'cuda': 'cuda' and 'other-cuda'"):
        plugins.detectors()


def test_conflict_with_a_bundled_profile(plugin_manager):
    plugin_manager.register(Profiles("mlx"), name="my-profiles")
    with pytest.raises(PluginError, match="runtime profile 'mlx'") as err:
        plugins.profiles()
    assert "'profiles'" in str(err.value) and "'my-profiles'" in str(err.value)


def test_unknown_hook_names_the_plugin(plugin_manager):
    class Typo:
        @hookimpl
        def gpulayer_accelerator_detector(self):  # singular: no such hook
            return []

    with pytest.raises(PluginError, match="plugin 'typo-plugin' implements gpulayer_accelerator_detector, which "
                                          "GPUlayer does not define"):
        plugin_manager.register(Typo(), name="typo-plugin")
    assert "typo-plugin" not in {i.name for i in plugin_manager.list_plugins()}


@pytest.mark.parametrize(("hook", "says"), [
    ("gpulayer_device_environment(kind, devices, worker)",
     "gpulayer_device_environment takes worker, which the hook does not offer; accepted: kind, devices (or fewer)"),
    ("gpulayer_accelerator_detectors(timeout)",
     "gpulayer_accelerator_detectors takes timeout, which the hook does not offer; accepted: no arguments"),
])
def test_a_hook_that_takes_an_argument_its_hook_does_not_offer_is_told_which(plugin_manager, monkeypatch, tmp_path,
                                                                              hook, says):
    module = "gl_test_extra_arg_" + hook.partition("(")[0]  # (one per case: a module is imported once)
    write_module(tmp_path, module, f"""\
        from gpulayer import plugin

        @plugin.hookimpl
        def {hook}:
            return None
        """, monkeypatch)
    monkeypatch.setenv("GPULAYER_PLUGINS", module)
    with pytest.warns(plugins.PluginWarning) as caught:
        plugin_manager.load()
    assert [str(w.message) for w in caught] == [
        f"gpulayer plugin {module!r} was not registered: {says} (to stop loading it: GPULAYER_DISABLE_PLUGINS={module})"]


@pytest.mark.parametrize("style", ["wrapper", "hookwrapper"])
def test_a_wrapper_on_a_record_hook_is_refused(plugin_manager, style):
    class Wrapping:
        @hookimpl(**{style: True})
        def gpulayer_runtime_profiles(self):
            result = yield
            return result

    with pytest.raises(PluginError) as err:
        plugin_manager.register(Wrapping(), name="wrapping")
    assert str(err.value) == (
        "plugin 'wrapping': gpulayer_runtime_profiles is a record hook and takes no wrapper "
        "(wrapper=True or hookwrapper=True); return or yield records instead")
    assert "wrapping" not in {i.name for i in plugin_manager.list_plugins()}
    assert "pytorch-cuda" in plugins.profiles()  # refused, not half registered


def test_record_hooks_go_through_pluggys_hook_caller(plugin_manager):
    plugin_manager.register(Profiles("acme-a"), name="acme")
    calls: list[tuple[str, list[str]]] = []
    undo = plugin_manager.pm.add_hookcall_monitoring(
        lambda hook_name, impls, kwargs: calls.append((hook_name, [i.plugin_name for i in impls])),
        lambda outcome, hook_name, impls, kwargs: None,
    )
    try:
        found = plugins.profiles()
    finally:
        undo()
    assert {"acme-a", "pytorch-cuda"} <= set(found)
    assert sorted(calls) == [("gpulayer_runtime_profiles", ["acme"]), ("gpulayer_runtime_profiles", ["profiles"])]
    assert plugin_manager.owner("gpulayer_runtime_profiles", "acme-a") == "acme"


def test_the_registry_is_typed(plugin_manager):
    profiles = plugin_manager.collect("gpulayer_runtime_profiles", RuntimeProfile)
    assert all(isinstance(p, RuntimeProfile) for p in profiles.values())
    with pytest.raises(TypeError, match="gpulayer_runtime_profiles offers RuntimeProfile records, not AcceleratorDetector"):
        plugin_manager.collect("gpulayer_runtime_profiles", AcceleratorDetector)
    with pytest.raises(ValueError, match="'gpulayer_device_environment' is not a record hook"):
        plugin_manager.collect("gpulayer_device_environment", RuntimeProfile)
    assert plugin.records(RuntimeProfile) == profiles
    with pytest.raises(TypeError, match="no hook offers HookRecord records"):
        plugin.records(HookRecord)


def test_a_record_of_the_wrong_type_fails_only_that_plugin(plugin_manager):
    class Wrong:
        @hookimpl
        def gpulayer_runtime_profiles(self):
            yield FrameworkProbe(name="oops")

    plugin_manager.register(Wrong(), name="wrong")
    with pytest.warns(plugins.PluginWarning) as caught:
        found = plugins.profiles()
    assert "pytorch-cuda" in found and "oops" not in found
    assert [str(w.message) for w in caught] == [
        "gpulayer plugin 'wrong' failed in gpulayer_runtime_profiles, which leaves it out: returned "
        "FrameworkProbe, expected runtime profile records (RuntimeProfile) "
        "(to stop loading it: GPULAYER_DISABLE_PLUGINS=wrong)"]


def test_a_single_record_instead_of_an_iterable_fails_only_that_plugin(plugin_manager):
    class Single:
        @hookimpl
        def gpulayer_runtime_profiles(self):
            return RuntimeProfile(name="alone")

    plugin_manager.register(Single(), name="single")
    with pytest.warns(plugins.PluginWarning, match="'single' failed in gpulayer_runtime_profiles, which leaves "
                                                   "it out: TypeError: returned one RuntimeProfile; return or "
                                                   "yield an iterable of records"):
        assert "alone" not in plugins.profiles()


@pytest.mark.parametrize("kind", ["XPU", "Acme NPU", "cpu", "none"])
def test_an_accelerator_kind_no_job_could_ask_for_fails_that_plugin(plugin_manager, kind):
    """A job names its accelerator in lowercase (``--accelerator XPU`` asks for ``xpu``), and
    ``cpu`` is no accelerator: a detector of such a kind would find devices no job could use."""
    plugin_manager.register(Detectors(kind), name="odd-kind")
    with pytest.warns(plugins.PluginWarning) as caught:
        assert kind not in plugins.detectors() and "cuda" in plugins.detectors()
    [message] = [str(w.message) for w in caught]
    assert message.startswith(
        f"gpulayer plugin 'odd-kind' failed in gpulayer_accelerator_detectors, which leaves it out: "
        f"ValidationError for AcceleratorDetector: name: Value error, accelerator kind {kind!r}: accepted: "
        "lowercase letters, digits, '.', '_' and '-', starting with a letter or digit, other than 'cpu' and 'none'"), message
    # the spelling a job would ask for, where there is one ('cpu' and 'none' are no kind)
    hint = {"XPU": " (jobs ask for a kind in lowercase: --accelerator xpu)"}.get(kind, "")
    assert message.split("'cpu' and 'none'", 1)[1].startswith(f"{hint} (to stop loading it"), message


@pytest.mark.parametrize(("answer", "says"), [(42, "int"), ("mpirun", "str"), ({"name": "a-dict"}, "dict")])
def test_an_answer_that_is_no_iterable_of_records_is_told_by_its_type(plugin_manager, answer, says):
    class Odd:
        @hookimpl
        def gpulayer_runtime_profiles(self):
            return answer

    plugin_manager.register(Odd(), name="odd")
    with pytest.warns(plugins.PluginWarning) as caught:
        assert "cpu" in plugins.profiles()
    assert [str(w.message) for w in caught] == [
        f"gpulayer plugin 'odd' failed in gpulayer_runtime_profiles, which leaves it out: TypeError: returned {says}; "
        "return or yield an iterable of records (to stop loading it: GPULAYER_DISABLE_PLUGINS=odd)"]


def test_a_hook_that_raises_is_reported_once_and_the_others_keep_working(plugin_manager):
    class Raising:
        @hookimpl
        def gpulayer_accelerator_detectors(self):
            raise RuntimeError("driver table missing")

        @hookimpl
        def gpulayer_runtime_profiles(self):
            yield RuntimeProfile(name="still-here")

    plugin_manager.register(Raising(), name="raising")
    with pytest.warns(plugins.PluginWarning) as caught:
        assert {"cuda", "rocm", "mps"} <= set(plugins.detectors())
        plugin_manager._forget_records()  # collected again: not reported again
        assert {"cuda", "rocm", "mps"} <= set(plugins.detectors())
    assert [str(w.message) for w in caught] == [
        "gpulayer plugin 'raising' failed in gpulayer_accelerator_detectors, which leaves it out: "
        "RuntimeError: driver table missing (to stop loading it: GPULAYER_DISABLE_PLUGINS=raising)"]
    assert "still-here" in plugins.profiles()  # its other hooks still answer
    info = {i.name: i for i in plugin_manager.list_plugins()}["raising"]
    assert (info.status, info.error) == ("failed", "gpulayer_accelerator_detectors: RuntimeError: driver table missing")


def test_a_plugin_that_fails_in_two_hooks_is_listed_with_both(plugin_manager):
    class TwiceWrong:
        @hookimpl
        def gpulayer_runtime_profiles(self):
            return [{"name": "a-dict"}]

        @hookimpl
        def gpulayer_distributed_launchers(self):
            raise RuntimeError("no mpirun")

    plugin_manager.register(TwiceWrong(), name="twice")
    with pytest.warns(plugins.PluginWarning):
        info = {i.name: i for i in plugin_manager.list_plugins()}["twice"]
        plugin_manager._forget_records()  # collected again: each said once
        info = {i.name: i for i in plugin_manager.list_plugins()}["twice"]
    assert info.status == "failed"
    assert info.error == ("gpulayer_runtime_profiles: returned dict, expected runtime profile records "
                          "(RuntimeProfile); gpulayer_distributed_launchers: RuntimeError: no mpirun")


def test_a_hook_that_fails_anew_each_time_is_listed_with_its_latest_failure_alone(plugin_manager):
    """A device-environment hook that fails at every task with another message must not
    grow the plugin's error for the life of a worker."""
    class Counting:
        calls = 0

        @hookimpl
        def gpulayer_device_environment(self, kind, devices):
            Counting.calls += 1
            raise RuntimeError(f"failure {Counting.calls}")

    plugin_manager.register(Counting(), name="counting")
    dev = plugin.Device(kind="cuda", index=0, name="GPU")
    with pytest.warns(plugins.PluginWarning):
        for _ in range(5):
            plugin_manager.device_environment("cuda", [dev])
    info = {i.name: i for i in plugin_manager.list_plugins()}["counting"]
    assert info.error == "gpulayer_device_environment: RuntimeError: failure 5"


def test_a_device_environment_hook_that_raises_is_named_and_passed_over(plugin_manager):
    class Raising:
        @hookimpl
        def gpulayer_device_environment(self, kind, devices):
            raise KeyError("oops")

    plugin_manager.register(Raising(), name="raising-env")
    dev = plugin.Device(kind="cuda", index=1, name="GPU")
    with pytest.warns(plugins.PluginWarning, match="'raising-env' failed in gpulayer_device_environment"):
        assert plugins.device_environment("cuda", [dev])["CUDA_VISIBLE_DEVICES"] == "1"
    with pytest.raises(PluginError, match=r"no environment for the granted npu device.*'raising-env'"):
        plugins.device_environment("npu", [dev.model_copy(update={"kind": "npu"})])


BAD_PLUGINS = {
    "gl_raises": """\
        from gpulayer import plugin

        @plugin.hookimpl
        def gpulayer_accelerator_detectors():
            raise RuntimeError("boom")
        """,
    "gl_typo": """\
        from gpulayer import plugin

        @plugin.hookimpl
        def gpulayer_runtime_profile():
            return []
        """,
}


@pytest.mark.parametrize("module", sorted(BAD_PLUGINS))
def test_a_misbehaving_plugin_does_not_stop_commands(module, tmp_path, gpulayer_home):
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(BAD_PLUGINS[module]))
    env = {"GPULAYER_PLUGINS": module, "GPULAYER_DETECTORS": "none"}
    listed = gpulayer_cli("plugins", "list", pythonpath=[tmp_path], env=env)
    assert listed.returncode == 0, listed.stderr
    line = next(ln for ln in listed.stdout.splitlines() if ln.startswith(module))
    assert line.split()[1] == "failed"
    assert f"to stop loading it: GPULAYER_DISABLE_PLUGINS={module}" in listed.stdout
    ran = gpulayer_cli("submit", "--", sys.executable, "-c", "print('ran')", pythonpath=[tmp_path], env=env)
    assert ran.returncode == 0, ran.stderr
    assert "ran" in ran.stdout
    warnings = [ln for ln in ran.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and f"gpulayer plugin {module!r}" in warnings[0], ran.stderr
    assert "GPULAYER_DISABLE_PLUGINS=" + module in warnings[0]
    assert "Warning:" not in ran.stderr  # one plain line, not a Python warning with its source


def test_plugins_list_shows_two_plugins_in_conflict_and_fails_as_other_commands_do(tmp_path, gpulayer_home):
    """It listed both as loaded and exited 0 while every command that needs detectors failed."""
    for name in ("gl_npu_one", "gl_npu_two"):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent("""\
            from gpulayer import plugin

            @plugin.hookimpl
            def gpulayer_accelerator_detectors():
                yield plugin.AcceleratorDetector(name="npu", detect=lambda timeout: plugin.DetectionResult())
            """))
    env = {"GPULAYER_PLUGINS": "gl_npu_one,gl_npu_two", "GPULAYER_DETECTORS": "none"}
    error = ("Conflicting plugins found for accelerator detector 'npu': 'gl_npu_one' and 'gl_npu_two' "
             "(to use one of them: GPULAYER_DISABLE_PLUGINS=gl_npu_one or GPULAYER_DISABLE_PLUGINS=gl_npu_two)")
    listed = gpulayer_cli("plugins", "list", pythonpath=[tmp_path], env=env)
    assert listed.returncode == 2 and error in listed.stderr, listed.stderr
    for name in ("gl_npu_one", "gl_npu_two"):
        line = next(ln for ln in listed.stdout.splitlines() if ln.startswith(name))
        assert line.split()[1] == "failed"
        assert f"to stop loading it: GPULAYER_DISABLE_PLUGINS={name}" in listed.stdout
    assert f"error: gpulayer_accelerator_detectors: {error}" in listed.stdout
    as_json = gpulayer_cli("plugins", "list", "--json", pythonpath=[tmp_path], env=env)
    assert as_json.returncode == 2 and json.loads(as_json.stdout)["conflicts"] == [error]
    detected = gpulayer_cli("resources", "detect", pythonpath=[tmp_path], env=env)
    assert detected.returncode == 2 and error in detected.stderr
    one = gpulayer_cli("plugins", "list", pythonpath=[tmp_path], env={**env, "GPULAYER_DISABLE_PLUGINS": "gl_npu_two"})
    assert one.returncode == 0, one.stderr


# --------------------------------------------------------------------------- fakes


def test_fake_accelerator_fixture_replaces_only_detection(fake_accelerator, plugin_manager):
    fake = fake_accelerator("cuda", count=2, memory_gb=80)
    devices, _ = plugin.detect_devices(timeout=5)
    assert [(d.kind, d.name) for d in devices] == [("cuda", "Fake CUDA GPU")] * 2 and fake.detect_calls == 1
    # the cuda plugin is still there, and a fake cuda job sees what a real one would
    assert {i.name: i.status for i in plugin_manager.list_plugins()}["cuda"] == "loaded"
    assert plugin_manager.owner(plugins.DETECTORS_HOOK, "cuda") == "fake-cuda"
    assert plugin_manager.stood_in_for("cuda") == "cuda"
    assert plugin.device_environment("cuda", devices[1:]) == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert plugins.detectors()["cuda"].hide_env == {"CUDA_VISIBLE_DEVICES": "", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    # a kind no installed plugin knows: the fake sets its own variable
    other = fake_accelerator()
    assert plugin.device_environment("fakegpu", other.devices) == {"FAKEGPU_VISIBLE_DEVICES": "0,1"}
    assert plugin_manager.stood_in_for("fakegpu") is None
    # a second fake of a kind replaces the first
    again = fake_accelerator("cuda", count=1)
    devices, _ = plugin.detect_devices(timeout=5)
    assert [d.kind for d in devices] == ["cuda", "fakegpu", "fakegpu"] and again.detect_calls == 1


def test_fake_devices_env_disables_nothing_unless_asked(monkeypatch):
    env = plugin.fake_devices_env("cuda:2:80:9.0")
    assert env == {"GPULAYER_PLUGINS": "gpulayer.fakes", "GPULAYER_FAKE_DEVICES": "cuda:2:80:9.0"}
    monkeypatch.setenv("GPULAYER_PLUGINS", "mine")
    monkeypatch.setenv("GPULAYER_DISABLE_PLUGINS", "rocm")
    assert plugin.fake_devices_env("npu:1", disable=["mps"]) == {
        "GPULAYER_PLUGINS": "mine,gpulayer.fakes", "GPULAYER_FAKE_DEVICES": "npu:1",
        "GPULAYER_DISABLE_PLUGINS": "rocm,mps"}
    with pytest.raises(ValueError, match="GPULAYER_FAKE_DEVICES: 'cuda' is not KIND:COUNT"):
        plugin.fake_devices_env("cuda")


def test_no_real_devices_env():
    assert plugin.no_real_devices_env() == {"GPULAYER_DETECTORS": "none"}
    assert plugin.no_real_devices_env(["NPU", " cuda "]) == {"GPULAYER_DETECTORS": "npu,cuda"}


# --------------------------------------------------------------------------- torch sub-probes


class TorchNpu:
    """A third-party accelerator plugin: its detector, and the probe of its torch extension
    with ``torch.npu``."""

    @hookimpl
    def gpulayer_accelerator_detectors(self):
        yield AcceleratorDetector(name="npu", detect=lambda timeout: DetectionResult())

    @hookimpl
    def gpulayer_framework_probes(self):
        yield FrameworkProbe(name="acme-torch", distributions=["acme-torch"], subprobes=[
            SubProbe(name="torch.npu", accelerator="npu", code="return None")])


def test_a_plugins_torch_subprobe_is_what_a_torch_job_on_its_accelerator_needs(plugin_manager):
    from gpulayer.torch import Trainer, torch_requirements, torch_subprobe

    assert torch_requirements(None, "npu") == {"torch": ""}
    plugin_manager.register(TorchNpu(), name="acme-npu")
    assert torch_subprobe("npu") == "torch.npu"
    assert torch_requirements(None, "npu") == {"torch": "", "torch.npu": ""}
    assert torch_requirements({"torch.npu": ">=1.2"}, "NPU") == {"torch": "", "torch.npu": ">=1.2"}
    job = Trainer("pkg.train:main", accelerator="npu", bundle=None).job
    assert job.requirements.frameworks == {"torch": "", "torch.npu": ""}
    assert torch_requirements(None, "cuda") == {"torch": "", "torch.cuda": ""}  # the bundled ones stay


def test_two_torch_subprobes_for_one_accelerator_name_both_plugins(plugin_manager):
    from gpulayer.torch import torch_requirements

    class OtherCuda:
        @hookimpl
        def gpulayer_framework_probes(self):
            yield FrameworkProbe(name="torch-extra", subprobes=[
                SubProbe(name="torch.cuda-extra", accelerator="cuda", code="return None")])

    plugin_manager.register(OtherCuda(), name="extra")
    with pytest.raises(PluginError) as err:
        torch_requirements(None, "cuda")
    assert str(err.value) == (
        "two torch sub-probes are declared for accelerator 'cuda': 'torch.cuda' (plugin 'frameworks') "
        "and 'torch.cuda-extra' (plugin 'extra'); a torch job on it could need either")


# --------------------------------------------------------------------------- the plugin API


def _gpulayer_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gpulayer":
            found.append(f"from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] == "gpulayer"]
    return found


PLUGIN_SOURCES = sorted([*(ROOT / "plugins").rglob("*.py"), *(ROOT / "examples" / "third_party_plugin").rglob("*.py"),
                         *(ROOT / "examples" / "gpulayer-provider-ec2").rglob("*.py")])


@pytest.mark.parametrize("path", PLUGIN_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_plugins_and_the_example_import_only_gpulayer_plugin(path):
    assert set(_gpulayer_imports(path)) <= {"from gpulayer import plugin"}


def test_the_bundled_plugins_are_checked_at_all():
    assert {p.parent.name for p in PLUGIN_SOURCES} >= {"gpulayer_cuda", "gpulayer_rocm", "gpulayer_acme_npu",
                                                        "gpulayer_provider_ec2", "tests"}
    assert _gpulayer_imports(ROOT / "plugins" / "gpulayer_cuda" / "__init__.py") == ["from gpulayer import plugin"]


def test_importing_the_plugin_api_stays_cheap():
    code = ("import sys\nimport gpulayer.plugin\n"
            "heavy = ('sqlalchemy', 'sqlmodel', 'httpx', 'starlette', 'uvicorn', 'torch', 'pytest', 'typer', 'psutil')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_every_exported_name_exists():
    missing = [name for name in plugin.__all__ if not hasattr(plugin, name)]
    assert missing == []
    assert issubclass(plugin.ToolError, GpulayerError)
