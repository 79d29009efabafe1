"""The console over plain HTTP (Starlette's TestClient on a private Redis): nothing served
without a token, the session cookie's flags, Bearer for scripts, CSRF on every change, the
viewer read only, rules set as `rules set` sets them, the promotion gate, the audit."""

from __future__ import annotations

import html
import re

import pytest
from starlette.testclient import TestClient

from tests.conftest import run_cli
from tests.console_setup import EDITOR_TOKEN, TOKEN_ENV, VIEWER_TOKEN, publish_events, two_versions
from worker.common.keys import Keys
from worker.common.settings import load_settings
from worker.console.app import build_app
from worker.console.context import make_console
from worker.console.tokens import Tokens
from worker.lifecycle.registry import Registry
from worker.rules.store import read_rule, read_rules

KEYS = Keys()
PAGES = ["/", "/rules", "/users", "/actions", "/models", "/api/overview", "/api/actions",
         "/static/console.js", "/rules/backtest?name=a&above=0.5"]  # fmt: skip
CHANGES = ["/rules/save", "/rules/delete", "/models/promote", "/models/rollback"]
RULE = {"name": "coupon", "above": "0.6", "rearm_below": "0.5", "cooldown": "15m",
        "min_events": "2", "types": "add_to_cart,checkout"}  # fmt: skip


@pytest.fixture
def client(redis_server, model_path):
    two_versions(redis_server.client(), model_path)
    settings = load_settings(None, redis_url=redis_server.url)
    app = build_app(make_console(settings, Tokens(EDITOR_TOKEN, VIEWER_TOKEN), 10_000))
    with TestClient(app, follow_redirects=False) as c:
        yield c


def signed_in(client: TestClient, token: str) -> str:
    """Sign in through /login; return the session's CSRF token as its pages carry it."""
    response = client.post("/login", data={"token": token})
    assert response.status_code == 303, response.text
    page = client.get("/rules")
    return re.search(r'data-csrf="([0-9a-f]+)"', page.text).group(1)


def audit(redis_server) -> list[dict]:
    entries = redis_server.client().xrange(KEYS.console_audit)
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


def test_nothing_is_served_without_a_token(client):
    for path in PAGES:
        response = client.get(path)
        assert response.status_code == 401, path
        assert "Bearer" in response.headers["www-authenticate"]
        browser = client.get(path, headers={"accept": "text/html"})
        assert (browser.status_code, browser.headers["location"]) == (303, "/login"), path
    for path in CHANGES:
        assert client.post(path, data={"name": "x"}).status_code == 401, path
    login = client.get("/login")
    assert login.status_code == 200 and 'name="token"' in login.text
    assert "default-src 'self'" in login.headers["content-security-policy"]
    for token in ("", "wrong-token-of-enough-length", EDITOR_TOKEN[:-1], VIEWER_TOKEN + "x"):
        assert client.post("/login", data={"token": token}).status_code == 401
        assert client.get("/api/overview", headers={"authorization": f"Bearer {token}"}
                          ).status_code == 401  # fmt: skip
    assert client.get("/api/overview", headers={"authorization": EDITOR_TOKEN}).status_code == 401


def test_the_session_cookie_is_httponly_strict_and_secure_under_tls(client):
    response = client.post("/login", data={"token": EDITOR_TOKEN})
    cookie = response.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Secure" not in cookie
    assert EDITOR_TOKEN not in cookie
    assert client.get("/").status_code == 200
    tls = TestClient(client.app, base_url="https://console.test", follow_redirects=False)
    assert "Secure" in tls.post("/login", data={"token": VIEWER_TOKEN}).headers["set-cookie"]
    value = cookie.split(";")[0].split("=", 1)[1]
    for altered in (value + "0", value.replace("editor", "viewer", 1), "editor.9999999999.0.0"):
        other = TestClient(client.app, follow_redirects=False)
        other.cookies.set("intentstream_console", altered)
        assert other.get("/api/overview").status_code == 401  # an altered cookie opens nothing


def test_no_page_renders_a_token(client):
    signed_in(client, EDITOR_TOKEN)
    for path in PAGES:
        body = client.get(path).text
        assert client.get(path).status_code == 200, path
        assert EDITOR_TOKEN not in body and VIEWER_TOKEN not in body, path


def test_a_bearer_token_reads_and_an_editor_bearer_changes_without_csrf(client, redis_server):
    viewer = {"authorization": f"Bearer {VIEWER_TOKEN}"}
    figures = client.get("/api/overview", headers=viewer).json()
    assert figures["model"] == {"current": "1", "shadow": None}
    assert client.post("/rules/save", data=RULE, headers=viewer).status_code == 403
    editor = {"authorization": f"Bearer {EDITOR_TOKEN}"}
    assert client.post("/rules/save", data=RULE, headers=editor).status_code == 303
    assert read_rule(redis_server.client(), KEYS, "coupon").above == 0.6
    (entry,) = audit(redis_server)
    assert entry["action"] == "rules.set" and entry["via"] == "bearer"
    assert entry["who"].startswith("editor:") and EDITOR_TOKEN not in str(entry)


def test_every_change_needs_the_sessions_csrf_token(client, redis_server):
    csrf = signed_in(client, EDITOR_TOKEN)
    for path in CHANGES:
        assert client.post(path, data=RULE).status_code == 403, path
        assert client.post(path, data=RULE | {"csrf": "0" * 64}).status_code == 403, path
    other = TestClient(client.app, follow_redirects=False)
    other_csrf = signed_in(other, EDITOR_TOKEN)
    assert other_csrf != csrf
    assert client.post("/rules/save", data=RULE | {"csrf": other_csrf}).status_code == 403
    evil = {"origin": "https://evil.example"}
    assert client.post("/rules/save", data=RULE | {"csrf": csrf}, headers=evil).status_code == 403
    assert read_rules(redis_server.client(), KEYS).version == 0  # nothing was written
    assert audit(redis_server) == []
    saved = client.post("/rules/save", data=RULE | {"csrf": csrf})
    assert (saved.status_code, saved.headers["location"]) == (303, "/rules?saved=coupon")
    by_header = client.post("/rules/delete", data={"name": "coupon"},
                            headers={"x-csrf-token": csrf})  # fmt: skip
    assert by_header.status_code == 303
    assert [e["action"] for e in audit(redis_server)] == ["rules.set", "rules.delete"]


def test_the_viewer_changes_nothing(client, redis_server):
    csrf = signed_in(client, VIEWER_TOKEN)
    page = client.get("/rules").text
    assert "/rules/save" not in page and "/rules/delete" not in page
    assert "/models/promote" not in client.get("/models").text
    for path in CHANGES:
        response = client.post(path, data=RULE | {"csrf": csrf, "version": "2"})
        assert response.status_code == 403 and "read only" in response.text, path
    assert read_rules(redis_server.client(), KEYS).version == 0
    assert redis_server.client().get(KEYS.model_current) == b"1"


def test_a_saved_rule_is_the_rule_rules_set_writes(client, redis_server):
    csrf = signed_in(client, EDITOR_TOKEN)
    assert client.post("/rules/save", data=RULE | {"csrf": csrf}).status_code == 303
    r = redis_server.client()
    by_console = r.hget(KEYS.rules, "coupon")
    result = run_cli("rules", "set", "coupon", "--above", "0.6", "--rearm-below", "0.5",
                     "--cooldown", "15m", "--min-events", "2", "--types", "add_to_cart,checkout",
                     "--redis-url", redis_server.url)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert r.hget(KEYS.rules, "coupon") == by_console
    assert read_rules(r, KEYS).version == 2  # each change bumped the version once
    assert "coupon" in client.get("/rules").text


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [("above", "2", "outside 0..1"), ("above", "", "above: required"),
     ("rearm_below", "0.9", "is above above"), ("cooldown", "soon", "duration 'soon'"),
     ("min_events", "0", "min_events 0 is outside"), ("name", "-x", "not a rule name")],
)  # fmt: skip
def test_a_bad_rule_is_refused_with_the_rule_models_words(client, redis_server, field, value, says):
    csrf = signed_in(client, EDITOR_TOKEN)
    response = client.post("/rules/save", data=RULE | {field: value, "csrf": csrf})
    assert response.status_code == 400 and says in html.unescape(response.text)
    assert client.get("/rules/backtest", params=RULE | {field: value}).status_code == 400
    assert read_rules(redis_server.client(), KEYS).version == 0


def test_a_backtest_shows_figures_and_charts_before_saving(client, redis_server):
    publish_events(redis_server.client(), 1500, 60, seed=5)
    signed_in(client, EDITOR_TOKEN)
    low = RULE | {"above": "0.3", "rearm_below": "0.25", "types": ""}
    page = client.get("/rules/backtest", params=low)
    assert page.status_code == 200, page.text
    assert "1500 retained events replayed through model 1" in page.text
    assert page.text.count("<svg") == 2 and "precision and recall by threshold" in page.text
    assert 'action="/rules/save"' in page.text
    assert read_rules(redis_server.client(), KEYS).version == 0  # a backtest writes nothing


def test_promotion_goes_through_the_gate_and_is_audited(client, redis_server):
    publish_events(redis_server.client(), 1500, 60, seed=6)
    csrf = signed_in(client, EDITOR_TOKEN)
    response = client.post("/models/promote", data={"version": "2", "csrf": csrf})
    assert response.status_code == 200, response.text
    assert "gate: both models scored on the retained history" in response.text
    assert "version 2 is current" in response.text
    assert redis_server.client().get(KEYS.model_current) == b"2"
    missing = client.post("/models/promote", data={"version": "9", "csrf": csrf})
    assert missing.status_code == 409 and "no model version" in missing.text
    back = client.post("/models/rollback", data={"csrf": csrf})
    assert back.status_code == 200 and "version 1 is current again" in back.text
    assert [e["action"] for e in audit(redis_server)] == ["model.promote", "model.promote",
                                                          "model.rollback"]  # fmt: skip


def test_the_overview_counts_what_the_streams_hold(client, redis_server):
    publish_events(redis_server.client(), 300, 20, seed=7)
    figures = client.get("/api/overview", headers={"authorization": f"Bearer {VIEWER_TOKEN}"})
    body = figures.json()
    assert body["totals"]["events"] == 300 and body["partitions"][0]["lag"] is None
    assert body["workers"] == [] and body["dead_letters"] == {}


def test_an_unknown_user_is_a_404_and_what_was_typed_is_escaped(client):
    signed_in(client, VIEWER_TOKEN)
    response = client.get("/users", params={"user_id": "nobody"})
    assert response.status_code == 404 and "no state for user nobody" in response.text
    typed = client.get("/users", params={"user_id": "<script>alert(1)</script>"}).text
    assert "<script>alert" not in typed and "&lt;script&gt;alert(1)&lt;/script&gt;" in typed
    assert client.post("/login", data={"token": "x" * 70_000}).status_code == 413


def test_the_console_command_refuses_to_start_without_a_token(tmp_path, monkeypatch):
    for name in TOKEN_ENV:
        monkeypatch.delenv(name, raising=False)
    result = run_cli("console", "--redis-url", "redis://127.0.0.1:1/0")
    assert result.returncode == 2
    assert "serves nothing without a token" in result.stderr
    short = tmp_path / "token"
    short.write_text("short\n")
    monkeypatch.setenv("INTENTSTREAM_CONSOLE_TOKEN_FILE", str(short))
    result = run_cli("console", "--redis-url", "redis://127.0.0.1:1/0")
    assert result.returncode == 2 and "shorter than 16" in result.stderr
    assert "is not a setting" not in result.stderr


def test_the_models_page_draws_each_versions_reliability_diagram(client, redis_server):
    """A trained model's meta records its validation reliability; the page draws it (a dot per
    bin, its counts in the dots' titles); a version without the record says so."""
    from model.artifact import model_to_bytes
    from model.data.synthetic import synthetic_events
    from model.training.train import TrainConfig, train

    trained = train(list(synthetic_events(3000, 200, seed=7)),
                    TrainConfig(hidden=8, epochs=2, test_fraction=0.0)).model  # fmt: skip
    record = trained.meta.model_extra["reliability"]
    assert sum(record["count"]) > 0 and len(record["mean_score"]) == len(record["observed"])
    Registry(redis_server.client(), KEYS.prefix).publish(model_to_bytes(trained))
    signed_in(client, VIEWER_TOKEN)
    page = client.get("/models").text
    assert page.count("reliability diagram") == 3  # versions 1, 2 and the trained 3
    assert "reliability: not recorded" in page  # the random models of versions 1 and 2
    dots = page.count("<circle ")
    assert dots == len(record["count"])
    n = record["count"][0]
    assert f"{n} steps</title>" in page


def test_the_actions_feed_says_where_each_webhook_delivery_stands(client, redis_server):
    """Per endpoint wanting the action's rule: acknowledged (read and acked), in flight (read,
    not acked), queued (not read yet); an endpoint of other rules is not listed."""
    import base64

    from worker.webhooks.endpoints import Endpoint
    from worker.webhooks.store import add_endpoint

    r = redis_server.client()
    stream = KEYS.actions(0)
    ids = [r.xadd(stream, {"user_id": f"u{i}", "rule": "hot", "score": "0.9", "reasons": "[]"})
           for i in range(3)]  # fmt: skip
    secret = "whsec_" + base64.b64encode(b"k" * 24).decode()
    add_endpoint(r, KEYS, Endpoint(name="crm", url="https://crm.example/hook", secret=secret))
    add_endpoint(r, KEYS, Endpoint(name="other", url="https://x.example/h", secret=secret,
                                   rules=("cold",)))  # fmt: skip
    r.xgroup_create(stream, "webhook:crm", "0-0")
    r.xreadgroup("webhook:crm", "d-1", {stream: ">"}, count=2)  # the first two read
    r.xack(stream, "webhook:crm", ids[0])  # the first delivered
    signed_in(client, VIEWER_TOKEN)
    rows = {a["id"]: a["delivery"] for a in client.get("/api/actions").json()["actions"]}
    status = {i: rows[i.decode()] for i in ids}
    assert status[ids[0]] == [{"endpoint": "crm", "status": "acknowledged"}]
    assert status[ids[1]] == [{"endpoint": "crm", "status": "in flight"}]
    assert status[ids[2]] == [{"endpoint": "crm", "status": "queued"}]
    page = client.get("/actions").text
    assert page.count("crm: in flight") == 1 and "other:" not in page
