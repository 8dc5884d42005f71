"""The pages in a real Chromium (Debian's, driven by Playwright) against a real server process.

``tests/web/ui_server.py`` runs ``firedrill serve``'s application under uvicorn on loopback; the
test posts Alertmanager's webhook to it like Alertmanager would, and two people, each in their
own browser context (own cookies), command the incident: Alice opens the board, follows the
incident, approves the lever (it needs two people), is refused when she approves it a second
time; Bob approves it and it is pulled; Alice's page shows Bob's approval and the pull without
being reloaded (the server-sent event stream). Then the game-day ladder and a run's report.

Every request the browser makes is checked to stay on the server: nothing from a CDN. Screenshots
go to ``out/screenshots/`` (kept as test artefacts, ignored by Git).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.adapters.test_twin_serve import free_port, stop_process, wait_for
from tests.web.test_serve_api import alert, payload

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "out" / "screenshots"
CHROMIUM = os.environ.get("FIREDRILL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKENS = {
    "am-secret": ("alertmanager", ["webhook"]),
    "alice-secret": ("Alice", ["capacity_lead", "incident_commander"]),
    "bob-secret": ("Bob", ["incident_commander"]),
}
playwright = pytest.importorskip("playwright.sync_api")

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists() and shutil.which("chromium") is None,
    reason="chromium not installed: make tools",
)


def sha(token: str) -> str:
    import hashlib

    return hashlib.sha256(token.encode()).hexdigest()


class Server:
    def __init__(self, work: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        tokens = {
            "tokens": [{"sha256": sha(t), "person": p, "roles": r} for t, (p, r) in TOKENS.items()]
        }
        (work / "tokens.yml").write_text(yaml.safe_dump(tokens))
        self.log = work / "serve.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.web.ui_server",
                    "--port",
                    str(self.port),
                    "--db",
                    f"sqlite:///{work / 'store.db'}",
                    "--tokens",
                    str(work / "tokens.yml"),
                ],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )

        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited:\n{self.log.read_text()[-3000:]}")
            try:
                return httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for("the server", ready, timeout_s=60)

    def api(self, method: str, path: str, token: str = "bob-secret", **kw: Any) -> Any:
        r = httpx.request(
            method, f"{self.url}{path}", headers={"Authorization": f"Bearer {token}"}, **kw
        )
        assert r.status_code < 300, r.text
        return r.json()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path)
    try:
        yield s
    finally:
        stop_process(s.process)


@pytest.fixture
def browser() -> Iterator[Any]:
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def person(browser: Any, server: Server, token: str, elsewhere: list[str]) -> Any:
    """A browser context of its own (its own cookies), logged in through the form."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)

    def gate(route: Any) -> None:
        if route.request.url.startswith(server.url):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    context.route("**/*", gate)
    page = context.new_page()
    page.goto(f"{server.url}/ui/board")
    assert "/ui/login" in page.url
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/ui/board")
    return page


def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_two_people_command_an_incident_in_chromium_and_the_page_updates_live(
    server: Server, browser: Any
) -> None:
    started = time.monotonic()
    elsewhere: list[str] = []
    alice = person(browser, server, "alice-secret", elsewhere)
    assert "No incidents match." in alice.content()

    # the pipeline's last hop: Alertmanager's webhook pages on usw2-b
    page_alert = payload(alert("usw2-b", "CellTTFTBurnFast", region="us-west-2"))
    server.api("POST", "/api/v1/alerts/webhook", "am-secret", json=page_alert)

    # the board shows it without a reload (the event stream refreshes the rows)
    row = alice.locator("#board-rows tbody tr").first
    playwright.expect(row).to_contain_text("usw2-b", timeout=15_000)
    playwright.expect(row).to_contain_text("SEV")
    shot(alice, "board")

    def proposed() -> list[dict[str, Any]]:
        (inc,) = server.api("GET", "/api/v1/incidents")
        levers = server.api("GET", f"/api/v1/incidents/{inc['id']}/levers")
        return [lv for lv in levers if lv["status"] == "proposed"]

    wait_for("a proposed lever", lambda: bool(proposed()), timeout_s=30)
    (lever,) = proposed()
    assert lever["roles_needed"] == ["capacity_lead", "incident_commander"]

    alice.locator("#board-rows a").first.click()
    alice.wait_for_url("**/ui/incidents/INC-*")
    approve = alice.get_by_role("button", name=f"Approve lever {lever['id']}")
    approve.focus()  # keyboard: the button takes focus and Enter presses it
    alice.keyboard.press("Enter")
    levers = alice.locator("#levers")
    playwright.expect(levers).to_contain_text("Still missing: incident_commander")
    # the same person again: refused, with the API's reason, and nothing pulled
    alice.get_by_role("button", name=f"Approve lever {lever['id']}").click()
    playwright.expect(levers.get_by_role("alert")).to_contain_text("another person")
    assert server.api("GET", f"/api/v1/levers/{lever['id']}")["status"] == "proposed"
    shot(alice, "incident-refused-one-person")

    # Alice starts an update; live refreshes must not wipe what she is typing
    draft = alice.get_by_label("Update", exact=True)
    draft.fill("Half-written: mitigation under way")
    bob = person(browser, server, "bob-secret", elsewhere)
    bob.goto(f"{server.url}/ui/incidents/{lever['incident_id']}")
    bob.get_by_role("button", name=f"Approve lever {lever['id']}").click()
    playwright.expect(bob.locator("#levers")).to_contain_text("applied")
    assert server.api("GET", f"/api/v1/levers/{lever['id']}")["status"] == "applied"

    # Alice's page, never reloaded, shows Bob's approval and the pull
    timeline = alice.locator("#timeline")
    playwright.expect(timeline).to_contain_text("Bob approved", timeout=15_000)
    playwright.expect(alice.locator(f"#lever-{lever['id']}")).to_contain_text("applied")
    playwright.expect(alice.get_by_role("button", name=f"Undo lever {lever['id']}")).to_be_visible()
    playwright.expect(draft).to_have_value("Half-written: mitigation under way")
    shot(alice, "incident-live-after-second-approval")

    # game days: the ladder, a run, its report
    alice.get_by_role("link", name="Game days").click()
    playwright.expect(alice.locator("main")).to_contain_text("last successful L5 for llm-70b")
    playwright.expect(alice.locator("main")).to_contain_text("Preheat the survivor pool")
    shot(alice, "gamedays")
    alice.get_by_role("link", name="report of run 1").click()
    alice.wait_for_url("**/report")
    assert alice.locator("svg").count() >= 3
    shot(alice, "gameday-report")

    assert elsewhere == []  # nothing asked of any other host
    print(f"browser test: {time.monotonic() - started:.1f} s after the server was up")
