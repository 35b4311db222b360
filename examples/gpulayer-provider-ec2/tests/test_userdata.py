"""The boot script, run by a real shell: what it exports is exactly what the worker needs."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from gpulayer_provider_ec2 import user_data

from gpulayer import plugin

PEM = "-----BEGIN CERTIFICATE-----\nMIIB'quoted' $HOME `id`\n-----END CERTIFICATE-----\n"


def test_the_script_exports_the_worker_environment_verbatim(tmp_path, make_provider, label):
    [offer] = make_provider(instance_types=["t3.large"]).offers(plugin.Requirements())
    req = plugin.LaunchRequest(machine_id="m-sh1", label=label, offer=offer, control_url="https://10.0.0.5:8765",
                               ca=PEM, bootstrap_token="glt_a'b\"c$d", join_deadline=time.time() + 60)
    # a stand-in for the image's Python: prints its argv and the GPULAYER_* environment
    fake_python = tmp_path / "python3"
    fake_python.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                           "print(json.dumps([sys.argv[1:], {k: v for k, v in os.environ.items() "
                           "if k.startswith('GPULAYER_')}]))\n")
    fake_python.chmod(0o755)
    script = tmp_path / "user-data.sh"
    script.write_text(user_data(req, python=str(fake_python)))
    out = subprocess.run(["/bin/sh", str(script)], capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    argv, env = json.loads(out.stdout)
    assert argv == ["-m", "gpulayer.cli", "worker", "start", "--name", "m-sh1"]
    assert env == req.worker_environment()
    assert env["GPULAYER_CA"] == PEM and env["GPULAYER_TOKEN"] == "glt_a'b\"c$d"
