"""The browser tests' fixtures: for the whole session, one real ``gpulayer server start`` on
loopback with one real worker (one CPU slot) and one headless Chromium.

The browser is Debian's Chromium (``/usr/bin/chromium``; ``.ci/run`` installs it), driven by
Playwright; Playwright's own browser download is not used (it cannot reach the network
here). Without Playwright or that browser the tests skip with a message, unless
``GPULAYER_REQUIRE_BROWSER=1`` (set by ``.ci/run``) makes that a failure.
``GPULAYER_TEST_CHROMIUM`` points at another Chromium binary.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.dashboard_support import CHROMIUM, CHROMIUM_ARGS, Dash
from tests.server_support import Api, ServerProc, start_remote_worker, stop_proc, wait_workers


def _need(message: str) -> None:
    if os.environ.get("GPULAYER_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{message} (GPULAYER_REQUIRE_BROWSER=1)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Headless Chromium. Playwright's ``launch`` gives it a fresh temporary profile
    (user-data dir), and each test's context is a fresh cookie jar. Per test file: while
    Playwright's sync API is open its event loop counts as running in this thread, and a
    later test file's ``asyncio.run`` in the same process would refuse to start."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need("playwright is not installed (pip install -e '.[test]')")
    if not os.access(CHROMIUM, os.X_OK):
        _need(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set GPULAYER_TEST_CHROMIUM)")
    from playwright.sync_api import expect

    # (the default 5 s for an ``expect`` is short for a page whose server shares two cores
    # with the rest of the suite; an expectation met sooner returns sooner)
    expect.set_options(timeout=30_000)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="session")
def dash(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dash]:
    home = tmp_path_factory.mktemp("browser-server")
    server = ServerProc(home, env={"GPULAYER_HEARTBEAT_TIMEOUT": "5"}).start()
    worker: subprocess.Popen[str] | None = None
    try:
        admin = Api(server.url, server.admin_token)
        join = admin.token_for("join")["token"]
        worker = start_remote_worker(server.url, join, tmp_path_factory.mktemp("browser-worker"), cpu_slots=1,
                                     name="laptop-worker")
        wait_workers(admin, 1)
        yield Dash(server, tmp_path_factory.mktemp("browser-gates"))
    finally:
        stop_proc(worker)
        server.stop()


@pytest.fixture(scope="module")
def admin_state(chromium: Any, dash: Dash) -> Any:
    """The cookies of a session logged in through the login form, for tests that start there."""
    context = chromium.new_context()
    try:
        page = context.new_page()
        page.goto(f"{dash.url}/login")
        page.get_by_label("Token").fill(dash.admin_token)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{dash.url}/")
        return context.storage_state()
    finally:
        context.close()


@pytest.fixture
def page(chromium: Any, admin_state: Any) -> Iterator[Any]:
    """A logged-in page at a laptop's size; a JavaScript dialog (``alert``) fails the test."""
    context = chromium.new_context(viewport={"width": 1280, "height": 800}, storage_state=admin_state)
    dialogs: list[str] = []
    context.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    try:
        yield context.new_page()
        assert dialogs == [], f"a page opened a dialog: {dialogs}"
    finally:
        context.close()
