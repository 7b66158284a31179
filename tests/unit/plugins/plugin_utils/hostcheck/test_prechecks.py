"""plugin_utils.prechecks.problems: one message per failing fact, each starting with the host name.

The launch specs are the real ones of the article's decode host (two DP ranks of TP4, 200GiB of
Recompute offload = 100GiB pinned per container), so the facts are judged against what would run.
"""

import base64
import copy

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.hostcheck import prechecks
from ansible_collections.pd.deploy.plugins.plugin_utils.plan import launch, model

GIB = 1024 ** 3
KIB = 1024
MODEL_PATH = "/data/models/DeepSeek-V4-Flash"
HOST = "a-d0"
RESERVE = 128 * GIB


def decode_specs():
    raw = {"name": "cluster_a", "vllm_ascend_version": "0.25.1", "image": "quay.io/ascend/vllm-ascend:v0.25.1",
           "model": {"path": MODEL_PATH},
           "decode": {"offload_connector": "RecomputeCPUOffloadConnector", "cpu_offload": "200GiB",
                      "recompute_scheduler": True}}
    cluster = model.normalize("cluster_a", raw)
    facts = {"pd_host_ram": "1TiB", "pd_hccl_if": "enp189s0f0"}
    hosts = [model.host_record("a-p0", "prefill", dict(facts, pd_host_address="10.0.0.11")),
             model.host_record(HOST, "decode", dict(facts, pd_host_address="10.0.0.12"))]
    topo, _ = model.topology(cluster, hosts)
    return [launch.rank_spec(cluster, inst, rank, topo["hosts"][rank["host"]])
            for inst in topo["instances"] for rank in inst["ranks"] if rank["host"] == HOST]


SPECS = decode_specs()
PINNED = sum(s["pinned_offload_bytes"] for s in SPECS)   # 2 x 100GiB

NPU_SMI = """\
\tTotal Count                    : 8

\tNPU ID                         : 0
\tChip Count                     : 1
"""


def meminfo(total_bytes):
    return f"MemTotal:       {total_bytes // KIB} kB\nMemFree:        1000 kB\n"


def good_facts():
    """What pd_host_probe reports on a healthy decode host, with the role's other inputs."""
    stats = {}
    for path in prechecks.required_paths(SPECS):
        stats[path] = {"exists": True, "isdir": False, "ischr": path.startswith("/dev/")}
    stats[MODEL_PATH] = {"exists": True, "isdir": True, "ischr": False}
    probe = {
        "changed": False,
        "stats": stats,
        "npu_smi": {"rc": 0, "stdout": NPU_SMI, "stderr": ""},
        "meminfo": meminfo(512 * GIB),
        "listening_ports": [22],
        "disk_free_bytes": 3650000000 * KIB,
        "docker": {"ok": True, "msg": ""},
        "containers": [],
        "images_missing": [],
        "health": [],
    }
    return {
        "host": HOST, "specs": copy.deepcopy(SPECS), "model_path": MODEL_PATH, "npus_needed": 8,
        "ram_reserve_bytes": RESERVE, "min_free_disk_bytes": 10 * GIB, "probe": probe, "checks": True,
    }


def test_a_good_host_has_no_problem():
    assert prechecks.problems(good_facts()) == []


def test_required_paths_cover_the_ranks_devices_and_driver_mounts():
    paths = prechecks.required_paths(SPECS)
    for n in range(8):
        assert f"/dev/davinci{n}" in paths
    for path in ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc", "/usr/local/dcmi",
                 "/usr/local/bin/npu-smi", "/etc/hccn.conf", MODEL_PATH):
        assert path in paths
    assert len(paths) == len(set(paths))


def _set(key, value):
    def change(facts):
        facts["probe"][key] = value
    return change


def _stat(path, **st):
    def change(facts):
        facts["probe"]["stats"][path] = st
    return change


def _sick(name, **result):
    def change(facts):
        spec = next(s for s in facts["specs"] if s["name"] == name)
        facts["probe"]["containers"].append({"name": name, "state": "running", "running": True,
                                             "hash": spec["labels"]["pd.spec-hash"]})
        facts["probe"]["health"].append({"name": name, "url": spec["health_url"], "ok": False, **result})
    return change


CASES = [
    ("docker down", _set("docker", {"ok": False, "msg": "cannot reach the Docker engine"}),
     ["Docker engine not reachable (cannot reach the Docker engine)", "systemctl start docker"]),
    ("device node missing", _stat("/dev/davinci5", exists=False),
     ["device node /dev/davinci5 is missing", "install the Ascend driver"]),
    ("device not a char device", _stat("/dev/davinci_manager", exists=True, ischr=False),
     ["/dev/davinci_manager exists but is not a character device"]),
    ("driver file missing", _stat("/usr/local/Ascend/driver/lib64", exists=False),
     ["driver path /usr/local/Ascend/driver/lib64 is missing"]),
    ("npu-smi fails", _set("npu_smi", {"rc": 127, "stdout": "", "stderr": "[Errno 2] No such file"}),
     ["npu-smi info -l failed ([Errno 2] No such file)"]),
    ("npu-smi count low", _set("npu_smi", {"rc": 0, "stdout": NPU_SMI.replace(": 8", ": 4")}),
     ["npu-smi reports 4 NPUs but this host's ranks use 8", "pd_npus"]),
    ("npu-smi unreadable", _set("npu_smi", {"rc": 0, "stdout": "Error: no device\n"}), ["no 'Total Count'"]),
    ("RAM short", _set("meminfo", meminfo(256 * GIB)),
     ["RAM 256GiB < pinned CPU offload 200GiB + reserve 128GiB", "lower cpu_offload"]),
    ("model dir missing", _stat(MODEL_PATH, exists=False, isdir=False),
     [f"model directory {MODEL_PATH} is missing", "pd_cluster.model.path"]),
    ("disk low", _set("disk_free_bytes", 5 * GIB),
     [f"only 5GiB free on the filesystem of {MODEL_PATH}, need 10GiB"]),
    ("port busy", _set("listening_ports", [22, 8201]),
     ["ports 8201 needed by pd-cluster_a-decode0-dp1 are already in use"]),
    ("image missing", _set("images_missing", ["quay.io/ascend/vllm-ascend:v0.25.1"]),
     ["image quay.io/ascend/vllm-ascend:v0.25.1 is not on this host", "pd_image_pull: missing"]),
    ("running rank does not answer", _sick("pd-cluster_a-decode0-dp0", status=503, error="HTTP 503"),
     ["pd-cluster_a-decode0-dp0 runs its current launch spec but http://127.0.0.1:8200/health does not "
      "answer (HTTP 503)", "nothing was restarted", "collect_logs.yml"]),
]


@pytest.mark.parametrize("change, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_failing_fact_gives_one_message_starting_with_the_host(change, expected):
    facts = good_facts()
    change(facts)
    found = prechecks.problems(facts)
    assert len(found) == 1, found
    assert found[0].startswith(f"{HOST}: ")
    for text in expected:
        assert text in found[0]
    assert " — " in found[0]  # every message says what to do


def test_every_failing_fact_at_once_gives_every_message():
    facts = good_facts()
    for _, change, _ in CASES:
        change(facts)
    found = prechecks.problems(facts)
    # npu-smi failing hides its count checks: one npu-smi message, the rest one each
    assert len(found) == len(CASES) - 2
    assert all(m.startswith(f"{HOST}: ") for m in found)


def test_ram_is_read_from_base64_meminfo_too():
    text = meminfo(256 * GIB)
    assert prechecks.mem_total_bytes(text) == 256 * GIB
    assert prechecks.mem_total_bytes(base64.b64encode(text.encode()).decode()) == 256 * GIB
    assert prechecks.mem_total_bytes("not base64 and no MemTotal") is None


def test_ram_just_enough_passes():
    facts = good_facts()
    facts["probe"]["meminfo"] = meminfo(PINNED + RESERVE)
    assert prechecks.problems(facts) == []
    facts["probe"]["meminfo"] = meminfo(PINNED + RESERVE - GIB)
    assert len(prechecks.problems(facts)) == 1


def test_busy_port_of_our_own_running_container_is_fine():
    facts = good_facts()
    facts["probe"]["listening_ports"] = [22, 8201]
    facts["probe"]["containers"] = [{"name": "pd-cluster_a-decode0-dp1", "state": "running", "running": True,
                                     "hash": "old"}]
    assert prechecks.problems(facts) == []
    # a stopped container of ours does not hold the port: the listener is something else
    facts["probe"]["containers"][0].update(state="exited", running=False)
    assert len(prechecks.problems(facts)) == 1


def test_skipped_checks_still_judge_docker_and_running_containers():
    facts = good_facts()
    for _, change, _ in CASES:
        change(facts)
    facts["checks"] = False
    found = prechecks.problems(facts)
    assert len(found) == 2
    assert "Docker engine not reachable" in found[0] and "does not answer" in found[1]


def test_a_settled_host_without_npu_smi_readings_has_no_npu_problem():
    # the probe runs no npu-smi where every rank runs its spec (it says why in skipped_checks)
    facts = good_facts()
    facts["probe"].update(npu_smi=None, npu_smi_info=None, skipped_checks="every container of this host runs its launch spec")
    assert prechecks.problems(facts) == []
    # without that reason a missing reading is still the driver's problem
    facts["probe"]["skipped_checks"] = ""
    [found] = prechecks.problems(facts)
    assert "npu-smi info -l failed (no output)" in found


def test_a_healthy_running_rank_is_no_problem():
    facts = good_facts()
    spec = facts["specs"][0]
    facts["probe"]["health"] = [{"name": spec["name"], "url": spec["health_url"], "ok": True, "status": 200}]
    assert prechecks.problems(facts) == []


def test_an_unhealthy_rank_beside_its_kept_previous_is_left_to_the_rollout():
    # an interrupted replacement: the rollout waits for it and restores the previous one if needed
    facts = good_facts()
    spec = facts["specs"][0]
    facts["probe"]["health"] = [{"name": spec["name"], "url": spec["health_url"], "ok": False, "status": 503}]
    assert len(prechecks.problems(facts)) == 1 and "does not answer" in prechecks.problems(facts)[0]
    facts["probe"]["containers"] = [{"name": spec["name"] + "-previous", "state": "exited", "running": False,
                                     "hash": "old"}]
    assert prechecks.problems(facts) == []


@pytest.mark.parametrize("state", ["running", "restarting"])
def test_a_previous_container_that_runs_is_a_problem(state):
    facts = good_facts()
    name = facts["specs"][0]["name"] + "-previous"
    facts["probe"]["containers"] = [{"name": name, "state": state, "running": state == "running", "hash": "old"}]
    found = prechecks.problems(facts)
    assert len(found) == 1
    assert found[0].startswith(f"{facts['host']}: {name} is running: a kept previous container must stay stopped")
    assert f"docker stop {name}" in found[0]


def test_helpers_read_real_command_output():
    assert prechecks.npu_count(NPU_SMI) == 8
    assert prechecks.npu_count("") is None
    assert prechecks.npu_count(None) is None


# ---- chip model and HBM per NPU from `npu-smi info` (issue 10 finding 5) ------------------------
# Tables in the layout of real `npu-smi info` output posted publicly (A2 910B2/910B3:
# vllm-project/vllm-ascend issues 975 and 1903; A3: issues 2035 and 2534; a busy chip printing
# "56152/ 65536" without the space: vllm-project/vllm-omni issue 3597; a 910B4-1 with 65536 MB:
# Project-HAMi/HAMi-WebUI issue 47). Values are ours.

HEAD = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.0                   Version: 24.1.0                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| {chip_hdr:<26}| Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
"""
PROCS = """\
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| 0       0                 | 412345        | python3                  | 51234                   |
+===========================+===============+====================================================+
"""


def a2_table(name="910B3", hbm=65536, npus=8, used="3162 / "):
    rows = []
    for i in range(npus):
        rows += [f"| {i:<6}{name:<20}| OK            | 96.0        36                0    / 0             |",
                 f"| 0                         | 0000:C{i + 1}:00.0  | 0           0    / 0          {used}{hbm:<8}|",
                 "+===========================+===============+====================================================+"]
    return HEAD.format(chip_hdr="Chip") + "\n".join(rows) + "\n" + PROCS


def a3_table(cards=8):
    rows = []
    for card in range(cards):
        for sub in range(2):
            rows += [f"| {card:<6}{'Ascend910':<20}| OK            | {'178.8' if sub == 0 else '-':<12}36                0    / 0             |",
                     f"| {sub:<6}{2 * card + sub:<20}| 0000:9D:00.0  | 0           0    / 0          56152/ 65536         |",
                     "+------------------------------------------------------------------------------------------------+"]
    return HEAD.format(chip_hdr="Chip  Phy-ID") + "\n".join(rows) + "\n" + PROCS


A3_LIST = "\tTotal Count                    : 8\n\n" + "".join(
    f"\tNPU ID                         : {i}\n\tChip Count                     : 2\n\n" for i in range(8))


def test_npu_table_reads_a2_rows_and_skips_the_process_table():
    table = prechecks.npu_table(a2_table("910B2"))
    assert [(r["npu"], r["chip"], r["name"], r["hbm_mb"]) for r in table] == [(i, 0, "910B2", 65536) for i in range(8)]


def test_npu_table_reads_a3_two_chips_per_card_and_busy_usage():
    table = prechecks.npu_table(a3_table())
    assert len(table) == 16
    assert {(r["name"], r["hbm_mb"]) for r in table} == {("Ascend910", 65536)}
    assert [(r["npu"], r["chip"]) for r in table[:3]] == [(0, 0), (0, 1), (1, 0)]


def test_a3_npu_count_is_chips_not_cards():
    """An Atlas 800T A3 lists 8 cards of 2 chips: 16 NPUs (pd_npus 16), not 8."""
    assert prechecks.npu_count(A3_LIST) == 16
    facts = good_facts()
    facts["npus_needed"] = 16
    facts["probe"]["npu_smi"] = {"rc": 0, "stdout": A3_LIST, "stderr": ""}
    assert prechecks.problems(facts) == []


def _with_table(text, chip="910B3", hbm=64 * GIB):
    facts = good_facts()
    facts["probe"]["npu_smi_info"] = {"rc": 0, "stdout": text, "stderr": ""}
    facts["npu_chip"], facts["hbm_per_npu_bytes"] = chip, hbm
    return facts


def test_matching_chip_and_hbm_is_no_problem():
    assert prechecks.problems(_with_table(a2_table())) == []
    assert prechecks.problems(_with_table(a2_table("910B4-1"), chip="910B4-1")) == []
    assert prechecks.problems(_with_table(a2_table(), chip="Ascend910B3")) == []   # prefix tolerated


def test_a_910b4_host_with_32gb_is_named_with_found_value_and_fix():
    found = prechecks.problems(_with_table(a2_table("910B4", 32768)))
    assert len(found) == 2
    chip, hbm = found
    assert chip.startswith(f"{HOST}: npu-smi info reports chip 910B4 but the inventory says pd_npu_chip 910B3")
    assert "set pd_npu_chip: 910B4" in chip
    assert hbm.startswith(f"{HOST}: npu-smi info reports 32768 MB of HBM per NPU (910B4) but pd_hbm_per_npu is 64GiB")
    assert "set pd_hbm_per_npu: 32GiB" in hbm


def test_hbm_is_checked_apart_from_the_chip_name():
    """A 910B4-1 carries 65536 MB (HAMi-WebUI issue 47): the name alone does not give the HBM."""
    found = prechecks.problems(_with_table(a2_table("910B4-1", 65536), chip="910B4-1", hbm=32 * GIB))
    assert len(found) == 1 and "65536 MB of HBM per NPU" in found[0]


def test_an_a3_host_declared_as_a2_is_a_problem():
    found = prechecks.problems(_with_table(a3_table()))
    assert len(found) == 1 and "reports chip Ascend910" in found[0]
    assert prechecks.problems(_with_table(a3_table(), chip="Ascend910")) == []


def test_unreadable_or_failing_npu_smi_info_is_a_problem():
    assert "printed no NPU status rows" in prechecks.problems(_with_table("garbage"))[0]
    facts = _with_table("")
    facts["probe"]["npu_smi_info"] = {"rc": 1, "stdout": "", "stderr": "dcmi module initialize failed"}
    assert "npu-smi info failed (dcmi module initialize failed)" in prechecks.problems(facts)[0]


@pytest.mark.parametrize("probe, head, fix", [
    ({"unreachable": True, "changed": False, "msg": "Failed to connect to the host via ssh:\n  Connection refused"},
     "a-d0: unreachable: Failed to connect to the host via ssh: Connection refused", "bring the host back"),
    ({"failed": True, "msg": "Missing sudo password"}, "a-d0: its probe failed: Missing sudo password", "sudo"),
])
def test_a_probe_that_read_nothing_is_one_problem_naming_why(probe, head, fix):
    """deploy-pd.yml goes on past an unreachable host or a failed probe (pd_prechecks_report_failure): the
    check names that alone, not every fact the probe did not read (Docker, paths, RAM ...)."""
    facts = dict(good_facts(), probe=probe)
    found = prechecks.problems(facts)
    assert len(found) == 1 and found[0].startswith(head + " — ") and fix in found[0], found
    # nothing read is not a problem when the task succeeded
    assert prechecks.problems(dict(good_facts(), probe=dict(good_facts()["probe"], failed=False))) == []
