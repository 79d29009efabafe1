"""deploy/k8s: kubernetes-validate on the core objects; the KEDA objects (no schema there)
field by field; the wiring between Deployment, ConfigMap, Secret, Service, KEDA and CronJob."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.deploy_tools import DEPLOY, run, venv_tool
from worker.commands.cli import build_parser
from worker.common.keys import Keys
from worker.common.settings import Settings

K8S = DEPLOY / "k8s"
KEDA_API = "keda.sh/v1alpha1"
# The redis-streams scaler's metadata fields (KEDA docs, "Redis Streams" scaler).
STREAM_METADATA = {
    "address", "host", "port", "addressFromEnv", "hostFromEnv", "portFromEnv",
    "usernameFromEnv", "passwordFromEnv", "stream", "consumerGroup", "pendingEntriesCount",
    "streamLength", "lagCount", "activationLagCount", "enableTLS", "unsafeSsl",
    "databaseIndex",
}  # fmt: skip
SCALED_OBJECT_SPEC = {
    "scaleTargetRef", "pollingInterval", "cooldownPeriod", "initialCooldownPeriod",
    "idleReplicaCount", "minReplicaCount", "maxReplicaCount", "fallback", "advanced", "triggers",
}  # fmt: skip


def manifests() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


@pytest.fixture(scope="module")
def objects() -> dict[tuple[str, str], dict]:
    """Every object of the manifests by (kind, name)."""
    out = {}
    for path in manifests():
        for doc in yaml.safe_load_all(path.read_text()):
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def one(objects: dict, kind: str) -> dict:
    found = [o for (k, _), o in objects.items() if k == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def worker(objects: dict) -> dict:
    """The workers' Deployment (the console has its own, console.yaml)."""
    return objects[("Deployment", "intentstream-worker")]


def settings(objects: dict) -> dict[str, str]:
    return one(objects, "ConfigMap")["data"]


@pytest.mark.integration
def test_kubernetes_validate_strict(tmp_path):
    tool = venv_tool("kubernetes-validate")
    core = [str(p) for p in manifests() if p.name != "keda.yaml"]
    result = run(tool, "--strict", "--quiet", *core)
    assert result.returncode == 0, result.stdout + result.stderr
    # strict validation bites: a misspelt field fails
    bad = tmp_path / "deployment.yaml"
    text = (K8S / "deployment.yaml").read_text()
    bad.write_text(text.replace("terminationGracePeriodSeconds", "terminationGracePeriodSecond"))
    result = run(tool, "--strict", "--quiet", str(bad))
    assert result.returncode != 0, result.stdout


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == [p.name for p in manifests()]
    assert kustomization["namespace"] == "intentstream"


def test_configmap_keys_are_settings(objects):
    known = {f"INTENTSTREAM_{name.upper()}" for name in Settings.model_fields}
    data = settings(objects)
    assert set(data) <= known, f"not settings: {set(data) - known}"
    Settings(**{k.removeprefix("INTENTSTREAM_").lower(): v for k, v in data.items()})
    assert data["INTENTSTREAM_METRICS_HOST"] == "0.0.0.0", "probes and Prometheus reach the pod"


def container(pod_spec: dict) -> dict:
    (only,) = pod_spec["containers"]
    return only


def secret_refs(c: dict) -> dict[str, tuple[str, str]]:
    return {
        e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }


def check_redis_env(objects: dict, c: dict, user: str) -> None:
    secret = one(objects, "Secret")
    for name, (secret_name, key) in secret_refs(c).items():
        assert secret_name == secret["metadata"]["name"] and key in secret["stringData"], name
    assert secret_refs(c)["REDIS_PASSWORD"][1] == f"{user}-password"
    url = {e["name"]: e.get("value") for e in c["env"]}["INTENTSTREAM_REDIS_URL"]
    assert url.startswith(f"redis://{user}:$(REDIS_PASSWORD)@"), url
    names = [e["name"] for e in c["env"]]
    # $(VAR) expands only variables defined earlier in the list
    for ref in re.findall(r"\$\((\w+)\)", url):
        assert names.index(ref) < names.index("INTENTSTREAM_REDIS_URL"), ref
    assert c["envFrom"] == [
        {"configMapRef": {"name": one(objects, "ConfigMap")["metadata"]["name"]}}
    ]


def pod_of(objects: dict, kind: str) -> dict:
    return one(objects, kind)["spec"]["template"]["spec"]


def test_deployment(objects):
    deployment = worker(objects)
    pod = deployment["spec"]["template"]["spec"]
    c = container(pod)
    assert c["args"] == ["worker"]
    build_parser().parse_args(c["args"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["metrics"] == int(settings(objects)["INTENTSTREAM_METRICS_PORT"])
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert c["resources"]["limits"]["memory"]
    assert pod["terminationGracePeriodSeconds"] >= 10
    assert pod["securityContext"]["runAsNonRoot"] is True
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    uid = re.findall(r"^USER (\d+)", dockerfile, re.M)[-1]
    assert pod["securityContext"]["runAsUser"] == int(uid)
    consumer = {e["name"]: e for e in c["env"]}["INTENTSTREAM_CONSUMER"]
    assert consumer["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    check_redis_env(objects, c, "worker")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert "replicas" not in deployment["spec"], "KEDA's HPA owns the count; apply resets it"
    check_locked_down(objects, pod)


def numba_cache_dir() -> str:
    """The image's NUMBA_CACHE_DIR, where its build compiled the kernels."""
    env = re.search(r"NUMBA_CACHE_DIR=(\S+)", (DEPLOY / "Dockerfile").read_text())
    assert env, "the Dockerfile sets NUMBA_CACHE_DIR"
    return env.group(1)


def check_locked_down(objects: dict, pod: dict) -> None:
    """Read-only root, no API token, and the Numba cache writable on an emptyDir that an init
    container fills with the image's compiled kernels (Numba cannot use a read-only cache)."""
    assert pod["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    c = container(pod)
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    cache = numba_cache_dir()
    assert cache in mounts and "emptyDir" in volumes[mounts[cache]], mounts
    assert "/tmp" in mounts and "emptyDir" in volumes[mounts["/tmp"]]
    (init,) = pod["initContainers"]
    assert init["image"] == c["image"]
    (seed,) = init["volumeMounts"]
    assert seed["name"] == mounts[cache]
    assert init["command"] == ["cp", "-a", f"{cache}/.", seed["mountPath"].rstrip("/") + "/"]
    for each in (init, c):
        sc = each["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True, each["name"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
        assert each["resources"]["limits"]["memory"], each["name"]


def test_service_account_mounts_no_token(objects):
    account = one(objects, "ServiceAccount")
    assert account["automountServiceAccountToken"] is False


def test_disruption_budget_drains_one_worker_at_a_time(objects):
    pdb = one(objects, "PodDisruptionBudget")
    pod_labels = worker(objects)["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]


def test_service_monitor_scrapes_the_metrics_service_as_job_intentstream(objects):
    monitoring = K8S / "monitoring"
    kustomization = yaml.safe_load((monitoring / "kustomization.yaml").read_text())
    (name,) = kustomization["resources"]
    monitor = yaml.safe_load((monitoring / name).read_text())
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["kind"] == "ServiceMonitor"
    service = objects[("Service", "intentstream-worker-metrics")]
    spec = monitor["spec"]
    assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["path"] == "/metrics"
    deliverers = objects[("Service", "intentstream-deliverer-metrics")]
    assert spec["selector"]["matchLabels"].items() <= deliverers["metadata"]["labels"].items()
    assert deliverers["spec"]["ports"][0]["name"] == endpoint["port"]
    # the job label is taken from this Service label, which the kustomization sets on every
    # object: the workers' job is "intentstream" on Kubernetes as outside it
    main = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    common = {k: v for pairs in main["labels"] for k, v in pairs["pairs"].items()}
    assert common[spec["jobLabel"]] == "intentstream"
    assert kustomization["namespace"] == main["namespace"]


def test_metrics_service(objects):
    service = objects[("Service", "intentstream-worker-metrics")]
    pod_labels = worker(objects)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "metrics" and port["name"] == "metrics"


def test_cronjob_trains_from_redis_and_promotes(objects):
    cron = one(objects, "CronJob")
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    c = container(pod)
    assert c["args"][:3] == ["train", "--from-redis", "--promote"]
    build_parser().parse_args(c["args"])
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    check_redis_env(objects, c, "trainer")
    assert cron["spec"]["startingDeadlineSeconds"] > 0, "a long-missed run is skipped"
    assert cron["spec"]["jobTemplate"]["spec"]["ttlSecondsAfterFinished"] > 0
    check_locked_down(objects, pod)


def test_keda_trigger_authentication(objects):
    auth = one(objects, "TriggerAuthentication")
    assert auth["apiVersion"] == KEDA_API
    secret = one(objects, "Secret")
    refs = auth["spec"]["secretTargetRef"]
    assert {r["parameter"] for r in refs} == {"username", "password"}
    for ref in refs:
        assert ref["name"] == secret["metadata"]["name"]
        assert ref["key"] in secret["stringData"], ref
    users = yaml.safe_load((K8S / "secret.yaml").read_text())["stringData"]
    acl = (DEPLOY / "redis" / "users.acl").read_text()
    assert f"user {users['keda-username']} on " in acl


def test_keda_scaled_object(objects):
    scaled = one(objects, "ScaledObject")
    assert scaled["apiVersion"] == KEDA_API
    spec = scaled["spec"]
    assert set(spec) <= SCALED_OBJECT_SPEC, set(spec) - SCALED_OBJECT_SPEC
    assert spec["scaleTargetRef"] == {"name": worker(objects)["metadata"]["name"]}
    data = settings(objects)
    partitions = int(data["INTENTSTREAM_PARTITIONS"])
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= partitions
    # cooldownPeriod acts only on scaling to zero: with a minimum of one it would do nothing
    assert "cooldownPeriod" not in spec
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 60
    worker_env = {
        e["name"]: e for e in container(worker(objects)["spec"]["template"]["spec"])["env"]
    }
    keys = Keys(data["INTENTSTREAM_PREFIX"])
    secret = one(objects, "Secret")["stringData"]
    auth_name = one(objects, "TriggerAuthentication")["metadata"]["name"]
    streams = []
    for trigger in spec["triggers"]:
        assert trigger["type"] == "redis-streams"
        meta = trigger["metadata"]
        assert set(meta) <= STREAM_METADATA, set(meta) - STREAM_METADATA
        assert all(isinstance(v, str) for v in meta.values()), "KEDA metadata values are strings"
        assert meta["consumerGroup"] == data["INTENTSTREAM_GROUP"]
        # the address comes from the worker's environment, i.e. the Secret, as the worker's
        assert not {"address", "host", "port", "addressFromEnv"} & set(meta)
        for field, key in (("hostFromEnv", "host"), ("portFromEnv", "port")):
            ref = worker_env[meta[field]]["valueFrom"]["secretKeyRef"]
            assert ref == {"name": one(objects, "Secret")["metadata"]["name"], "key": key}
            assert secret[key]
        assert int(meta["lagCount"]) > 0
        assert "activationLagCount" not in meta, "acts only on scaling from zero"
        assert not {"pendingEntriesCount", "streamLength"} & set(meta), "scale on lag"
        assert trigger["authenticationRef"] == {"name": auth_name}
        streams.append(meta["stream"])
    assert streams == [keys.events(p) for p in range(partitions)]


def test_the_console_has_its_own_deployment_and_service_with_a_read_only_root(objects):
    deployment = objects[("Deployment", "intentstream-console")]
    pod = deployment["spec"]["template"]["spec"]
    c = container(pod)
    assert c["args"][:3] == ["console", "--host", "0.0.0.0"]
    build_parser().parse_args(c["args"])
    check_redis_env(objects, c, "console")
    refs = secret_refs(c)
    assert refs["INTENTSTREAM_CONSOLE_TOKEN"][1] == "console-token"
    assert refs["INTENTSTREAM_CONSOLE_VIEWER_TOKEN"][1] == "console-viewer-token"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert "/var/cache/intentstream/numba" in mounts, "Numba needs a writable cache"
    assert c["readinessProbe"]["httpGet"] == {"path": "/login", "port": "http"}
    service = objects[("Service", "intentstream-console")]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["selector"] != worker(objects)["spec"]["selector"]["matchLabels"]
    (port,) = service["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (9200, "http")


def test_the_deliverer_has_its_own_deployment_user_and_metrics_service(objects):
    deployment = objects[("Deployment", "intentstream-deliverer")]
    pod = deployment["spec"]["template"]["spec"]
    c = container(pod)
    assert c["args"] == ["deliver"]
    build_parser().parse_args(c["args"])
    check_redis_env(objects, c, "deliverer")
    consumer = {e["name"]: e for e in c["env"]}["INTENTSTREAM_CONSUMER"]
    assert consumer["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", "one per pod"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["metrics"] == int(settings(objects)["INTENTSTREAM_METRICS_PORT"])
    assert c["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert pod["terminationGracePeriodSeconds"] >= 10
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"]
    service = objects[("Service", "intentstream-deliverer-metrics")]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["selector"] != worker(objects)["spec"]["selector"]["matchLabels"]
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["targetPort"]) == ("metrics", "metrics")
