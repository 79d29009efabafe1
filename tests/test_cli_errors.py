"""Every sub-command of the installed script: a user error or an unreachable Redis is one line
on stderr naming what to fix, exit 2; a closed pipe exits quietly; Ctrl-C exits 130."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import console_script, run_cli

pytestmark = pytest.mark.integration

DOWN = "redis://127.0.0.1:1/0"  # port 1: nothing listens there (binding it needs root)


def assert_one_line(result: subprocess.CompletedProcess, *needles: str) -> str:
    """The run failed with exit 2 and exactly one `error: ...` line holding the needles."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["publish", "--synthetic", "10"],
        ["demo"],
        # (`worker` waits for an unreachable Redis instead: tests/test_worker_start.py)
        ["train", "--from-redis", "--quiet"],
        ["model", "list"],
        ["model", "show", "2"],
        ["model", "promote", "1"],
        ["model", "rollback"],
        ["model", "shadow"],
        ["model", "export", "1", "--out", "x.npz"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_unreachable_redis_is_one_line_naming_the_url(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_cli(*argv, "--redis-url", DOWN)
    assert_one_line(result, "Redis at redis://127.0.0.1:1/0 is unreachable", "--redis-url")


def test_a_traceback_when_asked_keeps_the_exit_code_and_the_line(monkeypatch):
    monkeypatch.setenv("INTENTSTREAM_TRACEBACK", "1")
    result = run_cli("model", "list", "--redis-url", DOWN)
    assert result.returncode == 2, result.stderr
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: Redis at ")


def test_unreachable_cluster_is_one_line():
    result = run_cli("model", "list", "--cluster", "--redis-url", DOWN)
    assert_one_line(result, "Redis at redis://127.0.0.1:1/0 is unreachable")


@pytest.mark.parametrize("cluster", [False, True], ids=["one redis", "cluster client"])
def test_an_acl_refusal_says_which_permission_is_missing(redis_server, cluster):
    # redis-py's cluster client reports a refused CLUSTER SLOTS as "Cluster mode is not
    # enabled on this node": the line must name the refusal instead (ACL checks come before
    # the command runs, so a plain server refuses it the same way a cluster node does).
    import redis

    admin = redis.Redis.from_url(redis_server.url)
    admin.acl_setuser("scant", enabled=True, passwords=["+pw"], commands=["-@all", "+ping"])
    admin.close()
    url = redis_server.url.replace("redis://", "redis://scant:pw@")
    result = run_cli("model", "list", *(["--cluster"] if cluster else []), "--redis-url", url)
    line = assert_one_line(result, "refused a command", "ACL user 'scant' lacks a permission")
    assert ("'cluster|slots'" if cluster else "no permissions to run the") in line
    assert "Cluster mode is not enabled" not in line and "unreachable" not in line


def test_model_publish_to_unreachable_redis(golden_path):
    result = run_cli("model", "publish", str(golden_path), "--redis-url", DOWN)
    assert_one_line(result, "is unreachable")


def test_the_password_of_the_url_is_not_printed():
    result = run_cli("model", "list", "--redis-url", "redis://bob:s3cret@127.0.0.1:1/0")
    line = assert_one_line(result, "redis://bob:***@127.0.0.1:1/0")
    assert "s3cret" not in line


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["publish", "/nonexistent.jsonl", "--redis-url", DOWN],
         ["/nonexistent.jsonl", "No such file"]),
        (["score", "--model", "/nonexistent.npz"], ["/nonexistent.npz", "No such file"]),
        (["score", "--model", "{golden}", "/nonexistent.jsonl"], ["/nonexistent.jsonl"]),
        (["worker", "--model", "/nonexistent.npz", "--metrics-port", "0"], ["/nonexistent.npz"]),
        (["train", "--data", "/nonexistent.jsonl", "--quiet"], ["/nonexistent.jsonl"]),
        (["train", "--data", "/", "--quiet"], ["Is a directory"]),
        (["model", "show", "/nonexistent.npz"], ["/nonexistent.npz"]),
        (["model", "publish", "/nonexistent.npz", "--redis-url", DOWN], ["/nonexistent.npz"]),
        (["model", "init", "--event-types", "view", "--out", "/nonexistent/dir/m.npz"],
         ["/nonexistent/dir", "No such file"]),
    ],
)  # fmt: skip
def test_missing_files_are_one_line_naming_the_file(argv, needles, golden_path):
    argv = [a.replace("{golden}", str(golden_path)) for a in argv]
    assert_one_line(run_cli(*argv), *needles)


def test_model_evaluate_without_versions_says_where_they_go(golden_path):
    # --data takes every argument after it: the versions named there are not lost silently
    taken = run_cli(
        "model", "evaluate", "--data", "/dev/null", str(golden_path), "--redis-url", DOWN
    )
    assert_one_line(taken, "before --data", f"--data took {golden_path}")
    assert_one_line(run_cli("model", "evaluate", "--from-redis", "--redis-url", DOWN),
                    "name the versions")  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--event-types", "view", "--hidden", "0"], ["--hidden", ">= 1"]),
        (["--event-types", ""], ["--event-types", "at least 1 item"]),
        (["--event-types", "view", "--features", "foo"], ["--features", "unknown features"]),
        (["--event-types", "view,view"], ["--event-types", "distinct"]),
        (["--event-types", "view", "--session-gap", "-1"], ["--session-gap"]),
    ],
)
def test_model_init_bad_values_name_the_flag(flags, needles, tmp_path):
    result = run_cli("model", "init", *flags, "--out", str(tmp_path / "x.npz"))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "pydantic.dev" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]  # argparse's own checks print usage first
    for needle in needles:
        assert needle in last, result.stderr


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--validation-fraction", "1.5"], ["--validation-fraction", "less than 1"]),
        (["--min-type-count", "0"], ["--min-type-count"]),
        (["--optimizer", "rmsprop"], ["--optimizer", "invalid choice"]),
        (["--partitions", "0"], ["partitions", "--partitions"]),
    ],
)
def test_train_bad_values_name_the_flag(flags, needles, tmp_path):
    data = tmp_path / "e.jsonl"
    data.write_text(json.dumps({"user_id": "u", "type": "view", "ts": 1}) + "\n")
    result = run_cli("train", "--data", str(data), "--quiet", *flags)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    for needle in needles:
        assert needle in last, result.stderr


def test_bad_settings_are_one_line():
    assert_one_line(run_cli("publish", "--synthetic", "5", "--redis-url", "http://x"),
                    "error: --redis-url: must start with redis://")  # fmt: skip


def test_a_closed_stdout_pipe_exits_quietly(golden_path):
    for argv in (["model", "show", str(golden_path)], ["--help"]):
        proc = subprocess.Popen(
            [console_script(), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        proc.stdout.close()  # the reader is gone before the first write, as `| head -0`
        err = proc.stderr.read()
        code = proc.wait(timeout=60)
        proc.stderr.close()
        assert err == b"", err.decode()
        assert code in (0, 141)  # argparse's --help may fit the pipe buffer before the close


def test_a_closed_pipe_mid_stream_exits_quietly(golden_path):
    # `intentstream score ... | head -1` with more output than a pipe buffer holds
    lines = "".join(json.dumps({"user_id": f"u{i}", "type": "view"}) + "\n" for i in range(50_000))
    script = f"{console_script()} score --model {golden_path} | head -1; exit ${{PIPESTATUS[0]}}"
    result = subprocess.run(
        ["bash", "-c", script], input=lines, capture_output=True, text=True, timeout=120
    )
    assert result.stderr == ""
    assert result.returncode == 141
    assert json.loads(result.stdout)["user_id"] == "u0"


def _as_at_a_terminal() -> None:
    """SIGINT's default action in the child, as a shell gives a foreground command: a suite
    run in the background (`cmd &` without job control) passes SIGINT on ignored, and Python
    then installs no Ctrl-C handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_exits_130_without_a_traceback(golden_path: Path):
    proc = subprocess.Popen(
        [console_script(), "score", "--model", str(golden_path), "--batch-size", "1"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        bufsize=1, preexec_fn=_as_at_a_terminal,
    )  # fmt: skip
    try:
        proc.stdin.write(json.dumps({"user_id": "a", "type": "view"}) + "\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["user_id"] == "a"  # start-up is over
        proc.send_signal(signal.SIGINT)  # while it waits for the next line
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("key", "argv", "stdin"),
    [
        ("intentstream:config", ["publish"], '{"user_id": "u", "type": "view"}\n'),
        ("intentstream:config", ["explain", "u"], None),
        ("intentstream:events:{0}", ["publish"], '{"user_id": "u", "type": "view"}\n'),
        ("intentstream:state:{0}:u", ["explain", "u"], None),
    ],
)
def test_a_key_of_another_type_is_named(redis_server, key, argv, stdin):
    import redis

    redis.Redis.from_url(redis_server.url).set(key, "x")
    result = run_cli(*argv, "--redis-url", redis_server.url, stdin=stdin)
    want = "stream" if "events" in key else "hash"
    assert_one_line(result, f"key {key} holds a string, not a {want} (WRONGTYPE)")


@pytest.mark.parametrize("port", ["99999", "abc", "-1"])
@pytest.mark.parametrize("argv", [["model", "list"], ["rules", "list"], ["worker"]])
def test_a_bad_port_in_the_url_names_the_flag_not_the_password(argv, port):
    url = f"redis://user:secret@127.0.0.1:{port}/0"
    result = run_cli(*argv, "--redis-url", url)
    line = assert_one_line(
        result, f"error: --redis-url: the URL's port must be a number 0-65535, got '{port}'"
    )
    assert "secret" not in line


def test_cluster_on_a_plain_server_is_a_setting_to_fix_not_a_wait(redis_server, golden_path):
    for argv in (["model", "list"],
                 ["worker", "--model", str(golden_path), "--metrics-port", "0",
                  "--log-format", "text"]):  # fmt: skip
        result = run_cli(*argv, "--cluster", "--redis-url", redis_server.url)
        line = assert_one_line(result, f"Redis at {redis_server.url} is not a Redis Cluster "
                               "node", "drop --cluster / INTENTSTREAM_CLUSTER")  # fmt: skip
        assert "unreachable" not in line
