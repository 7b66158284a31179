"""issue 23 item 2: images from a registry. The pull policy and registry login of each host are checked
in the validate stage (plugins/plugin_utils/validate/registry.py), before any host is touched; the plan
carries {policy, registry, login}, never a credential; the rollout starts a container from the digest
pulled (plugins/plugin_utils/rollout/containers.py start_image).

Before this change no pd_image_* variable existed: the validator refused every one of them as unknown.
"""

import json

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet
from ansible_collections.pd.deploy.plugins.plugin_utils.rollout import containers
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError
from ansible_collections.pd.deploy.plugins.plugin_utils.validate import registry
from tests.unit.plugins.filter.test_filters_registration import PLUGIN
from tests.unit.plugins.plugin_utils.plan.test_fleet import cluster_a, example_fleet

PASSWORD = "s3cret-registry-pass-71c0"


def fleet_with(**hv):
    """The example fleet with the same variables on every host of cluster_a (its group_vars)."""
    f = example_fleet()
    for host in f["hosts"]:
        if host["name"].startswith("a-"):
            host["vars"].update(hv)
            host["keys"] = list(host.get("keys") or []) + [k for k in hv if k.startswith("pd_")]
    return f


def problems(plan, level="error"):
    return [v for v in plan["violations"] if v["level"] == level]


def test_default_policy_is_never_and_the_plan_says_so():
    plan = fleet.plan_fleet(example_fleet())
    assert plan["ok"], plan["messages"]
    assert {h["image_pull"]["policy"] for h in plan["hosts"].values()} == {"never"}
    assert registry.pull_hosts(plan) == []


def test_a_policy_per_cluster_selects_only_its_hosts():
    plan = fleet.plan_fleet(fleet_with(pd_image_pull="missing"))
    assert plan["ok"], plan["messages"]
    assert registry.pull_hosts(plan) == ["a-p0", "a-d0"]
    assert plan["hosts"]["a-p0"]["image_pull"] == {"policy": "missing", "registry": "", "login": False}


def test_credentials_reach_the_plan_only_as_a_login_flag():
    password = registry.password_fact(PASSWORD, {"vaulted": True, "template": False, "file": "g.yml"})
    plan = fleet.plan_fleet(fleet_with(pd_image_pull="always", pd_image_registry="https://harbor.example.com:5000/",
                                       pd_image_registry_username="deploy", pd_image_registry_password=password))
    assert plan["ok"], plan["messages"]
    assert plan["hosts"]["a-d0"]["image_pull"] == {"policy": "always", "registry": "harbor.example.com:5000",
                                                   "login": True}
    assert PASSWORD not in json.dumps(plan)
    assert problems(plan, "warning") == [] or all(v["field"] != "pd_image_registry_password"
                                                  for v in problems(plan, "warning"))


@pytest.mark.parametrize("hv, field, words", [
    ({"pd_image_pull": "sometimes"}, "pd_image_pull", ["'sometimes' is not a pull policy", "never, missing, always"]),
    ({"pd_image_pull": True}, "pd_image_pull", ["True is not a pull policy"]),
    ({"pd_image_registry_username": "deploy", "pd_image_registry_password": {"set": True}},
     "pd_image_registry", ["pd_image_registry_username and pd_image_registry_password set but no registry",
                           "set pd_image_registry"]),
    ({"pd_image_registry": "harbor.example.com", "pd_image_registry_username": "deploy"},
     "pd_image_registry_password", ["missing: pd_image_registry harbor.example.com has only one", "ansible-vault"]),
    ({"pd_image_registry": "harbor.example.com", "pd_image_registry_password": {"set": True}},
     "pd_image_registry_username", ["has only one of user name and password"]),
    ({"pd_image_registry": "harbor.example.com/ascend"}, "pd_image_registry", ["is not a registry host", "without a path"]),
    ({"pd_image_registry_password": {"set": True, "problem": "cannot be read: no vault password was given",
                                     "fix": "give the vault password"}},
     "pd_image_registry_password", ["no vault password was given", "give the vault password"]),
])
def test_bad_settings_are_refused_naming_host_field_and_fix(hv, field, words):
    plan = fleet.plan_fleet(fleet_with(**hv))
    found = [v for v in problems(plan) if v["field"] == field]
    assert not plan["ok"]
    assert found, plan["messages"]
    text = " ".join(v["message"] + " " + v["fix"] for v in found)
    assert all(w in text for w in words), text
    assert all("a-p0" in v["where"] and "a-d0" in v["where"] for v in found)  # both hosts named, once


def test_a_password_in_clear_is_a_warning_naming_the_file():
    fact = registry.password_fact(PASSWORD, {"vaulted": False, "template": False, "file": "/inv/group_vars/c.yml"})
    assert fact == {"set": True, "clear_in": "/inv/group_vars/c.yml"}
    plan = fleet.plan_fleet(fleet_with(pd_image_registry="reg.local:5000", pd_image_registry_username="u",
                                       pd_image_registry_password=fact))
    assert plan["ok"], plan["messages"]
    warned = [v for v in problems(plan, "warning") if v["field"] == "pd_image_registry_password"]
    assert warned and "/inv/group_vars/c.yml" in warned[0]["message"] and "encrypt_string" in warned[0]["fix"]
    # a vaulted value, or one given with -e (no origin), is not warned about
    assert "clear_in" not in registry.password_fact(PASSWORD, {"vaulted": True, "template": False, "file": "x"})
    assert registry.password_fact(PASSWORD, None) == {"set": True}
    assert registry.password_fact(None) == {"set": False}


def test_an_image_id_cannot_be_pulled():
    a = cluster_a()
    a["image"] = "sha256:" + "ab" * 32
    f = example_fleet(a=a)
    for host in f["hosts"]:
        if host["name"].startswith("a-"):
            host["vars"]["pd_image_pull"] = "missing"
            host["vars"]["pd_cluster"] = a
    plan = fleet.plan_fleet(f)
    found = [v for v in problems(plan) if v["field"] == "pd_image_pull"]
    assert found and "image ID" in found[0]["message"] and "repo digest" in found[0]["fix"], plan["messages"]
    # the same pin with the policy never is fine (the image is loaded on the hosts)
    for host in f["hosts"]:
        host["vars"].pop("pd_image_pull", None)
    assert not [v for v in problems(fleet.plan_fleet(f)) if v["field"] == "pd_image_pull"]


# ---- the rollout starts from what was pulled ------------------------------------------------------

REF = "127.0.0.1:5000/ascend/vllm-ascend:v1"
DIGEST = "sha256:" + "cd" * 32
IMAGE_ID = "sha256:" + "ef" * 32


def test_start_image_is_the_pulled_repo_digest():
    pulled = {REF: {"id": IMAGE_ID, "repo_digests": ["other.io/x@sha256:" + "00" * 32,
                                                     "127.0.0.1:5000/ascend/vllm-ascend@" + DIGEST]}}
    assert containers.start_image(REF, pulled) == "127.0.0.1:5000/ascend/vllm-ascend@" + DIGEST
    # without a repo digest of its repository: the image ID (what was pulled, not what the tag names later)
    assert containers.start_image(REF, {REF: {"id": IMAGE_ID, "repo_digests": []}}) == IMAGE_ID
    # nothing pulled for it: the reference as it is
    assert containers.start_image(REF, {}) == REF
    assert containers.start_image(REF, None) == REF
    assert containers.start_image(REF, pulled) == containers.start_image(REF, pulled)  # no state kept


def test_start_image_refuses_bad_input():
    with pytest.raises(PdError, match="pd_start_requests"):
        containers.start_image("", {})
    with pytest.raises(PdError, match="pulled"):
        containers.start_image(REF, ["x"])


def test_labels_follow_the_pulled_image():
    spec = {"name": "pd-c-decode0-dp0", "image": REF, "labels": {"pd.spec-hash": "h"}}
    pulled = {REF: {"id": IMAGE_ID, "repo_digests": ["127.0.0.1:5000/ascend/vllm-ascend@" + DIGEST]}}
    labels = containers.start_labels(spec, pulled)
    assert labels["pd.image-id"] == IMAGE_ID
    assert labels["pd.image-digest"] == "127.0.0.1:5000/ascend/vllm-ascend@" + DIGEST


def test_pulled_images_and_progress_lines_from_module_results():
    results = [
        {"item": REF, "changed": True, "image": {"Id": IMAGE_ID, "RepoDigests": ["127.0.0.1:5000/ascend/vllm-ascend@" + DIGEST]}},
        {"item": "quay.io/x:y", "changed": False, "image": {"Id": IMAGE_ID, "RepoDigests": []}},
        {"item": "quay.io/z:w", "changed": True, "image": {}},  # --check: nothing pulled
    ]
    assert registry.pulled_images(results) == {
        REF: {"id": IMAGE_ID, "repo_digests": ["127.0.0.1:5000/ascend/vllm-ascend@" + DIGEST]},
        "quay.io/x:y": {"id": IMAGE_ID, "repo_digests": []}}
    assert registry.pull_lines(results, "h1") == [
        f"h1: {REF} pulled: {DIGEST}",
        f"h1: quay.io/x:y already here: {IMAGE_ID}",
        "h1: quay.io/z:w would be pulled (--check)"]


def test_filters_are_registered():
    filters = PLUGIN.FilterModule().filters()
    for name in ("pd_pull_hosts", "pd_pulled_images", "pd_pull_lines", "pd_start_requests"):
        assert name in filters
