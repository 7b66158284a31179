"""issue 21 "fail closed, round 3" #3-#5 on plain fleet dicts (test_fleet.py helpers).

- strings that break what they reach: control / invisible characters in anything that reaches argv,
  env, labels, paths or file names are refused; names print escaped in every message;
- paths used on the hosts must be absolute;
- risky-but-legal settings are warnings naming the setting and the risk.
(Duplicate YAML keys and the provenance warnings need Ansible: tests/render/test_validate_round3.py.)
"""

import os
import re

import pytest
import yaml

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet
from ansible_collections.pd.deploy.plugins.plugin_utils.shared import text
from ansible_collections.pd.deploy.plugins.plugin_utils.validate import inventory, rules
from test_fleet import cluster_a, example_fleet

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
ZWSP = "\u200b"


def errors(plan, field=None):
    return [v for v in plan["violations"] if v["level"] == "error" and (field is None or v["field"] == field)]


def warnings(plan, field):
    return [v for v in plan["violations"] if v["level"] == "warning" and v["field"] == field]


def host_vars(f, name):
    return next(h for h in f["hosts"] if h["name"] == name)["vars"]


def with_a(change):
    a = cluster_a()
    change(a)
    return fleet.plan_fleet(example_fleet(a=a))


# ---- #3 strings that break what they reach ---------------------------------------------------------

@pytest.mark.parametrize("change, field", [
    (lambda a: a["decode"].update(env={"MY_TUNING": "1\nEVIL=2"}), "decode.env.MY_TUNING"),
    (lambda a: a["decode"].update(env={"HCCL_BUFFSIZE": "2048\r"}), "decode.env.HCCL_BUFFSIZE"),
    (lambda a: a["prefill"].setdefault("engine", {}).update(extra_args=["--seed", "7\n"]),
     "prefill.engine.extra_args[1]"),
    (lambda a: a["model"].update(served_name="deepseek\tv4"), "model.served_name"),
    (lambda a: a["model"].update(path="/data/models/DeepSeek" + ZWSP), "model.path"),
    (lambda a: a["prefill"].setdefault("engine", {}).update(additional_config={"x": "a\x00b"}),
     "prefill.engine.additional_config.x"),
])
def test_control_and_invisible_characters_are_refused_where_they_are_written(change, field):
    plan = with_a(change)
    found = errors(plan, field)
    assert found, plan["messages"]
    assert "retype" in found[0]["fix"]


def test_a_control_character_in_a_host_fact_is_refused():
    f = example_fleet()
    host_vars(f, "a-d0")["pd_hccl_if"] = "enp189s0f0\n"
    found = errors(fleet.plan_fleet(f), "pd_hccl_if")
    assert found and found[0]["where"] == "a-d0" and "line break" in found[0]["message"]


def test_plain_non_ascii_text_in_a_value_passes():
    # a visible accented letter in a model path is not a control character (Docker takes UTF-8 paths)
    plan = with_a(lambda a: a["model"].update(path="/data/modèles/DeepSeek-V4-Flash"))
    assert errors(plan, "model.path") == [], plan["messages"]


def test_an_invisible_character_in_a_host_name_is_shown_escaped_in_every_message():
    f = example_fleet()
    host = next(h for h in f["hosts"] if h["name"] == "b-d1")
    host["name"] = "b-d1" + ZWSP
    plan = fleet.plan_fleet(f)
    assert plan["ok"] is False
    assert not any(ZWSP in m for m in plan["messages"]), plan["messages"]
    assert any("b-d1\\u200b" in m and "inventory host name" in m for m in plan["messages"]), plan["messages"]


def test_shown_escapes_every_name_that_is_not_printable_ascii():
    assert text.shown("b-d1") == "b-d1"
    assert text.shown("b-d1" + ZWSP) == "b-d1\\u200b"
    assert text.shown("a-р0") == "a-\\u04400"  # a Cyrillic "р" that prints like a Latin "p"
    line = rules.format_violation({"level": "error", "where": "b-d1" + ZWSP, "field": "pd_hccl_if",
                                   "message": "missing\u2028here", "fix": "set it — now"})
    assert line == "ERROR b-d1\\u200b: pd_hccl_if: missing\\u2028here — set it — now"


# ---- #4 paths used on hosts are absolute ------------------------------------------------------------

@pytest.mark.parametrize("name", inventory.HOST_PATH_VARS)
def test_a_relative_host_path_is_refused(name):
    f = example_fleet()
    host_vars(f, "a-p0")[name] = "locks"
    found = errors(fleet.plan_fleet(f), name)
    assert found and "not an absolute path" in found[0]["message"] and "e.g. /" in found[0]["fix"]


def test_an_absolute_lock_dir_passes():
    f = example_fleet()
    host_vars(f, "a-p0")["pd_deploy_lock_dir"] = "/srv/pd/locks"
    assert errors(fleet.plan_fleet(f), "pd_deploy_lock_dir") == []


def _path_like_variables():
    names = set(yaml.safe_load(open(os.path.join(REPO, "plugins", "plugin_utils", "data", "variables.yml"),
                                    encoding="utf-8"))["variables"])
    for role in os.listdir(os.path.join(REPO, "roles")):
        path = os.path.join(REPO, "roles", role, "defaults", "main.yml")
        if os.path.exists(path):
            names |= set(yaml.safe_load(open(path, encoding="utf-8")) or {})
    return sorted(n for n in names if re.search(r"_(dir|socket|json|file|archive|root|path)$", n))


def test_every_path_variable_is_classified_host_or_controller():
    # a new path variable must be put on one list: host paths are checked absolute by validate
    unclassified = [n for n in _path_like_variables()
                    if n not in inventory.HOST_PATH_VARS + inventory.CONTROLLER_PATH_VARS]
    assert unclassified == []


# ---- #5 risky but legal: warnings -------------------------------------------------------------------

@pytest.mark.parametrize("proxy, warned", [
    ({"waiting_retry_interval": 60, "drain_timeout_s": 60}, True),
    ({"waiting_retry_interval": 90, "drain_timeout_s": 60}, True),
    ({"drain_timeout_s": 8}, True),                       # null = the proxy's 10 s
    ({"waiting_retry_interval": 5, "drain_timeout_s": 60}, False),
    ({"waiting_retry_interval": 90, "drain_timeout_s": 0}, False),   # no drain
    ({}, False),                                          # defaults: 10 s vs 60 s
])
def test_a_retry_interval_not_below_the_drain_timeout_is_a_warning(proxy, warned):
    plan = with_a(lambda a: a.setdefault("proxy", {}).update(proxy))
    found = warnings(plan, "proxy.waiting_retry_interval")
    assert plan["ok"], plan["messages"]
    assert bool(found) is warned, plan["messages"]
    if warned:
        assert "drain_timeout_s" in found[0]["message"] and "ends on its timeout" in found[0]["message"]


def one_warning_for_both_hosts(key, value):
    """The warning of `key` set to `value` on both hosts of cluster_a (one group_vars file): the plan
    stays ok and says it once."""
    f = example_fleet()
    for name in ("a-p0", "a-d0"):
        host_vars(f, name)[key] = value
    plan = fleet.plan_fleet(f)
    found = warnings(plan, key)
    assert plan["ok"] and len(found) == 1, plan["messages"]
    return found[0]


def test_a_break_lock_kept_in_the_inventory_is_one_warning_per_file():
    found = one_warning_for_both_hosts("pd_deploy_break_lock", {"kept_in": "/inv/group_vars/cluster_a.yml"})
    assert "/inv/group_vars/cluster_a.yml" in found["message"] and "-e pd_deploy_break_lock=true" in found["fix"]


def test_a_clear_text_api_key_is_a_warning_naming_the_file():
    found = one_warning_for_both_hosts("pd_api_key", {"fact": "pd_api_key", "redaction": "<redacted: sha256:abc...>",
                                                      "clear_in": "/inv/group_vars/cluster_a.yml"})
    assert "in clear in /inv/group_vars/cluster_a.yml" in found["message"] and "ansible-vault" in found["fix"]


def test_a_control_character_in_a_host_path_is_refused():
    f = example_fleet()
    host_vars(f, "a-p0")["pd_deploy_lock_dir"] = "/var/lib/pd\n"
    found = errors(fleet.plan_fleet(f), "pd_deploy_lock_dir")
    assert found and "line break" in found[0]["message"]
