from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata

import pytest

from gpulayer import plugins
from gpulayer.errors import InvalidRequirement
from gpulayer.hookrecords import FrameworkProbe, SubProbe
from gpulayer.profiles import resolve_requirements
from gpulayer.resources import PROBE_SCRIPT, probe_frameworks
from gpulayer.specs import Requirements

TORCH = metadata.version("torch")


def test_probe_against_the_real_torch():
    result, diagnostics = probe_frameworks(sys.executable, timeout=120, use_cache=False)
    assert diagnostics == []
    assert result["frameworks"]["torch"] == TORCH
    assert TORCH.startswith("2.")
    build = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.version.cuda, torch.version.hip)"],
        capture_output=True, text=True, timeout=120, check=True).stdout.split()
    if build == ["None", "None"]:  # the CPU build
        assert "torch.cuda" not in result["frameworks"]
        assert "torch.rocm" not in result["frameworks"]
    assert "gloo" in result["backends"]
    assert result["python_version"] == ".".join(map(str, sys.version_info[:3]))


def test_probe_runs_in_a_subprocess_and_is_cached(gpulayer_home):
    counter = gpulayer_home / "runs.txt"
    probe = FrameworkProbe(name="pytest", distributions=["pytest"], subprobes=[SubProbe(
        name="pytest.counted",
        code=f"open({str(counter)!r}, 'a').write('x')\nimport os\nreturn str(os.getpid())")])
    first, _ = probe_frameworks(timeout=60, probes={"pytest": probe})
    assert first["frameworks"]["pytest"] == metadata.version("pytest")
    import os

    assert first["frameworks"]["pytest.counted"] != str(os.getpid())
    second, _ = probe_frameworks(timeout=60, probes={"pytest": probe})
    assert second == first and counter.read_text() == "x"  # answered from the cache
    probe_frameworks(timeout=60, probes={"pytest": probe}, use_cache=False)
    assert counter.read_text() == "xx"


def test_cache_is_invalidated_when_site_packages_changes(gpulayer_home, tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(site))
    probes = {"acme": FrameworkProbe(name="acme", distributions=["acme-fw"])}
    before, _ = probe_frameworks(timeout=60, probes=probes)
    assert "acme" not in before["frameworks"]
    dist = site / "acme_fw-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-fw\nVersion: 1.2.3\n")
    after, _ = probe_frameworks(timeout=60, probes=probes)
    assert after["frameworks"]["acme"] == "1.2.3"


def test_glob_distribution_names(gpulayer_home, tmp_path, monkeypatch):
    site = tmp_path / "site"
    dist = site / "cupy_cuda12x-13.3.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: cupy-cuda12x\nVersion: 13.3.0\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    probes = {"cupy": plugins.framework_probes()["cupy"]}
    result, diagnostics = probe_frameworks(timeout=60, probes=probes, use_cache=False)
    assert result["frameworks"]["cupy"] == "13.3.0"
    # the cupy.cuda sub-probe ran, failed to import cupy, and said so
    assert any("cupy.cuda" in d and "ModuleNotFoundError" in d for d in diagnostics)


def test_probe_timeout_falls_back_to_metadata(gpulayer_home):
    probes = {"torch": FrameworkProbe(name="torch", distributions=["torch"], subprobes=[
        SubProbe(name="torch.slow", code="import time\ntime.sleep(60)\nreturn '1'")])}
    result, diagnostics = probe_frameworks(timeout=1, probes=probes, use_cache=False)
    assert result["frameworks"] == {"torch": TORCH}
    assert "no answer within 1s" in diagnostics[0]
    # the job Python is this interpreter: its version is known without the probe's answer
    # (it was "unknown", and every job with a python requirement was turned down)
    assert result["python_version"] == ".".join(map(str, sys.version_info[:3]))


def test_probe_that_crashes_keeps_this_interpreters_version(gpulayer_home):
    probes = {"torch": FrameworkProbe(name="torch", distributions=["torch"], subprobes=[
        SubProbe(name="torch.crash", code="import os\nos._exit(7)")])}
    result, diagnostics = probe_frameworks(timeout=60, probes=probes, use_cache=False)
    assert "exited with status 7" in diagnostics[0]
    assert result["frameworks"] == {"torch": TORCH}
    assert result["python_version"] == ".".join(map(str, sys.version_info[:3]))


def test_probe_of_a_missing_python(gpulayer_home, tmp_path):
    result, diagnostics = probe_frameworks(str(tmp_path / "nope" / "python"), timeout=5)
    assert result["frameworks"] == {}
    assert "cannot run" in diagnostics[0]


def test_probe_script_survives_a_framework_printing_to_stdout(tmp_path):
    spec = {"probes": [{"name": "pytest", "distributions": ["pytest"], "backends_code": None,
                        "subprobes": [{"name": "pytest.noisy", "code": "print('hello')\nreturn '1'"}]}]}
    out = subprocess.run([sys.executable, "-c", PROBE_SCRIPT], input=json.dumps(spec),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "hello" in out
    line = out.strip().splitlines()[-1]
    assert json.loads(line[line.index("{"):])["frameworks"]["pytest.noisy"] == "1"


def test_bundled_probes_and_profiles():
    probes = plugins.framework_probes()
    assert {"torch", "jax", "mlx", "cupy", "onnxruntime", "numpy"} <= set(probes)
    assert {s.name for s in probes["torch"].subprobes} == {"torch.cuda", "torch.rocm", "torch.mps"}
    profiles = plugins.profiles()
    assert {"pytorch-cuda", "pytorch-rocm", "pytorch-mps", "jax-cuda", "mlx", "cupy-cuda",
            "onnxruntime-cuda", "cpu"} <= set(profiles)
    assert profiles["pytorch-cuda"].frameworks == {"torch": "", "torch.cuda": ""}


def test_profile_fills_in_what_the_job_leaves_empty():
    req = resolve_requirements(Requirements(profile="pytorch-cuda", frameworks={"torch": ">=2.2"}))
    assert req.accelerator == "cuda" and req.device_count == 1
    assert req.frameworks == {"torch": ">=2.2", "torch.cuda": ""}
    assert resolve_requirements(req) == req
    mlx = resolve_requirements(Requirements(profile="mlx"))
    assert (mlx.accelerator, mlx.frameworks) == ("mps", {"mlx": ""})
    assert resolve_requirements(Requirements(profile="cpu")).accelerator is None


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(InvalidRequirement) as err:
        resolve_requirements(Requirements(profile="pytorch-tpu"))
    msg = str(err.value)
    assert "unknown runtime profile 'pytorch-tpu'" in msg
    for name in ("cpu", "jax-cuda", "mlx", "pytorch-cuda", "pytorch-mps", "pytorch-rocm"):
        assert name in msg


def test_profile_with_a_contradicting_accelerator_is_refused():
    with pytest.raises(InvalidRequirement, match="'pytorch-cuda' is for accelerator 'cuda'"):
        resolve_requirements(Requirements(profile="pytorch-cuda", accelerator="rocm"))
