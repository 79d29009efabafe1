"""`intentstream rules set/list/show/delete` through the installed script, on a real Redis:
what each prints, and a bad rule or a bad key refused in one line with nothing written."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.test_cli_errors import DOWN, assert_one_line
from worker.common.connection import connect
from worker.common.keys import Keys
from worker.rules.definition import make_rule
from worker.rules.store import read_rules

pytestmark = pytest.mark.integration


def cli(redis_server, *args: str):
    return run_cli("rules", *args, "--redis-url", redis_server.url)


def test_set_list_show_delete(redis_server):
    out = cli(redis_server, "set", "coupon", "--above", "0.7", "--rearm-below", "0.5",
              "--cooldown", "15m")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        "rule coupon set: above 0.7, re-arm below 0.5, cooldown 15m, min events 1, any type "
        "(rules version 1)\n"
    )
    out = cli(redis_server, "set", "cart", "--above", "0.85", "--min-events", "3",
              "--types", "add_to_cart,checkout", "--cooldown", "90")  # fmt: skip
    assert out.returncode == 0 and out.stdout.endswith("(rules version 2)\n"), out.stderr
    assert read_rules(connect(redis_server.url), Keys()).rules == (
        make_rule(name="cart", above=0.85, min_events=3, cooldown_ms=90_000,
                  types=("add_to_cart", "checkout")),
        make_rule(name="coupon", above=0.7, rearm_below=0.5, cooldown_ms=900_000),
    )  # fmt: skip

    listing = cli(redis_server, "list")
    assert listing.returncode == 0, listing.stderr
    rows = [line.split() for line in listing.stdout.splitlines()]
    assert rows == [
        ["name", "above", "rearm_below", "cooldown", "min_events", "types"],
        ["cart", "0.85", "0.85", "90s", "3", "add_to_cart,checkout"],
        ["coupon", "0.7", "0.5", "15m", "1", "(any)"],
        ["rules", "version", "2"],
    ]
    doc = json.loads(cli(redis_server, "list", "--json").stdout)
    assert doc["version"] == 2 and [r["name"] for r in doc["rules"]] == ["cart", "coupon"]
    assert doc["rules"][0] == {"above": 0.85, "cooldown_ms": 90_000, "min_events": 3,
                               "name": "cart", "rearm_below": None,
                               "types": ["add_to_cart", "checkout"]}  # fmt: skip

    shown = cli(redis_server, "show", "coupon")
    assert shown.returncode == 0
    assert json.loads(shown.stdout) == {"above": 0.7, "cooldown_ms": 900_000, "min_events": 1,
                                        "name": "coupon", "rearm_below": 0.5,
                                        "types": []}  # fmt: skip

    gone = cli(redis_server, "delete", "coupon")
    assert gone.returncode == 0 and gone.stdout == "rule coupon deleted (rules version 3)\n"
    assert [r["name"] for r in json.loads(cli(redis_server, "list", "--json").stdout)["rules"]] == [
        "cart"
    ]


def test_an_empty_listing_says_how_to_add_a_rule(redis_server):
    out = cli(redis_server, "list")
    assert out.returncode == 0
    assert "(no rules: `intentstream rules set NAME --above X` adds one)" in out.stdout
    assert out.stdout.endswith("rules version 0\n")
    assert json.loads(cli(redis_server, "list", "--json").stdout) == {"rules": [], "version": 0}


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["coupon", "--above", "0.7", "--rearm-below", "0.8"],
         "error: rule 'coupon': rearm_below 0.8 is above above 0.7"),
        (["bad/name", "--above", "0.7"], "error: rule 'bad/name': name 'bad/name' is not a rule"),
        (["x", "--above", "nan"], "error: rule 'x': above nan is not a finite number"),
        (["x", "--above", "inf"], "above inf is not a finite number"),
        (["x", "--above", "high"], "error: --above: invalid float value: 'high'"),
        (["x", "--above", "2"],
         "error: --above: 2 is outside 0..1 (a score is a probability) (see intentstream rules"),
        (["x", "--above", "-0.5"], "error: --above: -0.5 is outside 0..1"),
        (["x", "--above", "0.5", "--rearm-below", "-0.1"],
         "error: --rearm-below: -0.1 is outside 0..1"),
        (["x", "--above", "0.5", "--rearm-below=1.5"], "error: --rearm-below: 1.5 is outside"),
        (["x", "--above", "1", "--cooldown", "1w"], "error: --cooldown: duration '1w' is not"),
        (["x", "--above", "1", "--cooldown=-5s"], "error: --cooldown: duration '-5s'"),
        (["x", "--above", "1", "--min-events", "0"], "error: --min-events: must be >= 1, got 0"),
        (["x", "--above", "1", "--min-events", "100001"], "min_events 100001 is outside 1..100000"),
        (["x", "--above", "1", "--types", "a," + "b" * 129], "is not 1-128 bytes of UTF-8"),
    ],
)  # fmt: skip
def test_a_bad_rule_is_one_line_and_nothing_is_written(redis_server, argv, needle):
    r = connect(redis_server.url)
    result = cli(redis_server, "set", *argv)
    assert_one_line(result, needle)
    assert r.keys("*") == []  # no rule, no version


def test_a_key_of_another_type_and_a_missing_rule_are_one_line(redis_server):
    r = connect(redis_server.url)
    r.set("intentstream:rules", "coupon above 0.7")
    for argv in (["set", "a", "--above", "0.5"], ["delete", "a"], ["list"], ["show", "a"]):
        assert_one_line(cli(redis_server, *argv), "intentstream:rules holds a string")
    assert r.get("intentstream:rules") == b"coupon above 0.7"
    r.delete("intentstream:rules")
    assert_one_line(cli(redis_server, "show", "nope"), "no rule 'nope' under prefix")
    assert_one_line(cli(redis_server, "delete", "nope"), "no rule 'nope'", "nothing deleted")
    assert r.keys("*") == []


def test_the_prefix_flag_picks_the_hash(redis_server):
    out = cli(redis_server, "set", "a", "--above", "0.5", "--prefix", "shop")
    assert out.returncode == 0, out.stderr
    r = connect(redis_server.url)
    assert r.keys("*") == [b"shop:rules"]
    assert read_rules(r, Keys("shop")).version == 1


@pytest.mark.parametrize(
    "argv", [["list"], ["show", "a"], ["delete", "a"], ["set", "a", "--above", "0.5"]]
)
def test_unreachable_redis_is_one_line_naming_the_url(argv):
    result = run_cli("rules", *argv, "--redis-url", DOWN)
    assert_one_line(result, "Redis at redis://127.0.0.1:1/0 is unreachable", "--redis-url")


def test_help_has_examples():
    flat = " ".join(run_cli("rules", "--help").stdout.split())
    assert "intentstream rules set coupon --above 0.7 --rearm-below 0.5 --cooldown 15m" in flat
    for action in ("set", "list", "show", "delete"):
        assert f"intentstream rules {action}" in flat
    set_help = " ".join(run_cli("rules", "set", "--help").stdout.split())
    assert "--cooldown DURATION" in set_help and "500ms, 90s, 15m, 2h, 1d" in set_help
    assert "replaces a rule of that name whole" in set_help
    assert "(env INTENTSTREAM_REDIS_URL" in set_help
