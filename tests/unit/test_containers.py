"""pd_deploy.containers: what the container role decides from Docker's and the host's answers."""

import pytest

from pd_deploy import containers
from pd_deploy.errors import PdError


def spec(name, spec_hash="h-" + "0" * 8, http=8200, dp_rank=0, kv=(30100, 30108), dp_rpc=13399, **extra):
    out = {"name": name, "kind": "engine", "dp_rank": dp_rank, "health_url": f"http://127.0.0.1:{http}/health",
           "health_timeout_s": 1800, "ports": {"http": http, "kv": list(kv), "dp_rpc": dp_rpc},
           "labels": {"pd.spec-hash": spec_hash, "pd.managed-by": "pd-deploy"}}
    out.update(extra)
    return out


def info(exists, spec_hash=None):
    """One result of a docker_container_info loop (the parts the role reads)."""
    if not exists:
        return {"exists": False, "container": None}
    return {"exists": True, "container": {"Name": "/x", "Config": {"Labels": {"pd.spec-hash": spec_hash}}}}


# ---- containers_to_replace ----------------------------------------------------------------------

def test_only_existing_containers_with_a_different_hash_are_replaced():
    specs = [spec("missing", "aaa"), spec("same", "bbb"), spec("changed", "ccc")]
    results = [info(False), info(True, "bbb"), info(True, "old-ccc")]
    assert containers.containers_to_replace(specs, results) == ["changed"]


def test_existing_container_without_our_label_is_replaced():
    # a container of that name started by hand (no pd.spec-hash) must not be kept as if current
    results = [{"exists": True, "container": {"Config": {"Labels": None}}}]
    assert containers.containers_to_replace([spec("x", "aaa")], results) == ["x"]


def test_nothing_replaced_when_everything_matches():
    specs = [spec(f"r{i}", f"h{i}") for i in range(3)]
    assert containers.containers_to_replace(specs, [info(True, f"h{i}") for i in range(3)]) == []


@pytest.mark.parametrize("results", [[], [info(False), info(False)], None])
def test_results_must_pair_with_specs(results):
    with pytest.raises(PdError) as err:
        containers.containers_to_replace([spec("a")], results)
    assert err.value.where == "pd_containers_to_replace"


# ---- unhealthy_specs ----------------------------------------------------------------------------

def test_unhealthy_specs_are_those_without_a_200():
    a, b, c, d = spec("a"), spec("b"), spec("c"), spec("d")
    register = {"results": [
        {"item": a, "status": 200},
        {"item": b, "status": 503},
        {"item": c, "status": -1, "msg": "Connection refused"},
        {"item": d, "skipped": True},
    ]}
    assert containers.unhealthy_specs(register) == [b, c]


@pytest.mark.parametrize("register", [None, {}, {"results": []}, {"skipped": True}])
def test_no_started_containers_means_none_unhealthy(register):
    assert containers.unhealthy_specs(register) == []


# ---- rollback_message ---------------------------------------------------------------------------

def test_rollback_message_names_host_containers_state_logs_and_fix():
    bad_new = spec("pd-c-decode0-dp0", http=8200)
    bad_first = spec("pd-c-decode0-dp1", http=8201)
    body = "line one\nRuntimeError: NPU out of memory\n".encode()
    framed = bytes([1, 0, 0, 0]) + len(body).to_bytes(4, "big") + body
    # {name: text} as pd_docker_logs returns it; the second container's log could not be read
    logs = {"pd-c-decode0-dp0": framed.decode("utf-8", "surrogateescape")}
    text = containers.rollback_message([bad_new, bad_first], logs, ["pd-c-decode0-dp0"], "a-d0")
    first, *rest = text.splitlines()
    assert first.startswith("a-d0: 2 container(s) never answered")
    assert "pd-c-decode0-dp0 (http://127.0.0.1:8200/health, waited 1800 s): previous container restored" in text
    assert "pd-c-decode0-dp1 (http://127.0.0.1:8201/health, waited 1800 s): no previous container existed" in text
    # the log tail is quoted without Docker's stream framing bytes
    assert "RuntimeError: NPU out of memory" in text
    assert "\x00" not in text and "\x01" not in text
    assert "pd_render_only=true" in rest[-1] and "collect-logs.yml" in rest[-1]


def test_docker_logs_reads_slurped_bodies_by_container_name():
    import base64
    body = "x" * 200 + " é\n"  # 204 bytes: a size byte >= 0x80, not valid UTF-8 on its own
    framed = bytes([2, 0, 0, 0]) + len(body.encode()).to_bytes(4, "big") + body.encode()
    slurped = [{"item": {"item": spec("r"), "status": 200}, "content": base64.b64encode(framed).decode()},
               {"item": {"item": spec("s"), "status": 404}}]
    assert containers.docker_logs(slurped) == {"r": body}


def test_rollback_message_quotes_only_the_last_log_lines():
    bad = spec("r")
    log = "\n".join(f"log line {i}" for i in range(100))
    text = containers.rollback_message([bad], {"r": log}, [], "h")
    assert "log line 99" in text and "log line 85" in text
    assert "log line 84\n" not in text + "\n"


# ---- listening_ports ----------------------------------------------------------------------------

# `ss -Hltn` on an Ascend host (iproute2 6.x): state, recv-q, send-q, local address:port, peer
SS_OUTPUT = """\
LISTEN 0      4096         0.0.0.0:22         0.0.0.0:*
LISTEN 0      4096   127.0.0.53%lo:53         0.0.0.0:*
LISTEN 0      128        127.0.0.1:8200       0.0.0.0:*
LISTEN 0      511                *:30104            *:*
LISTEN 0      4096            [::]:22            [::]:*
LISTEN 0      128    [::ffff:10.0.0.12]:13399      *:*
LISTEN 0      100            [::1]:25            [::]:*
"""


def test_listening_ports_from_real_ss_output():
    assert containers.listening_ports(SS_OUTPUT) == [22, 25, 53, 8200, 13399, 30104]


@pytest.mark.parametrize("text", ["", None, "garbage\n", "State Recv-Q Send-Q Local Address:Port Peer Address:Port\n"])
def test_listening_ports_of_nothing(text):
    assert containers.listening_ports(text) == []


# ---- port_conflicts -----------------------------------------------------------------------------

def test_spec_ports_cover_http_dp_rpc_on_rank_0_and_the_kv_range():
    rank0 = containers.spec_ports(spec("r0", http=8200, dp_rank=0, kv=(30100, 30108), dp_rpc=13399))
    assert 8200 in rank0 and 13399 in rank0 and 30100 in rank0 and 30107 in rank0
    rank1 = containers.spec_ports(spec("r1", http=8201, dp_rank=1, kv=(30100, 30108), dp_rpc=13399))
    assert 13399 not in rank1  # only the DP master binds the RPC port
    proxy = containers.spec_ports({"name": "p", "ports": {"http": 8000}})
    assert proxy == [8000]


def test_port_conflicts_names_busy_ports_and_the_container():
    specs = [spec("pd-c-decode0-dp0", http=8200, dp_rank=0), spec("pd-c-decode0-dp1", http=8201, dp_rank=1)]
    msgs = containers.port_conflicts(specs, containers.listening_ports(SS_OUTPUT), [])
    # 8200, 13399 and 30104 (in the kv range) belong to dp0; dp1 only shares the kv range
    assert msgs[0].startswith("ports 8200, 13399, 30104 needed by pd-c-decode0-dp0 are already in use")
    assert msgs[1].startswith("ports 30104 needed by pd-c-decode0-dp1 are already in use")
    assert all("change port_base / kv_port" in m for m in msgs)
    assert len(msgs) == 2


def test_port_conflicts_ignore_our_own_running_containers():
    specs = [spec("pd-c-decode0-dp0", http=8200, dp_rank=0), spec("pd-c-decode0-dp1", http=8201, dp_rank=1)]
    in_use = containers.listening_ports(SS_OUTPUT)
    assert containers.port_conflicts(specs, in_use, ["pd-c-decode0-dp0", "pd-c-decode0-dp1"]) == []
    # only the not-yet-running one is judged
    msgs = containers.port_conflicts(specs, in_use, ["pd-c-decode0-dp0"])
    assert len(msgs) == 1 and "pd-c-decode0-dp1" in msgs[0]


def test_free_ports_give_no_conflict():
    specs = [spec("a", http=9100, kv=(31000, 31008), dp_rpc=14000)]
    assert containers.port_conflicts(specs, containers.listening_ports(SS_OUTPUT), []) == []


def test_clean_log_strips_control_bytes_but_keeps_lines():
    assert containers.clean_log("\x02\x00\x00\x00\x00\x00\x00\x05hello\nworld\t!") == "hello\nworld\t!"
    assert containers.clean_log(None) == ""


def test_rollback_message_says_when_the_restored_container_is_not_healthy_either():
    bad = spec("pd-c-decode0-dp0", http=8200)
    healthy = containers.rollback_message([bad], {}, ["pd-c-decode0-dp0"], "h")
    sick = containers.rollback_message([bad], {}, ["pd-c-decode0-dp0"], "h", ["pd-c-decode0-dp0"])
    assert "previous container restored and healthy" in healthy
    assert "does not answer its health URL either" in sick and "restored and healthy" not in sick
