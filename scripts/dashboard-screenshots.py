"""Take the screenshots of docs/dashboard.md: a real server and worker, a few jobs, headless
Chromium (Debian's, as in the browser tests). The worker's four CUDA devices are stand-ins
(:mod:`gpulayer.fakes`): the jobs run on this machine's CPU.

    .venv/bin/python scripts/dashboard-screenshots.py        # writes docs/images/dashboard-*.png
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from playwright.sync_api import sync_playwright  # noqa: E402

from gpulayer.client import http_client  # noqa: E402
from gpulayer.fakes import fake_devices_env  # noqa: E402
from gpulayer.specs import CommandJob, Placement, Requirements  # noqa: E402
from tests.dashboard_support import CHROMIUM, CHROMIUM_ARGS, Dash  # noqa: E402
from tests.server_support import Api, ServerProc, start_remote_worker, stop_proc, wait_workers  # noqa: E402

# what the pictured jobs run: a training loop that prints, then waits until the pictures are taken
TRAIN_PY = """\
import os, sys, time
losses = [2.412, 1.873, 1.502, 1.288, 1.131, 1.047]
for epoch, loss in enumerate(losses, 1):
    print(f"epoch {epoch}/8  loss {loss:.3f}  lr 3e-4  412 img/s", flush=True)
    time.sleep(0.2)
print(f"checkpoint saved to runs/{sys.argv[2]}/ckpt-6.pt", file=sys.stderr, flush=True)
while not os.path.exists(os.environ["GATE"]):
    time.sleep(0.2)
"""


def main() -> None:
    out = ROOT / "docs" / "images"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProc(Path(tmp) / "server", env={"GPULAYER_HEARTBEAT_TIMEOUT": "5"}).start()
        worker = None
        try:
            admin = Api(server.url, server.admin_token)
            worker = start_remote_worker(server.url, admin.token_for("join")["token"], Path(tmp) / "worker",
                                         cpu_slots=2, name="gpu-box-01", env=fake_devices_env("cuda:4:80:9.0"))
            wait_workers(admin, 1)
            dash = Dash(server, Path(tmp))
            project = Path(tmp) / "project"  # the pictured jobs' code, sent as a bundle
            project.mkdir()
            (project / "train.py").write_text(TRAIN_PY)
            (project / "sweep.py").write_text("print('sweep done')\n")
            client = http_client(server.url, token=server.admin_token)
            gate = dash.gate()

            def submit(name: str, *command: str, gpus: int = 0) -> str:
                needs = Requirements(accelerator="cuda", gpus=gpus) if gpus else Requirements()
                spec = CommandJob(command=list(command), name=name, bundle=str(project), env={"GATE": str(gate)},
                                  requirements=needs, placement=Placement(target="remote", on_unschedulable="wait"))
                return client.submit(spec).id

            for name, command, state in [
                ("prepare-data", ["python3", "-c", 'print("12000 images resized to 224x224")'], "succeeded"),
                ("lint", ["sh", "-c", "echo train.py:41: E501 line too long >&2; exit 1"], "failed"),
                ("eval-baseline", ["python3", "-c", 'print("top-1 0.761")'], "succeeded"),
            ]:
                dash.wait_state(submit(name, *command), state)
            train = submit("train-resnet50", "python3", "train.py", "--model", "resnet50", "--epochs", "8", gpus=2)
            submit("train-vit-small", "python3", "train.py", "--model", "vit-small", "--epochs", "8", gpus=1)
            dash.wait_state(train, "running")
            submit("sweep-lr", "python3", "sweep.py", "--lr", "1e-4,3e-4,1e-3", gpus=2)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 860})
                page.goto(f"{server.url}/login")
                page.get_by_label("Token").fill(server.admin_token)
                page.get_by_role("button", name="Log in").click()
                page.wait_for_url(f"{server.url}/")
                page.goto(f"{server.url}/jobs/{train}")
                page.locator("#log").get_by_text("checkpoint saved").wait_for()
                page.wait_for_timeout(500)  # let the last live region settle before the picture
                page.screenshot(path=str(out / "dashboard-job.png"), full_page=True)
                page.goto(f"{server.url}/")
                page.wait_for_timeout(500)
                page.screenshot(path=str(out / "dashboard-overview.png"))
                browser.close()
            gate.touch()
        finally:
            stop_proc(worker)
            server.stop()
    print(f"wrote {out}/dashboard-job.png and dashboard-overview.png")


if __name__ == "__main__":
    main()
