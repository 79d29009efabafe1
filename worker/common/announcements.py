"""Announcements on a pub/sub channel, turned into a wake-up: what the model and rule sources
listen to between their polls (pub/sub drops messages while disconnected, so each source also
polls; an announcement only makes the next check come sooner)."""

from __future__ import annotations

import threading
from contextlib import suppress

import redis

from worker.common.connection import refresh_topology


def wake_on_announcements(
    client: redis.Redis, channel: str, wake: threading.Event, closed: threading.Event
) -> None:
    """Set `wake` at every message on `channel` until `closed` is set; a thread's body. A
    lost subscription is retried every second."""
    while not closed.is_set():
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(channel)
            while not closed.is_set():
                if pubsub.get_message(timeout=1.0) is not None:
                    wake.set()
        except redis.RedisError:
            closed.wait(1.0)  # polling covers the gap
            # a cluster's pub/sub dials the channel's slot's node as the client maps it,
            # and redis-py never re-reads that map on a pub/sub error
            refresh_topology(client)
        finally:
            with suppress(redis.RedisError):
                pubsub.close()


def start_listener(
    client: redis.Redis, channel: str, wake: threading.Event, closed: threading.Event, name: str
) -> threading.Thread:
    """A daemon thread running `wake_on_announcements`."""
    thread = threading.Thread(target=wake_on_announcements, args=(client, channel, wake, closed),
                              name=name, daemon=True)  # fmt: skip
    thread.start()
    return thread
