"""deploy/Dockerfile: lint clean, pinned, non-root; its ENTRYPOINT and HEALTHCHECK commands
run outside a container against a test worker (no image can be built here)."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import distribution
from pathlib import Path

import pytest
import redis
from packaging.requirements import Requirement
from packaging.version import Version

from model.random_init import random_model
from tests.deploy_tools import DEPLOY, clean_env, run, venv_tool
from tests.workers import count_scores, wait_for
from worker.commands import probe
from worker.commands.cli import build_parser
from worker.commands.probe import healthz_url
from worker.common.local_redis import free_port
from worker.common.settings import Settings, load_settings
from worker.lifecycle.registry import Registry
from worker.producers.publisher import publish

DOCKERFILE = DEPLOY / "Dockerfile"
IMAGE_VENV_BIN = "/opt/intentstream/bin"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs of a Dockerfile, continuation lines joined."""
    out, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        current += " " + stripped.removesuffix("\\") if current else stripped.removesuffix("\\")
        if not stripped.endswith("\\"):
            word, _, rest = current.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            current = ""
    return out


def final_stage(text: str) -> list[tuple[str, str]]:
    ins = instructions(text)
    last_from = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    return ins[last_from:]


def exec_form(args: str) -> list[str]:
    """The JSON array of an exec-form instruction; fails on shell form."""
    doc = json.loads(args)
    assert isinstance(doc, list) and all(isinstance(a, str) for a in doc), args
    return doc


def image_env(stage: list[tuple[str, str]]) -> dict[str, str]:
    """ENV of the final stage, with ARG defaults substituted."""
    args = {}
    env: dict[str, str] = {}
    for word, rest in stage:
        if word == "ARG" and "=" in rest:
            k, v = rest.split("=", 1)
            args[k] = v
        if word == "ENV":
            for pair in shlex.split(rest):
                k, v = pair.split("=", 1)
                v = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m[1], env.get(m[1], m[0])), v)
                env[k] = v
    return env


@pytest.fixture(scope="module")
def dockerfile() -> str:
    return DOCKERFILE.read_text()


def test_base_image_is_a_pinned_slim_python(dockerfile):
    bases = [rest.split()[0] for word, rest in instructions(dockerfile) if word == "FROM"]
    assert bases, "no FROM"
    for base in bases:
        assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base), base
    assert len(set(bases)) == 1, "build and run stages must share the base (the venv's python)"


def test_runs_as_a_numeric_non_root_user(dockerfile):
    users = [rest for word, rest in final_stage(dockerfile) if word == "USER"]
    assert users, "the final stage sets no USER: it would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0, users[-1]
    assert not gid or (gid.isdigit() and int(gid) > 0), users[-1]


def test_entrypoint_and_healthcheck_are_exec_form(dockerfile):
    stage = dict(final_stage(dockerfile))
    assert exec_form(stage["ENTRYPOINT"]) == ["intentstream"]
    assert exec_form(stage["CMD"]) == ["worker"]
    hc = stage["HEALTHCHECK"]
    assert re.search(r"--interval=\d+s", hc) and re.search(r"--timeout=\d+s", hc)
    command = hc.split("CMD", 1)[1].strip()
    assert exec_form(command) == ["intentstream", "healthcheck"]
    assert "curl" not in dockerfile and "wget" not in dockerfile


def test_dependencies_installed_without_cache_under_constraints(dockerfile):
    env = {}
    for word, rest in instructions(dockerfile):
        if word == "ENV":
            env.update(dict(p.split("=", 1) for p in shlex.split(rest)))
    assert env.get("PIP_NO_CACHE_DIR") == "1"
    assert env.get("PIP_CONSTRAINT") == "/src/deploy/constraints.txt"
    copies = [rest for word, rest in instructions(dockerfile) if word == "COPY"]
    assert "deploy/constraints.txt deploy/constraints.txt" in copies
    pips = [r for w, r in instructions(dockerfile) if w == "RUN" and "pip install" in r]
    assert pips and all("--no-cache-dir" in r for r in pips)


def constraints() -> dict[str, str]:
    pins = {}
    for line in (DEPLOY / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"not pinned with ==: {line}"
            pins[name.lower().replace("_", "-")] = version
    return pins


def runtime_requirements(name: str, extras: frozenset = frozenset(), seen=None) -> dict:
    """Requirement objects of a distribution's runtime closure, by normalized name."""
    seen = {} if seen is None else seen
    for text in distribution(name).requires or []:
        req = Requirement(text)
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in extras or {""}):
            continue
        key = req.name.lower().replace("_", "-")
        if key not in seen:
            seen[key] = req
            runtime_requirements(req.name, frozenset(req.extras), seen)
    return seen


def test_constraints_pin_every_runtime_dependency():
    pins = constraints()
    needed = runtime_requirements("intentstream", frozenset({"console"}))  # the image's extra
    assert set(needed) <= set(pins), f"unpinned: {sorted(set(needed) - set(pins))}"
    for key, req in needed.items():
        assert Version(pins[key]) in req.specifier, f"{key}=={pins[key]} breaks {req}"
    assert "setuptools" in pins, "the build backend is not pinned"


@pytest.mark.integration
def test_hadolint_clean():
    hadolint = venv_tool("hadolint")
    result = run(hadolint, "--no-color", str(DOCKERFILE))
    assert result.returncode == 0, result.stdout + result.stderr
    # and it does find problems: the same file on an unpinned root image fails
    bad = re.sub(r"python:\S+", "python:latest", DOCKERFILE.read_text())
    result = run(hadolint, "--no-color", "-", input=bad + "RUN pip install flask\n")
    assert result.returncode != 0, result.stdout
    assert "DL3007" in result.stdout and "DL3042" in result.stdout, result.stdout


class _Status(BaseHTTPRequestHandler):
    code = 200

    def do_GET(self):
        body = b"ok\n" if self.code == 200 else b"main loop stalled\n"
        self.send_response(self.code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.integration
@pytest.mark.parametrize(("code", "exit_code"), [(200, 0), (503, 1)])
@pytest.mark.parametrize("address_from", ["flag", "environment"])
def test_healthcheck_follows_healthz(code, exit_code, address_from):
    handler = type("H", (_Status,), {"code": code})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = str(server.server_address[1])
        if address_from == "flag":
            result = run(venv_tool("intentstream"), "healthcheck", "--metrics-port", port,
                         env=clean_env())  # fmt: skip
        else:  # as in the image: INTENTSTREAM_METRICS_HOST=0.0.0.0 and the port
            env = clean_env(INTENTSTREAM_METRICS_PORT=port, INTENTSTREAM_METRICS_HOST="0.0.0.0")
            result = run(venv_tool("intentstream"), "healthcheck", env=env)
    finally:
        server.shutdown()
    assert result.returncode == exit_code, result.stdout + result.stderr
    assert ("healthy" if code == 200 else "HTTP 503") in result.stdout + result.stderr


@pytest.mark.integration
def test_healthcheck_fails_clearly_without_a_worker_or_with_a_bad_port():
    env = clean_env(INTENTSTREAM_METRICS_PORT=str(free_port()))
    result = run(venv_tool("intentstream"), "healthcheck", env=env)
    assert result.returncode == 1 and "cannot reach http://127.0.0.1:" in result.stderr
    # a value to reject goes to the full CLI: its one-line settings error, exit 2
    result = run(venv_tool("intentstream"), "healthcheck",
                 env=clean_env(INTENTSTREAM_METRICS_PORT="nine"))  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "INTENTSTREAM_METRICS_PORT: expected an integer, got 'nine'" in result.stderr


def test_probe_defaults_are_the_workers():
    fields = Settings.model_fields
    assert fields["metrics_host"].default == probe.DEFAULT_METRICS_HOST
    assert fields["metrics_port"].default == probe.DEFAULT_METRICS_PORT
    assert Settings.model_config["env_prefix"] == "INTENTSTREAM_"


PLAIN = [
    ([], {}),
    ([], {"INTENTSTREAM_METRICS_PORT": "9200", "INTENTSTREAM_METRICS_HOST": "0.0.0.0"}),
    (["--metrics-port", "9300"], {"INTENTSTREAM_METRICS_PORT": "9200"}),
    (["--metrics-port=9301", "--metrics-host", "::"], {}),
    (["--metrics-host", "10.1.2.3"], {"INTENTSTREAM_METRICS_HOST": "0.0.0.0"}),
    (["--url", "http://[::1]:7/healthz", "--timeout", "0.5"], {}),
]
NOT_PLAIN = [
    (["--help"], {}),
    (["--metrics-port"], {}),
    (["--metrics-port", "nine"], {}),
    ([], {"INTENTSTREAM_METRICS_PORT": "0"}),
    ([], {"INTENTSTREAM_METRICS_PORT": "70000"}),
    (["--timeout", "soon"], {}),
    (["--metrics-port", "1", "--metrics-port", "2"], {}),
    (["--log-level", "DEBUG"], {}),
]


@pytest.mark.parametrize(("argv", "env"), PLAIN)
def test_plain_healthcheck_checks_what_the_full_cli_checks(argv, env, monkeypatch):
    for name in ("INTENTSTREAM_METRICS_PORT", "INTENTSTREAM_METRICS_HOST"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["healthcheck", *argv])
    settings = load_settings(args, model=None)
    full = args.url or healthz_url(settings.metrics_host, settings.metrics_port)
    assert probe.plain_request(argv, env) == (full, args.timeout)


@pytest.mark.parametrize(("argv", "env"), NOT_PLAIN)
def test_anything_else_goes_to_the_full_cli(argv, env):
    assert probe.plain_request(argv, env) is None


@pytest.mark.integration
def test_plain_healthcheck_loads_only_the_standard_library():
    """What makes the container's check cheap: no numpy, Numba, pydantic or redis."""
    code = (
        "import sys; from worker.commands.entry import main; main(['healthcheck'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'numpy', 'numba', 'pydantic', 'redis', 'prometheus_client', 'model', 'argparse'}))"
    )
    env = clean_env(INTENTSTREAM_METRICS_PORT=str(free_port()))
    result = run(sys.executable, "-I", "-c", code, env=env)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_healthcheck_reaches_a_worker_bound_to_every_address():
    assert healthz_url("0.0.0.0", 9108) == "http://127.0.0.1:9108/healthz"
    assert healthz_url("::", 9108) == "http://[::1]:9108/healthz"
    assert healthz_url("10.1.2.3", 9) == "http://10.1.2.3:9/healthz"


def _host_command(argv: list[str], venv_bin: Path) -> list[str]:
    """An image command run here: the image's venv is this test's venv."""
    first = argv[0]
    if first.startswith(IMAGE_VENV_BIN + "/"):
        first = first[len(IMAGE_VENV_BIN) + 1 :]
    return [str(venv_bin / first), *argv[1:]]


@pytest.mark.integration
def test_entrypoint_and_healthcheck_run_a_worker(redis_server, tmp_path, dockerfile):
    """The image's environment and commands, outside a container: the Numba cache filled by
    the build's warm-up covers the worker (nothing compiled at start), the HEALTHCHECK passes
    while the worker runs and fails once SIGTERM stopped it (exit 0)."""
    stage = final_stage(dockerfile)
    ins = dict(stage)
    venv_bin = Path(sys.executable).parent
    env = image_env(stage)
    cache = tmp_path / "numba"
    env |= {
        "PATH": f"{venv_bin}:{clean_env()['PATH']}",
        "NUMBA_CACHE_DIR": str(cache),
        "INTENTSTREAM_REDIS_URL": redis_server.url,
        # loopback and a free port here; the image binds 0.0.0.0:9108
        "INTENTSTREAM_METRICS_HOST": "127.0.0.1",
        "INTENTSTREAM_METRICS_PORT": str(free_port()),
        "INTENTSTREAM_BLOCK_MS": "200",
    }
    env = clean_env(**env)

    warm = [rest for word, rest in stage if word == "RUN" and "warm-numba" in rest]
    assert warm == ["intentstream-warm-numba"], warm
    # a guard against a hang, not a speed check: ~50 s of CPU took over 300 s on a starved CI
    result = run("sh", str(DEPLOY / "docker" / "warm-numba.sh"), env=env, timeout=1200)
    assert result.returncode == 0, result.stderr
    compiled = sorted(p.relative_to(cache) for p in cache.rglob("*") if p.is_file())
    assert any(p.suffix == ".nbc" for p in compiled)

    client = redis.Redis.from_url(redis_server.url)
    model = random_model(["view", "add_to_cart", "purchase"], hidden=16, features=["gap"])
    Registry(client, "intentstream").publish_model(model, promote=True)

    entry = _host_command(exec_form(ins["ENTRYPOINT"]) + exec_form(ins["CMD"]), venv_bin)
    health = _host_command(exec_form(ins["HEALTHCHECK"].split("CMD", 1)[1]), venv_bin)
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(entry, env=env, stdout=log, stderr=log)
    try:
        wait_for(lambda: run(*health, env=env).returncode == 0, 60, "a healthy worker")
        events = [{"user_id": f"u{i % 7}", "type": "view"} for i in range(50)]
        publish(client, events)
        wait_for(lambda: count_scores(client) == 50, 60, "50 scores")
        # a GRU model swapped in: its kernels come from the cache too
        gru = random_model(["view", "add_to_cart"], hidden=16, layers=2, cell="gru")
        Registry(client, "intentstream").publish_model(gru, promote=True)
        wait_for(lambda: b"model swapped" in (tmp_path / "worker.log").read_bytes(), 60, "swap")
        publish(client, events)
        wait_for(lambda: count_scores(client) == 100, 60, "100 scores")
        after = sorted(p.relative_to(cache) for p in cache.rglob("*") if p.is_file())
        assert after == compiled, "the worker compiled kernels the image's warm-up did not"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    result = run(*health, env=env)
    assert result.returncode == 1, result.stdout
    assert "worker stopped" in (tmp_path / "worker.log").read_text()
