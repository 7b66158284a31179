"""plugin_utils.ops.gate: two answer sets compared token by token."""

import copy

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.ops import gate
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError


def test_token_gate_with_one_changed_token_fails_at_its_position():
    a = [[11, 12, 13, 14], [21, 22, 23, 24, 25], [31, 32]]
    b = copy.deepcopy(a)
    b[1][3] = 99
    got = gate.token_gate(a, b)
    assert got["passed"] is False and got["prompts"] == 3
    assert got["mismatches"] == [{
        "prompt_index": 1, "first_diverging_position": 3, "unit": "token", "a_token": a[1][3], "b_token": 99,
        "a_excerpt": a[1][0:8], "b_excerpt": b[1][0:8]}]
    assert gate.token_gate(a, copy.deepcopy(a)) == {"passed": True, "prompts": 3, "compared_by": ["token_ids"] * 3,
                                                    "mismatches": []}


def test_token_gate_on_texts_reports_the_character_and_a_shorter_answer():
    text = "the quick brown fox"
    pos = text.index("brown")
    got = gate.token_gate([text, "abc"], [text[:pos] + "green fox", "ab"])
    first, second = got["mismatches"]
    assert (first["prompt_index"], first["first_diverging_position"], first["unit"]) == (0, pos, "character")
    assert (first["a_token"], first["b_token"]) == ("b", "g")
    assert (second["first_diverging_position"], second["a_token"], second["b_token"]) == (2, "c", None)


def test_token_gate_prefers_token_ids_and_checks_records_match():
    a = {"prompts": ["p"], "settings": {"max_tokens": 4}, "answers": [{"text": "x y", "token_ids": [1, 2]}]}
    b = {"prompts": ["p"], "settings": {"max_tokens": 4}, "answers": [{"text": "x y", "token_ids": [1, 3]}]}
    got = gate.token_gate(a, b)
    assert got["compared_by"] == ["token_ids"] and got["mismatches"][0]["first_diverging_position"] == 1
    with pytest.raises(PdError) as info:
        gate.token_gate(a, dict(b, prompts=["q"]))
    assert info.value.field == "prompts"
    with pytest.raises(PdError) as info:
        gate.token_gate(a, dict(b, settings={"max_tokens": 8}))
    assert info.value.field == "settings"
    with pytest.raises(PdError):
        gate.token_gate([[1]], [[1], [2]])


def test_gate_answers_reads_text_and_token_ids_and_names_failed_prompts():
    results = [
        {"status": 200, "json": {"choices": [{"text": "a b", "token_ids": [5, 6]}]}},
        {"status": 200, "json": {"choices": [{"text": "c", "logprobs": {"tokens": ["token_id:7"]}}]}},
        {"status": 200, "json": {"choices": [{"message": {"content": "chat"}}]}},
    ]
    assert gate.gate_answers(results) == [{"text": "a b", "token_ids": [5, 6]}, {"text": "c", "token_ids": [7]},
                                         {"text": "chat", "token_ids": None}]
    with pytest.raises(PdError) as info:
        gate.gate_answers(results + [{"status": 503, "msg": "engine is not ready"}])
    assert "prompt 3: HTTP 503 engine is not ready" in str(info.value)
