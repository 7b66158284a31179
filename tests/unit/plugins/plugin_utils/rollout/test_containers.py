"""plugin_utils.containers: what the container role decides from Docker's and the host's answers."""


import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.rollout import containers
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError


def spec(name, spec_hash="h-" + "0" * 8, http=8200, dp_rank=0, kv=(30100, 30108), dp_rpc=13399, **extra):
    out = {"name": name, "kind": "engine", "dp_rank": dp_rank, "health_url": f"http://127.0.0.1:{http}/health",
           "health_timeout_s": 1800, "ports": {"http": http, "kv": list(kv), "dp_rpc": dp_rpc},
           "labels": {"pd.spec-hash": spec_hash, "pd.managed-by": "pd-deploy"}}
    out.update(extra)
    return out


def seen(name, spec_hash, running=True):
    """One container as pd_host_probe lists it."""
    return {"name": name, "state": "running" if running else "exited", "running": running, "hash": spec_hash}


# ---- spec_state / containers_to_start / replacement_plan ------------------------------------------

def test_each_spec_gets_the_state_of_what_runs_under_its_name():
    specs = [spec("missing", "aaa"), spec("same", "bbb"), spec("changed", "ccc"), spec("stopped", "ddd")]
    observed = [seen("same", "bbb"), seen("changed", "old-ccc"), seen("stopped", "ddd", running=False),
                seen("other", "zzz")]
    by_name = {c["name"]: c for c in observed}
    assert [containers.spec_state(s, by_name) for s in specs] == ["absent", "current", "changed", "stopped"]
    # only what does not run its spec is passed to docker_container
    assert [s["name"] for s in containers.containers_to_start(specs, observed)] == ["missing", "changed", "stopped"]
    # only a container with another spec is kept as <name>-previous; a stopped one of the same spec is started
    assert containers.replacement_plan(specs, observed)["preserve"] == ["changed"]


def test_existing_container_without_our_label_is_replaced():
    # a container of that name started by hand (no pd.spec-hash) must not be kept as if current
    assert containers.replacement_plan([spec("x", "aaa")], [seen("x", "")])["preserve"] == ["x"]


def test_nothing_to_start_or_replace_when_everything_runs_its_spec():
    specs = [spec(f"r{i}", f"h{i}") for i in range(3)]
    observed = [seen(f"r{i}", f"h{i}") for i in range(3)]
    assert containers.containers_to_start(specs, observed) == []
    assert containers.replacement_plan(specs, observed)["preserve"] == []


@pytest.mark.parametrize("observed", [None, {"a": 1}, [{"state": "running"}], ["a"]])
def test_observed_containers_must_be_the_probe_list(observed):
    for func, where in ((containers.containers_to_start, "pd_containers_to_start"),
                        (containers.replacement_plan, "pd_replacement_plan")):
        with pytest.raises(PdError) as err:
            func([spec("a")], observed)
        assert err.value.where == where and "pd_host_probe" in err.value.fix


def test_probe_specs_and_health_checks_carry_name_hash_url_and_timeout():
    specs = [spec("a", "h1", http=8200, image="repo/x:tag"),
             {"name": "p", "labels": {"pd.spec-hash": "h2"}, "health_url": None}]
    # the image reference goes along: the probe resolves it (what the tag names now on the host)
    assert containers.probe_specs(specs) == [
        {"name": "a", "hash": "h1", "health_url": "http://127.0.0.1:8200/health", "image": "repo/x:tag"},
        {"name": "p", "hash": "h2", "health_url": "", "image": ""}]
    assert containers.health_checks(specs) == [
        {"name": "a", "url": "http://127.0.0.1:8200/health", "timeout_s": 1800, "container": "a"}]
    # a replaced rank's previous container goes once the rank answers (wait.yml: no task of its own)
    two = [spec("a"), spec("b", http=8201)]
    assert [c.get("retire") for c in containers.health_checks(two, ["b", "x"])] == [None, "b-previous"]


def test_unhealthy_specs_are_those_whose_wait_did_not_end_ok():
    a, b, c, d = spec("a"), spec("b"), spec("c"), spec("d")
    wait = {"results": [
        {"name": "a", "ok": True, "status": 200},
        {"name": "b", "ok": False, "status": 503},
        {"name": "c", "ok": False, "status": 0, "error": "ConnectionRefusedError: [Errno 111]"},
    ], "all_ok": False}
    # d was not waited for (its container ran its spec already): not unhealthy
    bad = containers.unhealthy_specs(wait, [a, b, c, d])
    assert [s["name"] for s in bad] == ["b", "c"]
    # each keeps its spec and says how its wait ended, for the failure message
    assert bad[0] == dict(b, health_wait={"error": None, "waited_s": None, "exited": None})
    assert bad[1]["health_wait"]["error"] == "ConnectionRefusedError: [Errno 111]"


@pytest.mark.parametrize("wait", [None, {}, {"results": []}, {"skipped": True, "results": []},
                                  {"skipped": True, "skip_reason": "Conditional result was False"}])
def test_a_skipped_or_absent_wait_has_no_unhealthy_spec(wait):
    assert containers.unhealthy_specs(wait, [spec("a")]) == []


def test_sick_current_names_only_running_specs_that_failed_their_probe():
    a, b = spec("a", http=8200), spec("b", http=8201)
    probe = {"health": [{"name": "a", "ok": True, "status": 200},
                        {"name": "b", "ok": False, "status": 0, "error": "TimeoutError: timed out"}]}
    msgs = containers.sick_current([a, b], probe)
    assert len(msgs) == 1
    assert msgs[0].startswith("b runs its current launch spec but http://127.0.0.1:8201/health does not answer "
                              "(TimeoutError: timed out)")
    assert containers.sick_current([a, b], {}) == []


# ---- rollback_message ---------------------------------------------------------------------------

def test_rollback_message_names_host_containers_state_logs_and_fix():
    bad_new = dict(spec("pd-c-decode0-dp0", http=8200), health_wait={"error": "HTTP 503", "waited_s": 1801.2})
    bad_first = dict(spec("pd-c-decode0-dp1", http=8201),
                     health_wait={"error": "container exited (exit code 2)", "waited_s": 14.5, "exited": True})
    body = "line one\nRuntimeError: NPU out of memory\n".encode()
    framed = bytes([1, 0, 0, 0]) + len(body).to_bytes(4, "big") + body
    # {name: text} as pd_docker_logs returns it; the second container's log could not be read
    logs = {"pd-c-decode0-dp0": framed.decode("utf-8", "surrogateescape")}
    text = containers.rollback_message([bad_new, bad_first], logs, ["pd-c-decode0-dp0"], "a-d0")
    first, *rest = text.splitlines()
    assert first.startswith("a-d0: 2 container(s) never answered")
    assert ("pd-c-decode0-dp0 (http://127.0.0.1:8200/health, no answer within 1800 s (last: HTTP 503)): "
            "previous container restored") in text
    # a container that exited is not waited for until its timeout
    assert ("pd-c-decode0-dp1 (http://127.0.0.1:8201/health, stopped waiting after 14.5 s: container exited "
            "(exit code 2)): no previous container existed") in text
    # the log tail is quoted without Docker's stream framing bytes
    assert "RuntimeError: NPU out of memory" in text
    assert "\x00" not in text and "\x01" not in text
    assert "pd_render_only=true" in rest[-1] and "collect_logs.yml" in rest[-1]


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


# ports in LISTEN state on an Ascend host (what pd_host_probe reads from /proc/net/tcp{,6})
IN_USE = [22, 25, 53, 8200, 13399, 30104]


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
    msgs = containers.port_conflicts(specs, IN_USE, [])
    # 8200, 13399 and 30104 (in the kv range) belong to dp0; dp1 only shares the kv range
    assert msgs[0].startswith("ports 8200, 13399, 30104 needed by pd-c-decode0-dp0 are already in use")
    assert msgs[1].startswith("ports 30104 needed by pd-c-decode0-dp1 are already in use")
    assert all("change port_base / kv_port" in m for m in msgs)
    assert len(msgs) == 2


def test_port_conflicts_ignore_our_own_running_containers():
    specs = [spec("pd-c-decode0-dp0", http=8200, dp_rank=0), spec("pd-c-decode0-dp1", http=8201, dp_rank=1)]
    in_use = IN_USE
    assert containers.port_conflicts(specs, in_use, ["pd-c-decode0-dp0", "pd-c-decode0-dp1"]) == []
    # only the not-yet-running one is judged
    msgs = containers.port_conflicts(specs, in_use, ["pd-c-decode0-dp0"])
    assert len(msgs) == 1 and "pd-c-decode0-dp1" in msgs[0]


def test_free_ports_give_no_conflict():
    specs = [spec("a", http=9100, kv=(31000, 31008), dp_rpc=14000)]
    assert containers.port_conflicts(specs, IN_USE, []) == []


def test_clean_log_strips_control_bytes_but_keeps_lines():
    assert containers.clean_log("\x02\x00\x00\x00\x00\x00\x00\x05hello\nworld\t!") == "hello\nworld\t!"
    assert containers.clean_log(None) == ""


def test_rollback_message_says_when_the_restored_container_is_not_healthy_either():
    bad = spec("pd-c-decode0-dp0", http=8200)
    healthy = containers.rollback_message([bad], {}, ["pd-c-decode0-dp0"], "h")
    sick = containers.rollback_message([bad], {}, ["pd-c-decode0-dp0"], "h", ["pd-c-decode0-dp0"])
    assert "previous container restored and healthy" in healthy
    assert "does not answer its health URL either" in sick and "restored and healthy" not in sick


# ---- replacement_plan: a replacement an earlier run left half done ---------------------------------

def _plan(specs, observed):
    plan = containers.replacement_plan(specs, observed)
    return {k: ([s["name"] for s in v] if k in ("start", "wait") else v) for k, v in plan.items() if v}


def test_a_fresh_change_keeps_the_running_container_as_previous():
    assert _plan([spec("r", "new")], [seen("r", "old")]) == {
        "start": ["r"], "wait": ["r"], "preserve": ["r"], "previous": ["r"], "created": ["r"]}


def test_killed_after_the_rename_the_previous_is_the_rollback_target():
    # an earlier run renamed r to r-previous and was stopped before starting r
    assert _plan([spec("r", "new")], [seen("r-previous", "old", running=False)]) == {
        "start": ["r"], "wait": ["r"], "previous": ["r"], "interrupted": ["r"], "created": ["r"]}


@pytest.mark.parametrize("state", ["exited", "restarting", "created"])
def test_killed_during_the_health_wait_the_new_container_is_started_afresh(state):
    # r runs the new spec but is not running (it crashed, loops, or was never started): removed first
    observed = [dict(seen("r", "new", running=False), state=state), seen("r-previous", "old", running=False)]
    assert _plan([spec("r", "new")], observed) == {
        "start": ["r"], "wait": ["r"], "remove": ["r"], "previous": ["r"], "interrupted": ["r"], "created": ["r"]}


def test_a_new_container_running_beside_its_previous_is_waited_for_then_finished():
    observed = [seen("r", "new"), seen("r-previous", "old", running=False)]
    # not started again; health-waited, then the previous is removed (or restored if unhealthy)
    assert _plan([spec("r", "new")], observed) == {"wait": ["r"], "previous": ["r"], "finish": ["r"]}
    # and the cluster counts as one to roll
    assert [s["name"] for s in containers.containers_to_start([spec("r", "new")], observed)] == ["r"]


def test_a_stale_previous_beside_a_running_old_container_is_replaced_by_it():
    observed = [seen("r", "old"), seen("r-previous", "older", running=False)]
    assert _plan([spec("r", "new")], observed) == {
        "start": ["r"], "wait": ["r"], "preserve": ["r"], "previous": ["r"], "created": ["r"]}


def test_an_interrupted_run_then_a_new_spec_rolls_back_to_the_last_healthy_container():
    # run 1 kept old as r-previous and started r (spec 1), which crashed; run 2 brings spec 2
    observed = [seen("r", "spec1", running=False), seen("r-previous", "old", running=False)]
    assert _plan([spec("r", "spec2")], observed) == {
        "start": ["r"], "wait": ["r"], "remove": ["r"], "previous": ["r"], "interrupted": ["r"], "created": ["r"]}


def test_a_crash_looping_container_of_the_current_spec_is_not_running():
    observed = [dict(seen("r", "h", running=False), state="restarting")]
    # started as it is (not created: it keeps its filesystem and the command line of its creation)
    assert _plan([spec("r", "h")], observed) == {"start": ["r"], "wait": ["r"]}


def test_created_names_the_started_specs_that_get_a_new_container():
    # what the proxy role reads: a proxy created now carries the plan's backends on its command line;
    # one of the same spec that was stopped is started as it is and must be re-wired
    specs = [spec("missing", "a"), spec("changed", "b"), spec("stopped", "c"), spec("same", "d"),
             spec("crashed", "e")]
    observed = [seen("changed", "old-b"), seen("stopped", "c", running=False), seen("same", "d"),
                seen("crashed", "e", running=False), seen("crashed-previous", "old-e", running=False)]
    plan = containers.replacement_plan(specs, observed)
    assert [s["name"] for s in plan["start"]] == ["missing", "changed", "stopped", "crashed"]
    assert plan["created"] == ["missing", "changed", "crashed"]


def test_running_previous_names_previous_containers_that_run():
    observed = [seen("a-previous", "x"), dict(seen("b-previous", "x", running=False), state="restarting"),
                seen("c-previous", "x", running=False), seen("d", "x")]
    assert containers.running_previous(observed) == ["a-previous", "b-previous"]


# ---- know what runs: image IDs, start labels, moved tags (issue 19 item 4) ---------------------------

OLD, NEW = "sha256:" + "a1" * 32, "sha256:" + "b2" * 32
TAG = "quay.io/ascend/vllm-ascend:nightly-main"
NEW_DIGEST = "quay.io/ascend/vllm-ascend@sha256:" + "c3" * 32


def running_on(name, spec_hash, image_id, running=True, **labels):
    return dict(seen(name, spec_hash, running), image_id=image_id, image_labels=labels)


@pytest.mark.parametrize("ref, pinned", [
    (TAG, False), ("quay.io/ascend/vllm-ascend", False), ("registry:5000/vllm-ascend:v1", False),
    (NEW_DIGEST, True), ("quay.io/ascend/vllm-ascend:nightly-main@sha256:" + "c3" * 32, True), (OLD, True)])
def test_only_a_digest_or_an_image_id_is_pinned(ref, pinned):
    assert containers.pinned_image(ref) is pinned


def test_short_id_is_what_docker_images_shows():
    assert containers.short_id(OLD) == "a1" * 6
    assert containers.short_id("") == ""


def test_repo_digest_is_the_one_of_the_references_repository():
    found = {"id": NEW, "repo_digests": ["mirror.local/vllm-ascend@sha256:" + "d4" * 32, NEW_DIGEST]}
    assert containers.repo_digest(TAG, found) == NEW_DIGEST
    assert containers.repo_digest("registry:5000/other:v1", found) == found["repo_digests"][0]
    assert containers.repo_digest(TAG, {"id": NEW, "repo_digests": []}) == ""  # docker load: none


def test_start_labels_record_the_image_the_tag_names_without_touching_the_hash():
    s = spec("a", "h1", image=TAG)
    images = {TAG: {"id": NEW, "repo_digests": [NEW_DIGEST]}}
    labels = containers.start_labels(s, images, [])
    assert labels == dict(s["labels"], **{"pd.image-id": NEW, "pd.image-digest": NEW_DIGEST})
    assert s["labels"] == {"pd.spec-hash": "h1", "pd.managed-by": "pd-deploy"}  # the spec is not changed
    # an image without a repo digest (built or loaded on the host) gets the ID only
    assert containers.start_labels(s, {TAG: {"id": NEW, "repo_digests": []}}, []) == \
        dict(s["labels"], **{"pd.image-id": NEW})
    # not resolved (pull: always passes none, or the probe did not find it): no image label
    assert containers.start_labels(s, {}, []) == s["labels"]
    assert containers.start_labels(s, None) == s["labels"]


def test_a_stopped_container_of_the_same_spec_keeps_its_labels_so_it_is_started_not_recreated():
    # docker_container compares labels strictly: new image labels would recreate it on the moved tag
    s = spec("a", "h1", image=TAG)
    images = {TAG: {"id": NEW, "repo_digests": [NEW_DIGEST]}}
    stopped = [running_on("a", "h1", OLD, running=False, **{"pd.image-id": OLD})]
    assert containers.start_labels(s, images, stopped) == dict(s["labels"], **{"pd.image-id": OLD})
    # the new container of an interrupted replacement is removed and started afresh: the image read now
    interrupted = stopped + [running_on("a-previous", "h0", OLD, running=False)]
    assert containers.replacement_plan([s], interrupted)["remove"] == ["a"]
    assert containers.start_labels(s, images, interrupted)["pd.image-id"] == NEW
    # one made by an older pd-deploy carries none, and gets none
    assert containers.start_labels(s, images, [running_on("a", "h1", OLD, running=False)]) == s["labels"]
    # a container of another spec is replaced: the new one records the image it starts from
    assert containers.start_labels(s, images, [running_on("a", "h0", OLD)])["pd.image-id"] == NEW


def test_start_labels_refuse_what_is_not_a_launch_spec():
    with pytest.raises(PdError) as err:
        containers.start_labels({"name": "a"}, {})
    assert err.value.where == "pd_start_requests"


def test_a_container_running_its_spec_on_an_older_image_of_its_tag_is_moved():
    specs = [spec("cur", "h1", image=TAG), spec("same", "h2", image=TAG), spec("chg", "h3", image=TAG),
             spec("stop", "h4", image=TAG), spec("pin", "h5", image=NEW_DIGEST), spec("unknown", "h6", image=TAG),
             spec("absent", "h7", image=TAG)]
    observed = [running_on("cur", "h1", OLD, **{"pd.image-digest": "quay.io/ascend/vllm-ascend@sha256:old"}),
                running_on("same", "h2", NEW), running_on("chg", "old", OLD),
                running_on("stop", "h4", OLD, running=False), running_on("pin", "h5", OLD),
                running_on("unknown", "h6", "")]
    images = {TAG: {"id": NEW, "repo_digests": [NEW_DIGEST]}, NEW_DIGEST: {"id": NEW, "repo_digests": [NEW_DIGEST]}}
    assert containers.moved_images(specs, observed, images) == [
        {"name": "cur", "image": TAG, "running": OLD, "now": NEW,
         "running_digest": "quay.io/ascend/vllm-ascend@sha256:old", "digest": NEW_DIGEST}]
    # a tag that names no image on the host now is not a move (the prechecks report the missing image)
    assert containers.moved_images(specs, observed, {}) == []


def test_moved_image_warnings_name_cluster_containers_tag_both_images_and_the_fix():
    move = {"cluster": "ca", "host": "a-d0", "name": "pd-ca-decode0-dp0", "image": TAG, "running": OLD, "now": NEW,
            "running_digest": "", "digest": NEW_DIGEST}
    (one,) = containers.moved_image_warnings([move])
    assert one.startswith("WARNING ca: pd-ca-decode0-dp0 on a-d0 runs image a1a1a1a1a1a1, but its tag "
                          f"{TAG} now names image b2b2b2b2b2b2 on the host")
    assert "Nothing was recreated" in one and f"set pd_cluster.image to {NEW_DIGEST}" in one
    assert f"To stay on the running image, set it to {OLD}." in one  # no digest recorded: its image ID
    # the same move on two hosts is one warning; without a repo digest the image ID pins it
    other = dict(move, host="a-d1", name="pd-ca-decode0-dp1", digest="", running_digest="quay.io/x@sha256:1")
    (both,) = containers.moved_image_warnings([dict(move, digest=""), other])
    assert "pd-ca-decode0-dp0 on a-d0, pd-ca-decode0-dp1 on a-d1 run image" in both and "those hosts" in both
    assert f"set pd_cluster.image to {NEW}:" in both
    assert "set it to quay.io/x@sha256:1" in both
    # another cluster, or another image pair, is its own warning
    assert len(containers.moved_image_warnings([move, dict(move, cluster="cb")])) == 2
    assert containers.moved_image_warnings([]) == []


# ---- previous containers (the Docker steps themselves: tests/unit/plugins/modules/test_container_start.py) ----

def test_the_next_run_sets_policy_no_on_every_previous_container_it_finds():
    """A -previous left with another policy (an older pd-deploy, a hand rename) is fixed by the next run:
    every kept name is in the plan's previous list, which apply.yml updates to policy no."""
    s = spec("r", "new")
    for observed in ([seen("r-previous", "old", running=False)],                       # killed after the rename
                     [seen("r-previous", "old", running=False), seen("r", "new")],     # killed in the wait
                     [seen("r-previous", "old", running=False), seen("r", "new", running=False)],
                     [seen("r-previous", "older", running=False), seen("r", "old")]):  # stale previous
        assert containers.replacement_plan([s], observed)["previous"] == ["r"], observed


def test_a_wiring_that_failed_because_the_proxy_is_down_names_the_proxy_not_the_ranks():
    """Issue 20: with the proxy container killed the message said "Check that the new ranks answer /v1/models"."""
    down = {"wired": False, "error": "ConnectionRefusedError: [Errno 111] Connection refused", "added": {},
            "removed": {}, "restores": {}, "proxy_down": "its container pd-c-proxy: container exited (exit code 137)"}
    text = containers.wiring_message(down, "c-p0", "pd-c-proxy")
    assert text.startswith("c-p0: the proxy pd-c-proxy is down (its container pd-c-proxy: container exited "
                           "(exit code 137))")
    assert "/v1/models" not in text and "not at fault" in text and "docker logs pd-c-proxy on c-p0" in text
    # the proxy answers but does not take a new rank: then the ranks are the question
    slow = {"wired": False, "error": "", "added": {"decode": ["10.0.0.2:8200"]}, "removed": {}, "proxy_down": "",
            "restores": {"decode": {"missing": ["10.0.0.2:8200"]}}}
    text = containers.wiring_message(slow, "c-p0", "pd-c-proxy")
    assert "Check that the new ranks answer /v1/models" in text and 'still missing ["10.0.0.2:8200"]' in text
    assert "bound reached" in text and "is down" not in text


def test_every_step_on_a_previous_container_names_it_in_previous():
    # apply.yml's start task does the steps on previous containers (remove, preserve, the restart policy) and
    # names the half-done ones; it runs when `start` or `previous` is not empty, and every state with such a
    # step must list its rank in previous (a step with nothing to start would be skipped otherwise)
    states = {"absent": None, "current": ("h", True), "changed": ("old", True), "stopped": ("h", False),
              "changed-stopped": ("old", False)}
    for state, now in states.items():
        for kept in (None, True, False):
            observed = [] if now is None else [seen("r", now[0], running=now[1])]
            if kept is not None:
                observed.append(seen("r-previous", "older", running=kept))
            plan = containers.replacement_plan([spec("r", "h")], observed)
            steps = set(plan["remove"] + plan["preserve"] + plan["finish"] + plan["interrupted"])
            assert steps <= set(plan["previous"]), (state, kept, plan)
            # and a first start (nothing under either name) has none
            if now is None and kept is None:
                assert plan["previous"] == [] and [s["name"] for s in plan["start"]] == ["r"]
