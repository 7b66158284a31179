"""Compatibility prechecks (plugins/plugin_utils/compat.py): image versions from build history, driver, Docker settings."""

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.hostcheck import compat
from ansible_collections.pd.deploy.plugins.plugin_utils.plan import versions
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError

# CreatedBy of a RUN step as the Engine API returned it for an image built (docker build, 2026-12-01, on
# this machine) from a Dockerfile with the ARG names of vllm-project/vllm-ascend v0.25.1rc1:Dockerfile:25,42-43
HISTORY_0251 = ['|3 MOONCAKE_TAG=0.3.11.post1 VLLM_COMMIT= VLLM_TAG=v0.25.1 /bin/sh -c echo "$VLLM_TAG $MOONCAKE_TAG"',
                "/bin/sh -c #(nop)  ARG VLLM_COMMIT="]
# version.info layout of the fake tree (tests/harness/ascend-root.sh), as the driver installs it
VERSION_INFO = "Version=24.1.rc3\nascendhal_version=7.35.23\npackage_version=24.1.rc3\n"
GOOD_DAEMON = ('{"log-driver": "json-file", "log-opts": {"max-size": "100m", "max-file": "5"},'
               ' "default-ulimits": {"memlock": {"Name": "memlock", "Soft": -1, "Hard": -1}}}')


def test_versions_from_history():
    assert compat.image_versions({"history": HISTORY_0251}) == {"vllm": "0.25.1", "mooncake": "0.3.11.post1"}
    assert compat.image_versions({"history": ["/bin/sh -c true"], "env": ["PATH=/usr/bin"]}) == {
        "vllm": None, "mooncake": None}
    assert compat.image_versions({"labels": {"VLLM_VERSION": "0.23.0"}})["vllm"] == "0.23.0"


def test_driver_version():
    assert compat.driver_version(VERSION_INFO) == "24.1.rc3"
    assert compat.driver_version("package_version=1\n") is None


def facts(version, history, driver=VERSION_INFO, **extra):
    return {"host": "h", "vllm_ascend_version": version,
            "compat": {"images": {"img:1": {"history": history}}, "driver_info": driver}, **extra}


def test_image_of_the_row_passes():
    # the 0.25 row says vLLM 0.25.1 and Mooncake 0.3.11.post1 (versions.yml, Dockerfile ARGs at v0.25.1rc1)
    assert versions.version_row("0.25.1")["vllm_version"] == "0.25.1"
    assert compat.problems(facts("0.25.1", HISTORY_0251)) == []


def test_image_of_another_row_is_refused():
    [msg] = compat.problems(facts("0.23.0", HISTORY_0251))
    assert msg.startswith("h: image img:1 was built with vllm 0.25.1 but the version row 0.23")
    assert "needs 0.23.0" in msg


def test_image_without_records_is_not_judged():
    assert compat.problems(facts("0.23.0", ["/bin/sh -c true"])) == []


def test_driver_missing_unreadable_or_unsupported():
    [msg] = compat.problems(facts("0.25.1", HISTORY_0251, driver=None))
    assert "version.info is missing" in msg
    [msg] = compat.problems(facts("0.25.1", HISTORY_0251, driver="x=1"))
    assert "no Version= line" in msg
    [msg] = compat.problems(facts("0.25.1", HISTORY_0251, supported_drivers=["25.2"]))
    assert "Ascend driver 24.1.rc3 is not one the version row 0.25 supports (25.2)" in msg
    assert compat.problems(facts("0.25.1", HISTORY_0251, supported_drivers=["24.1"])) == []


@pytest.mark.parametrize("text, count, words", [
    (GOOD_DAEMON, 0, ""),
    (None, 2, "no /etc/docker/daemon.json"),
    ('{"log-opts": {"max-file": "3"}}', 2, "no log-opts max-size"),
    ('{"log-driver": "journald"}', 1, "memlock ulimit is not set"),
    ('{"log-opts": {"max-size": "10m"}, "default-ulimits": {"memlock": {"Soft": 65536, "Hard": 65536}}}', 1,
     "Soft 65536 / Hard 65536"),
    ("{", 1, "not valid JSON"),
])
def test_docker_settings(text, count, words):
    found = compat.docker_warnings("h", {"daemon_json": text})
    assert len(found) == count and all(m.startswith("h: ") for m in found)
    assert not words or words in found[0]


def test_not_asked_and_bad_input():
    assert compat.problems({"host": "h", "compat": None}) == []
    assert compat.docker_warnings("h", None) == []
    with pytest.raises(PdError):
        compat.problems({"host": "h", "vllm_ascend_version": "0.25.1", "compat": "x"})
