"""plugins/plugin_utils/data/models.yml: the expected KV bytes/token band per model family, and its loader."""

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.ops import common
from ansible_collections.pd.deploy.plugins.plugin_utils.ops.logparse import FAR_HIGH_FACTOR, judge_bytes_per_token
from ansible_collections.pd.deploy.plugins.plugin_utils.plan import model
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError

DATA = common.models()


def test_the_default_family_of_defaults_yml_has_data():
    family = model.defaults()["cluster"]["model"]["family"]
    assert family in DATA
    assert common.DEFAULT_FAMILY == family


@pytest.mark.parametrize("family", sorted(DATA))
def test_every_family_has_a_band_with_a_stated_source(family):
    band = DATA[family]["bytes_per_token"]
    assert set(band) == {"min", "max", "source"}
    assert isinstance(band["min"], int) and isinstance(band["max"], int)
    assert 0 < band["min"] < band["max"]
    assert len(band["source"].strip()) > 40, "say where the numbers come from"
    # the band must be one pd_judge_bytes_per_token accepts as it is
    assert judge_bytes_per_token((band["min"] + band["max"]) / 2, band)["verdict"] == "ok"


@pytest.mark.parametrize("family", sorted(DATA))
def test_every_family_has_an_estimate_inside_its_band(family):
    est = DATA[family]["estimate"]
    band = DATA[family]["bytes_per_token"]
    assert set(est) == {"marginal_bytes_per_token", "fixed_bytes_per_request", "source"}
    assert band["min"] <= est["marginal_bytes_per_token"] <= band["max"]
    assert est["fixed_bytes_per_request"] >= 0
    assert est["source"].strip()


def test_v4_flash_band_is_centred_on_the_ascend_layout_not_cuda_fp8():
    """The band holds the marginal cost derived from vllm-ascend's A2/A3 cache layout (6,218.5 B/token);
    the CUDA fp8 public fit (~3,300 B) and the article's "100K tokens ~ 300 MB" (~3,146 B) are below it
    (another cache dtype), and the article's "6~8 bytes/token" is far below (KiB read as bytes)."""
    band = DATA["deepseek_v4_flash"]["bytes_per_token"]
    assert band["min"] <= 6218.5 <= band["max"]
    for other in (300 * 1024 ** 2 / 100_000, 3300):
        assert judge_bytes_per_token(other, band)["verdict"] == "low"
    assert band["min"] > 8, "6~8 bytes/token would put every real engine far_high"


def test_v4_flash_band_separates_a_disabled_hybrid_manager():
    """Ten times the derived marginal rate (KV compression lost) must be judged far_high."""
    band = DATA["deepseek_v4_flash"]["bytes_per_token"]
    assert judge_bytes_per_token(10 * 6218.5, band)["verdict"] == "far_high"
    assert judge_bytes_per_token(10 * band["max"], band)["verdict"] == "far_high"
    assert FAR_HIGH_FACTOR * band["max"] <= 10 * band["max"]


def test_model_band_returns_a_fresh_copy_and_accepts_an_override():
    first = common.model_band("deepseek_v4_flash")
    first["max"] = 1
    assert common.model_band("deepseek_v4_flash")["max"] == DATA["deepseek_v4_flash"]["bytes_per_token"]["max"]
    override = {"min": 4096, "max": 16384, "source": "our bf16 KV measurement, 2026-05"}
    assert common.model_band("deepseek_v4_flash", override) == override
    assert common.model_band(None) == common.model_band("deepseek_v4_flash")


@pytest.mark.parametrize("override, field", [
    ({"min": 4096, "max": 16384}, "override.source"),
    ({"min": 4096, "max": 16384, "source": " "}, "override.source"),
    ({"min": 16384, "max": 4096, "source": "x"}, "override.min"),
    ({"min": "4k", "max": 16384, "source": "x"}, "override.min"),
])
def test_a_bad_override_is_refused_naming_the_field(override, field):
    with pytest.raises(PdError) as info:
        common.model_band("deepseek_v4_flash", override)
    assert info.value.field == field


def test_an_unknown_family_names_the_known_ones():
    with pytest.raises(PdError) as info:
        common.model_band("llama")
    assert "deepseek_v4_flash" in str(info.value)
