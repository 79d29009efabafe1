"""The console in a real browser: Debian's headless chromium driven by Playwright, against a
console process, a worker and a Redis this module starts. Sign in, watch a figure change
without a reload, make a rule in the form and see the worker act on it, open a user, promote
a model; no JavaScript error on any page; a screenshot of each page in test-artifacts/."""

from __future__ import annotations

import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from model.artifact import save_model
from model.random_init import random_model
from tests.conftest import console_script
from tests.console_setup import EDITOR_TOKEN, TOKEN_ENV, publish_events, two_versions
from tests.workers import WorkerProcess, count_scores, wait_for
from worker.common.keys import Keys
from worker.common.local_redis import LocalRedis, free_port
from worker.rules.store import read_rule

pytestmark = pytest.mark.integration

CHROMIUM = Path(os.environ.get("INTENTSTREAM_CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "console"
KEYS = Keys()
TYPES = ["view", "search", "add_to_cart", "remove_from_cart", "coupon", "checkout", "purchase"]
WAIT_MS = 90_000  # generous: two cores shared by the suite's workers


class Stack:
    """Redis, a worker and the console, all started here."""

    def __init__(self, tmp: Path) -> None:
        self.redis = LocalRedis().start()
        self.r = self.redis.client()
        model_path = tmp / "model.npz"
        save_model(random_model(TYPES, hidden=16, features=["gap"], seed=3), model_path)
        two_versions(self.r, model_path)
        self.events = publish_events(self.r, 600, 30, seed=11)
        self.worker = WorkerProcess(self.redis.url, model_path, tmp / "worker.log").start()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with open(tmp / "console.log", "ab") as log:
            self.console = subprocess.Popen(
                [console_script(), "console", "--redis-url", self.redis.url,
                 "--port", str(self.port)],
                env=os.environ | TOKEN_ENV, stdout=log, stderr=log,
            )  # fmt: skip
        wait_for(lambda: urllib.request.urlopen(f"{self.url}/login").status == 200, 60,
                 "the console to answer")  # fmt: skip
        wait_for(lambda: count_scores(self.r) >= len(self.events), 120, "the first scores")

    def close(self) -> None:
        self.console.terminate()
        self.console.wait(15)
        self.worker.terminate()
        self.redis.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("console"))
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():  # fail, never skip: CI must run these
        pytest.fail(f"no {CHROMIUM}: run `bash scripts/browser_tools.sh` as root (scripts/test.sh "
                    "does) to install Debian's chromium")  # fmt: skip
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser, request):
    """A fresh browser context; every page error and console error is collected and must be
    none; the page's last state is kept as a screenshot."""
    context = browser.new_context()
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    pg.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    pg.errors = errors
    yield pg
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    context.close()
    assert errors == [], errors


def sign_in(page, stack: Stack, token: str = EDITOR_TOKEN) -> None:
    page.goto(f"{stack.url}/")
    assert page.url.endswith("/login")  # nothing without a token
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{stack.url}/")


def took_rule(stack: Stack, name: str) -> bool:
    """Whether the worker has logged taking a rule set that holds `name`."""
    return any(
        "intent rules changed" in line and f'"{name}"' in line
        for line in stack.worker.log().splitlines()
    )


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_sign_in_and_watch_the_figures_change_without_a_reload(page, stack):
    from playwright.sync_api import expect

    sign_in(page, stack)
    page.evaluate("window.stillThisPage = true")
    before = int(page.text_content("#total-scores"))
    expect(page.locator("#rate-scores")).not_to_have_text("…", timeout=WAIT_MS)  # second poll
    publish_events(stack.r, 300, 30, seed=12)
    # read from Python: the page's CSP refuses the string eval of page.wait_for_function
    wait_for(lambda: int(page.text_content("#total-scores")) >= before + 300, WAIT_MS / 1000,
             "the overview's scores to move")  # fmt: skip
    expect(page.locator("#model-current")).to_have_text("1")
    expect(page.locator("#partitions tr")).to_have_count(1)
    expect(page.locator("#workers li")).to_contain_text("1 partition(s)")
    shot(page, "overview")
    assert page.evaluate("window.stillThisPage") is True  # no reload in between


def test_a_rule_made_in_the_form_is_backtested_saved_and_acted_on(page, stack):
    from playwright.sync_api import expect

    sign_in(page, stack)
    page.goto(f"{stack.url}/rules")
    for name, value in {"name": "from-browser", "above": "0", "rearm_below": "0",
                        "cooldown": "0", "min_events": "1", "types": ""}.items():  # fmt: skip
        page.fill(f"form.rule input[name={name}]", value)
    page.click("form.rule button[type=submit]")
    expect(page.locator("#backtest-figures")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("svg.chart")).to_have_count(2)
    shot(page, "backtest")
    page.click("#save-rule button[type=submit]")
    page.wait_for_url(f"{stack.url}/rules?saved=from-browser")
    expect(page.locator("tr[data-rule=from-browser]")).to_be_visible()
    assert read_rule(stack.r, KEYS, "from-browser").above == 0.0
    # events scored before the worker takes the rule fire nothing, and no more come
    wait_for(lambda: took_rule(stack, "from-browser"), WAIT_MS / 1000, "the worker's new rule")
    page.goto(f"{stack.url}/actions")
    publish_events(stack.r, 200, 10, seed=13)
    row = page.locator("#actions tr", has_text="from-browser").first
    expect(row).to_be_visible(timeout=WAIT_MS)  # the worker's action, polled in
    shot(page, "actions")


def test_open_a_user(page, stack):
    from playwright.sync_api import expect

    sign_in(page, stack)
    user = stack.events[-1]["user_id"]
    page.goto(f"{stack.url}/users")
    page.fill("input[name=user_id]", user)
    page.click("form.search button[type=submit]")
    expect(page.locator("#timeline tbody tr").first).to_be_visible()
    stored = float(stack.r.hget(KEYS.state(0, user), "score"))
    expect(page.locator("#stored-score")).to_have_text(f"{stored:.4f}")
    shot(page, "user")


def test_promote_a_model(page, stack):
    from playwright.sync_api import expect

    sign_in(page, stack)
    page.goto(f"{stack.url}/models")
    page.click("tr[data-version='2'] button[type=submit]")
    expect(page.locator("#gate")).to_contain_text("version 2 is current", timeout=WAIT_MS)
    assert stack.r.get(KEYS.model_current) == b"2"
    shot(page, "models")
