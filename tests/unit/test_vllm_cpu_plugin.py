"""The test-only vLLM plugin of pd-test/vllm-cpu (tests/fixtures/images/vllm_cpu/pd_test_vllm_plugin/),
against stand-ins of the two vLLM 0.27.1 / torch names it patches (neither is installed here).

Each bridge must change behaviour only where the unpatched code fails (no accelerator; a child without
Prometheus metrics) and be safe to load twice (vLLM loads general plugins once per process, maybe more).
"""

import importlib
import os
import sys
import types

import pytest

PLUGIN_DIR = os.path.join(os.path.dirname(__file__), "..", "fixtures", "images", "vllm_cpu", "pd_test_vllm_plugin")
# imported under its package path; dropped from sys.modules first so each test starts from a fresh load
MODULE = "tests.fixtures.images.vllm_cpu.pd_test_vllm_plugin.pd_test_vllm_plugin"


class _Metrics:
    """vLLM 0.27.1 multi_connector.MultiKVConnectorPromMetrics.observe, as upstream writes it."""

    def __init__(self, prom_metrics):
        self._prom_metrics = prom_metrics

    def observe(self, transfer_stats_data, engine_idx=0):
        for connector_id, stats_data in transfer_stats_data.items():
            assert connector_id in self._prom_metrics, f"{connector_id} is not contained in the list"
            self._prom_metrics[connector_id].observe(stats_data["data"], engine_idx)


class _Child:
    def __init__(self):
        self.seen = []

    def observe(self, data, engine_idx=0):
        self.seen.append((data, engine_idx))


@pytest.fixture()
def plugin(monkeypatch):
    state = {"accelerator": None}

    def current_device_index():
        if state["accelerator"] is None:
            raise RuntimeError("no accelerator")
        return 3

    accelerator = types.SimpleNamespace(current_device_index=current_device_index,
                                        current_accelerator=lambda: state["accelerator"])
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(accelerator=accelerator))
    multi = types.ModuleType("multi_connector")
    multi.MultiKVConnectorPromMetrics = type("MultiKVConnectorPromMetrics", (_Metrics,), {})
    v1 = types.ModuleType("v1")
    v1.multi_connector = multi
    for name in ("vllm", "vllm.distributed", "vllm.distributed.kv_transfer",
                 "vllm.distributed.kv_transfer.kv_connector"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.distributed.kv_transfer.kv_connector.v1", v1)
    monkeypatch.setitem(sys.modules, "vllm.distributed.kv_transfer.kv_connector.v1.multi_connector", multi)
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    module = importlib.import_module(MODULE)
    return module, state, accelerator, multi.MultiKVConnectorPromMetrics


def test_entry_point_names_the_register_function_in_vllms_group():
    with open(os.path.join(PLUGIN_DIR, "entry_points.txt"), encoding="utf-8") as fh:
        text = fh.read()
    assert "[vllm.general_plugins]" in text
    assert "= pd_test_vllm_plugin:register" in text


def test_device_index_is_0_without_accelerator_and_the_original_with_one(plugin):
    module, state, accelerator, _ = plugin
    with pytest.raises(RuntimeError):
        accelerator.current_device_index()
    module.register()
    module.register()
    assert accelerator.current_device_index() == 0
    state["accelerator"] = "cuda"
    assert accelerator.current_device_index() == 3


def test_observe_skips_children_without_metrics_and_feeds_the_others(plugin):
    module, _, _, cls = plugin
    child = _Child()
    metrics = cls({"MooncakeStoreConnector": child})
    stats = {"MooncakeConnector": {"data": {"x": 1}}, "MooncakeStoreConnector": {"data": {"y": 2}}}
    with pytest.raises(AssertionError):
        metrics.observe(stats)
    module.register()
    module.register()
    child.seen.clear()
    metrics.observe(stats, 1)
    assert child.seen == [({"y": 2}, 1)]
