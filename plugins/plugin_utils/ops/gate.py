# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Step 3, the token gate: two answer sets compared token by token (correctness before and after a change)."""

import re
from collections.abc import Mapping

from ..shared.errors import PdError

_TOKEN_ID_RE = re.compile(r"^token_id:(-?\d+)$")


def _choice_token_ids(choice):
    """Token ids of a completion choice when the server returned them, else None."""
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return ids
    tokens = ((choice.get("logprobs") or {}) if isinstance(choice.get("logprobs"), Mapping) else {}).get("tokens")
    if isinstance(tokens, list) and tokens:
        matches = [_TOKEN_ID_RE.match(t) if isinstance(t, str) else None for t in tokens]
        if all(matches):
            return [int(m.group(1)) for m in matches]
    return None


def gate_answers(results):
    """Answers of a token-gate run from the ``uri`` loop over the prompts (one POST each).

    Returns ``[{text, token_ids}]`` in prompt order: ``choices[0].text`` (or ``message.content`` of a
    chat completion) and the token ids when the server returned them (``choices[0].token_ids``, or
    ``logprobs.tokens`` as ``token_id:N`` strings), else None. Any failed request raises ``PdError``
    naming the prompt and the answer.
    """
    where = "pd_gate_answers"
    if not isinstance(results, (list, tuple)):
        raise PdError(where, "results", f"{type(results).__name__} is not a list", "pass the uri loop's .results")
    out, failed = [], []
    for index, res in enumerate(results):
        body = res.get("json") if isinstance(res, Mapping) else None
        choices = body.get("choices") if isinstance(body, Mapping) else None
        if not isinstance(res, Mapping) or res.get("status") != 200 or not choices:
            status = res.get("status") if isinstance(res, Mapping) else None
            detail = (res.get("msg") or "") if isinstance(res, Mapping) else ""
            failed.append(f"prompt {index}: HTTP {status} {detail}".strip())
            continue
        choice = choices[0]
        text = choice.get("text")
        if text is None:
            text = (choice.get("message") or {}).get("content")
        out.append({"text": text if isinstance(text, str) else "", "token_ids": _choice_token_ids(choice)})
    if failed:
        raise PdError(where, "results", f"{len(failed)} request(s) failed: {'; '.join(failed[:5])}",
                      "the endpoint must answer every prompt; check it with the health check first")
    return out


def _answers(side, name, where):
    """(answers, prompts or None, settings or None) of one side of the gate."""
    prompts = settings = None
    if isinstance(side, Mapping):
        prompts, settings = side.get("prompts"), side.get("settings")
        side = side.get("answers")
    if not isinstance(side, (list, tuple)):
        raise PdError(where, name, f"{type(side).__name__} is not a list of answers",
                      "pass one answer per prompt (text, token id list, or {text, token_ids}) or a gate record")
    return list(side), prompts, settings


def _unit(answer, where, name, index):
    """(kind, sequence) of one answer: token ids when present, else the text."""
    if isinstance(answer, Mapping):
        ids = answer.get("token_ids")
        if isinstance(ids, list):
            return "token_ids", ids
        answer = answer.get("text")
    if isinstance(answer, str):
        return "text", answer
    if isinstance(answer, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in answer):
        return "token_ids", list(answer)
    raise PdError(where, f"{name}[{index}]", f"{type(answer).__name__} is not an answer",
                  "give the generated text, a list of token ids or {text, token_ids}")


def token_gate(a, b):
    """Token-level correctness gate: the same prompts, greedy, must give identical output.

    ``a`` and ``b`` are lists with one answer per prompt (generated text, a list of token ids, or
    ``{text, token_ids}``), or gate records ``{prompts, settings, answers}`` (then their prompts and
    settings must be equal). Token ids are compared when both answers have them, else the texts
    (position = character index).

    Returns ``{passed, prompts, compared_by, mismatches}``; each mismatch is ``{prompt_index,
    first_diverging_position, unit, a_token, b_token, a_excerpt, b_excerpt}`` (a token is None where
    that answer already ended).
    """
    where = "pd_token_gate"
    answers_a, prompts_a, settings_a = _answers(a, "a", where)
    answers_b, prompts_b, settings_b = _answers(b, "b", where)
    if len(answers_a) != len(answers_b):
        raise PdError(where, "b", f"{len(answers_b)} answers against {len(answers_a)}",
                      "run both sides with the same prompt set")
    if prompts_a is not None and prompts_b is not None and prompts_a != prompts_b:
        raise PdError(where, "prompts", "the two records were made with different prompt sets",
                      "record both with the same files/token-gate-prompts.yml")
    if settings_a is not None and settings_b is not None and settings_a != settings_b:
        raise PdError(where, "settings", f"different request settings: {settings_a} vs {settings_b}",
                      "record both with the same max_tokens / temperature / seed")
    mismatches, kinds = [], []
    for index, (x, y) in enumerate(zip(answers_a, answers_b)):
        kind_a, seq_a = _unit(x, where, "a", index)
        kind_b, seq_b = _unit(y, where, "b", index)
        if kind_a != kind_b:
            kind_a = kind_b = "text"
            seq_a, seq_b = _unit(x.get("text") if isinstance(x, Mapping) else x, where, "a", index)[1], \
                _unit(y.get("text") if isinstance(y, Mapping) else y, where, "b", index)[1]
        kinds.append(kind_a)
        if seq_a == seq_b:
            continue
        pos = next((i for i, (p, q) in enumerate(zip(seq_a, seq_b)) if p != q), min(len(seq_a), len(seq_b)))
        mismatches.append({
            "prompt_index": index,
            "first_diverging_position": pos,
            "unit": "token" if kind_a == "token_ids" else "character",
            "a_token": seq_a[pos] if pos < len(seq_a) else None,
            "b_token": seq_b[pos] if pos < len(seq_b) else None,
            "a_excerpt": seq_a[max(0, pos - 10):pos + 20] if kind_a == "text" else seq_a[max(0, pos - 3):pos + 5],
            "b_excerpt": seq_b[max(0, pos - 10):pos + 20] if kind_a == "text" else seq_b[max(0, pos - 3):pos + 5],
        })
    return {"passed": not mismatches, "prompts": len(answers_a), "compared_by": kinds, "mismatches": mismatches}


def gate_message(result, label_a="A", label_b="B"):
    """Readable lines of a ``token_gate`` result (the playbook's failure message)."""
    head = (f"token gate {label_a} vs {label_b}: "
            + ("PASSED" if result["passed"] else f"FAILED on {len(result['mismatches'])} of {result['prompts']} prompt(s)"))
    lines = [head]
    for m in result["mismatches"]:
        lines.append(f"  prompt {m['prompt_index']}: first difference at {m['unit']} {m['first_diverging_position']}: "
                     f"{label_a} {m['a_token']!r} vs {label_b} {m['b_token']!r} "
                     f"({label_a} ...{m['a_excerpt']!r}... / {label_b} ...{m['b_excerpt']!r}...)")
    return lines
