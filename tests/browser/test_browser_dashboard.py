"""The dashboard in headless Chromium, against a real server with a real worker: the login,
a job going from queued to succeeded with its logs arriving live, cancelling a running job,
markup that stays text, and a phone's screen."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.dashboard_support import JOB_WAIT_MS, Dash

pytestmark = pytest.mark.timeout(240)

expect: Any
try:
    from playwright.sync_api import expect
except ImportError:  # the chromium fixture skips (or fails under .ci/run) with the reason
    expect = None


def test_a_page_without_a_session_goes_to_the_login_which_lets_a_token_in(chromium: Any, dash: Dash) -> None:
    context = chromium.new_context()
    try:
        page = context.new_page()
        page.goto(f"{dash.url}/workers")
        expect(page).to_have_url(f"{dash.url}/login?next=%2Fworkers")
        page.get_by_label("Token").fill("glt_not-a-real-token")
        page.get_by_role("button", name="Log in").click()
        expect(page.get_by_role("alert")).to_contain_text("no such token")
        expect(page.get_by_label("Token")).to_have_attribute("aria-invalid", "true")
        page.get_by_label("Token").fill(dash.admin_token)
        page.get_by_role("button", name="Log in").click()
        expect(page).to_have_url(f"{dash.url}/workers")
        expect(page.get_by_role("heading", name="laptop-worker")).to_be_visible()
        (cookie,) = [c for c in context.cookies() if c["name"] == "gpulayer_session"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert cookie["value"] != dash.admin_token
        assert page.evaluate("document.cookie") == ""  # out of scripts' reach
        assert dash.admin_token not in page.url and dash.admin_token not in page.content()
        page.get_by_role("button", name="Log out").click()
        expect(page).to_have_url(f"{dash.url}/login")
        page.goto(f"{dash.url}/jobs")
        expect(page).to_have_url(f"{dash.url}/login?next=%2Fjobs")
    finally:
        context.close()


def test_a_job_goes_from_queued_to_succeeded_with_its_logs_arriving_live(page: Any, dash: Dash) -> None:
    holder, free_slot = dash.hold_the_worker()
    gate = dash.gate()
    job_id = dash.submit(["sh", "-c", f"echo first line; while [ ! -e {gate} ]; do sleep 0.1; done; "
                                      "echo second line >&2; echo last line"], name="watched")
    jobs = page.context.new_page()
    jobs.goto(f"{dash.url}/jobs")
    row = jobs.get_by_role("row").filter(has_text=job_id)
    expect(row).to_contain_text("queued")

    page.goto(f"{dash.url}/jobs/{job_id}")
    state = page.locator("#live_job_state")
    expect(state).to_contain_text("queued")
    expect(page.locator("#live_job_placement")).to_contain_text("waiting")
    expect(page.locator("#live-status")).to_contain_text("Live")
    page.evaluate("window.gpulayerSamePage = true")  # gone if anything reloads the page

    free_slot.touch()  # the holder ends, the slot is free, the watched job starts
    expect(state).to_contain_text("running", timeout=JOB_WAIT_MS)
    expect(page.locator("#log")).to_contain_text("first line", timeout=JOB_WAIT_MS)
    expect(page.locator("#live_job_tasks")).to_contain_text("laptop-worker")
    expect(state).to_contain_text("running")  # the job waits at its gate: the log came while it ran
    gate.touch()
    expect(state).to_contain_text("succeeded", timeout=JOB_WAIT_MS)
    expect(page.locator("#log .stderr")).to_contain_text("second line", timeout=JOB_WAIT_MS)
    expect(page.locator("#log")).to_contain_text("last line")
    # no cancel button on an ended job: it may run again instead
    expect(page.locator("#live_job_actions").get_by_role("button")).to_have_text(["Run again"])
    expect(page.locator("#live-status")).to_contain_text("ended")
    assert page.evaluate("window.gpulayerSamePage") is True
    expect(row).to_contain_text("succeeded", timeout=JOB_WAIT_MS)  # the list changed in place too
    assert dash.state(holder) == "succeeded"


def test_a_jobs_artifacts_appear_as_it_ends_and_download_as_a_zip(page: Any, dash: Dash) -> None:
    import io
    import zipfile

    gate = dash.gate()
    job_id = dash.submit(["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.1; done; "
                                      'mkdir "$GPULAYER_ARTIFACTS_DIR/plots"; echo 0.1 > "$GPULAYER_ARTIFACTS_DIR/loss.txt"; '
                                      'echo png > "$GPULAYER_ARTIFACTS_DIR/plots/a.png"'])
    page.goto(f"{dash.url}/jobs/{job_id}")
    expect(page.locator("#live_job_state")).to_contain_text("running", timeout=JOB_WAIT_MS)
    expect(page.locator("#artifacts")).to_have_count(0)
    gate.touch()
    link = page.locator("#artifacts a")
    expect(link).to_have_text("2 file(s), 8 B", timeout=JOB_WAIT_MS)  # (the page is live: no reload)
    expect(page.locator("#artifacts")).to_contain_text(f"gpulayer jobs artifacts {job_id}")
    with page.expect_download() as info:
        link.click()
    download = info.value
    assert download.suggested_filename.startswith(f"{job_id}-tsk-") and download.suggested_filename.endswith(".zip")
    with zipfile.ZipFile(io.BytesIO(open(download.path(), "rb").read())) as zf:
        assert sorted(zf.namelist()) == ["loss.txt", "plots/a.png"] and zf.read("loss.txt") == b"0.1\n"
    other = page.context.new_page()  # (a task of no artifacts: the error page, not a zip)
    response = other.goto(f"{dash.url}/jobs/{job_id}/artifacts/tsk-000000000000")
    assert response is not None and response.status == 404
    expect(other.locator("body")).to_contain_text("no artifacts stored")


def test_cancel_a_running_job(page: Any, dash: Dash) -> None:
    job_id = dash.submit(["sh", "-c", "echo started; sleep 600"], name="to cancel")
    page.goto(f"{dash.url}/jobs/{job_id}")
    state = page.locator("#live_job_state")
    expect(state).to_contain_text("running", timeout=JOB_WAIT_MS)
    expect(page.locator("#log")).to_contain_text("started", timeout=JOB_WAIT_MS)
    workers = page.context.new_page()
    workers.goto(f"{dash.url}/workers")
    worker = workers.locator("article.worker").filter(has_text="laptop-worker")
    expect(worker.locator(".tasks")).to_contain_text(job_id)  # the worker lists what it runs
    expect(worker).to_contain_text("1 of 1 busy")
    page.get_by_role("button", name="Cancel job").click()
    expect(page.locator(".notice")).to_contain_text(job_id)
    expect(state).to_contain_text("cancelled", timeout=JOB_WAIT_MS)
    expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)
    assert dash.state(job_id) == "cancelled"
    expect(worker.locator(".tasks")).to_have_count(0, timeout=JOB_WAIT_MS)  # the workers page is live too


def test_markup_in_a_command_and_in_its_output_stays_text(page: Any, dash: Dash) -> None:
    holder, free_slot = dash.hold_the_worker()  # so the output arrives through the live stream
    job_id = dash.submit(["echo", "<script>alert(1)</script>"], name="<b>bold?</b>")
    page.goto(f"{dash.url}/jobs/{job_id}")
    expect(page.locator("#live_job_state")).to_contain_text("queued")
    free_slot.touch()
    expect(page.locator("#live_job_state")).to_contain_text("succeeded", timeout=JOB_WAIT_MS)
    expect(page.locator("#log")).to_have_text("<script>alert(1)</script>", timeout=JOB_WAIT_MS)
    for where in (page, page.context.new_page()):
        if where is not page:
            where.goto(f"{dash.url}/jobs/{job_id}")  # the same, rendered by the server this time
            expect(where.locator("#log")).to_have_text("<script>alert(1)</script>")
        expect(where.locator("#live_job_summary")).to_contain_text("echo '<script>alert(1)</script>'")
        expect(where.get_by_role("heading", level=1)).to_contain_text("<b>bold?</b>")
        assert where.locator("script", has_text="alert").count() == 0
        assert where.locator("b", has_text="bold?").count() == 0
    page.goto(f"{dash.url}/jobs")
    expect(page.get_by_role("row").filter(has_text=job_id)).to_contain_text("<script>alert(1)</script>")
    assert page.locator("script", has_text="alert").count() == 0
    dash.wait_state(holder, "succeeded")


def test_a_phone_screen_shows_every_page_without_sideways_scrolling(chromium: Any, admin_state: Any,
                                                                   dash: Dash) -> None:
    context = chromium.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True,
                                   storage_state=admin_state)
    try:
        page = context.new_page()
        done = dash.submit(["echo", "on a phone"])
        dash.wait_state(done, "succeeded")
        for path in ("/", "/jobs", f"/jobs/{done}", "/workers", "/machines"):
            page.goto(dash.url + path)
            expect(page.get_by_role("navigation", name="Main")).to_be_visible()
            width, inner = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
            assert width <= inner, f"{path} is {width}px wide on a {inner}px screen"
        page.goto(f"{dash.url}/jobs")
        page.get_by_label("State").select_option("succeeded")
        page.get_by_role("button", name="Show").click()
        expect(page).to_have_url(re.compile(r"/jobs\?state=succeeded$"))
        states = page.locator("#live_jobs_rows .state").all_inner_texts()
        assert states and set(states) == {"succeeded"}
        expect(page.locator("#live_jobs_rows")).to_contain_text(done)
        page.goto(f"{dash.url}/workers")
        expect(page.locator("article.worker")).to_contain_text("CPU slots")
    finally:
        context.close()
