"""issue 12 #3 "secrets": the cluster's API key (pd_api_key) reaches the engines (VLLM_API_KEY), the
proxy (OPENAI_API_KEY) and the playbooks' /v1 requests (Authorization: Bearer), and never the plan.

Before this change a key could only go through ``extra_args`` / ``env`` and was then written in clear
to build/plan.json and every render file; those routes are now refused.
"""

import argparse
import copy
import hashlib
import hmac
import json
import os
import threading
from http.server import ThreadingHTTPServer

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet, launch
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError
from ansible_collections.pd.deploy.plugins.plugin_utils.validate import secrets
from tests.unit.plugins.filter.test_filters_registration import PLUGIN
from tests.unit.plugins.plugin_utils.plan.test_fleet import cluster_a, example_fleet, member
from tests.fixtures.ops_inputs import _Pages

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
KEY = "sk-pd-test-9f8e7d6c5b4a39281706f5e4d3c2b1a0"
OTHER = "sk-pd-test-00000000000000000000000000000001"


def keyed_fleet(key_a=KEY, key_b=None):
    """The example fleet with pd_api_key on cluster_a's hosts (group_vars) and optionally cluster_b's."""
    f = example_fleet()
    for host in f["hosts"]:
        key = key_a if host["name"].startswith("a-") else key_b
        if key is not None:
            host["vars"]["pd_api_key"] = key
    return f


def all_specs(plan, cluster):
    out = [s for h in plan["hosts"].values() for s in h["specs"] if s["cluster"] == cluster]
    return out + [plan["clusters"][cluster]["proxy"]]


def expected_redaction(key):
    # the documented digest (docs/guide/inventory.md "Secrets"): HMAC-SHA256 under the label, first 12 hex digits
    mac = hmac.new(b"pd-deploy api key v1", key.encode(), hashlib.sha256).hexdigest()
    return f"<redacted: sha256:{mac[:12]}...>"


# ---- the plan carries a redaction, never the key ---------------------------------------------------

def test_engines_and_proxy_get_the_key_variable_as_a_redaction():
    plan = fleet.plan_fleet(keyed_fleet())
    assert plan["ok"], plan["messages"]
    specs = all_specs(plan, "cluster_a")
    assert len(specs) == 5  # 2 P ranks + 2 D ranks + proxy (example inventory, DP2 each)
    for spec in specs:
        name = "OPENAI_API_KEY" if spec["kind"] == "proxy" else "VLLM_API_KEY"
        assert spec["env"][name] == expected_redaction(KEY)
        assert spec["secret_env"] == [name]
        assert "--api-key" not in spec["command"]  # argv shows in `ps` and docker inspect's Cmd


def test_no_key_anywhere_in_the_plan():
    plan = fleet.plan_fleet(keyed_fleet(key_b=OTHER))
    text = json.dumps(plan)
    assert KEY not in text and OTHER not in text
    assert KEY[8:24] not in text  # not even a fragment


def test_a_cluster_without_a_key_is_unchanged():
    plain = fleet.plan_fleet(example_fleet())
    keyed = fleet.plan_fleet(keyed_fleet())
    assert all_specs(keyed, "cluster_b") == all_specs(plain, "cluster_b")
    for spec in all_specs(plain, "cluster_a"):
        assert "VLLM_API_KEY" not in spec["env"] and "OPENAI_API_KEY" not in spec["env"]
        assert "secret_env" not in spec


def test_the_spec_hash_changes_with_the_key_and_only_with_it():
    def hashes(plan):
        return {s["name"]: s["labels"]["pd.spec-hash"] for s in all_specs(plan, "cluster_a")}

    none, one, again, other = (hashes(fleet.plan_fleet(f)) for f in
                               (example_fleet(), keyed_fleet(), keyed_fleet(), keyed_fleet(OTHER)))
    assert one == again
    for name in one:
        assert len({none[name], one[name], other[name]}) == 3, name
    # the label is the hash of the spec as written (what the container role compares)
    for spec in all_specs(fleet.plan_fleet(keyed_fleet()), "cluster_a"):
        assert spec["labels"]["pd.spec-hash"] == launch.spec_hash(spec)


def test_redaction_is_stable_and_differs_per_key():
    assert secrets.redaction(KEY) == secrets.redaction(KEY) == expected_redaction(KEY)
    assert secrets.redaction(KEY) != secrets.redaction(OTHER)
    assert KEY not in secrets.redaction(KEY)


# ---- what is refused ----------------------------------------------------------------------------

@pytest.mark.parametrize("bad, says", [
    ("", "is empty"),
    ("sk with space", "spaces"),
    ("sk-line\nbreak", "line breaks"),
    ("sk-ключ", "non-ASCII"),
    (12345, "not a string"),
])
def test_unusable_keys_are_refused_without_echoing_them(bad, says):
    plan = fleet.plan_fleet(keyed_fleet(key_a=bad))
    found = [v for v in plan["violations"] if v["field"] == "pd_api_key"]
    assert not plan["ok"] and found
    assert all(says in v["message"] for v in found)
    text = json.dumps(plan)
    if isinstance(bad, str) and bad:
        assert bad not in text


def test_hosts_of_one_cluster_must_share_one_key():
    f = keyed_fleet()
    f["hosts"][1]["vars"]["pd_api_key"] = OTHER  # a-d0: a host_vars override
    plan = fleet.plan_fleet(f)
    found = [v for v in plan["violations"] if v["field"] == "pd_api_key" and v["where"] == "cluster_a"]
    assert not plan["ok"] and len(found) == 1
    assert KEY not in json.dumps(plan) and OTHER not in json.dumps(plan)
    # a host with no key beside one with a key is the same mistake
    f = keyed_fleet()
    del f["hosts"][1]["vars"]["pd_api_key"]
    assert not fleet.plan_fleet(f)["ok"]


@pytest.mark.parametrize("change, field", [
    (lambda a: a["decode"].setdefault("env", {}).update(VLLM_API_KEY=KEY), "decode.env.VLLM_API_KEY"),
    (lambda a: a["prefill"].setdefault("env", {}).update(OPENAI_API_KEY=KEY), "prefill.env.OPENAI_API_KEY"),
    (lambda a: a["prefill"].setdefault("engine", {}).update(extra_args=["--api-key", KEY]), "prefill.engine.extra_args"),
    (lambda a: a["decode"].setdefault("engine", {}).update(extra_args=[f"--api-key={KEY}"]), "decode.engine.extra_args"),
])
def test_a_key_in_env_or_extra_args_is_refused(change, field):
    """The only routes a key had before: they wrote it in clear to plan.json and every render."""
    a = cluster_a()
    change(a)
    plan = fleet.plan_fleet(example_fleet(a=a))
    assert not plan["ok"]
    assert [v for v in plan["violations"] if v["field"] == field and "pd_api_key" in v["fix"]]
    assert all(KEY not in m for m in plan["messages"])


# ---- where the key is injected ------------------------------------------------------------------

def test_secret_env_puts_the_real_key_only_in_the_named_variables():
    spec = next(s for s in all_specs(fleet.plan_fleet(keyed_fleet()), "cluster_a") if s["kind"] == "engine")
    before = copy.deepcopy(spec)
    env = secrets.secret_env(spec, KEY)
    assert env["VLLM_API_KEY"] == KEY
    assert {k: v for k, v in env.items() if k != "VLLM_API_KEY"} == \
        {k: v for k, v in spec["env"].items() if k != "VLLM_API_KEY"}
    assert spec == before  # the plan's copy keeps its redaction


def test_secret_env_refuses_a_missing_or_different_key():
    spec = next(s for s in all_specs(fleet.plan_fleet(keyed_fleet()), "cluster_a") if s["kind"] == "proxy")
    for given in (None, ""):
        with pytest.raises(PdError, match="pd_api_key is not set"):
            secrets.secret_env(spec, given)
    with pytest.raises(PdError) as err:
        secrets.secret_env(spec, OTHER)
    assert OTHER not in str(err.value) and KEY not in str(err.value)


def test_secret_env_without_a_key_is_the_spec_env():
    spec = all_specs(fleet.plan_fleet(example_fleet()), "cluster_a")[0]
    assert secrets.secret_env(spec, None) == spec["env"]
    assert secrets.secret_env(spec, KEY) == spec["env"]  # a key the plan did not ask for is not added


def test_auth_headers():
    assert secrets.auth_headers(KEY) == {"Authorization": f"Bearer {KEY}"}
    assert secrets.auth_headers(None) == secrets.auth_headers("") == {}


# ---- the hostvars adapter ------------------------------------------------------------------------

def test_fleet_input_passes_a_redaction_not_the_key():
    hostvars = {"h1": {"pd_cluster": {"name": "c"}, "pd_api_key": KEY, "group_names": ["c", "prefill"]}}
    got = PLUGIN.fleet_input(hostvars, ["h1"])
    assert KEY not in json.dumps(got)
    assert got["hosts"][0]["vars"]["pd_api_key"]["redaction"] == expected_redaction(KEY)
    assert "pd_api_key" in got["hosts"][0]["keys"]  # a documented variable: not refused as unknown
    # and the planner reads that fact as it reads a raw key
    raw = member("a-p0", "cluster_a", "prefill", cluster_a(), "10.0.0.11", pd_api_key=KEY)
    assert secrets.host_key_fact(raw["vars"]["pd_api_key"]) == \
        secrets.host_key_fact(secrets.host_key_fact(KEY))


# ---- the load generator sends the key ------------------------------------------------------------

class _Guarded(_Pages):
    """test_ops' stand-in proxy answering /v1 with 401 unless the Bearer key matches (vLLM's rule)."""

    def do_POST(self):
        if self.headers.get("Authorization") != f"Bearer {self.server.key}":
            self.server.refused += 1
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_POST()


def _serve():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Guarded)
    httpd.pages, httpd.hits, httpd.lock, httpd.key, httpd.refused = [""], 0, threading.Lock(), KEY, 0
    httpd.shift_for = lambda body: None
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_load_script_sends_the_key_from_its_file(tmp_path):
    from ansible_collections.pd.deploy.roles.pd_ops.files import pd_load as load
    key_file = tmp_path / "api-key"
    httpd = _serve()
    try:
        args = dict(url=f"http://127.0.0.1:{httpd.server_address[1]}/v1/completions", model="m", requests=4,
                    concurrency=2, max_tokens=4, prompt_tokens=16, timeout=10)
        key_file.write_text("")
        without = load.run(argparse.Namespace(api_key_file=str(key_file), **args))
        key_file.write_text(KEY)
        keyed = load.run(argparse.Namespace(api_key_file=str(key_file), **args))
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert (without["ok"], without["failed"]) == (0, 4)
    assert (keyed["ok"], keyed["failed"]) == (4, 0)
    assert httpd.refused == 4
    assert KEY not in json.dumps(keyed)
