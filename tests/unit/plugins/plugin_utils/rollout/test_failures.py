"""Known-failure scan (plugins/plugin_utils/failures.py, plugins/plugin_utils/data/known_failures.yml) and the table of
docs/guide/troubleshoot.md.

Each recorded line below is quoted from where the table's ``source`` says (issue or ref:path:line),
shortened to the part the operator sees; every table entry must be hit by at least one of them.
"""

import re
from pathlib import Path

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.rollout import failures
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError

REPO = Path(__file__).resolve().parents[5]

# (entry id, recorded line, provenance)
RECORDED = [
    ("kv-transfer-params", "WARNING 12-01 08:00:01 [mooncake_connector.py:1904] Got invalid KVTransferParams. params={}. ",
     "vllm-ascend main:vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py:1904 format string"),
    ("device-ip-not-set", "[RanktablCheck] 'device ip' is not set correctly, must be set when multi Server or "
     "HCCL INTRA ROCE ENABLE enabled", "vllm-ascend issue 7711 (D node plog)"),
    ("address-in-use", "zmq.error.ZMQError: Address already in use (addr='tcp://10.0.0.1:30000')",
     "vllm-ascend main:docs/source/tutorials/features/pd_disaggregation_mooncake_multi_node.md:230"),
    ("hccl-port-listen", "[ERROR] HCCL(60570,):2025-12-04-14:46:07.911.312 [hccl_socket.cc:106] [60570][HcclSocket]"
     "[Listen] socket type[0], listen on ip[192.2.2.195] and specific port[16666] fail.", "vllm-ascend issue 4725"),
    ("shm-too-small", "RuntimeError: Insufficient space in /dev/shm: 16379 MiB required, 7746 MiB free",
     "vllm issue 52496 wording as reported by users"),
    ("recompute-on-producer", "WARNING 12-01 08:00:02 [platform.py:900] recompute_scheduler_enable is ignored on "
     "PD-disaggregated P nodes (kv_role='kv_producer') and will be deprecated",
     "vllm-ascend main:vllm_ascend/platform.py:899-903"),
    ("hccl-timeout", "RuntimeError: HCCL function error: HcclAllReduce, error code is 9; EI0002: The wait execution "
     "of the Notify register times out. timed out waiting for peer", "pd-deploy pattern (wording varies by CANN)"),
    ("visible-devices", "[ERROR] RUNTIME(42,mindie_llm_backend_connector):2025-11-18-09:33:13.666.323 "
     "[runtime.cc:5632]58 GetVisibleDevices:[INIT][DEFAULT]set ASCEND_RT_VISIBLE_DEVICES:[4] error, input data "
     "rang[0-2)", "gpustack/gpustack issue 3352"),
    ("npu-oom", "RuntimeError: NPU out of memory. Tried to allocate 30.00 MiB (NPU 3; 60.96 GiB total capacity; "
     "60.34 GiB already allocated)", "vllm-ascend issue 1127"),
    ("host-oom", "[12345.678] Out of memory: Killed process 4242 (python3) total-vm:1234kB",
     "Linux mm/oom_kill.c message"),
]

# Lines of a healthy start that must not match anything (vllm-ascend's own info lines).
HEALTHY = [
    "INFO 12-01 08:00:00 [platform.py:743] The timeout interval of the HCCL operator is 1836s. Timeout in seconds "
    "for execute_model RPC calls in multiprocessing must be greater than 1836s, Set "
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=3000",
    "(Worker) Warning: The HCCL execution timeout was set to never timeout, so it is bigger than watchdog timeout",
    "INFO 12-01 08:00:05 [api_server.py] Starting vLLM API server on http://0.0.0.0:8200",
    "INFO: Application startup complete.",
]


def test_table_is_well_formed_and_complete():
    entries = failures.table()
    ids = [e["id"] for e in entries]
    assert sorted(ids) == sorted(i for i, _, _ in RECORDED), "every entry has a recorded line and vice versa"
    assert all(e["severity"] in ("fail", "warn") for e in entries)


@pytest.mark.parametrize("entry_id, line, source", RECORDED, ids=[r[0] for r in RECORDED])
def test_recorded_line_is_found(entry_id, line, source):
    found = failures.scan(f"INFO start\n{line}\nINFO more\n")
    assert [f["id"] for f in found] == [entry_id], source
    assert found[0]["line"] == line.strip()[:300]


def test_healthy_lines_find_nothing():
    assert failures.scan("\n".join(HEALTHY)) == []


def test_scan_logs_splits_fail_and_warn_per_rank_and_counts_repeats():
    recompute = next(line for i, line, _ in RECORDED if i == "recompute-on-producer")
    shm = next(line for i, line, _ in RECORDED if i == "shm-too-small")
    out = failures.scan_logs({"pd-c-prefill0-dp0": f"{recompute}\n{recompute}\n",
                              "pd-c-decode0-dp0": f"{shm}\n", "pd-c-decode0-dp1": "\n".join(HEALTHY)})
    assert len(out["fail"]) == 1 and out["fail"][0].startswith("pd-c-decode0-dp0: shm-too-small: ")
    assert "pd_shm_size" in out["fail"][0]
    assert len(out["warn"]) == 1 and out["warn"][0].startswith("pd-c-prefill0-dp0: recompute-on-producer: ")
    assert "(2 lines)" in out["warn"][0]


@pytest.mark.parametrize("data, field", [
    ({}, "failures"),
    ({"failures": [{"id": "a", "pattern": "x", "severity": "error", "source": "s", "fix": "f"}]}, "severity"),
    ({"failures": [{"id": "a", "pattern": "(", "severity": "fail", "source": "s", "fix": "f"}]}, "pattern"),
    ({"failures": [{"id": "a", "pattern": "x", "severity": "fail", "source": "", "fix": "f"}]}, "source"),
    ({"failures": [{"id": "a", "pattern": "x", "severity": "fail", "source": "s", "fix": "f"}] * 2}, "id"),
])
def test_bad_tables_are_refused(data, field):
    with pytest.raises(PdError, match=field):
        failures.table(data)


def test_bad_input_is_refused():
    with pytest.raises(PdError, match="logs"):
        failures.scan_logs(["x"])
    with pytest.raises(PdError, match="text"):
        failures.scan(42)


def test_guide_table_matches_the_data_file():
    page = (REPO / "docs" / "guide" / "troubleshoot.md").read_text()
    start = page.index("<!-- known-failures:start -->")
    end = page.index("<!-- known-failures:end -->")
    assert page[start:end].split("\n", 1)[1].strip() == failures.markdown_table().strip(), (
        "docs/guide/troubleshoot.md's known-failure table is stale: paste plugin_utils.failures.markdown_table() "
        "between the markers")


def test_every_source_names_a_place():
    for e in failures.table():
        assert re.search(r"issues? \d+|\S+\.(py|md|c)\b", e["source"]), e


class TestProxyAnswer:
    """vllm-ascend issues 12166 / 13140: the example proxy answered 200 with 0 bytes when decode failed."""

    def test_text_is_healthy(self):
        ok = {"status": 200, "json": {"choices": [{"index": 0, "text": " the"}]}, "content": "{...}"}
        assert failures.proxy_answer_problems("c", ok) == []
        chat = {"status": 200, "json": {"choices": [{"message": {"content": "hi"}}]}}
        assert failures.proxy_answer_problems("c", chat) == []

    @pytest.mark.parametrize("result, words", [
        ({"status": 200, "content": ""}, "HTTP 200 with an empty body"),
        ({"status": 200, "json": {}, "content": "{}"}, "without choices"),
        ({"status": 200, "json": {"choices": []}, "content": "{\"choices\": []}"}, "without choices"),
        ({"status": 200, "json": {"choices": [{"text": ""}]}, "content": "x"}, "empty text in every choice"),
        ({"status": 502, "msg": "Status code was 502"}, "HTTP 502 (Status code was 502)"),
        ({"status": -1, "msg": "Connection refused"}, "HTTP -1 (Connection refused)"),
    ])
    def test_failures(self, result, words):
        [msg] = failures.proxy_answer_problems("c proxy on h", result)
        assert msg.startswith("c proxy on h: ") and words in msg

    def test_not_a_result(self):
        with pytest.raises(PdError):
            failures.proxy_answer_problems("c", "200")
