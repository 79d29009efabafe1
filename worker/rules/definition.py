"""Intent rules: when a user's score fires an action (docs/contract.md), their validation,
durations and the JSON each rule is stored as in the `{prefix}:rules` hash.

Pure: no Redis here (worker/rules/store.py reads and writes the hash), so the engine's
compute layer uses the same `Rule` and `RuleSet`. Every refusal is a RuleError whose one-line
message names the rule, the field and the value.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from decimal import Decimal
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Strict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from worker.common.events import MAX_TYPE_BYTES

# The hash field holding the rule set's version; a rule name cannot start with ':'.
VERSION_FIELD = ":version"
MAX_RULES = 64
MAX_TYPES = 64
MAX_MIN_EVENTS = 100_000
# 2**53 - 1 ms (285,000 years): exact in a float and in every int64 sum with a timestamp.
MAX_COOLDOWN_MS = 2**53 - 1
# A score is a probability (a trained model's sigmoid head, its calibration map): a threshold
# outside 0..1 never fires, or always does; a typo for 0.2 (2) would fail silently.
SCORE_RANGE = (0.0, 1.0)
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
RULE_KEYS = ("above", "cooldown_ms", "min_events", "name", "rearm_below", "types")

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(ms|s|m|h|d)?")
_VERSION = re.compile(rb"-?[0-9]{1,19}")

StrictFloat = Annotated[float, Strict()]  # no bools, no strings: JSON numbers only
StrictInt = Annotated[int, Strict()]
StrictStr = Annotated[str, Strict()]


class RuleError(ValueError):
    """A rule, a rule set or a duration that cannot be used; the message says why."""


class Rule(BaseModel):
    """Fire once score >= above (and the event type, session size and cooldown allow);
    re-arm at the first later score < rearm (docs/contract.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: StrictStr
    above: StrictFloat
    rearm_below: StrictFloat | None = None  # None: re-arm below `above`
    cooldown_ms: StrictInt = 0
    min_events: StrictInt = 1
    types: tuple[StrictStr, ...] = ()  # empty: any type

    @property
    def rearm(self) -> float:
        """The effective re-arm threshold Y."""
        return self.above if self.rearm_below is None else self.rearm_below

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_PATTERN.fullmatch(v):
            raise ValueError(
                f"name {_short(v)} is not a rule name (1-64 letters, digits, '_', '.', '-', "
                "starting with a letter or digit)"
            )
        return v

    @field_validator("above", "rearm_below")
    @classmethod
    def _threshold(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is not None:
            problem = threshold_problem(v)
            if problem:
                raise ValueError(f"{info.field_name} {v} {problem}")
        return v

    @field_validator("cooldown_ms")
    @classmethod
    def _cooldown(cls, v: int) -> int:
        if not 0 <= v <= MAX_COOLDOWN_MS:
            raise ValueError(f"cooldown_ms {v} is outside 0..{MAX_COOLDOWN_MS}")
        return v

    @field_validator("min_events")
    @classmethod
    def _min_events(cls, v: int) -> int:
        if not 1 <= v <= MAX_MIN_EVENTS:
            raise ValueError(f"min_events {v} is outside 1..{MAX_MIN_EVENTS}")
        return v

    @field_validator("types")
    @classmethod
    def _types(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unique = tuple(dict.fromkeys(v))  # a type listed twice is listed once
        if len(unique) > MAX_TYPES:
            raise ValueError(f"types lists {len(unique)} types, at most {MAX_TYPES}")
        for t in unique:
            try:
                size = len(t.encode("utf-8"))
            except UnicodeEncodeError:  # a lone surrogate, as JSON's "\ud800" gives
                raise ValueError(f"type {_short(t)} is not valid UTF-8") from None
            if not 1 <= size <= MAX_TYPE_BYTES:
                raise ValueError(f"type {_short(t)} is not 1-{MAX_TYPE_BYTES} bytes of UTF-8")
        return unique

    @model_validator(mode="after")
    def _rearm_at_most_above(self) -> Rule:
        if self.rearm_below is not None and self.rearm_below > self.above:
            raise ValueError(f"rearm_below {self.rearm_below} is above above {self.above}")
        return self


class RuleSet(BaseModel):
    """Every rule in force, sorted by name, and the hash's version they were read at."""

    model_config = ConfigDict(frozen=True)

    version: StrictInt = 0
    rules: tuple[Rule, ...] = ()

    @field_validator("rules")
    @classmethod
    def _sorted_unique(cls, v: tuple[Rule, ...]) -> tuple[Rule, ...]:
        if len(v) > MAX_RULES:
            raise ValueError(f"{len(v)} rules, at most {MAX_RULES}")
        ordered = tuple(sorted(v, key=lambda r: r.name))
        for a, b in itertools.pairwise(ordered):
            if a.name == b.name:
                raise ValueError(f"rule {a.name!r} is listed twice")
        return ordered

    def get(self, name: str) -> Rule | None:
        """The rule of that name, or None."""
        return next((r for r in self.rules if r.name == name), None)


def threshold_problem(value: float) -> str | None:
    """Why `value` cannot be a rule's threshold (`above`, `rearm_below`), or None: it must be a
    finite number from 0 to 1, as a score is a probability. One check for every path that
    makes a rule (`rules set`, a backtest's rules file, the hash the worker reads)."""
    if not math.isfinite(value):
        return "is not a finite number"
    low, high = SCORE_RANGE
    if not low <= value <= high:
        return "is outside 0..1 (a score is a probability)"
    return None


def _short(value: Any, limit: int = 80) -> str:
    """repr(value), cut to about `limit` characters: a message stays one readable line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def _one_line(exc: ValidationError, name: Any) -> str:
    """A pydantic error as one line: `rule 'x': field: problem (got value)`."""
    problems = []
    for e in exc.errors():
        msg = e["msg"].removeprefix("Value error, ")
        field = ".".join(str(part) for part in e["loc"])
        if e["type"] == "value_error":  # our own checks name the field and value already
            problems.append(msg)
        elif e["type"] == "extra_forbidden":
            problems.append(f"unknown key {field!r}")
        else:
            problems.append(f"{field}: {msg} (got {_short(e['input'])})")
    who = f"rule {_short(name)}" if isinstance(name, str) else "rule"
    return f"{who}: {'; '.join(problems)}"


def make_rule(**fields: Any) -> Rule:
    """A validated Rule from its fields; RuleError names what is wrong."""
    try:
        return Rule.model_validate(fields)
    except ValidationError as exc:
        raise RuleError(_one_line(exc, fields.get("name"))) from None


def parse_duration(text: str) -> int:
    """Milliseconds of `500ms`, `90s`, `15m`, `2h`, `1d`, `1.5h`, or a bare number of
    seconds (`0` included); RuleError when it is none of these or not whole milliseconds."""
    match = _DURATION.fullmatch(text.strip().lower()) if len(text) <= 40 else None
    if match is None:
        raise RuleError(
            f"duration {text!r} is not a number with an optional unit ms, s, m, h or d "
            "(e.g. 500ms, 90s, 15m, 2h, 1d; a bare number is seconds)"
        )
    number, unit = match.groups()
    ms = Decimal(number) * _UNITS_MS[unit or "s"]  # exact: the pattern admits only decimals
    if ms != ms.to_integral_value():
        raise RuleError(f"duration {text!r} is not a whole number of milliseconds")
    return int(ms)


def format_duration(ms: int) -> str:
    """The shortest exact form parse_duration reads back: 0, 500ms, 90s, 15m, 2h, 1d."""
    if ms == 0:
        return "0"
    for unit in ("d", "h", "m", "s"):
        if ms % _UNITS_MS[unit] == 0:
            return f"{ms // _UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


def rule_to_dict(rule: Rule) -> dict[str, Any]:
    """The rule's stored form as a dict (types a list), keys in RULE_KEYS."""
    return {
        "above": rule.above,
        "cooldown_ms": rule.cooldown_ms,
        "min_events": rule.min_events,
        "name": rule.name,
        "rearm_below": rule.rearm_below,
        "types": list(rule.types),
    }


def rule_to_json(rule: Rule) -> bytes:
    """The rule's hash value: compact JSON, sorted keys, UTF-8."""
    text = json.dumps(rule_to_dict(rule), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8")


def _json_problem(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8"
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at byte {exc.pos}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return _short(str(exc))


def rule_from_json(raw: bytes, name: str) -> Rule:
    """The rule stored under hash field `name`; RuleError for anything else (not JSON, not
    an object, unknown keys, another name, an invalid rule), whatever the bytes."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # bad UTF-8, bad JSON, too deep, huge ints
        raise RuleError(f"rule {_short(name)}: not valid JSON ({_json_problem(exc)})") from None
    if not isinstance(doc, dict):
        raise RuleError(f"rule {_short(name)}: expected a JSON object, got {type(doc).__name__}")
    unknown = sorted(str(k) for k in doc.keys() - set(RULE_KEYS))
    if unknown:
        raise RuleError(f"rule {_short(name)}: unknown key(s) {_short(', '.join(unknown))}")
    if "name" in doc and doc["name"] != name:
        raise RuleError(f"rule {_short(name)}: its JSON names another rule, {_short(doc['name'])}")
    return make_rule(**(doc | {"name": name}))


def parse_version(raw: bytes | None) -> int:
    """The `:version` field's value (absent = 0); RuleError when it is not an integer."""
    if raw is None:
        return 0
    if not _VERSION.fullmatch(raw):
        raise RuleError(f"the rules' {VERSION_FIELD} field holds {_short(raw)}, not an integer")
    return int(raw)


def ruleset_from_hash(fields: dict[bytes, bytes]) -> RuleSet:
    """The RuleSet of an HGETALL reply of `{prefix}:rules`; RuleError naming the first bad
    rule (the worker then keeps the set it has)."""
    version = parse_version(fields.get(VERSION_FIELD.encode()))
    names = sorted(f for f in fields if f != VERSION_FIELD.encode())
    if len(names) > MAX_RULES:
        raise RuleError(f"the rules hash holds {len(names)} rules, at most {MAX_RULES}")
    rules = []
    for field in names:
        try:
            name = field.decode("utf-8")
        except UnicodeDecodeError:
            raise RuleError(f"rule {_short(field)}: its name is not UTF-8") from None
        rules.append(rule_from_json(fields[field], name))
    return RuleSet(version=version, rules=tuple(rules))
