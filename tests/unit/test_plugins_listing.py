"""``gpulayer plugins list`` lines its columns up whatever the names: a distribution named
as the guide suggests (``gpulayer-<something>``) is often longer than GPUlayer's own."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_plugins import gpulayer_cli, write_distribution

PROFILE = """\
    from gpulayer import plugin

    @plugin.hookimpl
    def gpulayer_runtime_profiles():
        yield plugin.RuntimeProfile(name="zed-zpu", accelerator="zpu")
    """


def test_the_hooks_column_starts_at_one_place_for_a_long_distribution_name(tmp_path: Path) -> None:
    write_distribution(tmp_path, "gpulayer-zed-runtime-profiles", "0.10.2", "zed = gpulayer_zed", {"gpulayer_zed": PROFILE})
    proc = gpulayer_cli("plugins", "list", pythonpath=[tmp_path], env={"GPULAYER_HOME": str(tmp_path / "home"),
                                                                         "GPULAYER_CLI_SERVER_IDLE": "0"})
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line and not line[0].isspace()}
    assert "gpulayer-zed-runtime-profiles 0.10.2  runtime_profiles" in rows["zed"], rows["zed"]
    assert rows["zed"].index("runtime_profiles") == rows["cuda"].index("accelerator_detectors"), proc.stdout
