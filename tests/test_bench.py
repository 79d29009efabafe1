"""`intentstream bench`: the competent consumer (variant f) writes exactly what the worker
writes, and the command reports every figure of issue 10 (a smoke run; its figures are
measured by hand, never asserted)."""

from __future__ import annotations

import re

import pytest

from model.artifact import save_model
from model.data.synthetic import EVENT_TYPES, LABEL_TYPE, synthetic_events
from model.random_init import random_model
from tests.conftest import run_cli
from worker.bench.plain_consumer import consume_plainly
from worker.bench.rules import QUIET_ABOVE, bench_rules
from worker.bench.throughput import main as bench_main
from worker.bench.throughput import run_competent, run_worker
from worker.bench.workload import preload
from worker.common.connection import connect
from worker.lifecycle.model_source import FileModelSource

SCORES = "intentstream:scores:{0}"


def outputs(r) -> tuple[list, dict]:
    """Every score entry's fields (minus the score), and every state hash minus h and score."""
    entries = [{k: v for k, v in f.items() if k != b"score"} for _, f in r.xrange(SCORES)]
    states = {}
    for key in r.scan_iter(match="intentstream:state:{0}:*"):
        states[key] = {k: v for k, v in r.hgetall(key).items() if k not in (b"h", b"score")}
    return entries, states


@pytest.mark.parametrize("event_ids", [True, False])
def test_the_competent_consumer_writes_exactly_the_workers_fields(
    redis_server, tmp_path, event_ids
):
    model = random_model([*EVENT_TYPES, LABEL_TYPE], hidden=8, seed=0)
    path = tmp_path / "m.npz"
    save_model(model, path)
    version = FileModelSource(path).current.version
    events = list(synthetic_events(600, 40, seed=1))
    r = connect(redis_server.url)
    preload(r, events, event_ids)
    entry_ids = [eid for eid, _ in r.xrange("intentstream:events:{0}")]
    run_worker(redis_server.url, path, len(events), 128, no_model=False)
    by_worker = outputs(r)
    preload(r, events, event_ids)
    entry_ids_again = [eid for eid, _ in r.xrange("intentstream:events:{0}")]
    run_competent(r, len(events), 128, model, version, history=32)
    by_competent = outputs(r)
    if not event_ids:  # a score's event_id is then its entry id
        assert [e[b"event_id"] for e in by_worker[0]] == entry_ids
        assert [e[b"event_id"] for e in by_competent[0]] == entry_ids_again
    assert len(by_worker[0]) == len(events) and len(by_worker[1]) == 40
    # the same entries with the same fields and values (the ids are new: a new preload)
    assert [sorted(e) for e in by_competent[0]] == [sorted(e) for e in by_worker[0]]
    if event_ids:
        assert [e[b"event_id"] for e in by_competent[0]] == [e[b"event_id"] for e in by_worker[0]]
    fields = [b"last_id", b"last_ts", b"model", b"n", b"recent"]
    fields += [b"event_ids"] if event_ids else []
    assert sorted(next(iter(by_worker[1].values()))) == sorted(fields)
    for key, state in by_worker[1].items():
        other = by_competent[1][key]
        assert sorted(other) == sorted(state)
        for field in fields[1:]:
            if field == b"event_ids":  # each id's time is its entry's: a new preload's later
                ours, theirs = other[field].split(b"\n"), state[field].split(b"\n")
                assert ours[:2] == theirs[:2] and len(ours[2].split()) == len(theirs[2].split())
                continue
            assert other[field] == state[field], (key, field)


def test_bench_reports_ratios_redis_cpu_latency_and_memory():
    result = run_cli(
        "bench", "--events", "3000", "--users", "300", "--variants", "afb", "--repeat", "2",
        "--latency", "--latency-seconds", "0.5", "--loads", "0.5", timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for name in ("a worker", "f competent redis-py", "b worker, no model"):
        assert re.search(rf"^{name} +3000 +[\d,]+ .* [\d.]+ +[\d,]+ [\d,]+$", out, re.M), name
    assert re.search(r"a / f \(worker / competent consumer\): [\d.]+ median", out)
    assert re.search(r"a / b \(model on / I/O path\): [\d.]+ median", out)
    # the commit's transaction, among the worker's commands (ranked by time: exec is usually
    # first, but on a loaded machine a read or the position script may rank above it)
    by_command = out[out.find("Redis time per event by command") :][:800]
    assert re.search(r"^  a worker +(\w+ [\d.]+, )*exec [\d.]+", out, re.M), by_command
    assert re.search(r"real worker process, history-events 32: [\d,]+ events/s .* Redis CPU "
                     r"[\d.]+ µs/event, worker CPU [\d.]+ µs/event; / f = [\d.]+", out)  # fmt: skip
    # the 50% row: target, reached rate, events, p50, p99, max, the load average at its start
    assert re.search(r"^ +50% +[\d,]+ +[\d,]+ +\d+ +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+$", out, re.M)
    assert re.search(r"^\(the producer (reached every rate|fell short of its rate at 50%)", out,
                     re.M)  # fmt: skip
    for history in (32, 0):
        assert re.search(rf"history-events +{history}: state \d+ B .* = [\d.]+x raw; retained "
                         r"event \d+ B", out)  # fmt: skip


def test_the_rules_bench_takes_every_path_of_the_rule_step_and_none_fires():
    quiet = bench_rules(3, QUIET_ABOVE)
    assert [r.name for r in quiet] == ["bench-0", "bench-1", "bench-2"]
    assert quiet[0].types and quiet[1].min_events > 1 and quiet[2].cooldown_ms > 0
    assert all(r.above == 1.0 for r in quiet)  # the highest threshold a rule takes
    assert [bool(r.types) for r in bench_rules(4, 0.5)] == [True, False, False, True]


@pytest.mark.parametrize(
    ("flags", "problem"),
    [(["--rules", "65"], "from 0 to 64 rules"), (["--rules", "x"], "not a whole number"),
     (["--rules", "3", "--rules-fire", "1"], "a quantile from 0"),
     (["--rules", "3", "--rules-fire", "p90"], "not a number")],
)  # fmt: skip
def test_the_rules_bench_refuses_bad_flags_before_starting(flags, problem, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_main(flags)
    assert exit_.value.code == 2
    assert problem in capsys.readouterr().err


def test_bench_rules_reports_the_cost_of_quiet_and_firing_rules():
    result = run_cli("bench", "--events", "3000", "--users", "300", "--rules", "3",
                     "--repeat", "2", timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    number = r"[\d,.]+"
    assert re.search(rf"^no rules +{number} +{number} +{number} +0 +0 ", out, re.M)
    assert re.search(rf"^3 rules, none firing +{number} +{number} +{number} +0 +0 ", out, re.M)
    fired = re.search(rf"^3 rules firing \(p90 = [\d.]+\) +{number} +{number} +{number} +"
                      r"([\d,]+) ", out, re.M)  # fmt: skip
    assert fired and int(fired.group(1).replace(",", "")) > 0
    assert re.search(r"3 rules, none firing: events/s [\d.]+, worker CPU per event [\d.]+ .*"
                     r"goal <= 1.10", out)  # fmt: skip
    assert re.search(r"an action costs [\d.]+ µs of worker CPU", out)


def test_bench_shadow_reports_what_a_shadow_model_costs():
    result = run_cli("bench", "--events", "3000", "--users", "300", "--shadow", "--repeat", "2",
                     timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    number = r"[\d,.]+"
    # each run checked its score entries: a shadow score in every shadow run, none without
    assert len(re.findall(r"^  (current|shadow) +[\d,]+ ev/s  worker", out, re.M)) == 4
    assert re.search(rf"^the current model alone +{number} +{number} +{number}  ", out, re.M)
    assert re.search(rf"^with a shadow model +{number} +{number} +{number}  ", out, re.M)
    assert re.search(r"with a shadow against without .*: events/s [\d.]+ \([\d.]+, [\d.]+\), "
                     r"worker CPU per event [\d.]+, Redis CPU per event [\d.]+", out)  # fmt: skip


def test_bench_inputs_reports_what_the_declared_inputs_cost_and_the_state_they_add():
    # no history of recent events: the state's growth is the item memory's alone
    result = run_cli("bench", "--events", "3000", "--users", "300", "--inputs", "--repeat", "1",
                     "--history-events", "0", timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    number = r"[\d,.]+"
    rows = {}
    for name in ("type-only model, events with the 4 fields", "the model reading the 4 fields",
                 "type-only model, bare events"):  # fmt: skip
        row = re.search(rf"^{name} +{number} +{number} +{number} +({number}) ", out, re.M)
        assert row, out
        rows[name] = int(row.group(1).replace(",", ""))
    # the item memory is the state's only growth, and the fields travelling change no state
    grown = (
        rows["the model reading the 4 fields"] - rows["type-only model, events with the 4 fields"]
    )
    assert 0 < grown <= 200
    assert re.search(r"the inputs add -?[\d.]+ µs of worker CPU per event .*goal <= 2", out)
    # the same models through the pipeline without Redis, alternated
    rounds = re.findall(r"^  (type-only model|the model reading the 4 fields) +fastest +([\d.]+) "
                        r"+median +[\d.]+ +rounds((?: [\d.]+)+)$", out, re.M)  # fmt: skip
    assert [r[0] for r in rounds] == ["type-only model", "the model reading the 4 fields"], out
    assert all(float(r[1]) == min(map(float, r[2].split())) for r in rounds)
    assert re.search(r"the inputs add -?[\d.]+ µs per event to the pipeline", out)


def test_the_latency_table_says_which_rates_the_producer_fell_short_of():
    from worker.bench.load import reached_note

    assert reached_note([]).startswith("(the producer reached every rate")
    note = reached_note([0.5, 0.75])
    assert "fell short of its rate at 50%, 75%" in note and "lighter load" in note


def test_the_plain_consumer_scores_and_acknowledges_each_entry_once(redis_server):
    r = connect(redis_server.url)
    events = list(synthetic_events(1500, 200, seed=4))
    preload(r, events)
    consume_plainly(r, len(events), 256, hidden=16)
    assert r.xlen(SCORES) == len(events)
    assert r.xpending("intentstream:events:{0}", "intentstream-workers")["pending"] == 0
    users = {e["user_id"] for e in events}
    keys = list(r.scan_iter(match="intentstream:state:{0}:*"))
    assert len(keys) == len(users)
    assert {len(r.hget(k, "h")) for k in keys} == {64}  # a state of 16 float32, as a scorer's


def test_bench_against_plain_alternates_the_worker_and_the_plain_consumer():
    result = run_cli("bench", "--events", "3000", "--users", "300", "--against-plain",
                     "--repeat", "2", timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rounds = re.findall(r"round (\d): worker ([\d,]+) ev/s .* plain ([\d,]+) ev/s .*: ([\d.]+)x",
                        result.stdout)  # fmt: skip
    assert [r[0] for r in rounds] == ["1", "2"], result.stdout
    for _, worker, plain, ratio in rounds:
        rate = float(worker.replace(",", "")) / float(plain.replace(",", ""))
        assert abs(rate - float(ratio)) < 0.01 + 0.01 * rate
    assert re.search(r"worker / plain: median [\d.]+x, lowest [\d.]+x; (every|not every) round",
                     result.stdout)  # fmt: skip


def test_bench_commit_replays_every_commit_of_each_layout_beside_the_plain_writes():
    result = run_cli("bench", "--events", "3000", "--users", "300", "--commit", "--repeat", "2",
                     timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]  # a refused replayed commit exits 1
    rounds = re.findall(r"round (\d): ([^;]+);", result.stdout)
    assert [k for k, _ in rounds] == ["1", "2"], result.stdout
    for _, figures in rounds:  # every variant once a round, each with its µs/event
        named = dict(re.fullmatch(r"(\w+) ([\d.]+)", x).groups() for x in figures.split(", "))
        assert sorted(named) == ["full", "lean", "plain"], result.stdout
    assert re.search(r"medians: full [\d.]+, lean [\d.]+, plain writes [\d.]+ µs/event; "
                     r"lean / full [\d.]+", result.stdout), result.stdout  # fmt: skip


def test_the_commit_bench_replays_what_the_worker_commits(redis_server):
    """The commit bench's replay (checks and transaction in one pipeline) leaves the states,
    score entries, acknowledgements and sequence that the worker's commit leaves, run the
    worker's way (two round trips, the checks judged)."""
    from model.scoring import ScoringModel
    from worker.bench import commit_cost as cc
    from worker.bench.pipeline_cpu import entries_of, pipeline_commits
    from worker.bench.workload import KEYS
    from worker.engine.adapters.commit import CommitLimits, Committer

    r = connect(redis_server.url)
    model = ScoringModel(random_model([*EVENT_TYPES, LABEL_TYPE], hidden=8, seed=0), "1")
    batches = entries_of(list(synthetic_events(2000, 150, seed=3)), ())
    commits = list(pipeline_commits(model, batches, 32))
    committer = Committer(r, KEYS, cc.HOLDER,
                          CommitLimits(10**9, 10_000, 512, 0), "full")  # fmt: skip

    def left() -> tuple:
        states = {k: r.hgetall(k) for k in r.scan_iter(match=KEYS.state(0, "*"))}
        scores = [f for _, f in r.xrange(KEYS.scores(0))]
        return states, scores, r.get(KEYS.acked(0)), r.get(KEYS.commit_seq(0))

    cc.replay_cpu(r, batches, [cc.worker_commit(c, committer) for c in commits])
    replayed = left()
    cc._pending(r, batches)
    for c in commits:
        committer.run(c)
    assert replayed[0] and replayed[1]
    assert left() == replayed


def test_the_producer_packs_each_chunk_as_xadds_of_the_users_events():
    import hiredis

    from worker.bench.load import packed_chunks
    from worker.bench.workload import STREAM

    users = [f"u{i}" for i in range(7)]
    chunks = packed_chunks(users, 5, 3)
    assert len(chunks) == 3
    for chunk in chunks:
        reader = hiredis.Reader()
        reader.feed(chunk)
        parsed = list(iter(reader.gets, False))
        assert len(parsed) == 5
        for cmd in parsed:
            assert cmd[:3] == [b"XADD", STREAM.encode(), b"*"]
            assert cmd[3] == b"user_id" and cmd[4].decode() in users and cmd[5] == b"type"
