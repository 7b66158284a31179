"""plugin_utils.ops.tuning: exactly one parameter changes per step; running containers against the plan.

Expected values are derived from the inputs each test writes (a chosen fixed + marginal footprint, the
metrics values served, the cluster configuration), never copied from the code's output.
"""

import copy

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.ops import tuning
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError
from tests.fixtures.ops_inputs import CLUSTER, D_SEQS, GIB, PLAN


def test_one_change_names_the_single_changed_parameter():
    after = copy.deepcopy(CLUSTER)
    after["prefill"]["engine"]["max_num_batched_tokens"] = 32768
    assert tuning.one_change(CLUSTER, after) == {"path": "prefill.engine.max_num_batched_tokens", "old": 8192,
                                              "new": 32768, "kind": "changed"}


def test_one_change_refuses_two_changes_and_names_both():
    after = copy.deepcopy(CLUSTER)
    after["prefill"]["engine"]["max_num_batched_tokens"] = 32768
    after["decode"]["engine"]["max_num_seqs"] = 32
    with pytest.raises(PdError) as info:
        tuning.one_change(CLUSTER, after)
    text = str(info.value)
    assert "2 parameters changed" in text
    assert "prefill.engine.max_num_batched_tokens: 8192 -> 32768" in text
    assert f"decode.engine.max_num_seqs: {D_SEQS} -> 32" in text


def test_one_change_refuses_no_change_and_ignores_cosmetic_edits():
    cosmetic = copy.deepcopy(CLUSTER)
    cosmetic["decode"]["engine"]["max_num_seqs"] = D_SEQS      # the default, now explicit
    with pytest.raises(PdError) as info:
        tuning.one_change(CLUSTER, cosmetic)
    assert "nothing changed" in str(info.value)
    before = dict(copy.deepcopy(CLUSTER), decode=dict(CLUSTER["decode"], cpu_offload="200GiB",
                                                      offload_connector="RecomputeCPUOffloadConnector",
                                                      recompute_scheduler=True))
    after = copy.deepcopy(before)
    after["decode"]["cpu_offload"] = "128GiB"
    change = tuning.one_change(before, after)
    assert change == {"path": "decode.cpu_offload", "old": 200 * GIB, "new": 128 * GIB, "kind": "changed"}
    assert tuning.tune_check(change, "decode.cpu_offload", "128GiB") == change
    # a raw diff sees the edited keys as written
    assert tuning.diff_paths({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}, effective=False) == [
        {"path": "a.c", "old": None, "new": 2, "kind": "added"}]


def test_one_change_compares_values_not_exact_types():
    """Ansible passes tagged subclasses of str/int; they must compare equal to plain values."""
    class TaggedStr(str):
        pass

    class TaggedInt(int):
        pass

    after = copy.deepcopy(CLUSTER)
    after["image"] = TaggedStr(CLUSTER["image"])
    after["prefill"]["engine"]["max_num_batched_tokens"] = TaggedInt(32768)
    assert tuning.one_change(CLUSTER, after)["path"] == "prefill.engine.max_num_batched_tokens"
    flag = copy.deepcopy(CLUSTER)
    flag["prefill"]["engine"]["enforce_eager"] = 0       # a number where a bool was: a change
    assert tuning.diff_paths(dict(CLUSTER, prefill={"engine": {"enforce_eager": False}}), flag)[0]["path"] == \
        "prefill.engine.enforce_eager"


def test_tune_check_wants_the_declared_parameter_and_value():
    after = copy.deepcopy(CLUSTER)
    after["prefill"]["engine"]["max_num_batched_tokens"] = 32768
    change = tuning.one_change(CLUSTER, after)
    assert tuning.tune_check(change, "prefill.engine.max_num_batched_tokens", "32768")["new"] == 32768
    with pytest.raises(PdError) as info:
        tuning.tune_check(change, "decode.engine.max_num_seqs", "32")
    assert "prefill.engine.max_num_batched_tokens" in str(info.value)
    with pytest.raises(PdError) as info:
        tuning.tune_check(change, "prefill.engine.max_num_batched_tokens", "24576")
    assert info.value.field == "pd_tune_value"


def test_spec_hashes_and_running_drift():
    hashes = tuning.spec_hashes(PLAN, "c1")
    proxy = PLAN["clusters"]["c1"]["proxy"]
    assert set(hashes) == {"c1-p0", "c1-d0"}
    assert proxy["name"] in hashes[proxy["host"]]
    expected = hashes["c1-d0"]
    names = list(expected)
    info = [{"item": names[0], "exists": True, "container": {"State": {"Running": True},
                                                            "Config": {"Labels": {"pd.spec-hash": expected[names[0]]}}}},
            {"item": names[1], "exists": True, "container": {"State": {"Running": True},
                                                            "Config": {"Labels": {"pd.spec-hash": "0" * 64}}}}]
    drift = tuning.running_drift(expected, info)
    assert drift == [f"{names[1]}: runs spec {'0' * 12} but {expected[names[1]][:12]} was recorded"]
    assert tuning.running_drift(expected, info[:1]) == [f"{names[1]}: not present"]
