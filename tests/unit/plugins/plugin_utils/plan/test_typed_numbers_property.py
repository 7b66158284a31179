"""Property: a number in the inventory is refused on its field, or rendered as its reader parses it.

Clusters are generated with numeric fields written as an int, a float (whole or not) or a string of
either (what YAML gives for ``8000``, ``8000.0``, ``8000.5``, ``"8000"``). For every field without an
error on it, the text rendered into the launch spec is parsed back the way the program that reads it
parses it, and must give the number the operator meant, with its type:

* vLLM's argparse: ``--port``, ``--max-num-seqs``, ``--data-parallel-rpc-port`` are ``type=int``;
  ``--max-model-len`` / ``--max-num-batched-tokens`` go through ``human_readable_int``, whose plain
  branch is ``int(value)`` (vllm@v0.27.1 vllm/utils/argparse_utils.py); ``--gpu-memory-utilization`` is
  ``float``. ``int("8000.0")`` raises: such an engine never starts.
* the PD proxy (vllm-ascend main:examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py
  L672-L690, same at v0.23.0): ``--port`` / ``--max-retries`` ``type=int``, ``--retry-delay`` ``float``.
* JSON arguments (``--speculative-config``, ``--kv-transfer-config``) are read with json: the value
  must be an int there (a ``2.0`` would reach vLLM's int fields as a float); Mooncake's ``kv_port`` is
  rendered as text and must read as an int.
* ``HCCL_IF_BASE_PORT`` is read by HCCL as a decimal integer.
"""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet
from test_fleet import member


def _arg(cmd, flag):
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def _int_text(text):
    """argparse type=int / human_readable_int on a plain number: int(text), else the program exits."""
    return int(text)


def _json_int(value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not a JSON integer")
    return value


def _prefill(plan):
    return plan["hosts"]["a-p0"]["specs"][0]


def _decode(plan):
    return plan["hosts"]["a-d0"]["specs"][0]


def _proxy(plan):
    return plan["clusters"]["cluster_a"]["proxy"]


def _kv_port(spec):
    config = json.loads(_arg(spec["command"], "--kv-transfer-config"))
    kids = config.get("kv_connector_extra_config", {}).get("connectors") or [config]
    return next(k["kv_port"] for k in kids if "kv_port" in k)


# field -> (kind, valid whole values, where the value is rendered, how its reader parses it)
FIELDS = {
    "prefill.port_base": (int, (8100, 8150), lambda p: _arg(_prefill(p)["command"], "--port"), _int_text),
    "prefill.dp_rpc_port": (int, (13300, 13380),
                            lambda p: _arg(_prefill(p)["command"], "--data-parallel-rpc-port"), _int_text),
    "prefill.kv_port": (int, (30000, 30050), lambda p: _kv_port(_prefill(p)), _int_text),
    "proxy.port": (int, (8000, 8050), lambda p: _arg(_proxy(p)["command"], "--port"), _int_text),
    "proxy.max_retries": (int, (0, 10), lambda p: _arg(_proxy(p)["command"], "--max-retries"), _int_text),
    "proxy.retry_delay": (float, (0, 5), lambda p: _arg(_proxy(p)["command"], "--retry-delay"), float),
    "hccl_if_base_port": (int, (60100, 60400), lambda p: _decode(p)["env"].get("HCCL_IF_BASE_PORT"), _int_text),
    "prefill.engine.max_model_len": (int, (32768, 40000),
                                     lambda p: _arg(_prefill(p)["command"], "--max-model-len"), _int_text),
    "prefill.engine.max_num_batched_tokens": (
        int, (20480, 32768), lambda p: _arg(_prefill(p)["command"], "--max-num-batched-tokens"), _int_text),
    "decode.engine.max_num_seqs": (int, (16, 64), lambda p: _arg(_decode(p)["command"], "--max-num-seqs"), _int_text),
    "decode.engine.gpu_memory_utilization": (
        float, (0.5, 0.89), lambda p: _arg(_decode(p)["command"], "--gpu-memory-utilization"), float),
    "decode.engine.num_speculative_tokens": (
        int, (1, 3), lambda p: json.loads(_arg(_decode(p)["command"], "--speculative-config"))["num_speculative_tokens"],
        _json_int),
}


def _cluster():
    return {"name": "cluster_a", "vllm_ascend_version": "main", "image": "quay.io/ascend/vllm-ascend:nightly-main",
            "model": {"path": "/data/models/DeepSeek-V4-Flash"}}


def _fleet(raw):
    return {"hosts": [member("a-p0", "cluster_a", "prefill", raw, "10.0.0.11"),
                      member("a-d0", "cluster_a", "decode", raw, "10.0.0.12")], "limit": None}


@st.composite
def written(draw, field):
    """(value as written in YAML, the number the operator meant)."""
    kind, (low, high), _, _ = FIELDS[field]
    if kind is int:
        meant = draw(st.integers(min_value=low, max_value=high))
    else:
        meant = draw(st.floats(min_value=low, max_value=high, allow_nan=False).filter(lambda x: x > 0))
    form = draw(st.sampled_from(["int", "float", "half", "text", "float text"]))
    if form == "int":
        value = int(meant) if kind is int else meant
    elif form == "float":
        value = float(meant)
    elif form == "half":
        value = meant + 0.5
        meant = value
    elif form == "text":
        value = str(meant)
    else:
        value = str(float(meant))
    return value, meant


@st.composite
def inventories(draw):
    fields = draw(st.lists(st.sampled_from(sorted(FIELDS)), min_size=1, max_size=3, unique=True))
    return {field: draw(written(field)) for field in fields}


def _set(raw, field, value):
    keys = field.split(".")
    for key in keys[:-1]:
        raw = raw.setdefault(key, {})
    raw[keys[-1]] = value


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inventories())
def test_a_number_is_refused_on_its_field_or_rendered_as_its_reader_parses_it(changes):
    raw = _cluster()
    for field, (value, _) in changes.items():
        _set(raw, field, value)
    plan = fleet.plan_fleet(_fleet(raw))
    assert not any("internal error" in m for m in plan["messages"]), plan["messages"]
    refused = {v["field"] for v in plan["violations"] if v["level"] == "error"}
    rendered = bool(plan["hosts"].get("a-p0", {}).get("specs"))
    for field, (value, meant) in changes.items():
        if field in refused:
            continue
        if not rendered:
            # refused as a whole on another of the generated fields (a port clash, a bound), never silently
            assert plan["ok"] is False and refused, plan["messages"]
            continue
        kind, _, read, parse = FIELDS[field]
        text = read(plan)
        if text is None:  # not rendered at its default (HCCL_IF_BASE_PORT 60000)
            continue
        parsed = parse(text)
        assert type(parsed) is kind and parsed == (kind(meant) if kind is float else meant), (field, value, text)
        if kind is int:
            assert isinstance(value, int), f"{field}: {value!r} was accepted and rendered as {text!r}"


def test_whole_ints_everywhere_are_accepted_and_rendered_as_written():
    """The property is not vacuous: ints in range render and parse back exactly."""
    raw = _cluster()
    for field, (kind, (low, _), _, _) in FIELDS.items():
        _set(raw, field, low if kind is int else 0.75)
    plan = fleet.plan_fleet(_fleet(raw))
    assert plan["ok"], plan["messages"]
    for field, (kind, (low, _), read, parse) in FIELDS.items():
        assert parse(read(plan)) == (low if kind is int else 0.75), field
