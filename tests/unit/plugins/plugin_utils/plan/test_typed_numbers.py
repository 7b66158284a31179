"""issue 21 "fail closed, round 3": numbers of the wrong type, messages in the operator's words.

Each case is the example fleet (tests/unit/plugins/plugin_utils/plan/test_fleet.py helpers) with one mistake of a class the
issue found; the plan must refuse it on the field the operator wrote, once, with a figure that can be
true, and never in the code's own names.
"""

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet, model
from ansible_collections.pd.deploy.plugins.plugin_utils.validate import rules
from test_fleet import cluster_a, example_fleet

INTERNAL = ("pd_recompute_child", "pd_offloading_child", "pd_kv_transfer_config", "cpu_bytes_to_use",
            "pd_split_per_rank", "internal error")


def errors(plan, field=None):
    return [v for v in plan["violations"] if v["level"] == "error" and (field is None or v["field"] == field)]


def set_path(data, path, value):
    keys = path.split(".")
    for key in keys[:-1]:
        data = data.setdefault(key, {})
    data[keys[-1]] = value


def plan_with(**changes):
    a = cluster_a()
    for path, value in changes.items():
        set_path(a, path.replace("__", "."), value)
    return fleet.plan_fleet(example_fleet(a=a))


def host_vars(f, name):
    return next(h for h in f["hosts"] if h["name"] == name)["vars"]


# ---- numbers that are not the type they look like -------------------------------------------------

@pytest.mark.parametrize("changes, field, written", [
    # the cases: accepted before, and rendered as --port 8000.0 / --max-retries 3.0
    ({"proxy.port": 8000, "prefill.port_base": 8000.0}, "prefill.port_base", "8000"),
    ({"proxy.port": 8100.0}, "proxy.port", "8100"),
    ({"prefill.dp_rpc_port": 8101.0}, "prefill.dp_rpc_port", "8101"),
    ({"proxy.max_retries": 3.0}, "proxy.max_retries", "3"),
    ({"decode.engine.max_num_seqs": 48.0}, "decode.engine.max_num_seqs", "48"),
    ({"prefill.engine.max_model_len": 32768.0}, "prefill.engine.max_model_len", "32768"),
    ({"hccl_if_base_port": 60032.0}, "hccl_if_base_port", "60032"),
    ({"decode.engine.num_speculative_tokens": 2.0}, "decode.engine.num_speculative_tokens", "2"),
])
def test_a_whole_number_written_as_a_float_is_refused_on_its_field(changes, field, written):
    plan = plan_with(**{k.replace(".", "__"): v for k, v in changes.items()})
    found = errors(plan, field)
    assert plan["ok"] is False and found, plan["messages"]
    assert "float" in found[0]["message"] and f"write {written}" in found[0]["fix"], found[0]


@pytest.mark.parametrize("path, value", [
    ("proxy.port", "8100"), ("decode.engine.max_num_seqs", "48"), ("prefill.kv_port", "30000"),
    ("decode.engine.gpu_memory_utilization", "0.85"),
])
def test_a_number_written_as_text_is_refused_on_its_field_with_the_unquoted_fix(path, value):
    plan = plan_with(**{path.replace(".", "__"): value})
    found = errors(plan, path)
    assert found, plan["messages"]
    assert "quot" in found[0]["message"] and f"write {value} without quotes" in found[0]["fix"], found[0]


def test_a_size_written_as_a_float_is_refused_with_the_integer_and_the_unit():
    plan = plan_with(decode__cpu_offload=214748364800.0)
    found = errors(plan, "decode.cpu_offload")
    assert found and found[0]["fix"] == "write 214748364800 or 200GiB", plan["messages"]


def test_a_host_fact_written_as_a_float_is_refused_on_its_field():
    f = example_fleet()
    host_vars(f, "a-d0")["pd_npus"] = 8.0
    found = errors(fleet.plan_fleet(f), "pd_npus")
    assert found and found[0]["where"] == "a-d0" and "write 8" in found[0]["fix"], found


def test_check_cluster_reports_a_float_port_instead_of_skipping_it():
    """A direct caller of pd_check_cluster (no schema in front) gets the type error, not silence."""
    plan = fleet.plan_fleet(example_fleet())
    cluster = plan["clusters"]["cluster_a"]
    assert cluster["proxy"]["ports"]["http"] == 8000
    raw = cluster_a()
    raw["proxy"] = {"port": 8000}
    norm = model.normalize("cluster_a", raw)
    hosts = [fleet.model.host_record(n, r, {"pd_host_address": a, "pd_host_ram": "1TiB", "pd_hccl_if": "eth0"})
             for n, r, a in (("a-p0", "prefill", "10.0.0.11"), ("a-d0", "decode", "10.0.0.12"))]
    norm["roles"]["prefill"]["port_base"] = 8000.0
    topo, _ = model.topology(norm, hosts)
    found = [v for v in rules.check_cluster(norm, topo) if v["field"] == "prefill.port_base"]
    assert found and found[0]["level"] == "error", found


# ---- one root cause once, one fleet-wide problem once --------------------------------------------

def test_a_missing_host_fact_is_reported_without_its_consequences():
    f = example_fleet()
    del host_vars(f, "a-d0")["pd_host_ram"]
    plan = fleet.plan_fleet(f)
    assert [v["field"] for v in errors(plan)] == ["pd_host_ram"], plan["messages"]


def test_the_same_problem_on_every_host_is_reported_once_naming_the_hosts():
    f = example_fleet()
    for host in f["hosts"]:
        del host["vars"]["pd_hccl_if"]
    plan = fleet.plan_fleet(f)
    found = errors(plan, "pd_hccl_if")
    assert len(found) == 1, plan["messages"]
    assert found[0]["where"] == "a-p0, a-d0, b-p0 and 2 other hosts", found[0]


# ---- absurd inputs are refused on their own field, with figures that can be true -----------------

def test_an_astronomical_max_num_seqs_is_refused_on_max_num_seqs_without_overflowing_figures():
    plan = plan_with(decode__engine__max_num_seqs=10 ** 15)
    assert [v["field"] for v in errors(plan)] == ["decode.engine.max_num_seqs"], plan["messages"]
    assert not any("EiB" in m or "PiB" in m for m in plan["messages"]), plan["messages"]


@pytest.mark.parametrize("changes, field", [
    ({"prefill__engine__max_num_seqs": 10 ** 15}, "prefill.engine.max_num_seqs"),  # was: raise batched to 1e15
    ({"prefill__engine__max_num_batched_tokens": 10 ** 15}, "prefill.engine.max_num_batched_tokens"),
    ({"decode__engine__max_num_batched_tokens": 10 ** 15}, "decode.engine.max_num_batched_tokens"),
    ({"decode__engine__num_speculative_tokens": 10 ** 15}, "decode.engine.num_speculative_tokens"),
    ({"workload__p99_prompt_tokens": 10 ** 15}, "workload.p99_prompt_tokens"),  # was: set max_model_len: 1e15
    ({"workload__avg_prompt_tokens": 10 ** 15}, "workload.avg_prompt_tokens"),  # was: accepted
    ({"decode__shm_size": "1000000EiB"}, "decode.shm_size"),                    # was: accepted
])
def test_an_absurd_value_is_refused_once_on_the_field_written(changes, field):
    plan = plan_with(**changes)
    assert [v["field"] for v in errors(plan)] == [field], plan["messages"]


def test_max_model_len_beyond_the_models_context_is_refused():
    plan = plan_with(prefill__engine__max_model_len=100000000)
    found = errors(plan, "prefill.engine.max_model_len")
    assert found and "1048576" in found[0]["message"], plan["messages"]


def test_max_model_len_at_the_models_context_is_accepted():
    plan = plan_with(prefill__engine__max_model_len=1048576, decode__engine__max_model_len=1048576)
    assert not errors(plan, "prefill.engine.max_model_len") and not errors(plan, "decode.engine.max_model_len")


# ---- messages in the operator's words ------------------------------------------------------------

@pytest.mark.parametrize("value", [0, 7])
def test_an_unusable_decode_cpu_offload_is_reported_on_decode_cpu_offload(value):
    plan = plan_with(decode__cpu_offload=value)
    assert plan["ok"] is False
    assert {v["field"] for v in errors(plan)} == {"decode.cpu_offload"}, plan["messages"]
    assert not any(word in m for m in plan["messages"] for word in INTERNAL), plan["messages"]


# ---- a vault value: no password vs a wrong one ---------------------------------------------------

class _Event:
    def __init__(self, msg):
        self.msg = msg
        self.formatted_source_context = "Origin: /inv/group_vars/cluster_a.yml:52:13\n\n52 pd_api_key: !vault |"


class _Undecryptable:
    """What ansible-core 2.19 hands a filter for a !vault value it could not decrypt (a marker whose
    str() raises, carrying Ansible's event); the messages are ansible/parsing/vault's."""

    def __init__(self, msg):
        self._marker_event = _Event(msg)

    def __str__(self):
        raise RuntimeError("A vault exception marker was tripped.")


@pytest.mark.parametrize("said, problem, fix", [
    ("Attempting to decrypt but no vault secrets found.", "no vault password was given", "--ask-vault-pass"),
    ("Decryption failed (no vault secrets were found that could decrypt).",
     "the vault password given does not decrypt it", "the password it was encrypted with"),
])
def test_a_missing_and_a_wrong_vault_password_get_different_hints(said, problem, fix):
    from ansible_collections.pd.deploy.plugins.plugin_utils.validate import secrets

    fact = secrets.host_key_fact(_Undecryptable(said))
    assert problem in fact["problem"] and "/inv/group_vars/cluster_a.yml:52:13" in fact["problem"], fact
    assert fix in fact["fix"], fact
