"""NPU network prechecks (plugins/plugin_utils/netchecks.py) and the probe's hccn option, with the fake hccn_tool.

Healthy and broken outputs come from the fake tool (tests/fixtures/ascend/hccn_tool) run through the
probe's own run_hccn, so the parser reads what the probe returns. The fake's layout follows the
upstream recordings quoted in TestRecordedOutput; its ping computes the answer and sends nothing.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.hostcheck import netchecks
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError

REPO = Path(__file__).resolve().parents[5]
TOOL = REPO / "tests" / "fixtures" / "ascend" / "hccn_tool"


from ansible_collections.pd.deploy.plugins.modules import pd_host_probe as probe_mod  # noqa: E402


class FakeModule:
    """What run_hccn needs of AnsibleModule: run_command."""

    def run_command(self, args, handle_exceptions=True):  # noqa: ARG002 (AnsibleModule's signature)
        r = subprocess.run(args, capture_output=True, text=True, timeout=10, check=False)
        return r.returncode, r.stdout, r.stderr


def fake_host(tmp_path, name, npus=8, variant="", conf=None):
    """A host's tool directory (fake tool + its variant file) and hccn.conf in the ascend-root.sh layout."""
    root = tmp_path / name
    tools = root / "tools"
    tools.mkdir(parents=True)
    shutil.copy(TOOL, tools / "hccn_tool")
    (tools / "hccn_tool").chmod(0o755)
    (tools / "hccn_tool.fake.conf").write_text(variant)
    if conf is None:
        conf = "".join(f"address_{i}=198.51.100.{10 + i}\nnetmask_{i}=255.255.255.0\n" for i in range(npus))
    if conf is not False:
        (root / "hccn.conf").write_text(conf)
    return {"tool": str(tools / "hccn_tool"), "conf": str(root / "hccn.conf")}


def probe(spec, npus=range(8), ping=()):
    return probe_mod.run_hccn(FakeModule(), {**spec, "devices": list(npus), "ping": list(ping)})


def specs(*npus):
    return [{"devices": [f"/dev/davinci{n}" for n in npus] + ["/dev/davinci_manager"]}]


class TestRecordedOutput:
    """Lines as published upstream (provenance per test); the parsers must read them."""

    def test_tls_line_of_huawei_hccn_tool_docs(self):
        # Huawei hccn_tool reference "-tls -g" example, also in vllm-ascend multi-node guide's grep switch step
        line = ("dev_id:0, tls switch[1](0:disable, 1:enable), tls preconfigured[1](0:non-preset, 1:preset), "
                "tls alarm time threshold[60]days")
        state = netchecks.device_state({"conf": "", "devices": {"0": {"tls": {"rc": 0, "stdout": line}}}}, 0)
        assert state["tls"] == "1"

    def test_ping_success_and_timeout_wordings(self):
        # MindIE / CANN docs: success is "0.00% packet loss"; "recv time out seq" means not connected
        target = [{"device": 0, "address": "198.51.100.20", "peer": "d0", "peer_device": 0}]
        ok = [{"device": 0, "address": "198.51.100.20", "rc": 0,
               "stdout": "3 packets transmitted, 3 received, 0.00% packet loss"}]
        bad = [{"device": 0, "address": "198.51.100.20", "rc": 0,
                "stdout": "recv time out seq=0\n3 packets transmitted, 0 received, 100.00% packet loss"}]
        assert netchecks.ping_problems("p0", target, ok) == []
        [msg] = netchecks.ping_problems("p0", target, bad)
        assert msg.startswith("p0: npu 0: cannot reach decode d0 npu 0 at 198.51.100.20 (100.00% packet loss)")

    def test_conf_addresses(self):
        text = "address_0=10.20.0.20\nnetmask_0=255.255.255.0\naddress_1 = 10.20.0.21\n# address_2=x\n"
        assert netchecks.conf_addresses(text) == {0: "10.20.0.20", 1: "10.20.0.21"}


class TestHostChecks:
    def test_healthy_host_has_no_problem(self, tmp_path):
        hccn = probe(fake_host(tmp_path, "h"))
        assert netchecks.host_problems("h", hccn, range(8)) == []

    @pytest.mark.parametrize("variant, device, words", [
        ("PD_FAKE_HCCN_LINK_DOWN=3", 3, "link status DOWN"),
        ("PD_FAKE_HCCN_UNHEALTHY=2", 2, "net health status Init"),
        # the fake reports 198.51.100.(110+N) while hccn.conf keeps 198.51.100.(10+N)
        ("PD_FAKE_HCCN_STALE_IP=1", 1, "hccn_tool -ip -g says 198.51.100.111 but /etc/hccn.conf says "
                                       "address_1=198.51.100.11"),
    ])
    def test_one_message_per_broken_npu(self, tmp_path, variant, device, words):
        hccn = probe(fake_host(tmp_path, "h", variant=variant + "\n"))
        [msg] = netchecks.host_problems("h", hccn, range(8))
        assert msg.startswith(f"h: npu {device}: ") and words in msg and " — " in msg

    def test_two_broken_npus_two_messages(self, tmp_path):
        hccn = probe(fake_host(tmp_path, "h", variant='PD_FAKE_HCCN_LINK_DOWN="0 7"\n'))
        msgs = netchecks.host_problems("h", hccn, range(8))
        assert [m.split(":")[1].strip() for m in msgs] == ["npu 0", "npu 7"]

    def test_only_the_ranks_npus_are_judged(self, tmp_path):
        hccn = probe(fake_host(tmp_path, "h", variant="PD_FAKE_HCCN_LINK_DOWN=7\n"), npus=range(4))
        assert netchecks.host_problems("h", hccn, range(4)) == []

    def test_missing_hccn_conf(self, tmp_path):
        hccn = probe(fake_host(tmp_path, "h", conf=False), npus=[0])
        [msg] = netchecks.host_problems("h", hccn, [0])  # one problem: the file, not each NPU's address
        assert msg.startswith("h: /etc/hccn.conf is missing") and "issue 7711" in msg

    def test_conf_without_one_npu(self, tmp_path):
        conf = "".join(f"address_{i}=198.51.100.{10 + i}\n" for i in range(8) if i != 5)
        [msg] = netchecks.host_problems("h", probe(fake_host(tmp_path, "h", conf=conf)), range(8))
        assert msg.startswith("h: npu 5: /etc/hccn.conf has no address_5")

    def test_broken_driver(self, tmp_path):
        hccn = probe(fake_host(tmp_path, "h", variant="PD_FAKE_HCCN_BROKEN=1\n"), npus=[0])
        msgs = netchecks.host_problems("h", hccn, [0])
        assert len(msgs) == 4  # link, net_health, ip, tls: each names the driver error
        assert all("rc 255" in m and "dsmi get device info failed" in m for m in msgs)

    def test_a_transient_no_answer_is_asked_again_before_it_fails_a_precheck(self, tmp_path, monkeypatch):
        """Issue 20: `hccn_tool -i N -link -g gave no answer (rc 0)` failed a precheck on a loaded host."""
        monkeypatch.setattr(probe_mod, "HCCN_RETRY_PAUSE_S", 0.0)
        seen = {}

        class Loaded(FakeModule):
            """The first call of each query answers nothing (rc 0, no output), as a loaded hccn_tool did."""

            def run_command(self, args, handle_exceptions=True):
                key = tuple(args[1:])
                seen[key] = seen.get(key, 0) + 1
                return (0, "", "") if seen[key] == 1 else super().run_command(args, handle_exceptions)

        hccn = probe_mod.run_hccn(Loaded(), {**fake_host(tmp_path, "h"), "devices": [0, 1], "ping": []})
        assert netchecks.host_problems("h", hccn, [0, 1]) == []
        assert all(count == 2 for count in seen.values()) and len(seen) == 8
        assert {r["tries"] for runs in hccn["devices"].values() for r in runs.values()} == {2}

    def test_a_query_that_never_answers_fails_after_its_tries_and_says_how_many(self, tmp_path, monkeypatch):
        monkeypatch.setattr(probe_mod, "HCCN_RETRY_PAUSE_S", 0.0)
        calls = []

        class Silent(FakeModule):
            def run_command(self, args, handle_exceptions=True):
                calls.append(args)
                return (0, "", "") if "-link" in args else super().run_command(args, handle_exceptions)

        hccn = probe_mod.run_hccn(Silent(), {**fake_host(tmp_path, "h"), "devices": [4], "ping": []})
        [msg] = netchecks.host_problems("h", hccn, [4])
        assert msg.startswith("h: npu 4: hccn_tool -i 4 -link -g gave no answer (rc 0, after 3 tries)")
        assert sum("-link" in c for c in calls) == probe_mod.HCCN_TRIES == 3

    def test_ask_again_is_bounded_pauses_between_tries_and_stops_at_an_answer(self):
        pauses, answers = [], iter([{"rc": 0, "stdout": ""}, {"rc": 1, "stdout": "x"}, {"rc": 0, "stdout": "UP"},
                                    {"rc": 0, "stdout": "never asked"}])
        got = probe_mod.ask_again(lambda: next(answers), tries=5, pause=0.25, sleep=pauses.append)
        assert got == {"rc": 0, "stdout": "UP", "tries": 3} and pauses == [0.25, 0.25]
        pauses.clear()
        got = probe_mod.ask_again(lambda: {"rc": 0, "stdout": " "}, tries=3, pause=1, sleep=pauses.append)
        assert got["tries"] == 3 and pauses == [1, 1]  # no pause after the last try
        # a ping that printed its failure is a reading, not asked again
        got = probe_mod.ask_again(lambda: {"rc": 1, "stdout": "", "stderr": "timeout"}, sleep=pauses.append,
                                  done=probe_mod.said_something)
        assert got["tries"] == 1

    def test_missing_tool(self, tmp_path):
        hccn = probe_mod.run_hccn(FakeModule(), {"tool": str(tmp_path / "nope"), "devices": [0]})
        [msg] = netchecks.host_problems("h", hccn, [0])
        assert msg.startswith("h: hccn_tool could not run") and "pd_prechecks_hccn: false" in msg

    def test_a_settled_host_reads_only_hccn_conf(self, tmp_path):
        # every rank of the host runs its spec: no hccn_tool call (a broken driver is not even noticed),
        # but the addresses a rolled cluster's prefill hosts ping come from its hccn.conf
        calls = []

        class Counting(FakeModule):
            def run_command(self, args, handle_exceptions=True):
                calls.append(args)
                return super().run_command(args, handle_exceptions)

        spec = {**fake_host(tmp_path, "h", variant="PD_FAKE_HCCN_BROKEN=1\n"), "devices": list(range(8))}
        hccn = probe_mod.run_hccn(Counting(), spec, skip="every container of this host runs its launch spec")
        assert calls == [] and hccn["skipped"] and hccn["devices"] == {}
        assert netchecks.host_problems("h", hccn, range(8)) == []
        assert netchecks.device_state(hccn, 3)["conf_ip"] == "198.51.100.13"
        # asked to ping, it pings whatever the host runs
        pinged = probe_mod.run_hccn(Counting(), {**spec, "ping": [{"device": 0, "address": "198.51.100.99"}]},
                                    skip="every container of this host runs its launch spec")
        assert "skipped" not in pinged and calls

    def test_starting_names_the_specs_a_run_would_start(self):
        specs_ = [{"name": "a", "hash": "h1"}, {"name": "b", "hash": "h2"}, {"name": "c", "hash": "h3"}]
        containers = [{"name": "a", "hash": "h1", "running": True}, {"name": "b", "hash": "old", "running": True},
                      {"name": "c", "hash": "h3", "running": False}]
        assert probe_mod.starting(specs_, containers) == ["b", "c"]
        assert probe_mod.starting(specs_[:1], containers) == []

    def test_not_asked(self):
        assert probe_mod.run_hccn(FakeModule(), {}) is None
        assert netchecks.host_problems("h", None, [0]) == []
        with pytest.raises(PdError):
            netchecks.host_problems("h", "text", [0])


def plan_2p_2d():
    return {"hosts": {
        "p0": {"cluster": "c", "role": "prefill", "specs": specs(0, 1, 2, 3)},
        "d0": {"cluster": "c", "role": "decode", "specs": specs(0, 1)},
        "d1": {"cluster": "c", "role": "decode", "specs": specs(4, 5, 6, 7)},
        "idle": {"cluster": "c", "role": "decode", "specs": []},
        "x0": {"cluster": "other", "role": "decode", "specs": specs(0)},
    }}


def probe_host(tmp_path, plan, host, variant=""):
    """Probe only the NPUs the host's ranks use, as the role does."""
    return {"hccn": probe(fake_host(tmp_path, host, variant=variant),
                          npus=netchecks.devices(plan["hosts"][host]["specs"]))}


class TestCluster:
    def test_tls_differs_on_one_host(self, tmp_path):
        plan = plan_2p_2d()
        probes = {h: probe_host(tmp_path, plan, h, 'PD_FAKE_HCCN_TLS_ON="4 5"\n' if h == "d1" else "")
                  for h in ("p0", "d0", "d1", "x0")}
        msgs = netchecks.cluster_problems(plan, probes)
        # 6 NPUs of cluster c report 0, d1's npu 4 and 5 report 1: two messages, x0's cluster is separate
        assert [m.split(": ")[:2] for m in msgs] == [["d1", "npu 4"], ["d1", "npu 5"]]
        assert "TLS switch 1 but 0 on the other NPUs of cluster c" in msgs[0]

    def test_same_tls_everywhere_is_fine_even_when_enabled(self, tmp_path):
        variant = 'PD_FAKE_HCCN_TLS_ON="0 1 2 3 4 5 6 7"\n'
        plan = plan_2p_2d()
        probes = {h: probe_host(tmp_path, plan, h, variant) for h in ("p0", "d0", "d1")}
        assert netchecks.tls_problems(plan, probes) == []

    def test_ping_targets_pair_prefill_npus_with_each_decode_host(self, tmp_path):
        plan = plan_2p_2d()
        probes = {h: probe_host(tmp_path, plan, h) for h in ("p0", "d0", "d1")}
        targets = netchecks.ping_targets(plan, probes)
        assert list(targets) == ["p0"]
        # p0's NPUs 0..3 -> d0's [0, 1] cycled, then d1's [4, 5, 6, 7]; addresses 198.51.100.(10+N) from hccn.conf
        assert [(t["device"], t["peer"], t["peer_device"], t["address"]) for t in targets["p0"]] == [
            (0, "d0", 0, "198.51.100.10"), (1, "d0", 1, "198.51.100.11"),
            (2, "d0", 0, "198.51.100.10"), (3, "d0", 1, "198.51.100.11"),
            (0, "d1", 4, "198.51.100.14"), (1, "d1", 5, "198.51.100.15"),
            (2, "d1", 6, "198.51.100.16"), (3, "d1", 7, "198.51.100.17")]

    def test_unreachable_decode_npu_is_named_from_the_prefill_side(self, tmp_path):
        plan = plan_2p_2d()
        probes = {h: probe_host(tmp_path, plan, h) for h in ("d0", "d1")}
        targets = netchecks.ping_targets(plan, probes)["p0"]
        p0 = fake_host(tmp_path, "p0", variant="PD_FAKE_HCCN_UNREACHABLE=198.51.100.15\n")
        ran = probe(p0, npus=[], ping=netchecks.ping_request(targets))["ping"]
        assert len(ran) == len(targets)
        [msg] = netchecks.ping_problems("p0", targets, ran)
        assert msg.startswith("p0: npu 1: cannot reach decode d1 npu 5 at 198.51.100.15 (100.00% packet loss)")

    def test_ping_not_run_is_a_problem(self):
        target = [{"device": 2, "address": "198.51.100.20", "peer": "d0", "peer_device": 0}]
        [msg] = netchecks.ping_problems("p0", target, [])
        assert "(not run)" in msg

    def test_devices_from_specs(self):
        assert netchecks.devices(specs(3, 1) + specs(1, 10)) == [1, 3, 10]
