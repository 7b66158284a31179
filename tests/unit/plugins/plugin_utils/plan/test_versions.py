"""plugin_utils.versions and plugins/plugin_utils/data/versions.yml."""

import copy

import pytest
import os

import yaml

from ansible_collections.pd.deploy.plugins import plugin_utils
from ansible_collections.pd.deploy.plugins.plugin_utils.plan import versions
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError

OLD_SPEC = "vllm_ascend.kv_offload.npu"
MAIN_SPEC = "vllm_ascend.distributed.kv_transfer.kv_pool.kv_offload.native.npu"


@pytest.mark.parametrize("version, line", [
    ("0.23.0", "0.23"),
    ("v0.23.0", "0.23"),
    ("0.23.0rc1", "0.23"),
    ("0.24.0rc1", "0.24"),
    ("0.25.1", "0.25"),
    ("v0.25.1rc1", "0.25"),
    ("0.25", "0.25"),
    ("0.26.0", "0.26"),
    ("v0.26.0rc1", "0.26"),
    ("0.26.0.post1", "0.26"),
    ("main", "main"),
    (" Main ", "main"),
])
def test_version_maps_to_its_line(version, line):
    assert versions.version_row(version)["line"] == line


@pytest.mark.parametrize("line, spec, key", [
    ("0.23", OLD_SPEC, "top"),
    ("0.24", OLD_SPEC, "top"),
    ("0.25", OLD_SPEC, "nested"),
    ("0.26", OLD_SPEC, "nested"),
    ("main", MAIN_SPEC, "nested"),
])
def test_rows_carry_the_version_dependent_keys(line, spec, key):
    row = versions.version_row(line)
    assert row["offloading_spec_module_path"] == spec
    assert row["offloading_spec_name"] == "NPUOffloadingSpec"
    assert row["recompute_scheduler_key"] == key
    assert row["max_num_partial_prefills_max"] == 1
    assert row["max_long_partial_prefills_max"] == 1
    assert row["partial_prefills_over_max"] == "refuse"
    assert {"MooncakeConnectorV1", "MooncakeHybridConnector"} <= set(row["mooncake_connectors"])


def test_vllm_pairing():
    assert versions.version_row("0.23.0")["vllm_version"] == "0.23.0"
    assert versions.version_row("v0.25.1rc1")["vllm_version"] == "0.25.1"


def test_known_versions_lists_the_required_lines_in_order():
    known = versions.known_versions()
    assert known[:1] == ["0.23"] and known[-1] == "main"
    assert {"0.23", "0.25", "0.26", "main"} <= set(known)


def test_every_row_cites_public_sources_and_domain():
    for line in versions.known_versions():
        sources = versions.version_row(line)["sources"]
        assert any(s.startswith("https://github.com/vllm-project/vllm-ascend/") for s in sources), line
        assert any(s.startswith("DOMAIN.md") for s in sources), line


@pytest.mark.parametrize("version", ["0.22.1", "1.0.0", "v0.9.1"])
def test_unknown_line_names_the_known_ones(version):
    with pytest.raises(PdError) as err:
        versions.version_row(version)
    text = str(err.value)
    assert text.startswith("pd_version_row: vllm_ascend_version:")
    assert version in text
    for line in versions.known_versions():
        assert line in text


@pytest.mark.parametrize("version", ["", "latest", "0.25.x", "25", "v0.25.1-a3"])
def test_unparsable_version_is_refused(version):
    with pytest.raises(PdError, match="not a version string"):
        versions.version_row(version)


@pytest.mark.parametrize("version", [0.25, 25, None, True, ["0.25"]])
def test_non_string_version_asks_to_quote(version):
    with pytest.raises(PdError) as err:
        versions.version_row(version)
    assert err.value.where == "pd_version_row"
    assert "quote it" in str(err.value)


def test_rows_are_copies():
    first = versions.version_row("0.25.1")
    before = copy.deepcopy(first)
    first["offloading_spec_module_path"] = "tampered"
    first["mooncake_connectors"].append("Tampered")
    first["sources"].clear()
    second = versions.version_row("0.25.1")
    assert second == before
    assert second is not first


def test_same_answer_twice():
    assert versions.version_row("main") == versions.version_row("main")
    assert versions.known_versions() == versions.known_versions()
    listed = versions.known_versions()
    listed.append("9.9")
    assert "9.9" not in versions.known_versions()


def test_table_file_is_plain_yaml_with_quoted_lines():
    path = os.path.join(os.path.dirname(plugin_utils.__file__), "data", "versions.yml")
    with open(path, encoding="utf-8") as handle:
        table = yaml.safe_load(handle)
    assert all(isinstance(k, str) for k in table)
    assert list(table) == versions.known_versions()


def test_malformed_table_is_refused():
    table = {"0.25": {"vllm_version": "0.25.1"}}
    with pytest.raises(PdError, match="versions.yml.0.25"):
        versions._check_table(table)
    good = copy.deepcopy(versions._table())
    good["0.25"]["recompute_scheduler_key"] = "sideways"
    with pytest.raises(PdError, match="recompute_scheduler_key"):
        versions._check_table(good)


# the ref each row was checked at (versions.yml header): its kv_peer_cache lines must point there
ROW_REFS = {"0.23": "v0.23.0", "0.24": "v0.24.0rc1", "0.25": "v0.25.1rc1", "0.26": "releases/v0.26.0rc", "main": "main"}


@pytest.mark.parametrize("line", sorted(ROW_REFS))
def test_kv_peer_cache_cites_the_connector_platform_and_proxy_at_the_rows_ref(line):
    """issue 20 #2: why no engine_id is rendered, per row, with the lines at the row's own ref."""
    cache = versions.version_row(line)["kv_peer_cache"]
    assert cache["keyed_by"][0] == "remote_engine_id" and cache["refreshed"] == "never"
    base = f"https://github.com/vllm-project/vllm-ascend/blob/{ROW_REFS[line]}/"
    for path in ("vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py#L", "vllm_ascend/platform.py#L",
                 "examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py#L"):
        assert any(s.startswith(base + path) for s in cache["sources"]), (line, path)


@pytest.mark.parametrize("change", [
    lambda c: c.pop("keyed_by"), lambda c: c.update(refreshed=None),
    lambda c: c.update(engine_id_suffix_per_process="yes"), lambda c: c.update(sources=[])])
def test_malformed_kv_peer_cache_is_refused(change):
    table = copy.deepcopy(versions._table())
    change(table["main"]["kv_peer_cache"])
    with pytest.raises(PdError, match="versions.yml.main.kv_peer_cache"):
        versions._check_table(table)
