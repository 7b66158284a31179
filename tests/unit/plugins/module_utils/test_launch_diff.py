"""module_utils.pd_launch and pd_host_probe's diff_specs: what --check --diff prints per container.

The running side is Docker's inspect as dockerd answers it for a container that community.docker's
docker_container started from a launch spec (Config.Cmd the argv, Config.Env the image's variables
merged with the spec's, HostConfig.Binds / Devices / ShmSize / RestartPolicy, the spec hash label).
"""

import copy

from ansible_collections.pd.deploy.plugins.module_utils import pd_launch
from ansible_collections.pd.deploy.plugins.modules import pd_host_probe as probe_mod
from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet
from ansible_collections.pd.deploy.plugins.plugin_utils.validate import secrets
from tests.unit.plugins.plugin_utils.plan.test_fleet import example_fleet

IMAGE_ENV = ["PATH=/usr/local/sbin:/usr/bin", "ASCEND_HOME=/usr/local/Ascend"]
KEY = "sk-the-real-key-1"


def _spec(key=KEY):
    plan = fleet.plan_fleet(example_fleet())
    spec = copy.deepcopy(plan["hosts"]["a-d0"]["specs"][0])
    spec["env"]["VLLM_API_KEY"] = secrets.redaction(key)
    spec["secret_env"] = ["VLLM_API_KEY"]
    return spec


def started_from(spec, key=KEY, status="running"):
    """Docker's inspect of the container docker_container makes from ``spec`` (the real key in its env)."""
    env = dict(spec["env"], **{name: key for name in spec.get("secret_env") or []})
    merged = {**dict(e.split("=", 1) for e in IMAGE_ENV), **env}
    return {
        "Image": "sha256:" + "a" * 64,
        "Config": {"Image": spec["image"], "Cmd": list(spec["command"]), "Env": [f"{k}={v}" for k, v in merged.items()],
                   "Labels": dict(spec["labels"])},
        "HostConfig": {"Binds": list(spec["volumes"]),
                       "Devices": [{"PathOnHost": d.split(":")[0], "PathInContainer": d.split(":")[1],
                                    "CgroupPermissions": "rwm"} for d in spec["devices"]],
                       "ShmSize": spec["shm_size_bytes"] or pd_launch.DOCKER_SHM_DEFAULT,
                       "NetworkMode": spec["network_mode"], "Privileged": spec["privileged"],
                       "RestartPolicy": {"Name": spec["restart_policy"], "MaximumRetryCount": 0}},
        "State": {"Status": status, "Running": status == "running", "ExitCode": 0 if status == "running" else 2},
    }


def test_the_module_redaction_is_the_plans():
    assert pd_launch.redaction(KEY) == secrets.redaction(KEY)
    assert pd_launch.DIGEST_LABEL == secrets.DIGEST_LABEL


def test_a_container_started_from_its_spec_reads_the_same():
    spec = _spec()
    assert pd_launch.running_view(started_from(spec), IMAGE_ENV, spec) == pd_launch.spec_view(spec)
    assert pd_launch.container_diff(spec["name"], spec, started_from(spec), IMAGE_ENV) is None


def test_a_changed_flag_and_env_show_line_by_line_and_the_key_never():
    spec = _spec()
    old = copy.deepcopy(spec)
    old["command"][old["command"].index("--max-num-seqs") + 1] = "16"
    old["env"]["PD_OLD_ONLY"] = "512"
    old["labels"]["pd.spec-hash"] = "the-old-hash"
    diff = pd_launch.container_diff(spec["name"], spec, started_from(old, key="sk-the-old-key"), IMAGE_ENV)
    before, after = diff["before"].splitlines(), diff["after"].splitlines()
    changed = sorted(set(before) ^ set(after))
    max_seqs = spec["command"][spec["command"].index("--max-num-seqs") + 1]
    assert "  - 16" in before and f"  - {max_seqs}" in after
    assert "  PD_OLD_ONLY: 512" in before and not any(line.startswith("  PD_OLD_ONLY") for line in after)
    assert "spec_hash: the-old-hash" in before
    # the key: both sides as the plan's redaction, and the change of key shows as a changed digest
    assert f"  VLLM_API_KEY: {secrets.redaction('sk-the-old-key')}" in before
    assert f"  VLLM_API_KEY: {secrets.redaction(KEY)}" in after
    assert KEY not in diff["before"] + diff["after"] and "sk-the-old-key" not in diff["before"] + diff["after"]
    # the image's own variables (PATH) are not the spec's and are not shown
    assert not any("PATH" in line for line in changed)
    assert diff["before_header"] == f"{spec['name']} on a-d0: what runs now"
    assert diff["after_header"] == f"{spec['name']} on a-d0: its launch spec"


def test_an_absent_a_stopped_and_a_removed_container():
    spec = _spec()
    absent = pd_launch.container_diff(spec["name"], spec, None)
    assert absent["before"] == "" and "no container" in absent["before_header"] and "image: " in absent["after"]
    stopped = pd_launch.container_diff(spec["name"], spec, started_from(spec, status="exited"), IMAGE_ENV)
    assert ["state: exited (exit code 2)"] == [line for line in stopped["before"].splitlines()
                                              if line not in stopped["after"].splitlines()]
    removed = pd_launch.container_diff("pd-cluster_a-decode1-dp0", None, started_from(spec), IMAGE_ENV)
    assert removed["after"] == "" and "removed" in removed["after_header"]


def test_a_proxy_without_shm_size_reads_unset_on_both_sides():
    plan = fleet.plan_fleet(example_fleet())
    proxy = plan["clusters"]["cluster_a"]["proxy"]
    assert proxy["shm_size_bytes"] is None
    assert pd_launch.container_diff(proxy["name"], proxy, started_from(proxy), IMAGE_ENV) is None


def test_the_probe_diffs_only_containers_a_deploy_would_change(monkeypatch):
    spec = _spec()
    same = copy.deepcopy(spec)
    same["name"] = spec["name"].replace("dp0", "dp1")
    old = copy.deepcopy(spec)
    old["command"].append("--enforce-eager")
    old["labels"]["pd.spec-hash"] = "old"
    dropped = copy.deepcopy(spec)
    dropped["name"] = "pd-cluster_a-decode9-dp0"
    inspects = {spec["name"]: started_from(old), same["name"]: started_from(same), dropped["name"]: started_from(dropped)}
    asked = []

    def docker(sock, method, path):
        asked.append(path)
        if path.startswith("/images/"):
            return 200, {"Config": {"Env": IMAGE_ENV}}, None
        name = path.split("/")[2]
        return (200, inspects[name], None) if name in inspects else (404, {"message": "no such container"}, None)

    monkeypatch.setattr(probe_mod, "docker", docker)
    containers = [{"name": spec["name"], "running": True, "hash": "old", "cluster": "cluster_a", "host": "a-d0"},
                  {"name": same["name"], "running": True, "hash": same["labels"]["pd.spec-hash"], "cluster": "cluster_a",
                   "host": "a-d0"},
                  {"name": dropped["name"], "running": True, "hash": "x", "cluster": "cluster_a", "host": "a-d0"},
                  {"name": spec["name"] + "-previous", "running": False, "hash": "y", "cluster": "cluster_a",
                   "host": "a-d0"}]
    diffs = probe_mod.spec_diffs("/none.sock", [spec, same], containers)
    assert [d["before_header"].split(" ")[0] for d in diffs] == [spec["name"], dropped["name"]]
    assert "  - --enforce-eager" in diffs[0]["before"] and "--enforce-eager" not in diffs[0]["after"]
    # the container running its spec is not even read; the image env is read once for all
    assert f"/containers/{same['name']}/json" not in asked
    assert sum(p.startswith("/images/") for p in asked) == 1
