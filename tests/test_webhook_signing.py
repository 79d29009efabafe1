"""Webhook signatures, bodies and the retry schedule, without Redis or HTTP: signatures as the
Standard Webhooks reference library makes and verifies them, bodies the same bytes for the
same entry, waits 1 s, 2 s, 4 s ... capped, with jitter."""

from __future__ import annotations

import base64
import json
import time
from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from worker.webhooks.attempt import Attempt
from worker.webhooks.backoff import RetrySchedule
from worker.webhooks.endpoints import Endpoint, shown_url
from worker.webhooks.payload import from_entry
from worker.webhooks.signing import SecretError, masked, new_secret, secret_key, signed_headers

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
ENTRY = {b"user_id": b"alice", b"rule": b"coupon", b"score": b"0.812", b"event_id": b"e-9",
         b"ts": b"1764979200000", b"model": b"7",
         b"reasons": b'[{"type":"add_to_cart","ts":1764979100000,"delta":0.31}]'}  # fmt: skip


@given(body=st.binary(max_size=2000), msg_id=st.text("abc_-0123456789", min_size=1, max_size=40),
       timestamp=st.integers(0, 2**33))  # fmt: skip
def test_signature_is_the_reference_librarys(body, msg_id, timestamp):
    headers = signed_headers(secret_key(SECRET), msg_id, timestamp, body)
    stamp = datetime.fromtimestamp(timestamp, tz=timezone.utc)
    assert headers["webhook-signature"] == Webhook(SECRET).sign(msg_id, stamp, body)
    assert headers["webhook-id"] == msg_id and headers["webhook-timestamp"] == str(timestamp)


def test_reference_library_verifies_a_fresh_delivery_and_refuses_a_changed_one():
    delivery = from_entry(3, b"1764979200123-4", ENTRY)
    headers = signed_headers(secret_key(SECRET), delivery.webhook_id, int(time.time()),
                             delivery.body)  # fmt: skip
    doc = Webhook(SECRET).verify(delivery.body, headers)
    assert doc["id"] == "act_3_1764979200123-4" == delivery.webhook_id
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(delivery.body.replace(b"alice", b"mallory"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(delivery.body, headers)


def test_body_holds_the_actions_fields_and_is_the_same_bytes_every_time():
    a = from_entry(0, b"1764979200123-0", dict(ENTRY))
    b = from_entry(0, b"1764979200123-0", dict(reversed(list(ENTRY.items()))))
    assert a.body == b.body and a.webhook_id == b.webhook_id
    doc = json.loads(a.body)
    assert doc == {
        "type": "intent.action", "id": "act_0_1764979200123-0", "committed_at_ms": 1764979200123,
        "user_id": "alice", "rule": "coupon", "score": 0.812, "event_id": "e-9",
        "ts": 1764979200000, "model": "7",
        "reasons": [{"type": "add_to_cart", "ts": 1764979100000, "delta": 0.31}],
    }  # fmt: skip
    assert a.committed_ms == 1764979200123 and a.rule == "coupon"
    # another partition or entry: another id
    assert from_entry(1, b"1764979200123-0", ENTRY).webhook_id != a.webhook_id


def test_odd_fields_still_make_a_body():
    d = from_entry(0, b"5-0", {b"user_id": b"\xff\xfe", b"score": b"nan?", b"reasons": b"{bad"})
    doc = json.loads(d.body)
    assert doc["score"] is None and doc["reasons"] == "{bad" and doc["rule"] == ""


@pytest.mark.parametrize(
    "secret, problem",
    [
        ("abc", "starts with whsec_"),
        ("whsec_!!notbase64", "followed by base64"),
        ("whsec_" + base64.b64encode(b"short").decode(), "24 to 128 bytes, this one 5"),
    ],
)
def test_bad_secrets_are_refused_without_being_quoted(secret, problem):
    with pytest.raises(SecretError, match=problem) as caught:
        secret_key(secret)
    assert secret not in str(caught.value)
    with pytest.raises(ValidationError) as caught:
        Endpoint(name="crm", url="https://x.example/h", secret=secret)
    assert secret not in str(caught.value)


def test_secrets_are_shown_masked_and_new_ones_are_valid():
    assert len(secret_key(new_secret())) == 32
    assert new_secret() != new_secret()
    assert masked(SECRET) == "whsec_..." + SECRET[-4:]
    assert SECRET not in json.dumps(
        Endpoint(name="crm", url="https://x.example/h", secret=SECRET).shown()
    )
    assert SECRET not in repr(Endpoint(name="crm", url="https://x.example/h", secret=SECRET))


def test_urls_are_shown_without_password_or_query():
    assert shown_url("https://u:pw@h.example/p?token=t") == "https://u:***@h.example/p?..."
    assert shown_url("http://h.example:8080/p") == "http://h.example:8080/p"


@pytest.mark.parametrize(
    "fields, problem",
    [
        ({"name": "a b"}, "1-64 letters"),
        ({"url": "ftp://x.example/"}, "http:// or https://"),
        ({"url": "https:///nohost"}, "with a host"),
        ({"timeout": 0}, "greater than 0"),
    ],
)
def test_bad_endpoints_are_refused(fields, problem):
    good = {"name": "crm", "url": "https://x.example/h", "secret": SECRET}
    with pytest.raises(ValidationError, match=problem):
        Endpoint(**{**good, **fields})


def test_endpoint_rules_filter():
    every = Endpoint(name="a", url="http://h.example/", secret=SECRET)
    some = Endpoint(name="b", url="http://h.example/", secret=SECRET, rules=("coupon",))
    assert every.wants("x") and some.wants("coupon") and not some.wants("x")
    assert some.group == "webhook:b"


def test_waits_double_from_one_second_up_to_the_cap():
    s = RetrySchedule(cap=300.0, jitter=0.2)
    assert [s.wait(n, rand=0.0) for n in range(1, 11)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
    assert s.wait(500, rand=0.0) == 300  # no overflow however many failures
    assert RetrySchedule(cap=5.0).wait(4, rand=0.0) == 5.0


@given(failures=st.integers(1, 80), rand=st.floats(0, 1, exclude_max=True))
def test_jitter_takes_at_most_its_share_off_and_never_passes_the_cap(failures, rand):
    s = RetrySchedule(cap=300.0, jitter=0.2)
    base = s.wait(failures, rand=0.0)
    assert 0.8 * base <= s.wait(failures, rand=rand) <= base <= 300.0


def test_jitter_spreads_the_waits():
    s = RetrySchedule()
    assert len({round(s.wait(3), 6) for _ in range(50)}) > 10


def test_max_age():
    s = RetrySchedule(max_age=86400.0)
    assert not s.expired(86399.9) and s.expired(86400.0)


@pytest.mark.parametrize(
    "attempt, ok, result",
    [
        (Attempt(200), True, "2xx"),
        (Attempt(204), True, "2xx"),
        (Attempt(301), False, "3xx"),
        (Attempt(410), False, "4xx"),
        (Attempt(503), False, "5xx"),
        (Attempt(None, "timeout: ReadTimeout"), False, "timeout"),
        (Attempt(None, "connection: ConnectError: refused"), False, "connection"),
    ],
)
def test_attempt_outcomes(attempt, ok, result):
    assert attempt.ok is ok and attempt.result == result


def test_the_docs_standard_library_check_agrees():
    """docs/webhooks.md's few lines of standard library verify what the deliverer signs."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "webhooks.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "def valid" in b]
    scope: dict = {}
    exec(compile(block, "docs/webhooks.md", "exec"), scope)
    delivery = from_entry(0, b"1764979200123-0", ENTRY)
    headers = signed_headers(secret_key(SECRET), delivery.webhook_id, 1764979300, delivery.body)
    assert scope["valid"](SECRET, headers, delivery.body)
    assert not scope["valid"](SECRET, headers, delivery.body + b" ")
    assert not scope["valid"](new_secret(), headers, delivery.body)
