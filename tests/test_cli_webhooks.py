"""`intentstream webhooks add|list|remove|test` through the installed console script: secrets
never printed in full (not even when refused), a signed ping the standardwebhooks library
verifies, a removal that takes the endpoint's groups and dead letters with it."""

from __future__ import annotations

import json

from standardwebhooks.webhooks import Webhook

from tests.conftest import run_cli
from tests.webhook_receiver import Receiver
from worker.webhooks.signing import new_secret


def test_add_list_test_remove(redis_server):
    url, client = redis_server.url, redis_server.client()
    receiver = Receiver().start()
    secret = new_secret()
    try:
        result = run_cli("webhooks", "add", "crm", "--url", receiver.url, "--secret", "-",
                         "--rules", "coupon,nudge", "--redis-url", url,
                         stdin=secret + "\n")  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert secret not in result.stdout and secret[-4:] in result.stdout
        again = run_cli("webhooks", "add", "crm", "--url", receiver.url, "--secret", secret,
                        "--redis-url", url)  # fmt: skip
        assert again.returncode == 2 and "exists (--replace" in again.stderr
        listed = run_cli("webhooks", "list", "--json", "--redis-url", url)
        assert listed.returncode == 0 and secret not in listed.stdout
        (crm,) = json.loads(listed.stdout)
        assert crm["name"] == "crm" and crm["rules"] == ["coupon", "nudge"]
        assert crm["secret"] == "whsec_..." + secret[-4:]
        table = run_cli("webhooks", "list", "--redis-url", url)
        assert "crm" in table.stdout and secret not in table.stdout
        assert json.loads(client.hget("intentstream:webhooks", "crm"))["secret"] == secret

        pinged = run_cli("webhooks", "test", "crm", "--redis-url", url)
        assert pinged.returncode == 0 and "HTTP 200" in pinged.stdout, pinged.stdout
        (post,) = receiver.all()
        assert Webhook(secret).verify(post.body, post.headers)["type"] == "intent.ping"

        client.xgroup_create("intentstream:actions:{0}", "webhook:crm", "0", mkstream=True)
        client.xadd("intentstream:webhooks:deadletter:crm", {"webhook_id": "x", "body": "{}"})
        removed = run_cli("webhooks", "remove", "crm", "--redis-url", url)
        assert removed.returncode == 0 and "1 consumer groups" in removed.stdout
        assert client.xinfo_groups("intentstream:actions:{0}") == []
        assert not client.exists("intentstream:webhooks:deadletter:crm", "intentstream:webhooks")
        gone = run_cli("webhooks", "test", "crm", "--redis-url", url)
        assert gone.returncode == 2 and "no endpoint named 'crm'" in gone.stderr
    finally:
        receiver.stop()


def test_bad_endpoints_are_refused_without_echoing_the_secret(redis_server):
    url = redis_server.url
    short = "whsec_c2hvcnQ="
    for args, message in (
        (["--url", "https://x.example/h", "--secret", short], "--secret: a secret's key is 24"),
        (["--url", "ftp://x.example", "--secret", new_secret()], "--url: the URL must be"),
        (["--url", "https://x.example/h", "--secret", "whsec_&&&"], "--secret: a secret is"),
    ):
        result = run_cli("webhooks", "add", "crm", *args, "--redis-url", url)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert args[-1] not in result.stderr  # the secret (or the URL) is not echoed
    assert not redis_server.client().exists("intentstream:webhooks")


def test_a_ping_to_a_receiver_that_is_down_exits_1(redis_server):
    receiver = Receiver()  # never started: connections refused
    assert run_cli("webhooks", "add", "crm", "--url", receiver.url, "--secret", new_secret(),
                   "--redis-url", redis_server.url).returncode == 0  # fmt: skip
    result = run_cli("webhooks", "test", "crm", "--redis-url", redis_server.url)
    assert result.returncode == 1 and "connection: ConnectionRefusedError" in result.stdout, (
        result.stdout
    )
