"""Log lines in both formats keep the fields a log call gives with `extra=`."""

from __future__ import annotations

import json
import logging

from worker.common.logs import JsonFormatter, TextFormatter


def record(**extra: object) -> logging.LogRecord:
    fields = {"name": "intentstream.worker", "levelname": "WARNING", "levelno": logging.WARNING}
    rec = logging.makeLogRecord({**fields, "msg": "could not release leases"})
    rec.__dict__.update(extra)
    return rec


def test_text_lines_keep_the_extra_fields():
    line = TextFormatter().format(record(error="timeout", partition=3))
    assert line.endswith("WARNING intentstream.worker: could not release leases error=timeout "
                         "partition=3")  # fmt: skip


def test_json_lines_keep_the_extra_fields():
    doc = json.loads(JsonFormatter().format(record(error="timeout", partition=3)))
    assert (doc["msg"], doc["error"], doc["partition"]) == ("could not release leases",
                                                           "timeout", 3)  # fmt: skip


def test_a_line_without_extras_is_the_plain_message():
    assert (
        TextFormatter().format(record()).endswith("intentstream.worker: could not release leases")
    )
