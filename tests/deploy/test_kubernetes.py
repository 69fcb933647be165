"""The Kubernetes manifests in configs/kubernetes/: parsed, and checked against the config they
carry and configs/example.yaml — volumes, mounts, users, sizes and sharding agree."""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from prefetchd.config import Config, load_config

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "configs" / "kubernetes"
EXAMPLE = ROOT / "configs" / "example.yaml"
_QUANTITY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "": 1}


def documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def quantity(value: str) -> int:
    m = re.fullmatch(r"([0-9]+)(Ki|Mi|Gi|Ti|)", str(value))
    assert m, f"unexpected quantity {value!r}"
    return int(m.group(1)) * _QUANTITY[m.group(2)]


def jobs() -> list[dict[str, Any]]:
    return [d for d in documents() if d["kind"] == "Job"]


def configmaps() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in documents() if d["kind"] == "ConfigMap"}


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in pod["containers"] if c["name"] == name]
    assert found, f"no container {name}"
    return found[0]


def mounted(c: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """The volumeMount of container ``c`` that holds ``path``."""
    best = None
    for mount in c.get("volumeMounts", []):
        root = PurePosixPath(mount["mountPath"])
        if (PurePosixPath(path) == root or root in PurePosixPath(path).parents) and (
            best is None or len(mount["mountPath"]) > len(best["mountPath"])
        ):
            best = mount
    return best


def mount_name(c: dict[str, Any], path: str) -> str:
    mount = mounted(c, Path(path))
    assert mount is not None, f"{path} is on no volume of container {c['name']}"
    return str(mount["name"])


def env_value(c: dict[str, Any], name: str) -> str | None:
    for var in c.get("env", []):
        if var["name"] == name:
            value: str | None = var.get("value")
            return value
    return None


def daemon_config_path(daemon: dict[str, Any]) -> str:
    """The --config of the prefetchd container, which runs ``prefetchd run`` through
    ``command:`` (replacing any image entrypoint, docker/Dockerfile's ``prefetchd`` included)."""
    argv = daemon["command"]
    assert argv[:2] == ["prefetchd", "run"] and "args" not in daemon, argv
    return str(argv[argv.index("--config") + 1])


def load_pod_config(job: dict[str, Any], tmp_path: Path, index: int = 0) -> Config:
    """The config the pod's prefetchd container sees, loaded as the daemon loads it (with the
    TF_CONFIG its env gives worker ``index``)."""
    pod = job["spec"]["template"]["spec"]
    daemon = container(pod, "prefetchd")
    config_path = PurePosixPath(daemon_config_path(daemon))
    mount = mounted(daemon, Path(config_path))
    assert mount is not None and mount.get("readOnly"), "the config is not mounted read-only"
    volume = {v["name"]: v for v in pod["volumes"]}[mount["name"]]
    configmap = configmaps()[volume["configMap"]["name"]]
    text = configmap["data"][config_path.name]
    local = tmp_path / f"{job['metadata']['name']}-{index}.yaml"
    local.write_text(text)
    tf_config = env_value(daemon, "TF_CONFIG")
    monkey = pytest.MonkeyPatch()
    try:
        if tf_config is not None:
            monkey.setenv("TF_CONFIG", tf_config.replace("$(WORKER_INDEX)", str(index)))
        return load_config(local)
    finally:
        monkey.undo()


def keys_of(data: dict[str, Any]) -> set[str]:
    return {f"{section}.{key}" for section, body in data.items() for key in body}


def test_manifests_parse_and_name_what_they_reference() -> None:
    docs = documents()
    kinds = {d["kind"] for d in docs}
    assert {"ConfigMap", "Secret", "ServiceAccount", "Job", "Service"} <= kinds
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    for job in jobs():
        pod = job["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] in accounts
        for c in pod["containers"] + pod.get("initContainers", []):
            for var in c.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets[ref["name"]]["stringData"]
                    assert ref.get("optional"), "credentials must also work from an IAM role"
                    assert c["name"] == "prefetchd", "only the daemon gets credentials"
        volumes = {v["name"] for v in pod["volumes"]}
        for c in pod["containers"] + pod.get("initContainers", []):
            assert {m["name"] for m in c.get("volumeMounts", [])} <= volumes


@pytest.mark.parametrize("job", jobs(), ids=lambda j: j["metadata"]["name"])
def test_config_keys_agree_with_the_example(job: dict[str, Any], tmp_path: Path) -> None:
    load_pod_config(job, tmp_path)  # valid, as the daemon would load it
    pod = job["spec"]["template"]["spec"]
    daemon = container(pod, "prefetchd")
    config_path = daemon_config_path(daemon)
    volume = {v["name"]: v for v in pod["volumes"]}[mount_name(daemon, config_path)]
    ours = yaml.safe_load(configmaps()[volume["configMap"]["name"]]["data"]["prefetchd.yaml"])
    example = yaml.safe_load(EXAMPLE.read_text())
    # every knob of the example is spelt out (worker_index comes from TF_CONFIG with "auto")
    missing = keys_of(example) - keys_of(ours) - {"source.profile", "source.manifest"}
    if ours["sharding"]["num_workers"] == "auto":
        missing.discard("sharding.worker_index")
    assert not missing, f"keys of configs/example.yaml missing: {sorted(missing)}"
    assert keys_of(ours) <= keys_of(example)


@pytest.mark.parametrize("job", jobs(), ids=lambda j: j["metadata"]["name"])
def test_volumes_and_mounts_agree_with_the_config(job: dict[str, Any], tmp_path: Path) -> None:
    cfg = load_pod_config(job, tmp_path)
    pod = job["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    daemon, trainer = container(pod, "prefetchd"), container(pod, "trainer")

    # the RAM disk: memory-backed, shared by both containers, with room for the budget
    ram = mounted(daemon, cfg.output.ram_dir)
    assert ram is not None, "output.ram_dir is on no volume of the prefetchd container"
    assert not ram.get("readOnly")
    ram_volume = volumes[ram["name"]]["emptyDir"]
    assert ram_volume["medium"] == "Memory"
    limit = quantity(ram_volume["sizeLimit"])
    assert limit >= cfg.output.ram_budget * 1.1, "sizeLimit leaves no headroom over ram_budget"
    trainer_ram = mounted(trainer, cfg.output.ram_dir)
    assert trainer_ram is not None and trainer_ram["name"] == ram["name"]
    assert trainer_ram["mountPath"] == ram["mountPath"], "the trainer sees other paths"
    assert not trainer_ram.get("readOnly"), "the trainer must claim (rename) shards"
    # tmpfs pages are charged to the daemon's memory: its limit must hold the budget
    memory = quantity(daemon["resources"]["limits"]["memory"])
    assert memory >= cfg.output.ram_budget + 2**30

    # the window on disk, the daemon's only
    cache = mounted(daemon, cfg.download.cache_dir)
    assert cache is not None
    cache_volume = volumes[cache["name"]]["emptyDir"]
    assert cache_volume.get("medium", "") != "Memory"
    assert quantity(cache_volume["sizeLimit"]) >= cfg.download.window
    assert mounted(trainer, cfg.download.cache_dir) is None

    # state: written by the daemon, read by the trainer (daemon health, epoch ends)
    state = mounted(daemon, cfg.status.state_dir)
    trainer_state = mounted(trainer, cfg.status.state_dir)
    assert state is not None and trainer_state is not None
    assert state["name"] == trainer_state["name"]
    assert state["mountPath"] == trainer_state["mountPath"]

    # the trainer reads the same config file at the same path
    config_path = daemon_config_path(daemon)
    assert config_path in trainer["args"]
    assert mount_name(trainer, config_path) == mount_name(daemon, config_path)

    # one user for both (the directories are 0700), never root
    security = pod["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] != 0
    for c in (daemon, trainer):
        assert "runAsUser" not in c.get("securityContext", {})
        assert c["securityContext"]["allowPrivilegeEscalation"] is False

    # the mount points are made sticky before prefetchd creates its private dirs in them
    init = {c["name"]: c for c in pod.get("initContainers", [])}["volume-permissions"]
    for directory in (cfg.output.ram_dir, cfg.download.cache_dir, cfg.status.state_dir):
        mount = mounted(daemon, directory)
        assert mount is not None
        assert mount["mountPath"] in init["command"] and "1777" in init["command"]


def test_multi_host_job_gives_every_pod_its_own_share(tmp_path: Path) -> None:
    job = {j["metadata"]["name"]: j for j in jobs()}["train-multi"]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    n = spec["completions"]
    assert spec["parallelism"] == n
    pod = spec["template"]["spec"]
    daemon, trainer = container(pod, "prefetchd"), container(pod, "trainer")
    assert env_value(daemon, "TF_CONFIG") == env_value(trainer, "TF_CONFIG"), (
        "the daemon and the trainer must agree on the cluster"
    )
    tf_config = json.loads(str(env_value(daemon, "TF_CONFIG")).replace("$(WORKER_INDEX)", "0"))
    assert len(tf_config["cluster"]["worker"]) == n
    service = {d["metadata"]["name"]: d for d in documents() if d["kind"] == "Service"}
    assert pod["subdomain"] in service
    assert service[pod["subdomain"]]["spec"]["clusterIP"] == "None"
    for host in tf_config["cluster"]["worker"]:
        assert host.split(":")[0].endswith(f".{pod['subdomain']}")
    shares = [load_pod_config(job, tmp_path, index=i).sharding for i in range(n)]
    assert [(s.num_workers, s.worker_index) for s in shares] == [(n, i) for i in range(n)]
    index_var = next(v for v in daemon["env"] if v["name"] == "WORKER_INDEX")
    assert "job-completion-index" in index_var["valueFrom"]["fieldRef"]["fieldPath"]
