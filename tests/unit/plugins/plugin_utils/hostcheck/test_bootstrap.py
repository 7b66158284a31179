"""issue 23 item 3: the host bootstrap (bootstrap-hosts.yml, role pd_bootstrap).

What it writes is decided by pure functions (plugin_utils.hostcheck.bootstrap): Docker's daemon.json merged
with log rotation, live-restore and the memlock / nofile ulimits, and the limits.d file. A host bootstrapped
with the defaults must draw none of the prechecks' Docker warnings (compat.docker_problems, the same
reading), and its Ascend checks are the prechecks' own (prechecks.driver_problems).
"""

import json

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.hostcheck import bootstrap, compat, prechecks
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError
from tests.unit.plugins.filter.test_filters_registration import PLUGIN
from tests.unit.plugins.plugin_utils.hostcheck.test_prechecks import CASES, HOST, good_facts

SETTINGS = {"log_max_size": "100m", "log_max_file": 5, "live_restore": True, "nofile": 1048576}


def test_a_host_without_daemon_json_is_warned_about_and_bootstrapped_is_not():
    assert len(compat.docker_problems(None)) == 2  # what the prechecks say about a fresh host
    text = bootstrap.daemon_config(None, SETTINGS)
    assert compat.docker_problems(text) == []
    conf = json.loads(text)
    assert conf["log-driver"] == "json-file"
    assert conf["log-opts"] == {"max-size": "100m", "max-file": "5"}
    assert conf["live-restore"] is True
    assert conf["default-ulimits"]["memlock"] == {"Name": "memlock", "Soft": -1, "Hard": -1}
    assert conf["default-ulimits"]["nofile"] == {"Name": "nofile", "Soft": 1048576, "Hard": 1048576}


def test_the_site_keys_are_kept_and_a_second_merge_changes_nothing():
    site = json.dumps({"data-root": "/data/docker", "registry-mirrors": ["https://m.example"],
                       "log-opts": {"labels": "pd.cluster", "max-size": "10m"},
                       "default-ulimits": {"core": {"Name": "core", "Soft": 0, "Hard": 0}}})
    once = bootstrap.daemon_config(site, SETTINGS)
    conf = json.loads(once)
    assert conf["data-root"] == "/data/docker" and conf["registry-mirrors"] == ["https://m.example"]
    assert conf["log-opts"] == {"labels": "pd.cluster", "max-size": "100m", "max-file": "5"}
    assert conf["default-ulimits"]["core"] == {"Name": "core", "Soft": 0, "Hard": 0}
    assert bootstrap.daemon_config(once, SETTINGS) == once  # idempotent: same bytes, no rewrite, no restart
    assert once.endswith("\n")


@pytest.mark.parametrize("driver, kept", [("local", "local"), ("json-file", "json-file"), ("journald", "json-file")])
def test_a_rotating_log_driver_is_kept_another_is_replaced(driver, kept):
    conf = json.loads(bootstrap.daemon_config(json.dumps({"log-driver": driver}), SETTINGS))
    assert conf["log-driver"] == kept


def test_live_restore_can_be_switched_off():
    assert json.loads(bootstrap.daemon_config("", dict(SETTINGS, live_restore=False)))["live-restore"] is False


@pytest.mark.parametrize("text, words", [
    ("{not json", ["not valid JSON", "fix or remove it"]),
    ("[1, 2]", ["not a JSON object"]),
])
def test_a_broken_daemon_json_is_refused_not_overwritten(text, words):
    with pytest.raises(PdError) as info:
        bootstrap.daemon_config(text, SETTINGS)
    assert all(w in str(info.value) for w in words), str(info.value)


@pytest.mark.parametrize("change, field", [
    ({"log_max_size": ""}, "pd_bootstrap_docker_log_max_size"),
    ({"log_max_size": "big"}, "pd_bootstrap_docker_log_max_size"),
    ({"log_max_file": 0}, "pd_bootstrap_docker_log_files"),
    ({"nofile": True}, "pd_bootstrap_nofile"),
])
def test_bad_settings_name_the_variable(change, field):
    with pytest.raises(PdError, match=field):
        bootstrap.daemon_config(None, dict(SETTINGS, **change))


def test_limits_conf_covers_every_user_and_root():
    text = bootstrap.limits_conf(65536)
    for who in ("*", "root"):
        for kind in ("soft", "hard"):
            assert any(line.split() == [who, kind, "memlock", "unlimited"] for line in text.splitlines())
            assert any(line.split() == [who, kind, "nofile", "65536"] for line in text.splitlines())
    assert bootstrap.limits_conf(65536) == text
    with pytest.raises(PdError, match="pd_bootstrap_nofile"):
        bootstrap.limits_conf(0)


# ---- the Ascend checks are the prechecks' own -------------------------------------------------------

DRIVER_CASES = [c for c in CASES if c[0] in ("device node missing", "device not a char device", "driver file missing",
                                              "npu-smi fails", "npu-smi count low", "npu-smi unreadable")]
OTHER_CASES = [c for c in CASES if c[0] in ("docker down", "RAM short", "port busy", "image missing", "disk low")]


@pytest.mark.parametrize("change, expected", [c[1:] for c in DRIVER_CASES], ids=[c[0] for c in DRIVER_CASES])
def test_driver_problems_are_the_prechecks_messages(change, expected):
    facts = good_facts()
    change(facts)
    found = prechecks.driver_problems(facts, facts["probe"])
    assert found == [p for p in prechecks.problems(facts)]
    assert found[0].startswith(f"{HOST}: ") and all(t in found[0] for t in expected)


@pytest.mark.parametrize("change", [c[1] for c in OTHER_CASES], ids=[c[0] for c in OTHER_CASES])
def test_driver_problems_leave_out_what_a_bootstrap_does_not_judge(change):
    # Docker, RAM, ports, images, disk: the bootstrap installs Docker itself and runs before any image
    facts = good_facts()
    change(facts)
    assert prechecks.problems(facts) and prechecks.driver_problems(facts, facts["probe"]) == []


def test_filters_are_registered():
    filters = PLUGIN.FilterModule().filters()
    for name in ("pd_docker_daemon_config", "pd_limits_conf", "pd_driver_problems"):
        assert name in filters
