"""`intentstream partitions repair P [--dry-run] [--to ID]`: put a partition's position
(`{prefix}:acked:{p}`) and the workers' group back on a consistent entry (docs/operators.md,
An impossible position).

A position is impossible when `acked` holds another type, is not an entry id, or lies past
the stream's last id (the worker's seek refuses it and stops that partition only,
`intentstream_partition_stopped`). The repair's target, unless `--to` names one:

1. the entry the partition's last commit token records (`{prefix}:lastcommit:{p}`, written
   with `acked` by every commit), when it is an entry id not past the stream's last id;
2. else the stream's start (`0-0`): every entry kept is read again; those applied before are
   at or below their user's `last_id` and commit without effect (dead letters among them are
   written again).

It writes `acked` and the token (`repair <id>`) under WATCH, so a commit landing meanwhile
makes it refuse rather than move the position back, and moves the group there. A running
worker retries the stopped partition within a minute and reads on from the target.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import redis

from worker.common.connection import Client
from worker.common.entry_ids import entry_id, valid_id
from worker.common.keys import Keys
from worker.engine.adapters.commit_token import token_position


class RepairRefusedError(Exception):
    """The repair cannot go ahead (a bad --to, a commit landed meanwhile); one line."""


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _field(info: dict, name: str):
    return info.get(name, info.get(name.encode()))


@dataclass
class RepairPlan:
    """What the repair found and what it does."""

    partition: int
    problem: str  # "" when the position is consistent
    findings: list[str] = field(default_factory=list)
    target: bytes | None = None  # the position to write; None: nothing to do
    why: str = ""
    commands: list[tuple] = field(default_factory=list)

    def lines(self, done: bool) -> list[str]:
        verb = "did" if done else "would run"
        out = [f"partition {self.partition}: {f}" for f in self.findings]
        if self.target is None:
            out.append(f"partition {self.partition}: the position is consistent; nothing to do")
            return out
        out.append(f"partition {self.partition}: new position {self.target.decode()} ({self.why})")
        out += [f"{verb}: " + " ".join(map(_text, c)) for c in self.commands]
        return out


def plan(client: Client, keys: Keys, group: str, p: int, to: str | None = None) -> RepairPlan:
    """Read the partition's keys and decide the repair (writes nothing)."""
    acked_key, token_key, stream = keys.acked(p), keys.last_commit(p), keys.events(p)
    result = RepairPlan(p, "")
    kind = _text(client.type(acked_key))
    acked = client.get(acked_key) if kind == "string" else None
    token = client.get(token_key) if _text(client.type(token_key)) == "string" else None
    newest: tuple[int, int] | None = None
    has_stream = _text(client.type(stream)) == "stream"
    if has_stream:
        info = client.xinfo_stream(stream)
        newest = entry_id(_field(info, "last-generated-id") or b"0-0")
        result.findings.append(
            f"{stream}: {_field(info, 'length')} entries, last id "
            f"{_text(_field(info, 'last-generated-id'))}, entries added "
            f"{_field(info, 'entries-added')}"
        )
    else:
        result.findings.append(f"{stream}: no stream")
    if kind not in ("string", "none"):
        result.problem = "wrong_type"
        result.findings.append(f"{acked_key} holds a {kind}, not an entry id")
    elif acked is not None and not valid_id(acked):
        result.problem = "unparsable"
        result.findings.append(f"{acked_key} holds {_text(acked[:64])!r}, not an entry id")
    elif acked is not None and newest is not None and entry_id(acked) > newest:
        result.problem = "ahead"
        result.findings.append(f"{acked_key} is {acked.decode()}, past the stream's last id")
    elif acked is not None and not has_stream:
        result.problem = "ahead"
        result.findings.append(f"{acked_key} is {acked.decode()} and the stream is gone")
    else:
        result.findings.append(f"{acked_key} is {_text(acked or b'absent')}")

    def fits(raw: bytes | None) -> bool:
        return raw is not None and valid_id(raw) and (newest is None or entry_id(raw) <= newest)

    if to is not None:
        wanted = to.encode()
        if not fits(wanted):
            raise RepairRefusedError(f"--to {to}: not an entry id at or below the stream's last id")
        result.target, result.why = wanted, "--to"
    elif result.problem:
        at = token_position(token)
        if fits(at):
            result.target, result.why = at, "the entry the last commit token records"
        else:
            result.target = b"0-0"
            result.why = "the stream's start: no valid last commit token; entries applied "
            result.why += "before commit without effect, dead letters among them are written again"
    if result.target is not None:
        target = result.target.decode()
        result.commands = [("SET", acked_key, target), ("SET", token_key, f"repair {target}")]
        if has_stream and any(_text(_field(g, "name")) == group
                              for g in client.xinfo_groups(stream)):  # fmt: skip
            result.commands.append(("XGROUP", "SETID", stream, group, target))
    return result


def apply(client: Client, keys: Keys, result: RepairPlan) -> None:
    """Run the plan's commands in one transaction, refused if `acked` or the token changed
    since the plan was read (a commit landed: the position was valid after all)."""
    p = result.partition
    with client.pipeline(transaction=True) as pipe:
        pipe.watch(keys.acked(p), keys.last_commit(p))
        again = plan(client, keys, "", p, None)
        if again.problem != result.problem:
            raise RepairRefusedError(f"partition {p}: its position changed meanwhile; run again")
        pipe.multi()
        for command in result.commands:
            pipe.execute_command(*command)
        try:
            pipe.execute()
        except redis.WatchError:
            raise RepairRefusedError(
                f"partition {p}: a commit landed meanwhile; run again"
            ) from None


def repair(
    client: Client, keys: Keys, group: str, p: int, to: str | None, dry_run: bool
) -> list[str]:
    """Plan, and apply unless `dry_run`; the lines to print."""
    result = plan(client, keys, group, p, to)
    if not dry_run and result.target is not None:
        apply(client, keys, result)
    return result.lines(done=not dry_run)
