"""deploy/redis/users.acl on a real redis-server (started with deploy/redis/redis.conf): the
worker, a producer, the trainer, whoever sets the intent rules and a shop reading its actions
do their whole jobs under their own users with no ACL denial, and each is refused what it
must not do."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from model.artifact import save_model
from model.data.synthetic import synthetic_events
from model.random_init import random_model
from tests.conftest import NO_TEST_USERS, local_cluster
from tests.deploy_tools import DEPLOY, clean_env
from tests.test_worker import scrape
from tests.workers import count_scores, wait_for
from worker.common.connection import connect
from worker.common.keys import Keys
from worker.common.local_redis import LocalCluster, free_port, redis_server_binary

ACL = DEPLOY / "redis" / "users.acl"
CONF = DEPLOY / "redis" / "redis.conf"
# The development passwords whose SHA-256 users.acl holds (compose.yaml uses them too).
PASSWORDS = {
    u: f"intentstream-dev-{u}"
    for u in (
        "admin",
        "worker",
        "producer",
        "trainer",
        "keda",
        "ruler",
        "shop",
        "console",
        "deliverer",
    )
}
STREAM = "intentstream:events:{0}"
STATE = "intentstream:state:{0}:user-1"
ACTIONS = "intentstream:actions:{0}"
RULES = "intentstream:rules"


def acl_users() -> dict[str, list[str]]:
    """users.acl as {user: rules}."""
    users = {}
    for line in ACL.read_text().splitlines():
        if line.strip():
            word, name, *rules = line.split()
            assert word == "user", line
            users[name] = rules
    return users


def test_acl_file_users_and_passwords():
    users = acl_users()
    assert set(users) == {"default", "healthcheck", "admin", *PASSWORDS}
    assert "off" in users["default"] and "-@all" in users["default"]
    assert users["healthcheck"][-2:] == ["-@all", "+ping"], "healthcheck may only PING"
    for name, password in PASSWORDS.items():
        rules = users[name]
        hashes = [r[1:] for r in rules if r.startswith("#")]
        assert hashes == [hashlib.sha256(password.encode()).hexdigest()], name
        assert not any(r.startswith(">") or r == "nopass" for r in rules), f"{name}: plain password"
        if name != "admin":
            assert "-@all" in rules and "+@all" not in rules and "~*" not in rules, name
            assert "resetkeys" in rules and "resetchannels" in rules, name


def test_redis_conf_keeps_state():
    conf = {}
    for line in CONF.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.strip().partition(" ")
            conf[key] = value
    assert conf["maxmemory-policy"] == "noeviction"
    assert conf["appendonly"] == "yes" and conf["appendfsync"] == "everysec"
    assert conf["aclfile"].endswith("/users.acl")
    assert re.fullmatch(r"\d+[kmg]b", conf["maxmemory"])


@pytest.fixture
def acl_redis(tmp_path):
    """redis-server with the deploy config and ACL file, on a free loopback port."""
    port = free_port()
    args = [
        redis_server_binary(), str(CONF),
        "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path),
        "--aclfile", str(ACL), "--logfile", str(tmp_path / "redis.log"),
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    probe = redis.Redis(port=port, username="healthcheck", password="x", socket_timeout=2)
    try:
        wait_for(lambda: proc.poll() is not None or probe.ping(), 10, "redis-server")
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server refused the deploy config: {proc.stderr.read()}")
        version = subprocess.run([args[0], "--version"], capture_output=True, text=True).stdout
        major = int(re.search(r"v=(\d+)", version)[1])
        assert major >= 7, f"users.acl needs Redis 7 (selectors): {version}"
        yield port
    finally:
        probe.close()
        proc.terminate()
        proc.wait(10)


def url(port: int, user: str) -> str:
    return f"redis://{user}:{PASSWORDS[user]}@127.0.0.1:{port}/0"


def client(port: int, user: str) -> redis.Redis:
    return redis.Redis.from_url(url(port, user), socket_timeout=5)


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).parent / "intentstream")
    return subprocess.run(
        [exe, *args], capture_output=True, text=True, timeout=timeout, env=clean_env()
    )


def refused(call) -> bool:
    """True when Redis answers NOPERM (or an ACL refusal inside a script)."""
    try:
        call()
    except redis.exceptions.NoPermissionError:
        return True
    except redis.ResponseError as exc:
        return "NOPERM" in str(exc) or "can't access" in str(exc)
    return False


def in_script(client: redis.Redis, body: str, key: str):
    """Run a script the way the worker does (SCRIPT LOAD, then EVALSHA) on one key."""
    return client.evalsha(client.script_load(body), 1, key)


def shadow_scored(admin: redis.Redis) -> int:
    return sum(f.get(b"shadow_model") == b"1" for _, f in admin.xrange("intentstream:scores:{0}"))


def shadow_version(metrics_port: int) -> float:
    return scrape(metrics_port)["intentstream_shadow_model_version"]


def maintained(metrics_port: int) -> bool:
    """Whether the worker's maintenance tick has run (every 10 s, the first at its first
    round): only the tick sets the Redis memory and lag gauges."""
    gauges = scrape(metrics_port)
    return gauges.get("intentstream_redis_memory_used_bytes", 0) > 0 and any(
        name.startswith("intentstream_lag_entries{") for name in gauges
    )


def measured_oldest(admin: redis.Redis) -> bool:
    """Whether the deliverer's measure of the oldest undelivered action has reached its last
    step: the trimmed actions' script, the only EVALSHA in that test (refused or not)."""
    stats = admin.info("commandstats").get("cmdstat_evalsha", {})
    return sum(stats.get(k, 0) for k in ("calls", "rejected_calls", "failed_calls")) > 0


def scored_by(admin: redis.Redis, version: str) -> int:
    return sum(
        f.get(b"model") == version.encode() for _, f in admin.xrange("intentstream:scores:{0}")
    )


@pytest.mark.integration
def test_each_user_does_its_job_and_nothing_else(acl_redis, tmp_path):
    port = acl_redis
    admin = client(port, "admin")
    model = tmp_path / "m.npz"
    save_model(random_model(["view", "add_to_cart", "coupon", "purchase"], hidden=8), model)

    # trainer: registry writes
    result = cli("model", "publish", str(model), "--promote", "--redis-url", url(port, "trainer"))
    assert result.returncode == 0, result.stderr
    result = cli("model", "list", "--redis-url", url(port, "trainer"))
    assert result.returncode == 0 and result.stdout.count("* ") == 1, result.stderr

    # worker: follows the registry, consumes, commits
    metrics_port = free_port()
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [str(Path(sys.executable).parent / "intentstream"), "worker",
         "--redis-url", url(port, "worker"), "--metrics-port", str(metrics_port),
         "--block-ms", "200", "--model-poll-seconds", "0.5", "--consumer", "w1"],
        stdout=log, stderr=log, env=clean_env(),
    )  # fmt: skip
    try:
        # ruler: a rule the worker picks up (it subscribed to the announcements at start)
        result = cli("rules", "set", "first", "--above", "0", "--redis-url", url(port, "ruler"))
        assert result.returncode == 0, result.stderr
        wait_for(lambda: b"intent rules changed" in (tmp_path / "worker.log").read_bytes(), 30,
                 "the worker taking the rule")  # fmt: skip

        # producer: events in
        result = cli("publish", "--synthetic", "3000", "--users", "150",
                     "--redis-url", url(port, "producer"))  # fmt: skip
        assert result.returncode == 0, result.stderr
        wait_for(lambda: count_scores(admin) == 3000, 90, "3000 scores by the worker")
        assert admin.xlen(ACTIONS) > 0, "the rule should have fired (XADD in the commit)"

        # ruler: lists, backtests over the retained events, explains a user, deletes a rule
        for args in (
            ["rules", "list"],
            ["rules", "show", "first"],
            ["rules", "backtest", "--from-redis"],
            ["explain", "user-1"],
            ["rules", "set", "spare", "--above", "0.9"],
            ["rules", "delete", "spare"],
        ):
            result = cli(*args, "--redis-url", url(port, "ruler"))
            assert result.returncode == 0, f"{args}: {result.stdout}{result.stderr}"

        # shop: its consumer group on the actions, read and acknowledged; scores read
        shop = client(port, "shop")
        shop.xgroup_create(ACTIONS, "shop", id="0", mkstream=True)
        read = shop.xreadgroup("shop", "web", {ACTIONS: ">"}, count=10)
        ids = [entry_id for entry_id, _ in read[0][1]]
        assert len(ids) == 10 and shop.xack(ACTIONS, "shop", *ids) == 10
        assert shop.xpending(ACTIONS, "shop")["pending"] == 0
        assert shop.xautoclaim(ACTIONS, "shop", "web", 0, justid=True) is not None
        assert shop.xinfo_groups(ACTIONS)[0]["name"] == b"shop"
        assert shop.xinfo_consumers(ACTIONS, "shop") and shop.xinfo_stream(ACTIONS)["length"]
        assert shop.xlen(ACTIONS) == len(shop.xrange(ACTIONS)) == len(shop.xrevrange(ACTIONS))
        assert shop.xrevrange("intentstream:scores:{0}", count=1)
        assert shop.xread({"intentstream:scores:{0}": "0"}, count=1)

        # trainer: reads the retained history, publishes and promotes; the worker swaps
        result = cli("train", "--from-redis", "--epochs", "1", "--hidden", "8", "--quiet",
                     "--promote", "--force", "--redis-url", url(port, "trainer"),
                     *NO_TEST_USERS)  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        assert "promoted version 2" in result.stdout
        wait_for(lambda: b"model swapped" in (tmp_path / "worker.log").read_bytes(), 30, "swap")
        result = cli("publish", "--synthetic", "50", "--users", "5", "--seed", "1",
                     "--redis-url", url(port, "producer"))  # fmt: skip
        assert result.returncode == 0, result.stderr
        wait_for(lambda: scored_by(admin, "2") == 50, 60, "scores by the new model")

        # trainer: a shadow challenger; the worker scores with both and writes shadow states
        result = cli("model", "shadow", "1", "--redis-url", url(port, "trainer"))
        assert result.returncode == 0, result.stderr
        wait_for(lambda: b"shadow" in (tmp_path / "worker.log").read_bytes(), 30, "the shadow")
        result = cli("publish", "--synthetic", "50", "--users", "5", "--seed", "2",
                     "--redis-url", url(port, "producer"))  # fmt: skip
        assert result.returncode == 0, result.stderr
        wait_for(lambda: shadow_scored(admin) == 50, 60, "shadow scores")
        result = cli("model", "shadow", "--off", "--redis-url", url(port, "trainer"))
        assert result.returncode == 0, result.stderr
        wait_for(lambda: shadow_version(metrics_port) == 0 or admin.acl_log(), 30,
                 "the worker following the shadow's end")  # fmt: skip
        wait_for(lambda: maintained(metrics_port) or admin.acl_log(), 30,
                 "a maintenance tick (trim, gauges) under the worker's user")  # fmt: skip
    finally:
        worker.terminate()
        code = worker.wait(30)
        log.close()
    worker_log = (tmp_path / "worker.log").read_text()
    assert code == 0, worker_log
    assert "NOPERM" not in worker_log and "redis unavailable" not in worker_log, worker_log
    denials = admin.acl_log()
    assert denials == [], f"the jobs were refused something they need: {denials}"

    keda = client(port, "keda")
    group = keda.xinfo_groups(STREAM)[0]
    assert group["name"] == b"intentstream-workers" and group["lag"] == 0
    assert keda.xpending(STREAM, "intentstream-workers")["pending"] == 0
    assert keda.xlen(STREAM) > 0
    # KEDA's redis-streams scaler reads the Redis version (INFO) whenever lagCount is set
    assert keda.info("server")["redis_version"]
    assert admin.acl_log() == [], "KEDA's reads were refused"

    worker_c, producer, trainer, ruler, shop = (
        client(port, u) for u in ("worker", "producer", "trainer", "ruler", "shop")
    )
    rule = '{"above":0.5}'
    denied = {
        # the worker cannot write events or the registry, nor announce models
        "worker XADD events": lambda: worker_c.xadd(STREAM, {"user_id": "x", "type": "view"}),
        "worker XADD events in a script": lambda: in_script(
            worker_c, "return redis.call('XADD', KEYS[1], '*', 'user_id', 'x')", STREAM
        ),
        "worker EVAL": lambda: worker_c.eval("return 1", 0),
        "worker DEL events": lambda: worker_c.delete(STREAM),
        "worker SET registry": lambda: worker_c.set("intentstream:model:current", "1"),
        "worker registry in a script": lambda: in_script(
            worker_c, "return redis.call('SET', KEYS[1], '9')", "intentstream:model:current"
        ),
        "worker PUBLISH": lambda: worker_c.publish("intentstream:model:updates", "9"),
        "worker FLUSHALL": lambda: worker_c.flushall(),
        # nor set the intent rules, nor announce them
        "worker HSET rules": lambda: worker_c.hset(RULES, "x", rule),
        "worker HSET rules in a script": lambda: in_script(
            worker_c, "return redis.call('HSET', KEYS[1], 'x', '{}')", RULES
        ),
        "worker PUBLISH rules": lambda: worker_c.publish("intentstream:rules:updates", "9"),
        "worker CONFIG": lambda: worker_c.config_set("maxmemory-policy", "allkeys-lru"),
        # a producer cannot read states, scores, events or the registry
        "producer HGETALL state": lambda: producer.hgetall(STATE),
        "producer GET registry": lambda: producer.get("intentstream:model:current"),
        "producer XRANGE events": lambda: producer.xrange(STREAM, count=1),
        "producer XRANGE scores": lambda: producer.xrange("intentstream:scores:{0}", count=1),
        "producer HSET state": lambda: producer.hset(STATE, "h", b"x"),
        # nor write what stops or reconfigures the workers
        "producer HSETNX config resize_to": lambda: producer.hsetnx(
            "intentstream:config", "resize_to", 16
        ),
        "producer HSET config": lambda: producer.hset("intentstream:config", "partitions", 3),
        "producer DEL config": lambda: producer.delete("intentstream:config"),
        "producer SET lease": lambda: producer.set("intentstream:lease:{0}", "x"),
        "producer XTRIM events": lambda: producer.xtrim(STREAM, maxlen=0),
        "producer XDEL events": lambda: producer.xdel(STREAM, b"1-1"),
        # the trainer cannot write events nor touch states
        "trainer XADD events": lambda: trainer.xadd(STREAM, {"user_id": "x", "type": "view"}),
        "trainer HGETALL state": lambda: trainer.hgetall(STATE),
        "trainer XTRIM events": lambda: trainer.xtrim(STREAM, maxlen=0),
        "trainer HSET rules": lambda: trainer.hset(RULES, "x", rule),
        # whoever sets the rules reads what a backtest and an explanation need, writes nothing
        # else: no events, states, registry, actions, config
        "ruler XADD events": lambda: ruler.xadd(STREAM, {"user_id": "x", "type": "view"}),
        "ruler HSET state": lambda: ruler.hset(STATE, "rules", "0"),
        "ruler SET registry": lambda: ruler.set("intentstream:model:current", "1"),
        "ruler PUBLISH model": lambda: ruler.publish("intentstream:model:updates", "9"),
        "ruler XADD actions": lambda: ruler.xadd(ACTIONS, {"rule": "x"}),
        "ruler XRANGE actions": lambda: ruler.xrange(ACTIONS, count=1),
        "ruler HSET config": lambda: ruler.hset("intentstream:config", "partitions", 3),
        "ruler DEL rules": lambda: ruler.delete(RULES),
        # a shop reads its actions and the scores: it cannot forge an action or a score, nor
        # drop entries, nor see the rules, the states or the events
        "shop XADD actions": lambda: shop.xadd(ACTIONS, {"rule": "x"}),
        "shop XDEL actions": lambda: shop.xdel(ACTIONS, b"1-1"),
        "shop XTRIM actions": lambda: shop.xtrim(ACTIONS, maxlen=0),
        "shop DEL actions": lambda: shop.delete(ACTIONS),
        "shop XGROUP DESTROY actions": lambda: shop.xgroup_destroy(ACTIONS, "shop"),
        "shop XADD scores": lambda: shop.xadd("intentstream:scores:{0}", {"score": "1"}),
        "shop XGROUP CREATE scores": lambda: shop.xgroup_create("intentstream:scores:{0}", "s"),
        "shop HGETALL rules": lambda: shop.hgetall(RULES),
        "shop HGETALL state": lambda: shop.hgetall(STATE),
        "shop XRANGE events": lambda: shop.xrange(STREAM, count=1),
        # KEDA reads stream and group info only
        "keda XRANGE events": lambda: keda.xrange(STREAM, count=1),
        "keda XREADGROUP": lambda: keda.xreadgroup("intentstream-workers", "k", {STREAM: ">"}),
        "keda XADD": lambda: keda.xadd(STREAM, {"user_id": "x", "type": "view"}),
        "keda GET registry": lambda: keda.get("intentstream:model:current"),
        "keda HGETALL state": lambda: keda.hgetall(STATE),
        "keda KEYS": lambda: keda.keys("*"),
    }
    allowed = [name for name, call in denied.items() if not refused(call)]
    assert allowed == [], f"not refused: {allowed}"
    anonymous = redis.Redis(port=port, socket_timeout=5)
    with pytest.raises(redis.AuthenticationError):
        anonymous.get(STATE)
    assert admin.hget(STATE, "h") is not None, "the worker should have written user-1's state"
    assert admin.xlen(STREAM) == 3100


# What redis-py's cluster client (8.1) sends on connect and on each refresh of the slot map,
# beyond a job's own commands: CLUSTER SLOTS, COMMAND (the key positions of every command),
# and COMMAND GETKEYS for commands whose keys move (XREADGROUP, FCALL). No READONLY: no
# client reads from replicas. KEDA's cluster scaler (go-redis) sends CLUSTER SLOTS and COMMAND.
CLUSTER_CLIENT = [["CLUSTER", "SLOTS"], ["COMMAND"], ["COMMAND", "GETKEYS", "GET", "k"]]
CHANGES_THE_CLUSTER = [
    ["CLUSTER", "FAILOVER"], ["CLUSTER", "RESET"], ["CLUSTER", "FORGET", "x"],
    ["CLUSTER", "MEET", "127.0.0.1", "1"], ["CLUSTER", "ADDSLOTS", "1"],
    ["CLUSTER", "SETSLOT", "1", "STABLE"], ["READWRITE"], ["CONFIG", "SET", "save", ""],
]  # fmt: skip


@pytest.mark.integration
def test_cluster_client_rights_and_nothing_that_changes_the_cluster(acl_redis):
    admin = client(acl_redis, "admin")

    def dryrun(user: str, command: list[str]) -> bool:
        return admin.execute_command("ACL", "DRYRUN", user, *command) == b"OK"

    for user in ("worker", "trainer", "keda", "ruler", "shop", "deliverer"):
        missing = [c for c in CLUSTER_CLIENT if not dryrun(user, c)]
        assert missing == [], f"{user} cannot connect with --cluster: lacks {missing}"
        allowed = [c for c in CHANGES_THE_CLUSTER if dryrun(user, c)]
        assert allowed == [], f"{user} may change the cluster: {allowed}"
    assert dryrun("keda", ["INFO"]) and dryrun("keda", ["INFO", "server"])


ADMIN = ("admin", PASSWORDS["admin"])
CLUSTER_P = 4


@pytest.fixture(scope="module")
def acl_cluster():
    """A local cluster (3 masters, 3 replicas) with users.acl loaded on every node."""
    yield from local_cluster(extra=("--aclfile", str(ACL)), auth=ADMIN)


def node_url(port: int, user: str) -> str:
    return f"redis://{user}:{PASSWORDS[user]}@127.0.0.1:{port}/0"


def acl_denials(cluster: LocalCluster) -> dict[int, list]:
    """ACL LOG of every node that has one: port -> entries."""
    logs = {n.port: n.client().acl_log() for n in cluster.nodes}
    return {port: log for port, log in logs.items() if log}


@pytest.mark.integration
def test_the_users_do_their_jobs_on_a_cluster(acl_cluster, tmp_path):
    port = acl_cluster.nodes[0].port
    admin = connect(node_url(port, "admin"), cluster=True)
    model = tmp_path / "m.npz"
    save_model(random_model(["view", "add_to_cart", "coupon", "purchase"], hidden=8), model)

    # trainer: registry writes and reads through the cluster client
    trainer_url = node_url(port, "trainer")
    result = cli("model", "publish", str(model), "--promote", "--cluster", "--redis-url",
                 trainer_url)  # fmt: skip
    assert result.returncode == 0, result.stderr
    result = cli("model", "list", "--cluster", "--redis-url", trainer_url)
    assert result.returncode == 0 and result.stdout.count("* ") == 1, result.stderr

    # producer: events in, through the cluster client
    events = list(synthetic_events(2000, 200, seed=5))
    data = tmp_path / "events.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in events))
    result = cli("publish", str(data), "--cluster", "--partitions", str(CLUSTER_P),
                 "--redis-url", node_url(port, "producer"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    keys = Keys()
    nodes = {admin.get_node_from_key(keys.events(p)).name for p in range(CLUSTER_P)}
    assert len(nodes) > 1, "the partitions should spread over the masters"

    # worker: follows the registry, consumes and commits on every master
    log_path = tmp_path / "worker.log"
    metrics_port = free_port()
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [str(Path(sys.executable).parent / "intentstream"), "worker", "--cluster",
             "--redis-url", node_url(port, "worker"), "--partitions", str(CLUSTER_P),
             "--metrics-port", str(metrics_port), "--block-ms", "200", "--consumer", "w1"],
            stdout=log, stderr=log, env=clean_env(),
        )  # fmt: skip
    try:
        wait_for(lambda: count_scores(admin, partitions=CLUSTER_P) == len(events), 120,
                 "every event scored by the worker user")  # fmt: skip
        # the worker installed the producers' function on every master: now it is FCALL
        assert all(n.client().function_list() for n in acl_cluster.nodes[:3])
        more = tmp_path / "more.jsonl"
        more.write_text("".join(json.dumps(e) + "\n" for e in synthetic_events(300, 30, seed=6)))
        result = cli("publish", str(more), "--cluster", "--partitions", str(CLUSTER_P),
                     "--redis-url", node_url(port, "producer"))  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert "falls back" not in result.stderr
        wait_for(lambda: count_scores(admin, partitions=CLUSTER_P) == len(events) + 300, 120,
                 "the events sent through the function scored")  # fmt: skip
        wait_for(lambda: maintained(metrics_port) or acl_denials(acl_cluster), 30,
                 "a maintenance tick (trim, gauges) under the worker's user")  # fmt: skip
    finally:
        worker.terminate()
        code = worker.wait(30)
    worker_log = log_path.read_text()
    assert code == 0, worker_log
    assert "NOPERM" not in worker_log and "redis unavailable" not in worker_log, worker_log

    # keda: what the scaler reads, through the cluster client and on each node directly
    keda = connect(node_url(port, "keda"), cluster=True)
    for p in range(CLUSTER_P):
        stream = keys.events(p)
        group = keda.xinfo_groups(stream)[0]
        assert group["name"] == b"intentstream-workers" and group["lag"] == 0, group
        assert keda.xpending(stream, "intentstream-workers")["pending"] == 0
        assert keda.xlen(stream) > 0
        owner = admin.get_node_from_key(stream)
        direct = redis.Redis.from_url(node_url(owner.port, "keda"), socket_timeout=5)
        assert direct.xlen(stream) == keda.xlen(stream)
        assert direct.xinfo_groups(stream)[0]["lag"] == 0
    for node in acl_cluster.nodes:
        direct = redis.Redis.from_url(node_url(node.port, "keda"), socket_timeout=5)
        assert direct.info("server")["redis_version"]
    keda.close()
    assert acl_denials(acl_cluster) == {}, "a job was refused something it needs"


@pytest.mark.integration
def test_the_worker_corrects_a_phantom_lag_under_its_user(acl_redis):
    # XGROUP SETID (to the group's own last id, in REPAIR_SCRIPT): the worker could skip or
    # replay with it, as it can already skip by acknowledging unscored entries
    from worker.common.settings import Settings
    from worker.engine.adapters.maintenance import Maintenance
    from worker.engine.adapters.metrics import WorkerMetrics

    admin, worker_c = client(acl_redis, "admin"), client(acl_redis, "worker")
    for i in range(5):
        admin.xadd(STREAM, {"user_id": f"u{i}", "type": "view"})
    admin.xgroup_create(STREAM, "intentstream-workers", id="0")
    admin.xreadgroup("intentstream-workers", "c", {STREAM: ">"})
    admin.execute_command("XGROUP", "SETID", STREAM, "intentstream-workers", "$", "ENTRIESREAD", 1)
    metrics = WorkerMetrics()
    settings = Settings(redis_url="redis://x", metrics_port=0, consumer="c")
    Maintenance(worker_c, Keys(), settings, metrics).run([0])
    assert metrics.registry.get_sample_value("intentstream_lag_entries", {"partition": "0"}) == 0
    assert admin.xinfo_groups(STREAM)[0]["lag"] == 0, "the worker's tick should repair it"
    assert admin.acl_log() == []


@pytest.mark.integration
def test_the_deliverer_delivers_under_its_user(acl_redis, tmp_path):
    from tests.deliverers import DelivererProcess, add_actions, check_received
    from tests.webhook_receiver import Receiver
    from worker.webhooks.signing import new_secret

    admin, port = client(acl_redis, "admin"), acl_redis
    receiver, secret = Receiver(plan=lambda n: "500" if n < 3 else "ok").start(), new_secret()
    result = cli("webhooks", "add", "crm", "--url", receiver.url, "--secret", secret,
                 "--from-start", "--redis-url", url(port, "admin"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    ids = add_actions(admin, 40)
    deliverer = DelivererProcess(url(port, "deliverer"), tmp_path / "d.log").start()
    try:
        wait_for(lambda: set(receiver.ok_ids()) >= set(ids), 60, "every action delivered")
        wait_for(lambda: admin.xpending(ACTIONS, "webhook:crm")["pending"] == 0, 30, "acked")
        dead = {"webhook_id": "act_0_1-1", "body": '{"id":"act_0_1-1"}', "attempts": 1}
        admin.xadd("intentstream:webhooks:deadletter:crm", dead)
        for args in (["webhooks", "list"], ["webhooks", "test", "crm"],
                     ["webhooks", "replay", "crm"]):  # fmt: skip
            result = cli(*args, "--redis-url", url(port, "deliverer"))
            assert result.returncode == 0, f"{args}: {result.stdout}{result.stderr}"
        measure = "a measure of the oldest undelivered action (every 5 s) under its user"
        wait_for(lambda: measured_oldest(admin) or admin.acl_log(), 30, measure)
        assert deliverer.terminate() == 0
    finally:
        deliverer.kill()
        receiver.stop()
    check_received(receiver.all(), secret)
    assert "NOPERM" not in deliverer.log(), deliverer.log()
    assert admin.acl_log() == [], "the deliverer was refused something it needs"
    removed = cli("webhooks", "remove", "crm", "--redis-url", url(port, "deliverer"))
    assert removed.returncode == 2 and "lacks a permission" in removed.stderr


# Each role's job, command by command (what its process sends), for the ACL matrix below.
E0, SC0, D0, ST0 = STREAM, "intentstream:scores:{0}", "intentstream:deadletter:{0}", STATE
A0, RU = ACTIONS, RULES
WH, WD = "intentstream:webhooks", "intentstream:webhooks:deadletter:crm"
JOBS: dict[str, list[list[str]]] = {
    "worker": [
        ["XREADGROUP", "GROUP", "g", "c", "COUNT", "5", "NOACK", "STREAMS", E0, ">"],
        ["XGROUP", "SETID", E0, "g", "0-0"],  # a seek back to the last commit
        ["XGROUP", "CREATE", E0, "g", "0", "MKSTREAM"], ["XTRIM", E0, "MINID", "1-1"],
        ["EVALSHA", "0" * 40, "2", E0, ST0], ["HSET", ST0, "h", "x"], ["XADD", SC0, "*", "a", "b"],
        ["XADD", D0, "*", "a", "b"], ["SET", "intentstream:lease:{0}", "w"],
        ["SET", "intentstream:route:{0}", "2"],
        ["HSETNX", "intentstream:config", "partitions", "2"],
        ["FUNCTION", "LOAD", "x"], ["GET", "intentstream:model:current"],
        ["STRLEN", "intentstream:model:1"], ["LRANGE", "intentstream:model:history", "0", "-1"],
        # the commit (adapters/commit.py): the checks under WATCH, then MULTI/EXEC
        ["WATCH", "intentstream:lease:{0}", "intentstream:seq:{0}", SC0, D0, A0],
        ["GET", "intentstream:acked:{0}"], ["XRANGE", E0, "(0-0", "(1-1", "COUNT", "1"],
        ["GET", "intentstream:lastcommit:{0}"],
        ["TIME"], ["MULTI"], ["INCR", "intentstream:seq:{0}"], ["EXEC"],
        # the intent rules (rules/source.py, rules/store.py) and the actions,
        # which the commit writes (TYPE, XADD: Redis checks them against the caller)
        ["HGET", RU, ":version"], ["HGETALL", RU], ["TYPE", RU],
        ["SUBSCRIBE", "intentstream:rules:updates"], ["TYPE", A0],
        ["XADD", A0, "MAXLEN", "~", "1000000", "*", "user_id", "u", "rule", "r"],
    ],
    "producer": [
        ["FCALL", "intentstream_append_v1", "2", E0, "intentstream:route:{0}", "1", "2",
         "user_id", "u", "type", "view"],
        ["HGETALL", "intentstream:config"], ["GET", "intentstream:route:{0}"],
    ],
    "trainer": [
        ["XRANGE", E0, "-", "+", "COUNT", "10"], ["SET", "intentstream:model:7", "bytes"],
        ["INCR", "intentstream:model:seq"], ["RPUSH", "intentstream:model:history", "6"],
        ["PUBLISH", "intentstream:model:updates", "7"],
        ["HGETALL", RU],  # the promotion gate's share of sessions per live rule
    ],
    "keda": [["XINFO", "GROUPS", E0], ["XPENDING", E0, "g"], ["INFO", "server"]],
    # `intentstream rules set/delete/list/show` (rules/store.py: WATCH, the checks, then
    # MULTI/EXEC with the write and the version, then PUBLISH), `rules backtest --from-redis`
    # and `explain`: the registry's model, the partition count, the events, a state
    "ruler": [
        ["WATCH", RU], ["TYPE", RU], ["HGET", RU, ":version"], ["HEXISTS", RU, "coupon"],
        ["HLEN", RU], ["HSET", RU, "coupon", '{"above":0.7}'], ["HDEL", RU, "coupon"],
        ["HINCRBY", RU, ":version", "1"], ["UNWATCH"],
        ["PUBLISH", "intentstream:rules:updates", "2"], ["HGETALL", RU], ["HGET", RU, "coupon"],
        ["GET", "intentstream:model:current"], ["STRLEN", "intentstream:model:1"],
        ["GET", "intentstream:model:meta:1"], ["HGET", "intentstream:config", "partitions"],
        ["XRANGE", E0, "-", "+", "COUNT", "10000"], ["HGETALL", ST0],
    ],
    # a shop's consumer group on its actions, and reads of the scores
    "shop": [
        ["XGROUP", "CREATE", A0, "shop", "$", "MKSTREAM"],
        ["XREADGROUP", "GROUP", "shop", "web", "COUNT", "10", "STREAMS", A0, ">"],
        ["XACK", A0, "shop", "1-1"], ["XPENDING", A0, "shop"],
        ["XAUTOCLAIM", A0, "shop", "web", "60000", "0-0"], ["XINFO", "GROUPS", A0],
        ["XINFO", "CONSUMERS", A0, "shop"], ["XINFO", "STREAM", A0], ["XLEN", A0],
        ["XRANGE", A0, "-", "+"], ["XREVRANGE", SC0, "+", "-", "COUNT", "3"],
        ["XREAD", "COUNT", "10", "STREAMS", SC0, "0"],
    ],
    # `intentstream console` (worker/console/): the overview's reads, the actions feed, the
    # registry's promotion and rollback, the audit; and the ruler's whole job (SHARED below)
    "console": [
        ["XINFO", "STREAM", E0], ["XINFO", "STREAM", SC0], ["XINFO", "STREAM", A0],
        ["XREVRANGE", E0, "+", "-", "COUNT", "10"], ["XREVRANGE", A0, "+", "-", "COUNT", "50"],
        ["XLEN", D0], ["XREVRANGE", D0, "+", "-", "COUNT", "200"],
        ["GET", "intentstream:lease:{0}"], ["ZRANGEBYSCORE", "intentstream:workers", "0", "+inf"],
        ["MGET", "intentstream:model:current", "intentstream:model:shadow"],
        ["EXISTS", "intentstream:model:meta:1"], ["SET", "intentstream:model:current", "2"],
        ["RPOP", "intentstream:model:history"], ["DEL", "intentstream:model:shadow"],
        ["XADD", "intentstream:console:audit", "MAXLEN", "~", "100000", "*", "who", "e"],
        ["XREVRANGE", "intentstream:console:audit", "+", "-", "COUNT", "20"],
        # the actions feed's webhook delivery: the endpoints, their groups' positions
        ["HGETALL", "intentstream:webhooks"], ["XINFO", "GROUPS", A0],
        ["XPENDING", A0, "webhook:crm", "1-1", "9-9", "10"],
    ],
    # `intentstream deliver` (worker/webhooks): the endpoints, an endpoint's consumer group
    # on the actions, its dead letters; `webhooks list|test|replay` under the same user
    "deliverer": [
        ["HGETALL", WH], ["HGET", WH, "crm"], ["HGET", "intentstream:config", "partitions"],
        ["XGROUP", "CREATE", A0, "webhook:crm", "0-0", "MKSTREAM"],
        ["XREADGROUP", "GROUP", "webhook:crm", "c-0", "COUNT", "100", "BLOCK", "100",
         "STREAMS", A0, ">"],
        ["XACK", A0, "webhook:crm", "1-1"],
        ["XAUTOCLAIM", A0, "webhook:crm", "c-0", "60000", "0-0", "COUNT", "100"],
        ["XCLAIM", A0, "webhook:crm", "c-0", "0", "1-1", "JUSTID"],
        ["XPENDING", A0, "webhook:crm"], ["XRANGE", A0, "(1-1", "+", "COUNT", "1"],
        ["XADD", WD, "MAXLEN", "~", "100000", "*", "webhook_id", "x"],
        ["XRANGE", WD, "0-0", "+", "COUNT", "1000"], ["XDEL", WD, "1-1"], ["XLEN", WD],
        # its retry records (failures, due) of the actions waiting for a retry
        ["HSET", "intentstream:webhooks:retry:crm:{0}", "1-1", "2:1796520490000"],
        ["HMGET", "intentstream:webhooks:retry:crm:{0}", "1-1"],
        ["HDEL", "intentstream:webhooks:retry:crm:{0}", "1-1"],
        # actions trimmed before the group read them (worker/webhooks/trimmed.py's script)
        ["SCRIPT", "LOAD", "return 0"], ["EVALSHA", "0" * 40, "1", A0, "webhook:crm"],
        ["EXISTS", A0], ["XINFO", "STREAM", A0],
        ["XGROUP", "SETID", A0, "webhook:crm", "1-1", "ENTRIESREAD", "5"],
    ],
}  # fmt: skip
# What no role but admin may do: stop, empty or reconfigure anything.
NOBODY = [
    ["FLUSHALL"], ["CONFIG", "SET", "maxmemory", "1"], ["DEL", E0], ["XDEL", E0, "1-1"],
    ["XTRIM", E0, "MAXLEN", "0"], ["HSET", "intentstream:config", "resize_to", "16"],
    ["SET", "intentstream:route:{0}", "resizing"], ["SET", "intentstream:seq:{0}", "1"],
    ["FUNCTION", "FLUSH"], ["FUNCTION", "DELETE", "intentstream_v1"], ["SHUTDOWN"],
    ["SCRIPT", "FLUSH"], ["ACL", "SETUSER", "x"], ["CLIENT", "KILL", "ID", "1"],
    ["XGROUP", "DESTROY", E0, "g"],
]  # fmt: skip
# Where another role's job command is rightly this role's too.
SHARED = {
    ("worker", "HGETALL intentstream:config"), ("worker", "GET intentstream:route:{0}"),
    ("worker", "INFO server"), ("worker", f"XINFO GROUPS {E0}"), ("worker", f"XPENDING {E0} g"),
    ("trainer", "GET intentstream:model:current"),
    # the worker reads what the ruler writes, and what a backtest or an explanation reads
    ("worker", f"TYPE {RU}"), ("worker", f"HGET {RU} :version"), ("worker", f"HGETALL {RU}"),
    ("worker", f"HGET {RU} coupon"), ("worker", "GET intentstream:model:current"),
    ("worker", "STRLEN intentstream:model:1"), ("worker", "GET intentstream:model:meta:1"),
    ("worker", "HGET intentstream:config partitions"), ("worker", f"HGETALL {ST0}"),
    ("worker", f"XLEN {A0}"), ("producer", "HGET intentstream:config partitions"),
    # the worker's commit watches its keys as the ruler does the rules (a read)
    ("worker", f"WATCH {RU}"), ("worker", "UNWATCH"),
    # ... and the writers of the registry and the rules open transactions as it does
    ("trainer", "MULTI"), ("trainer", "EXEC"), ("ruler", "MULTI"), ("ruler", "EXEC"),
    # the worker reads event ranges (its commit's gap check, a seek, the lag) as the trainer
    # and the ruler read the history
    ("worker", f"XRANGE {E0} - + COUNT 10"), ("worker", f"XRANGE {E0} - + COUNT 10000"),
    ("trainer", f"XRANGE {E0} (0-0 (1-1 COUNT 1"), ("ruler", f"XRANGE {E0} (0-0 (1-1 COUNT 1"),
    ("trainer", "GET intentstream:model:meta:1"), ("trainer", f"XRANGE {E0} - + COUNT 10000"),
    # the trainer's promotion gate reads the rules as the worker does
    ("trainer", f"HGETALL {RU}"), ("worker", f"HGETALL {RU}"), ("ruler", f"HGETALL {RU}"),
    # ... and HGETALL reaches the config it could already read: the partition count, harmless
    ("trainer", "HGETALL intentstream:config"),
    # the ruler reads the rules as the worker does, and the events and models as the trainer
    ("ruler", f"TYPE {RU}"), ("ruler", f"HGET {RU} :version"), ("ruler", f"HGETALL {RU}"),
    ("ruler", "GET intentstream:model:current"), ("ruler", "STRLEN intentstream:model:1"),
    ("ruler", f"XRANGE {E0} - + COUNT 10"),
    # the deliverer reads the partition count as the ruler does, and a consumer group on the
    # actions is its job as a shop's (a shop's own reader would do what it does)
    ("deliverer", "HGET intentstream:config partitions"),
    ("ruler", "HGET intentstream:config partitions"),
    ("deliverer", f"XGROUP CREATE {A0} shop $ MKSTREAM"),
    ("deliverer", f"XREADGROUP GROUP shop web COUNT 10 STREAMS {A0} >"),
    ("deliverer", f"XACK {A0} shop 1-1"), ("deliverer", f"XPENDING {A0} shop"),
    ("deliverer", f"XAUTOCLAIM {A0} shop web 60000 0-0"), ("deliverer", f"XINFO GROUPS {A0}"),
    ("deliverer", f"XRANGE {A0} - +"),
    ("shop", f"XGROUP CREATE {A0} webhook:crm 0-0 MKSTREAM"),
    ("shop", f"XREADGROUP GROUP webhook:crm c-0 COUNT 100 BLOCK 100 STREAMS {A0} >"),
    ("shop", f"XACK {A0} webhook:crm 1-1"),
    ("shop", f"XAUTOCLAIM {A0} webhook:crm c-0 60000 0-0 COUNT 100"),
    ("shop", f"XPENDING {A0} webhook:crm"), ("shop", f"XRANGE {A0} (1-1 + COUNT 1"),
}  # fmt: skip
# The console does the ruler's whole job; it reads what its overview shows as the worker, KEDA
# and a shop read it, and promotes as the trainer does (the registry's owner, who may too).
SHARED |= {("console", " ".join(c)) for c in JOBS["ruler"]} | {
    ("console", f"XRANGE {E0} (0-0 (1-1 COUNT 1"), ("console", f"XRANGE {E0} - + COUNT 10"),
    ("console", "RPUSH intentstream:model:history 6"), ("console", f"XINFO GROUPS {E0}"),
    ("console", "PUBLISH intentstream:model:updates 7"), ("console", f"XINFO STREAM {A0}"),
    ("console", f"XREVRANGE {SC0} + - COUNT 3"), ("console", "MULTI"), ("console", "EXEC"),
    ("worker", f"XINFO STREAM {E0}"), ("keda", f"XINFO STREAM {E0}"), ("worker", f"XLEN {D0}"),
    ("worker", "GET intentstream:lease:{0}"), ("shop", f"XINFO STREAM {A0}"),
    ("shop", f"XREVRANGE {A0} + - COUNT 50"), ("trainer", "EXISTS intentstream:model:meta:1"),
    ("trainer", "SET intentstream:model:current 2"), ("trainer", "RPOP intentstream:model:history"),
    ("trainer", "DEL intentstream:model:shadow"),
    # the actions feed reads the webhook groups' positions as a shop's reader and the
    # deliverer read them
    ("console", f"HGETALL {WH}"), ("console", f"XINFO GROUPS {A0}"),
    ("console", f"XPENDING {A0} shop"), ("console", f"XPENDING {A0} webhook:crm"),
    ("shop", f"XINFO GROUPS {A0}"), ("shop", f"XPENDING {A0} webhook:crm 1-1 9-9 10"),
    ("deliverer", f"HGETALL {WH}"), ("deliverer", f"XPENDING {A0} webhook:crm 1-1 9-9 10"),
    # the deliverer reads a stream's counters as a shop and the console do; the worker runs
    # scripts on every intentstream key (its commit), the deliverer's among them
    ("deliverer", f"XINFO STREAM {A0}"), ("worker", "SCRIPT LOAD return 0"),
    ("worker", f"EVALSHA {'0' * 40} 1 {A0} webhook:crm"),
}  # fmt: skip
# Known and documented (docs/deploy.md, "Redis users and TLS"): an ACL cannot restrict arguments, so
# the worker, which trims history (XTRIM MINID) and records routes, may also trim more and
# hold producers back; the trainer, the registry's owner, may delete its keys.
ARGUMENTS_UNRESTRICTED = {("worker", "XTRIM"), ("worker", "SET")}


def acl_matrix(dryrun) -> list[str]:
    """Every role's user against every role's job commands and the forbidden list: the
    mistakes found (a job refused to its role, or a command allowed to another)."""
    wrong = []
    for user in JOBS:
        for role, commands in JOBS.items():
            for command in commands:
                text = " ".join(command)
                mine = role == user or (user, text) in SHARED
                if dryrun(user, command) != mine:
                    wrong.append(f"{user} {'may not' if mine else 'may'} {text}")
        for command in NOBODY:
            if (user, command[0]) not in ARGUMENTS_UNRESTRICTED and dryrun(user, command):
                wrong.append(f"{user} may {' '.join(command)}")
    return wrong


@pytest.mark.integration
def test_acl_matrix_every_role_against_every_role_standalone(acl_redis):
    admin = client(acl_redis, "admin")

    def dryrun(user: str, command: list[str]) -> bool:
        return admin.execute_command("ACL", "DRYRUN", user, *command) == b"OK"

    assert acl_matrix(dryrun) == []


@pytest.mark.integration
def test_acl_matrix_every_role_against_every_role_on_each_cluster_node(acl_cluster):
    for node in acl_cluster.nodes:
        admin = node.client()

        def dryrun(user: str, command: list[str], admin=admin) -> bool:
            return admin.execute_command("ACL", "DRYRUN", user, *command) == b"OK"

        assert acl_matrix(dryrun) == [], f"node {node.port}"


@pytest.mark.integration
def test_the_console_does_its_whole_job_under_its_user(acl_redis, tmp_path):
    from starlette.testclient import TestClient

    from worker.common.settings import load_settings
    from worker.console.app import build_app
    from worker.console.context import make_console
    from worker.console.tokens import Tokens
    from worker.lifecycle.registry import Registry
    from worker.producers.publisher import publish

    admin = client(acl_redis, "admin")
    path = tmp_path / "model.npz"
    save_model(random_model(["view", "add_to_cart", "purchase"], hidden=8, seed=1), path)
    registry = Registry(admin)
    registry.publish(path.read_bytes(), promote=True)
    registry.publish(path.read_bytes())
    registry.set_shadow("2")
    publish(admin, synthetic_events(400, 20, seed=3))
    admin.xgroup_create(STREAM, "intentstream-workers", "0")
    admin.hset(STATE, mapping={"score": "0.5"})
    # an endpoint and an action: the feed reads where its delivery stands
    from worker.common.keys import Keys
    from worker.webhooks.endpoints import Endpoint
    from worker.webhooks.store import add_endpoint

    secret = "whsec_" + base64.b64encode(b"k" * 24).decode()
    add_endpoint(admin, Keys(), Endpoint(name="crm", url="https://crm.example/h", secret=secret))
    admin.xadd(ACTIONS, {"user_id": "user-1", "rule": "c", "score": "0.9", "reasons": "[]"})
    admin.xgroup_create(ACTIONS, "webhook:crm", "0", mkstream=True)
    token = "console-editor-token-0123456789"
    settings = load_settings(None, redis_url=url(acl_redis, "console"))
    app = build_app(make_console(settings, Tokens(token, None), 1000))
    bearer = {"authorization": f"Bearer {token}"}
    with TestClient(app, follow_redirects=False, headers=bearer) as c:
        for page in ("/", "/api/overview", "/rules", "/users?user_id=user-1", "/actions",
                     "/api/actions", "/models", "/rules/backtest?name=c&above=0.5"):  # fmt: skip
            assert c.get(page).status_code == 200, page
        assert c.post("/rules/save", data={"name": "c", "above": "0.5"}).status_code == 303
        assert c.post("/models/promote", data={"version": "2"}).status_code == 200
        assert c.post("/models/rollback").status_code == 200
        assert c.post("/rules/delete", data={"name": "c"}).status_code == 303
    assert admin.get("intentstream:model:current") == b"1"
    assert admin.get("intentstream:model:shadow") is None  # the promotion ended the shadow
    assert admin.xlen("intentstream:console:audit") == 4
    assert admin.acl_log() == []


@pytest.mark.integration
def test_a_producer_user_started_before_any_worker_follows_a_resize(acl_redis):
    """The shipped `producer` user, with no producers' function loaded yet (it may not load
    one), publishes without pause while `partitions resize --to 3` runs as admin: every
    entry ends on its user's partition under 3, none lost or doubled, nothing in the ACL
    LOG. (Plain XADD went on for up to 10 s after the resize had loaded the function:
    misrouted entries.)"""
    import threading

    from worker.common.keys import partition_of
    from worker.producers.publisher import publish

    admin = client(acl_redis, "admin")
    admin.hset("intentstream:config", "partitions", 2)  # a count recorded, no function yet
    producer = connect(url(acl_redis, "producer"))
    sent: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def produce() -> None:
        try:
            while not stop.is_set():
                users = [f"u{len(sent) + i}" for i in range(10)]
                publish(producer, [{"user_id": u, "type": "view"} for u in users],
                        partitions=2, pipeline_size=10)  # fmt: skip
                sent.extend(users)
        except BaseException as exc:  # the test fails on it below
            errors.append(exc)

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        wait_for(lambda: len(sent) >= 300 or errors, 60, "events by plain XADD")
        assert not admin.execute_command("FUNCTION", "LIST")  # no function: XADD so far
        result = cli("partitions", "resize", "--to", "3", "--redis-url", url(acl_redis, "admin"))
        assert result.returncode == 0, result.stdout + result.stderr
        after = len(sent)
        wait_for(lambda: len(sent) >= after + 300 or errors, 60, "events after the resize")
    finally:
        stop.set()
        thread.join(30)
    assert not errors, errors
    placed = []
    for p in range(4):
        for _, fields in admin.xrange(f"intentstream:events:{{{p}}}"):
            user = fields[b"user_id"].decode()
            assert partition_of(user, 3) == p, f"{user} on partition {p}"
            placed.append(user)
    assert sorted(placed) == sorted(sent)
    assert admin.acl_log() == []
