"""Intent rules without Redis: validation, durations, the JSON codec (hostile bytes too) and
the rule set read from a hash."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.common.keys import Keys
from worker.rules.definition import (
    MAX_COOLDOWN_MS,
    MAX_RULES,
    VERSION_FIELD,
    Rule,
    RuleError,
    RuleSet,
    format_duration,
    make_rule,
    parse_duration,
    parse_version,
    rule_from_json,
    rule_to_json,
    ruleset_from_hash,
)


def refused(match: str, **fields) -> str:
    with pytest.raises(RuleError, match=match) as info:
        make_rule(**fields)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_defaults_and_the_effective_rearm():
    rule = make_rule(name="coupon", above=0.7)
    assert (rule.rearm_below, rule.rearm, rule.cooldown_ms, rule.min_events, rule.types) == (
        None, 0.7, 0, 1, ())  # fmt: skip
    assert make_rule(name="c", above=0.7, rearm_below=0.5).rearm == 0.5
    assert make_rule(name="c", above=1, rearm_below=1).rearm == 1.0  # Y = X is allowed
    with pytest.raises(Exception, match="frozen"):
        rule.above = 0.1  # type: ignore[misc]


def test_an_invalid_rule_is_one_line_naming_the_rule_the_field_and_the_value():
    assert (
        refused("rearm_below", name="coupon", above=0.7, rearm_below=0.8)
        == "rule 'coupon': rearm_below 0.8 is above above 0.7"
    )
    refused(r"rule 'x': above nan is not a finite number", name="x", above=float("nan"))
    refused(r"rearm_below -inf is not a finite", name="x", above=1, rearm_below=float("-inf"))
    refused(r"rule 'x': above: Input should be a valid number \(got '0.5'\)", name="x", above="0.5")
    refused(r"above: .* \(got True\)", name="x", above=True)
    refused(r"cooldown_ms -1 is outside 0\.\.", name="x", above=1, cooldown_ms=-1)
    refused(r"cooldown_ms", name="x", above=1, cooldown_ms=MAX_COOLDOWN_MS + 1)
    refused(r"cooldown_ms: .* \(got 1.5\)", name="x", above=1, cooldown_ms=1.5)
    refused(r"min_events 0 is outside 1\.\.100000", name="x", above=1, min_events=0)
    refused(r"min_events 100001", name="x", above=1, min_events=100_001)
    refused(r"unknown key 'colour'", name="x", above=1, colour="red")
    refused(r"above: Field required", name="x")
    assert make_rule(name="x", above=1, min_events=100_000).min_events == 100_000
    assert make_rule(name="x", above=0, rearm_below=0).rearm == 0.0  # 0 and 1 are scores


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        ({"above": 2}, "rule 'x': above 2.0 is outside 0..1 (a score is a probability)"),
        ({"above": -0.5}, "rule 'x': above -0.5 is outside 0..1 (a score is a probability)"),
        ({"above": 1.0000001}, "rule 'x': above 1.0000001 is outside 0..1"),
        ({"above": 0.5, "rearm_below": -0.1}, "rule 'x': rearm_below -0.1 is outside 0..1"),
    ],
)
def test_a_threshold_outside_0_to_1_is_refused_as_a_score_is_a_probability(fields, line):
    assert refused("outside 0..1", name="x", **fields).startswith(line)
    with pytest.raises(RuleError, match=r"outside 0\.\.1"):  # a rule stored by hand, too
        rule_from_json(json.dumps(fields).encode(), "x")


@pytest.mark.parametrize(
    "name", ["", "-x", ".x", "_x", "a b", "a/b", ":version", "x" * 65, "é", "a\n", "a:b"]
)
def test_rule_names_are_restricted(name):
    refused("is not a rule name", name=name, above=1)


@pytest.mark.parametrize("name", ["a", "A9", "coupon.v2", "x_y-z", "9" + "x" * 63])
def test_good_rule_names(name):
    assert make_rule(name=name, above=1).name == name


def test_types_are_checked_and_listed_once():
    assert make_rule(name="x", above=1, types=("a", "b", "a")).types == ("a", "b")
    assert make_rule(name="x", above=1, types=("é" * 64,)).types == ("é" * 64,)  # 128 bytes
    refused(r"type 'éé.* is not 1-128 bytes", name="x", above=1, types=("é" * 65,))
    refused(r"type '' is not 1-128 bytes", name="x", above=1, types=("",))
    refused(
        r"types lists 65 types, at most 64", name="x", above=1, types=[f"t{i}" for i in range(65)]
    )
    refused(r"types.0: Input should be a valid string", name="x", above=1, types=(5,))
    refused(r"types: .*tuple", name="x", above=1, types="view")


def test_a_rule_set_is_sorted_unique_and_bounded():
    rules = [make_rule(name=n, above=0.5) for n in ("b", "a", "c")]
    rs = RuleSet(version=3, rules=rules)
    assert [r.name for r in rs.rules] == ["a", "b", "c"]
    assert rs.get("b") == rules[0] and rs.get("z") is None
    assert RuleSet() == RuleSet(version=0, rules=())
    with pytest.raises(ValueError, match="listed twice"):
        RuleSet(rules=[rules[0], rules[0]])
    with pytest.raises(ValueError, match="at most 64"):
        RuleSet(rules=[make_rule(name=f"r{i}", above=1) for i in range(MAX_RULES + 1)])


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("0", 0), ("0s", 0), ("500ms", 500), ("90s", 90_000), ("15m", 900_000),
        ("2h", 7_200_000), ("1d", 86_400_000), ("90", 90_000), ("1.5", 1500),
        ("1.5h", 5_400_000), (" 90 S ", 90_000), ("0.25s", 250), (".5s", 500), ("7D", 604_800_000),
    ],
)  # fmt: skip
def test_parse_duration(text, ms):
    assert parse_duration(text) == ms


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "not a number with an optional unit"),
        ("-5s", "not a number"),
        ("1w", "not a number"),
        ("s", "not a number"),
        ("1e3s", "not a number"),
        ("nan", "not a number"),
        ("1 2s", "not a number"),
        ("0.5ms", "not a whole number of milliseconds"),
        ("0.0001", "not a whole number of milliseconds"),
        ("9" * 50, "not a number"),
    ],
)
def test_parse_duration_refusals_name_the_text(text, problem):
    with pytest.raises(RuleError, match=problem) as info:
        parse_duration(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "0"), (500, "500ms"), (1500, "1500ms"), (90_000, "90s"), (900_000, "15m"),
     (5_400_000, "90m"), (7_200_000, "2h"), (86_400_000, "1d"), (90_000_001, "90000001ms")],
)  # fmt: skip
def test_format_duration(ms, text):
    assert format_duration(ms) == text


@given(st.integers(min_value=0, max_value=MAX_COOLDOWN_MS))
def test_format_duration_reads_back(ms):
    assert parse_duration(format_duration(ms)) == ms


def test_the_json_is_compact_with_sorted_keys_and_reads_back():
    rule = make_rule(
        name="cart.v2", above=0.8, rearm_below=0.5, cooldown_ms=900_000, min_events=3,
        types=("add_to_cart", "coupon"),
    )  # fmt: skip
    raw = rule_to_json(rule)
    assert raw == (
        b'{"above":0.8,"cooldown_ms":900000,"min_events":3,"name":"cart.v2",'
        b'"rearm_below":0.5,"types":["add_to_cart","coupon"]}'
    )
    assert rule_from_json(raw, "cart.v2") == rule
    plain = make_rule(name="p", above=1)
    assert json.loads(rule_to_json(plain))["rearm_below"] is None
    assert rule_from_json(rule_to_json(plain), "p") == plain
    unicode = make_rule(name="u", above=0.1, types=("ça",))
    assert "ça".encode() in rule_to_json(unicode)
    assert rule_from_json(rule_to_json(unicode), "u") == unicode


def test_the_name_may_be_left_out_of_the_json_the_hash_field_gives_it():
    assert rule_from_json(b'{"above":0.5}', "x") == make_rule(name="x", above=0.5)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"", "not valid JSON"),
        (b"\xff\xfe\x00", "not valid JSON"),
        (b"{", "not valid JSON"),
        (b"[" * 100_000, "not valid JSON \\(nested too deeply\\)"),
        (b"1" * 5000, "not valid JSON"),
        (b"[1]", "expected a JSON object, got list"),
        (b'"x"', "expected a JSON object, got str"),
        (b"null", "expected a JSON object, got NoneType"),
        (b'{"above":1,"colour":"red"}', "unknown key\\(s\\) 'colour'"),
        (b'{"name":"other","above":1}', "its JSON names another rule, 'other'"),
        (b'{"name":5,"above":1}', "its JSON names another rule, 5"),
        (b'{"above":"0.5"}', "above: Input should be a valid number"),
        (b'{"above":NaN}', "above nan is not a finite number"),
        (b'{"above":1e999}', "above inf is not a finite number"),
        (b'{"above":0.5,"rearm_below":0.6}', "rearm_below 0.6 is above above 0.5"),
        (b'{"above":0.5,"types":"view"}', "types: "),
        (b'{"above":0.5,"types":["\\ud800"]}', "is not valid UTF-8"),
        (b'{"above":0.5,"min_events":1.0}', "min_events: Input should be a valid integer"),
        (b'{"above":0.5,"cooldown_ms":true}', "cooldown_ms: "),
        (b'{"rearm_below":0.5}', "above: Field required"),
    ],
)
def test_rule_from_json_refuses_anything_but_a_rule(raw, problem):
    with pytest.raises(RuleError, match=problem) as info:
        rule_from_json(raw, "r")
    line = str(info.value)
    assert line.startswith("rule 'r': ") and "\n" not in line and len(line) < 400


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
_rule_like = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["r", "other", "", 3]),
        "above": _json_values | st.floats(),
        "rearm_below": _json_values | st.floats(),
        "cooldown_ms": _json_values | st.integers(),
        "min_events": _json_values | st.integers(),
        "types": _json_values
        | st.lists(st.text(max_size=4), max_size=4)
        | st.sampled_from([["x"] * 65, [f"t{i}" for i in range(65)], ["é" * 65], [""]]),
        "extra": _json_values,
    },
)


def _decode_or_rule_error(raw: bytes) -> None:
    try:
        rule = rule_from_json(raw, "r")
    except RuleError as exc:
        assert "\n" not in str(exc)
    else:
        assert isinstance(rule, Rule) and rule.name == "r"
        assert rule_from_json(rule_to_json(rule), "r") == rule


@settings(max_examples=500)
@given(st.binary(max_size=200))
def test_rule_from_json_on_arbitrary_bytes_raises_only_rule_error(raw):
    _decode_or_rule_error(raw)


@settings(max_examples=500)
@given(_rule_like)
def test_rule_from_json_on_rule_like_objects_raises_only_rule_error(doc):
    _decode_or_rule_error(json.dumps(doc).encode())


@settings(max_examples=300)
@given(_json_values)
def test_rule_from_json_on_any_json_raises_only_rule_error(doc):
    _decode_or_rule_error(json.dumps(doc).encode())


def test_a_rule_set_from_an_hgetall_reply():
    a = make_rule(name="a", above=0.9, types=("checkout",))
    b = make_rule(name="b", above=0.5, rearm_below=0.3, cooldown_ms=60_000)
    reply = {b"b": rule_to_json(b), VERSION_FIELD.encode(): b"7", b"a": rule_to_json(a)}
    assert ruleset_from_hash(reply) == RuleSet(version=7, rules=(a, b))
    assert ruleset_from_hash({}) == RuleSet(version=0, rules=())
    assert ruleset_from_hash({b"a": rule_to_json(a)}).version == 0  # no `:version` yet


def test_a_bad_rule_in_the_hash_names_the_rule():
    good = rule_to_json(make_rule(name="good", above=0.5))
    with pytest.raises(RuleError, match="rule 'bad': not valid JSON"):
        ruleset_from_hash({b"good": good, b"bad": b"{", b":version": b"2"})
    with pytest.raises(RuleError, match="rule 'copy': its JSON names another rule, 'good'"):
        ruleset_from_hash({b"copy": good, b"good": good})
    with pytest.raises(RuleError, match="rule 'a b': name 'a b' is not a rule name"):
        ruleset_from_hash({b"a b": b'{"above":1}'})
    with pytest.raises(RuleError, match="its name is not UTF-8"):
        ruleset_from_hash({b"\xff": b'{"above":1}'})
    many = {f"r{i}".encode(): b'{"above":1}' for i in range(MAX_RULES + 1)}
    with pytest.raises(RuleError, match="holds 65 rules, at most 64"):
        ruleset_from_hash(many)
    del many[b"r0"]
    assert len(ruleset_from_hash(many).rules) == MAX_RULES


@pytest.mark.parametrize("raw", [b"x", b"1.5", b" 1", b"1_0", b"", b"+1", b"9" * 20])
def test_a_version_that_is_not_an_integer_is_refused(raw):
    with pytest.raises(RuleError, match=":version field holds"):
        parse_version(raw)
    with pytest.raises(RuleError, match=":version field holds"):
        ruleset_from_hash({b":version": raw})


def test_versions_and_keys():
    assert parse_version(None) == 0 and parse_version(b"12") == 12 and parse_version(b"-3") == -3
    keys = Keys("shop")
    assert (keys.rules, keys.rules_updates) == ("shop:rules", "shop:rules:updates")
