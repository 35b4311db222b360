"""`gpulayer resources detect`, `plugins list`, `profiles list` as real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulayer.testing import fake_devices_env, no_real_devices_env

pytestmark = pytest.mark.usefixtures("gpulayer_isolated")

ROOT = Path(__file__).resolve().parents[2]
H200_X2 = (
    "0, NVIDIA H200, 143771, 9.0, GPU-aaaaaaaa-0000, 550.54.15\n"
    "1, NVIDIA H200, 143771, 9.0, GPU-aaaaaaaa-0001, 550.54.15\n"
)


def gpulayer(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpulayer.cli", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=timeout)


def pythonpath(*first: Path) -> str:
    """``first``, then whatever PYTHONPATH this test run has (which may put a checkout first)."""
    return os.pathsep.join([*map(str, first), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])


@pytest.fixture
def cuda_detector(gpulayer_isolated: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundled cuda detector runs (against a fake nvidia-smi), every other one stays
    hidden, and NVML is not asked, so a real GPU here cannot answer instead."""
    for name, value in no_real_devices_env(keep=["cuda"]).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GPULAYER_CUDA_NO_NVML", "1")


def test_resources_detect_end_to_end():
    proc = gpulayer("resources", "detect")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    host = lines[0]
    assert host.startswith("host      ") and "CPUs" in host and "GB RAM" in host
    assert f"python {sys.version_info[0]}.{sys.version_info[1]}" in host
    assert "device    none found" in lines
    assert any(ln.startswith("framework torch 2.") for ln in lines)
    assert any(ln.startswith("backends  ") and "gloo" in ln for ln in lines)


@pytest.mark.usefixtures("cuda_detector", "probes_seeded")  # (the probes run: end_to_end above)
def test_resources_detect_lists_fake_nvidia_gpus(fake_tool):
    fake_tool("nvidia-smi", H200_X2)
    proc = gpulayer("resources", "detect")
    assert proc.returncode == 0, proc.stderr
    devices = [ln for ln in proc.stdout.splitlines() if ln.startswith("device")]
    assert devices == [
        "device    [0] cuda NVIDIA H200 (140.4 GB) cc=9.0 independent=fixture-tested distributed=fixture-tested",
        "device    [1] cuda NVIDIA H200 (140.4 GB) cc=9.0 independent=fixture-tested distributed=fixture-tested",
    ]


@pytest.mark.usefixtures("cuda_detector", "probes_seeded")  # (the probes run: end_to_end above)
def test_resources_detect_json(fake_tool):
    fake_tool("nvidia-smi", H200_X2)
    proc = gpulayer("resources", "detect", "--json", "--timeout", "60")
    assert proc.returncode == 0, proc.stderr
    caps = json.loads(proc.stdout)
    assert [(d["kind"], d["memory_bytes"], d["compute_capability"]) for d in caps["devices"]] == [
        ("cuda", 143771 * 1024**2, "9.0")] * 2
    assert caps["host"]["python_path"] and caps["frameworks"]["torch"].startswith("2.")


@pytest.mark.usefixtures("cuda_detector")
def test_hanging_tool_does_not_hang_the_cli(fake_tool):
    fake_tool("nvidia-smi", H200_X2, sleep=60)
    proc = gpulayer("resources", "detect", "--timeout", "1", timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "device    none found" in proc.stdout
    assert "diagnostic cuda: nvidia-smi: no answer within 1s (killed)" in proc.stdout


@pytest.mark.usefixtures("cuda_detector")
def test_the_cli_never_imports_torch(fake_tool):
    fake_tool("nvidia-smi", H200_X2)
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from gpulayer.cli import app\n"
        "for args in (['resources', 'detect', '--refresh'], ['plugins', 'list'], ['profiles', 'list']):\n"
        "    r = CliRunner().invoke(app, args)\n"
        "    assert r.exit_code == 0, (args, r.output, r.exception)\n"
        "assert 'NVIDIA H200' in CliRunner().invoke(app, ['resources', 'detect']).output\n"
        "heavy = sorted(m for m in ('torch', 'jax', 'numpy', 'pynvml', 'mlx', 'cupy') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("ok")


@pytest.mark.usefixtures("probes_seeded")  # (the probes run: end_to_end above)
def test_fake_cuda_devices_reach_a_subprocess(fake_tool):
    fake_tool("nvidia-smi", H200_X2)  # what the real detector would find, if it ran
    env = {**fake_devices_env("cuda:2:80:9.0"), "GPULAYER_DETECTORS": "cuda", "GPULAYER_CUDA_NO_NVML": "1"}
    assert "GPULAYER_DISABLE_PLUGINS" not in env
    proc = gpulayer("resources", "detect", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    caps = json.loads(proc.stdout)
    assert [(d["kind"], d["index"], d["memory_bytes"], d["name"]) for d in caps["devices"]] == [
        ("cuda", 0, 80 * 1024**3, "Fake CUDA GPU"), ("cuda", 1, 80 * 1024**3, "Fake CUDA GPU")]
    listing = gpulayer("plugins", "list", env=env).stdout.splitlines()
    assert any(ln.startswith("gpulayer.fakes") and "loaded" in ln for ln in listing)
    assert any(ln.split()[:2] == ["cuda", "loaded"] for ln in listing)  # stood in for, not disabled


def test_plugins_list_shows_a_broken_plugin_named_in_gpulayer_plugins_and_fails(tmp_path):
    (tmp_path / "gl_broken.py").write_text("import gpulayer_no_such_module\n")
    env = {"PYTHONPATH": pythonpath(tmp_path), "GPULAYER_PLUGINS": "gl_broken"}
    proc = gpulayer("plugins", "list", env=env)
    assert proc.returncode == 2
    rows = {ln.split()[0]: ln.split() for ln in proc.stdout.splitlines() if ln.strip() and not ln.startswith(" ")}
    assert rows["gl_broken"][1:4] == ["broken", "module", "gl_broken"]
    assert rows["cuda"][1] == "loaded"
    assert "error: ModuleNotFoundError: No module named 'gpulayer_no_such_module'" in proc.stdout
    assert proc.stderr.startswith("error: plugin 'gl_broken' named in GPULAYER_PLUGINS failed to import:\n"
                                  "Traceback (most recent call last):\n")
    assert f'File "{tmp_path / "gl_broken.py"}", line 1, in <module>' in proc.stderr
    data = json.loads(gpulayer("plugins", "list", "--json", env=env).stdout)
    broken = next(p for p in data["plugins"] if p["name"] == "gl_broken")
    assert broken["status"] == "broken" and "gl_broken.py" in broken["traceback"]
    detect = gpulayer("resources", "detect", env=env)
    assert detect.returncode == 2 and "named in GPULAYER_PLUGINS failed to import" in detect.stderr


def test_plugins_list():
    proc = gpulayer("plugins", "list", env={"GPULAYER_DISABLE_PLUGINS": "rocm,nvidia"})
    assert proc.returncode == 0, proc.stderr
    rows = {ln.split()[0]: ln.split() for ln in proc.stdout.splitlines() if ln.strip()}
    assert rows["cuda"][1:4] == ["loaded", "gpulayer", "0.1.0"]
    assert "accelerator_detectors," in rows["cuda"] and "device_environment" in rows["cuda"]
    assert rows["rocm"][1] == "disabled"
    assert "warning: GPULAYER_DISABLE_PLUGINS names no installed plugin: nvidia" in proc.stderr
    data = json.loads(gpulayer("plugins", "list", "--json",
                               env={"GPULAYER_DISABLE_PLUGINS": "nvidia"}).stdout)
    assert data["unknown_disabled"] == ["nvidia"]
    assert {p["name"]: p["status"] for p in data["plugins"]}["cuda"] == "loaded"


def test_profiles_list():
    proc = gpulayer("profiles", "list")
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("pytorch-cuda "))
    assert "accelerator=cuda" in line and "frameworks=torch, torch.cuda" in line
    data = json.loads(gpulayer("profiles", "list", "--json").stdout)
    assert {p["name"] for p in data} >= {"pytorch-cuda", "jax-cuda", "mlx", "cpu"}


def test_third_party_plugin_found_through_entry_point_metadata(tmp_path):
    """The example package, made discoverable the way pip would: a dist-info directory
    with entry_points.txt next to the package on the path."""
    src = ROOT / "examples" / "third_party_plugin" / "src"
    site = tmp_path / "site"
    dist = site / "gpulayer_acme_npu-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gpulayer-acme-npu\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[gpulayer]\nacme-npu = gpulayer_acme_npu\n")
    env = {"PYTHONPATH": pythonpath(site, src), "ACME_NPU_DEVICES": "2",
           **no_real_devices_env(keep=["npu"])}
    proc = gpulayer("resources", "detect", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    caps = json.loads(proc.stdout)
    assert [(d["kind"], d["index"], d["name"]) for d in caps["devices"]] == [
        ("npu", 0, "Acme NPU 9000"), ("npu", 1, "Acme NPU 9000")]
    listing = gpulayer("plugins", "list", env=env).stdout
    row = next(ln for ln in listing.splitlines() if ln.startswith("acme-npu"))
    assert "gpulayer-acme-npu 0.1.0" in row and "accelerator_detectors" in row
    assert "acme-npu" in gpulayer("profiles", "list", env=env).stdout
    # and the example's own tests pass with gpulayer's fixtures
    tests = ROOT / "examples" / "third_party_plugin" / "tests"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env, "ACME_NPU_DEVICES": "0"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
