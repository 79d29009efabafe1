"""Redis clients with an explicit timeout and retry policy, for one Redis or a Redis Cluster.

redis-py 8 defaults to a 5 s socket timeout and retries on timeouts, resending a command whose
reply was lost. The worker's commit script is idempotent, so a resend is safe; blocking reads
stay below the socket timeout (see Settings). The cluster client follows MOVED and ASK
redirections and retries TRYAGAIN itself; every script and transaction of ours touches one
slot only.

A cluster client's slot map is refreshed by redis-py only on some paths: a plain command's
connection error re-reads it, but a transaction pipeline re-reads it at every fifth error
counted on that pipeline (ours are made fresh, so never) and a pub/sub connection never.
After a master dies and its replica is promoted, those paths keep dialling the dead node:
every retry loop of ours calls `refresh_topology` after a Redis error.
"""

from __future__ import annotations

import logging
import math
import random

import hiredis
import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from worker.common.settings import Settings

# Errors that say Redis is not there (down, unreachable, still loading): wait and retry,
# never dead-letter or give up on the data.
REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)

log = logging.getLogger("intentstream.worker")

try:  # what redis-py's hiredis reader answers while a reply is incomplete
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
except ImportError:  # another redis-py: replies are read one by one
    _NOT_ENOUGH_DATA = None

Client = redis.Redis | redis.RedisCluster


class OwnJitterBackoff(ExponentialWithJitterBackoff):
    """redis-py's jittered exponential backoff, its jitter drawn from a generator of its own.
    Why: the global `random` belongs to whoever seeded it (a test's Hypothesis strategies);
    a thread of ours retrying a lost connection drew from it, and moved its state."""

    _jitter = random.Random()

    def compute(self, failures: int) -> float:
        """Seconds before retry number `failures`: up to base * 2**failures, capped."""
        return min(self._cap, math.ldexp(self._jitter.random() * self._base, min(failures, 64)))


def connect(
    url: str, socket_timeout: float = 5.0, retries: int = 3, cluster: bool = False
) -> Client:
    """A client for redis://, rediss:// (TLS) or unix:// URLs; ACL user:password in the URL.
    With cluster, a Redis Cluster client that discovers the nodes from the one in the URL.

    Replies stay bytes (no decoding): event fields may be any bytes and are validated here.
    Connection errors and timeouts are retried `retries` times with jittered exponential
    backoff (10 ms doubling, capped at 1 s); the caller's loop handles longer outages.
    """
    common = dict(
        socket_timeout=socket_timeout,
        socket_connect_timeout=min(socket_timeout, 5.0),
        retry=Retry(OwnJitterBackoff(cap=1.0, base=0.01), retries),
        decode_responses=False,
        # no CLIENT SETINFO at connect: least-privilege ACL users (deploy/redis) lack it
        driver_info=None,
    )
    if cluster:
        return redis.RedisCluster.from_url(url, **common)
    return redis.Redis.from_url(
        url,
        health_check_interval=30,
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        **common,
    )


def connect_settings(settings: Settings) -> Client:
    """The client for a command's settings."""
    return connect(settings.redis_url, settings.socket_timeout, cluster=settings.cluster)


def is_cluster(client: Client) -> bool:
    return isinstance(client, redis.RedisCluster)


def refresh_topology(client: Client) -> bool:
    """After a connection error, timeout or cluster error in cluster mode: re-read the slot
    map and the node list (CLUSTER SLOTS) from the nodes that still answer, so the next
    retry goes to the node that holds each slot now (a promoted replica) rather than the
    one cached. True if refreshed. One Redis: nothing to do (False). Never raises: with no
    node answering, the next retry fails and calls this again."""
    if not is_cluster(client):
        return False
    try:
        client.nodes_manager.initialize()
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        log.debug("cluster topology not refreshed", extra={"error": str(exc)})
        return False
    return True


def raw_replies(client: Client, *commands: str) -> None:
    """Make these commands answer redis-py's raw reply (no per-entry dicts, nothing dropped).
    A cluster client parses on each node's client, and nodes come and go: call it again
    before use."""
    clients = (
        [n.redis_connection for n in client.get_nodes() if n.redis_connection is not None]
        if is_cluster(client)
        else [client]
    )
    for c in clients:
        for command in commands:
            c.set_response_callback(command, _raw)


def _raw(reply, **_):
    return reply


def reply_or_error(conn: redis.connection.Connection) -> object:
    """The next reply on a connection, or the error it holds, not raised (the replies behind
    it are still read)."""
    try:
        return conn.read_response()
    except redis.ResponseError as exc:
        return exc


def read_replies(conn: redis.connection.Connection, n: int) -> list:
    """The next n replies on a connection, an error reply as its exception (not raised).

    Why not read_response n times: a transaction's commands each answer QUEUED, thousands a
    batch, and redis-py's read_response costs about 1 µs a reply in Python; its hiredis
    reader takes them at about 0.08 µs each. Without a hiredis reader, one by one."""
    parser = getattr(conn, "_parser", None)
    reader = getattr(parser, "_reader", None)
    if _NOT_ENOUGH_DATA is None or not isinstance(reader, hiredis.Reader):
        return [reply_or_error(conn) for _ in range(n)]
    out: list = []
    gets, add, wanting = reader.gets, out.append, _NOT_ENOUGH_DATA
    while len(out) < n:
        for _ in range(n - len(out)):
            reply = gets()
            if reply is wanting:
                break
            add(reply)
        else:
            break
        try:
            parser.read_from_socket()
        except OSError as exc:  # as read_response says it: a connection error, retried
            raise redis.ConnectionError(f"Error while reading from Redis: {exc}") from exc
    return out


def call_packed(client: redis.Redis, command: bytes) -> object:
    """The reply to a command packed as RESP bytes, sent on a connection of the client's
    pool as it is: the worker packs its big commands itself (engine/adapters/resp.py)."""
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_packed_command([command])
        return conn.read_response()
    except redis.ResponseError:
        raise  # the reply was read whole: the connection stays usable
    except BaseException:
        conn.disconnect()  # a reply may still be in flight on it
        raise
    finally:
        pool.release(conn)


def packed_replies(client: redis.Redis, packed: bytes, n: int) -> list:
    """The n replies to commands packed as RESP bytes, sent at once on a connection of the
    client's pool; an error reply as its exception, not raised (`read_replies`)."""
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_packed_command([packed])
        return read_replies(conn, n)
    except BaseException:
        conn.disconnect()  # a reply may still be in flight on it
        raise
    finally:
        pool.release(conn)


class WrongTypeError(redis.ResponseError):
    """A WRONGTYPE reply with the key named: `key K holds a string, not a hash (WRONGTYPE)`.
    Still a ResponseError: a loop that retries Redis replies retries it as before."""


def _type_of(client: Client, key: str) -> str:
    try:
        kind = client.type(key)
    except redis.RedisError:
        return "another type"
    return kind.decode() if isinstance(kind, bytes) else str(kind)


def name_wrong_type(client: Client, exc: BaseException, expected: dict[str, str]) -> None:
    """Raise a WrongTypeError naming the first of `expected`'s keys (key -> its type:
    `hash`, `stream`, ...) that holds another type, when `exc` is a WRONGTYPE reply; return
    otherwise (the caller re-raises `exc`)."""
    if isinstance(exc, WrongTypeError) or not isinstance(exc, redis.ResponseError):
        return
    if not str(exc).startswith("WRONGTYPE"):
        return
    for key, want in expected.items():
        kind = _type_of(client, key)
        if kind not in (want, "none"):
            raise WrongTypeError(f"key {key} holds a {kind}, not a {want} (WRONGTYPE)") from None
