"""The pd_container_start module (roles/pd_container/tasks/apply.yml) and the pd_start_requests filter.

The module talks to a fake Docker Engine API on a unix socket in a temporary directory: an in-memory
daemon that keeps containers and images and answers create, start, stop, delete and inspect the way
dockerd does (status codes, the image's labels merged into the container's). What it creates is read
back with module_utils.pd_launch, the reading --check --diff compares with a launch spec, so a field
the module sent wrong shows as a difference from the plan. molecule/default checks the same fields on
containers a real dockerd created (shm, devices, env, labels, argv).
"""

import copy
import json
import threading
import time
import urllib.parse

import pytest

from ansible_collections.pd.deploy.plugins.module_utils import pd_launch
from ansible_collections.pd.deploy.plugins.modules import pd_container_start as mod
from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet
from ansible_collections.pd.deploy.plugins.plugin_utils.rollout import containers
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError
from ansible_collections.pd.deploy.plugins.plugin_utils.validate import secrets
from tests.fixtures.unix_http import QuietHandler, serving
from tests.unit.plugins.plugin_utils.plan.test_fleet import example_fleet

IMAGE_ID = "sha256:" + "e" * 64
IMAGE_LABELS = {"org.opencontainers.image.title": "vllm-ascend", "vendor": "test"}


class Daemon:
    """What the fake dockerd holds: containers by name, images by reference and ID, the calls made."""

    def __init__(self):
        self.containers = {}
        self.images = {}
        self.calls = []
        self.lock = threading.Lock()
        self.create_delay = 0.0
        self.refuse_start = set()
        # (name, RestartPolicy, running) of every container after each call that changed one: the states a
        # run killed between two calls leaves behind
        self.states = []

    def add_container(self, name, labels=None, running=True, policy="always"):
        self.containers[name] = {"Id": name + "-id", "Name": "/" + name, "Image": IMAGE_ID,
                                 "Config": {"Labels": dict(labels or {})},
                                 "HostConfig": {"RestartPolicy": {"Name": policy}},
                                 "State": {"Running": running, "Status": "running" if running else "exited"}}

    def snapshot(self):
        return {n: (c["HostConfig"]["RestartPolicy"]["Name"], c["State"]["Running"]) for n, c in self.containers.items()}

    def add_image(self, ref, image_id=IMAGE_ID, labels=None):
        image = {"Id": image_id, "Config": {"Labels": dict(labels or {})}}
        self.images[ref] = self.images[image_id] = image


class FakeDocker(QuietHandler):
    daemon = None

    def _reply(self, status, body=None):
        raw = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _route(self, method):
        d = FakeDocker.daemon
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
        with d.lock:
            d.calls.append((method, url.path, query, body))
        if parts[0] == "images" and method == "GET":
            image = d.images.get("/".join(parts[1:-1]))
            return self._reply(200, image) if image else self._reply(404, {"message": "No such image"})
        if parts == ["containers", "create"]:
            time.sleep(d.create_delay)
            name = query["name"][0]
            image = d.images.get(body["Image"])
            if image is None:
                return self._reply(404, {"message": f"No such image: {body['Image']}"})
            with d.lock:
                if name in d.containers:
                    return self._reply(409, {"message": f'Conflict. The container name "/{name}" is already in use'})
                labels = dict(image["Config"]["Labels"], **body.get("Labels", {}))
                d.containers[name] = {
                    "Id": name + "-id", "Name": "/" + name, "Image": image["Id"],
                    "Config": {"Image": body["Image"], "Cmd": body.get("Cmd"), "Env": body.get("Env") or [],
                               "Labels": labels},
                    "HostConfig": dict({"ShmSize": pd_launch.DOCKER_SHM_DEFAULT}, **body["HostConfig"]),
                    "State": {"Running": False, "Status": "created"}}
            return self._reply(201, {"Id": name + "-id", "Warnings": []})
        if parts[0] == "containers":
            found = d.containers.get(parts[1])
            if found is None:
                return self._reply(404, {"message": f"No such container: {parts[1]}"})
            if method == "GET":
                return self._reply(200, found)
            return self._change(d, method, parts, query, body, found)
        return self._reply(500, {"message": f"unexpected call {method} {self.path}"})

    def _change(self, d, method, parts, query, body, found):
        with d.lock:
            if method == "DELETE":
                if found["State"]["Running"] and query.get("force") != ["1"]:
                    return self._reply(409, {"message": "You cannot remove a running container"})
                del d.containers[parts[1]]
                reply = (204,)
            elif parts[2] == "start":
                if parts[1] in d.refuse_start:
                    return self._reply(500, {"message": "error gathering device information while adding custom device"})
                if found["State"]["Running"]:
                    return self._reply(304)
                found["State"] = {"Running": True, "Status": "running"}
                reply = (204,)
            elif parts[2] == "stop":
                if not found["State"]["Running"]:
                    return self._reply(304)
                found["State"] = {"Running": False, "Status": "exited"}
                reply = (204,)
            elif parts[2] == "update":
                found["HostConfig"]["RestartPolicy"] = dict(body["RestartPolicy"])
                reply = (200, {"Warnings": []})
            elif parts[2] == "rename":
                new = query["name"][0]
                if new in d.containers:
                    return self._reply(409, {"message": f'Conflict. The container name "/{new}" is already in use'})
                d.containers[new] = dict(d.containers.pop(parts[1]), Name="/" + new)
                reply = (204,)
            else:
                return self._reply(500, {"message": f"unexpected call {method} {self.path}"})
            d.states.append(d.snapshot())
        return self._reply(*reply)

    def do_GET(self):  # noqa: N802 (http.server's name)
        self._route("GET")

    def do_POST(self):  # noqa: N802
        self._route("POST")

    def do_DELETE(self):  # noqa: N802
        self._route("DELETE")


@pytest.fixture
def dockerd(tmp_path):
    FakeDocker.daemon = Daemon()
    with serving(str(tmp_path / "docker.sock"), FakeDocker) as path:
        yield path, FakeDocker.daemon


def specs(host="a-p0"):
    """What a first deploy starts on a prefill host of the example fleet: its engine ranks (devices, binds,
    shm) and its cluster's proxy (none of those)."""
    plan = fleet.plan_fleet(example_fleet())
    entry = plan["hosts"][host]
    return copy.deepcopy(entry["specs"] + ([entry["proxy"]] if entry.get("proxy") else []))


def requests_for(items, images=None, found=None, key=None):
    return containers.start_requests(items, images or {}, {}, found or [], key)


def calls(daemon, method=None):
    return [(m, p) for m, p, _q, _b in daemon.calls if method is None or m == method]


# ---- what is sent: read back the way --check --diff reads a running container -----------------------

def test_a_created_container_reads_back_as_its_launch_spec(dockerd):
    sock, daemon = dockerd
    items = specs()
    assert {s["kind"] for s in items} == {"engine", "proxy"}
    for spec in items:
        daemon.add_image(spec["image"])
    out = mod.start_all(sock, requests_for(items))
    assert [r["action"] for r in out] == ["created"] * len(items)
    for spec in items:
        found = daemon.containers[spec["name"]]
        assert found["State"]["Running"]
        assert pd_launch.container_diff(spec["name"], spec, found, []) is None
        assert found["HostConfig"]["RestartPolicy"] == {"Name": spec["restart_policy"]}
        if spec["devices"]:
            assert {d["CgroupPermissions"] for d in found["HostConfig"]["Devices"]} == {"rwm"}
        # the spec's labels, nothing else (this image has none of its own)
        assert found["Config"]["Labels"] == spec["labels"]


def test_device_and_body_forms():
    assert mod.parse_device("/dev/davinci0") == {"PathOnHost": "/dev/davinci0", "PathInContainer": "/dev/davinci0",
                                                 "CgroupPermissions": "rwm"}
    assert mod.parse_device("/h/d:/dev/d") == {"PathOnHost": "/h/d", "PathInContainer": "/dev/d", "CgroupPermissions": "rwm"}
    assert mod.parse_device("/h/d:/dev/d:r") == {"PathOnHost": "/h/d", "PathInContainer": "/dev/d", "CgroupPermissions": "r"}
    body = mod.create_body({"name": "x", "image": "img", "command": ["a", 1], "env": {"K": 2}, "devices": [],
                            "volumes": [], "shm_size_bytes": None, "network_mode": "host", "privileged": False,
                            "restart_policy": "always", "labels": {"l": 1}})
    # only what the spec sets (container_default_behavior no_defaults): no Devices, Binds or ShmSize keys
    assert body == {"Image": "img", "Cmd": ["a", "1"], "Env": ["K=2"], "Labels": {"l": "1"}, "AttachStdout": True,
                    "AttachStderr": True,
                    "HostConfig": {"NetworkMode": "host", "Privileged": False, "RestartPolicy": {"Name": "always"}}}


# ---- the docker_container rule: the labels decide --------------------------------------------------

def test_same_labels_running_is_left_alone_stopped_is_started_other_labels_is_recreated(dockerd):
    sock, daemon = dockerd
    engine = [s for s in specs() if s["kind"] == "engine"][0]
    daemon.add_image(engine["image"], labels=IMAGE_LABELS)
    (req,) = requests_for([engine])
    assert mod.start_all(sock, [req]) == [{"name": engine["name"], "action": "created"}]
    # image labels are merged by Docker and not counted as a difference
    assert daemon.containers[engine["name"]]["Config"]["Labels"] == dict(IMAGE_LABELS, **req["labels"])
    daemon.calls.clear()
    assert mod.start_all(sock, [req]) == [{"name": engine["name"], "action": "none"}]
    assert calls(daemon, "POST") == []
    daemon.containers[engine["name"]]["State"] = {"Running": False, "Status": "exited"}
    assert mod.start_all(sock, [req]) == [{"name": engine["name"], "action": "started"}]
    assert calls(daemon, "POST") == [("POST", f"/containers/{engine['name']}/start")]
    assert daemon.containers[engine["name"]]["State"]["Running"]
    daemon.calls.clear()
    other = dict(req, labels=dict(req["labels"], **{"pd.spec-hash": "0" * 64}))
    assert mod.start_all(sock, [other]) == [{"name": engine["name"], "action": "recreated"}]
    assert calls(daemon)[-4:] == [("POST", f"/containers/{engine['name']}/stop"), ("DELETE", f"/containers/{engine['name']}"),
                                  ("POST", "/containers/create"), ("POST", f"/containers/{engine['name']}/start")]
    assert daemon.containers[engine["name"]]["Config"]["Labels"]["pd.spec-hash"] == "0" * 64
    # an image label the spec sets itself (pd.image-id) must match too
    assert mod.same_labels({"a": "1", "vendor": "x"}, {"vendor": "x"}, {"a": "1"})
    assert not mod.same_labels({"a": "1", "vendor": "x", "extra": "y"}, {"vendor": "x"}, {"a": "1"})
    assert not mod.same_labels({"a": "1"}, {}, {"a": "1", "pd.image-id": "sha256:1"})


def test_check_mode_says_what_it_would_do_and_changes_nothing(dockerd):
    sock, daemon = dockerd
    items = specs()
    for spec in items:
        daemon.add_image(spec["image"])
    out = mod.start_all(sock, requests_for(items), check_mode=True)
    assert [r["action"] for r in out] == ["created"] * len(items)
    assert daemon.containers == {} and calls(daemon, "POST") == [] and calls(daemon, "DELETE") == []


def test_every_container_is_tried_and_each_refusal_named(dockerd):
    sock, daemon = dockerd
    engine, _other, proxy = sorted(specs(), key=lambda s: s["kind"])
    daemon.add_image(proxy["image"])
    req_engine, req_proxy = requests_for([engine, proxy])
    req_engine = dict(req_engine, image="registry.local/not-here:1")
    daemon.refuse_start.add(proxy["name"])
    out = mod.start_all(sock, [req_engine, req_proxy])
    assert out[0] == {"name": engine["name"], "action": "failed",
                      "error": "Docker refused to create it: Docker API answered HTTP 404: No such image: registry.local/not-here:1"}
    assert out[1]["action"] == "failed" and "Docker refused to start it: Docker API answered HTTP 500: error gathering device" in out[1]["error"]


def test_an_engine_that_cannot_be_reached_is_a_failure_per_container(tmp_path):
    out = mod.start_all(str(tmp_path / "no.sock"), [{"name": "x", "image": "i", "labels": {}}])
    assert out[0]["action"] == "failed" and "cannot reach the Docker engine" in out[0]["error"]


def test_the_containers_start_at_the_same_time(dockerd):
    """Each container in its own thread: three creates that take 1 s each end well under their sum."""
    sock, daemon = dockerd
    items = specs()
    assert len(items) == 3
    for spec in items:
        daemon.add_image(spec["image"])
    daemon.create_delay = 1.0
    start = time.monotonic()
    mod.start_all(sock, requests_for(items))
    took = time.monotonic() - start
    # one after the other takes >= 3 s of sleeps alone; together about 1 s (the sum is the bound: room for 2.9x)
    assert took < 2.9, took
    creates = [c for c in daemon.calls if c[1] == "/containers/create"]
    assert len(creates) == 3


# ---- the steps of a replacement and of a rollback, before the start ---------------------------------

def test_a_replacement_keeps_the_old_container_stopped_pinned_as_previous_then_starts_the_new(dockerd):
    """preserve: a stale <name>-previous removed, the old one stopped, restart policy no, renamed; then the
    new container starts under the name (it was roles/pd_container/tasks/preserve.yml, four tasks)."""
    sock, daemon = dockerd
    engine = [s for s in specs() if s["kind"] == "engine"][0]
    name = engine["name"]
    daemon.add_image(engine["image"])
    daemon.add_container(name, labels={"pd.spec-hash": "old"}, policy="unless-stopped")
    daemon.add_container(name + "-previous", labels={"pd.spec-hash": "older"}, running=False, policy="no")
    steps, failed = mod.prepare_all(sock, {"preserve": [name], "previous": [name]})
    assert failed == [] and steps == [{"name": name, "step": "preserved"}, {"name": name, "step": "pinned"}]
    kept = daemon.containers[name + "-previous"]
    assert kept["Config"]["Labels"] == {"pd.spec-hash": "old"} and not kept["State"]["Running"]
    assert kept["HostConfig"]["RestartPolicy"] == {"Name": "no"} and name not in daemon.containers
    assert mod.start_all(sock, requests_for([engine])) == [{"name": name, "action": "created"}]
    assert daemon.containers[name]["State"]["Running"]


@pytest.mark.parametrize("policy", ["always", "unless-stopped", "on-failure"])
def test_no_kill_point_of_a_replacement_leaves_a_previous_container_that_restarts_by_itself(dockerd, policy):
    """A run SIGKILLed after any Docker call of the replacement: whatever is named <name>-previous is stopped
    with restart policy no (issue 20: a kill right after the rename left it unless-stopped)."""
    sock, daemon = dockerd
    daemon.add_container("r", labels={"pd.spec-hash": "old"}, policy=policy)
    daemon.add_container("r-previous", labels={"pd.spec-hash": "older"}, running=False, policy="no")
    states = [daemon.snapshot()]
    assert mod.prepare_all(sock, {"preserve": ["r"], "previous": ["r"]})[1] == []
    states += daemon.states
    assert len(daemon.states) == 5  # remove the stale one, stop, pin, rename, pin again
    for state in states:
        assert state.get("r-previous", ("no", False)) == ("no", False), states
    assert "r" not in daemon.containers and "r-previous" in daemon.containers


def test_a_rollback_puts_the_previous_container_back_with_its_policy_and_starts_it(dockerd):
    sock, daemon = dockerd
    daemon.add_container("r", labels={"pd.spec-hash": "new"})                       # the new one never answered
    daemon.add_container("r-previous", labels={"pd.spec-hash": "old"}, running=False, policy="no")
    daemon.add_container("q", labels={"pd.spec-hash": "new"})                       # a first start: nothing kept
    steps, failed = mod.prepare_all(sock, {"remove": ["r", "q"], "restore": {"r": "always"}})
    assert failed == [] and [s["step"] for s in steps] == ["removed", "removed", "restored"]
    assert set(daemon.containers) == {"r"}
    back = daemon.containers["r"]
    assert back["Config"]["Labels"] == {"pd.spec-hash": "old"} and back["State"]["Running"]
    assert back["HostConfig"]["RestartPolicy"] == {"Name": "always"}


def test_a_refused_step_is_named_and_ends_the_steps_and_check_mode_changes_nothing(dockerd):
    sock, daemon = dockerd
    daemon.add_container("r", labels={"pd.spec-hash": "new"})
    daemon.add_container("r-previous", labels={"pd.spec-hash": "old"}, running=False, policy="no")
    daemon.add_container("s", labels={"pd.spec-hash": "old"})
    # the rename back cannot happen while "r" exists (nothing removed it): refused, and no pin follows
    steps, failed = mod.prepare_all(sock, {"restore": {"r": "always"}, "previous": ["s"]})
    assert [s["name"] for s in failed] == ["r"] and steps == failed
    assert failed[0]["error"].startswith("cannot rename r-previous back to r: Docker API answered HTTP 409: Conflict.")
    daemon.calls.clear()
    steps, failed = mod.prepare_all(sock, {"remove": ["r"], "preserve": ["s"], "restore": {"r": "always"},
                                           "previous": ["s", "r"]}, check_mode=True)
    assert failed == [] and len(steps) == 5 and daemon.calls == []
    steps, failed = mod.prepare_all(str(sock) + ".gone", {"remove": ["r"]})
    assert "cannot remove r: cannot reach the Docker engine" in failed[0]["error"]


# ---- pd_start_requests --------------------------------------------------------------------------

def test_start_requests_use_the_pulled_digest_the_real_key_and_the_image_labels():
    spec = [s for s in specs() if s["kind"] == "engine"][0]
    key = "sk-the-real-key-1"
    spec["env"]["VLLM_API_KEY"] = secrets.redaction(key)
    spec["secret_env"] = ["VLLM_API_KEY"]
    images = {spec["image"]: {"id": IMAGE_ID, "repo_digests": []}}
    pulled = {spec["image"]: {"id": IMAGE_ID, "repo_digests": [spec["image"].rsplit(":", 1)[0] + "@sha256:" + "f" * 64]}}
    (req,) = containers.start_requests([spec], images, pulled, [], key)
    assert req["image"] == containers.start_image(spec["image"], pulled)
    assert req["image"].endswith("@sha256:" + "f" * 64)
    assert req["env"]["VLLM_API_KEY"] == key
    assert req["labels"] == containers.start_labels(spec, images, [])
    assert req["labels"]["pd.image-id"] == IMAGE_ID
    assert {k: req[k] for k in ("name", "command", "devices", "volumes", "shm_size_bytes", "network_mode", "privileged",
                                "restart_policy")} == {k: spec[k] for k in ("name", "command", "devices", "volumes",
                                                                           "shm_size_bytes", "network_mode", "privileged",
                                                                           "restart_policy")}
    # without the key the plan was made with: refused, the key never echoed
    with pytest.raises(PdError) as err:
        containers.start_requests([spec], images, pulled, [], None)
    assert "pd_api_key" in str(err.value)


def test_start_requests_refuse_what_is_not_a_list_of_specs():
    with pytest.raises(PdError) as err:
        containers.start_requests({"name": "x"}, {})
    assert err.value.where == "pd_start_requests" and "pd_container_plan.start" in str(err.value)
    with pytest.raises(PdError):
        containers.start_requests([{"name": "x"}], {})
    assert containers.start_requests([], {}) == []
