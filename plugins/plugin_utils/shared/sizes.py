# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Byte sizes: read sizes ("200GiB", "25 GiB", "1.5gib"), split them over ranks, print them back.

One grammar, everywhere a size is read (inventory, extra vars, filters): an integer byte count, or a
number followed by a binary (IEC) unit, optionally separated by spaces, unit case-insensitive:
``B``, ``KiB``, ``MiB``, ``GiB``, ``TiB``, ``PiB``, ``EiB`` (``200GiB``, ``200 gib``, ``1.5TiB``).

Units without the ``i`` (``K``, ``M``, ``G``, ``T``, ``KB``, ``GB``, ``g``, ...) are **refused**, not
converted: Docker's ``--shm-size=200g`` and Ansible's ``human_to_bytes("200GB")`` read them as
200 x 1024**3, the SI reading is 200 x 1000**3, and the two differ by 15 GiB at that size. The error
gives both byte counts and the spelling to use (``200GiB``, or the decimal byte count).

The unit factors are Ansible's own (``ansible.module_utils.common.text.formatters.SIZE_RANGES``). The
arithmetic is exact (``fractions.Fraction``) rather than ``human_to_bytes``' float: that function
silently rounds ``"0.3"`` to 0 and loses whole bytes above 2**53, and offload sizes are passed to vLLM
as exact byte counts (``cpu_bytes_to_use_per_rank: 26843545600``).

The module also holds the small argument checks the other numeric modules of the core share
(``check_int``, ``check_number``), so that every one of them rejects bad input with the same kind of
message.
"""

import math
import re
from fractions import Fraction

from ansible.module_utils.common.text import formatters

from .errors import PdError

_SIZE_RE = re.compile(r"^(?P<num>[0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*(?P<unit>[A-Za-z]*)$")
_UNIT_RE = re.compile(r"^(?P<letter>[KMGTPE])(?P<i>i?)(?P<b>b?)$", re.IGNORECASE)
_UNIT_HELP = "B, KiB, MiB, GiB, TiB, PiB, EiB (binary, 1KiB = 1024 bytes; any letter case)"
#: What the schemas and the guide (docs/guide/inventory.md, Sizes) call the grammar (kept in one place).
GRAMMAR = ("an integer byte count, or a number and a binary unit (B, KiB, MiB, GiB, TiB, PiB, EiB; any letter "
           "case, spaces allowed): 200GiB, 200 gib, 1.5TiB. Decimal-looking units (200G, 200GB) are refused")
_HUMAN_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def _shown(value):
    """Short ``repr`` of a bad value for an error message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_int(value, field, where, minimum=1):
    """Return ``value`` if it is an int (not a bool) >= ``minimum``, else raise ``PdError``.

    Strings and floats are refused on purpose: a count of devices, ranks or tokens written as
    ``"8"`` or ``8.0`` is a typo in the inventory, not something to guess about.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise PdError(
            where,
            field,
            f"{_shown(value)} ({type(value).__name__}) is not a whole number",
            f"write an integer >= {minimum} without quotes",
        )
    if value < minimum:
        raise PdError(where, field, f"{value} is below {minimum}", f"use an integer >= {minimum}")
    return value


def check_number(value, field, where, low=None, high=None, low_open=False, high_open=False):
    """Return ``value`` as an exact ``Fraction`` if it is a finite real number inside the range.

    ``low``/``high`` bound the range (``None`` = unbounded); ``low_open``/``high_open`` exclude the
    bound itself. Floats are read through their shortest decimal form, so ``0.85`` is exactly 17/20
    and ``512GiB x 0.85`` does not pick up a binary-float error in the last byte. Bools and strings
    are refused.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PdError(
            where,
            field,
            f"{_shown(value)} ({type(value).__name__}) is not a number",
            "write a number without quotes",
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise PdError(where, field, f"{value} is not a finite number", "write a finite number")
    exact = Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
    below = low is not None and (exact <= low if low_open else exact < low)
    above = high is not None and (exact >= high if high_open else exact > high)
    if below or above:
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        lo = "-inf" if low is None else f"{low}"
        hi = "inf" if high is None else f"{high}"
        raise PdError(
            where, field, f"{value} is outside {left}{lo}, {hi}{right}", f"use a value in {left}{lo}, {hi}{right}"
        )
    return exact


def parse_size(value, field="size", where="pd_to_bytes"):
    """Read a size as an exact ``Fraction`` of bytes, which may be fractional ("0.1KiB" = 102.4).

    Same input rules as ``to_bytes`` except that the result need not be a whole number of bytes;
    ``to_bytes`` and the log parser (which reads "12.34 GiB") build on it.
    """
    if value is None:
        raise PdError(where, field, "no size given (None)", 'give a size such as "200GiB" or a byte count')
    if isinstance(value, bool):
        raise PdError(where, field, f"{value} is a boolean, not a size", 'give a size such as "200GiB" or a byte count')
    if isinstance(value, int):
        exact = Fraction(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise PdError(where, field, f"{value} is not a finite size", "give a byte count or a size such as 25GiB")
        exact = Fraction(value)
    elif isinstance(value, str):
        exact = _parse_size_text(value, field, where)
    else:
        raise PdError(
            where,
            field,
            f"{_shown(value)} ({type(value).__name__}) is not a size",
            'give an integer byte count or a string such as "200GiB"',
        )
    if exact < 0:
        raise PdError(where, field, f"{_shown(value)} is negative", "sizes must be 0 or more")
    return exact


def _parse_size_text(value, field, where):
    """Parse the string form of a size; see ``to_bytes``."""
    text = value.strip()
    if not text:
        raise PdError(where, field, "empty string is not a size", 'give a size such as "200GiB" or a byte count')
    if text.startswith("-"):
        raise PdError(where, field, f"{_shown(value)} is negative", "sizes must be 0 or more")
    match = _SIZE_RE.match(text)
    if match is None:
        raise PdError(
            where,
            field,
            f"cannot read {_shown(value)} as a size",
            f'write a number and an optional unit, e.g. "200GiB", "25 GiB", "1.5TiB"; units: {_UNIT_HELP}',
        )
    number = Fraction(match.group("num"))
    unit = match.group("unit")
    if not unit:
        return number
    if unit.upper() == "B":
        return number
    unit_match = _UNIT_RE.match(unit)
    if unit_match is None or unit_match.group("letter").upper() not in formatters.SIZE_RANGES:
        raise PdError(where, field, f"unknown unit {unit!r} in {_shown(value)}", f"use one of {_UNIT_HELP}")
    letter = unit_match.group("letter").upper()
    binary = number * formatters.SIZE_RANGES[letter]
    if not unit_match.group("i"):
        # 200G / 200GB: Docker and Ansible read 1024**3, SI reads 1000**3 -- say both, guess neither
        power = "KMGTPE".index(letter) + 1
        decimal = number * 1000 ** power
        shown_number = match.group("num")
        raise PdError(
            where, field,
            f"{_shown(value)} is ambiguous: {_whole(binary)} bytes as Docker and Ansible read it (binary), "
            f"{_whole(decimal)} bytes in SI units",
            f'write "{shown_number}{letter}iB" for the binary size (what Docker\'s {shown_number}{letter.lower()} '
            f"and the article's {shown_number} {letter}B mean) or the byte count {_whole(decimal)} for the "
            "decimal one")
    return binary


def _whole(exact):
    """A Fraction of bytes as text: the integer when whole, else a short decimal."""
    return str(exact.numerator) if exact.denominator == 1 else f"{float(exact):.6g}"


def to_bytes(value, field="size", where="pd_to_bytes"):
    """Return a size as an int number of bytes.

    Accepts an int >= 0, a float that is a whole number of bytes, or a string of the module's
    grammar: digits (``"1024"``), or a number with a binary unit, optionally separated by spaces, in
    any letter case: ``"200GiB"``, ``"25 GiB"``, ``"200gib"``, ``"1.5GiB"``, ``"512MiB"``.
    A fractional number is fine as long as the bytes come out whole (``"1.5GiB"`` = 1610612736);
    ``"0.3"`` or ``"0.1KiB"`` (102.4 bytes) are refused rather than rounded.

    Raises ``PdError`` for None, bools, negatives (``"-3GiB"``), text that is not a size (``"abc"``,
    ``"1.5.2GiB"``, ``""``), unknown units (``"10X"``), ambiguous units (``"200G"``, ``"200GB"``:
    binary or decimal?) and fractional bytes.
    """
    exact = parse_size(value, field, where)
    if exact.denominator != 1:
        raise PdError(
            where,
            field,
            f"{_shown(value)} is not a whole number of bytes ({float(exact):.6g} bytes)",
            "give a size that is a whole number of bytes, e.g. a larger unit or an integer byte count",
        )
    return int(exact)


def split_per_rank(total, ranks, align=None, where="pd_split_per_rank"):
    """Return the bytes each of ``ranks`` ranks gets out of ``total`` (a size, see ``to_bytes``).

    Without ``align`` the split must be exact: ``"200GiB"`` over 8 ranks is 26843545600 (25GiB),
    the article's ``cpu_bytes_to_use_per_rank``; a total that does not divide raises ``PdError``
    naming the remainder and two totals that would divide. With ``align`` (a size, e.g. ``"2MiB"``
    or an int) the share is rounded down to a multiple of ``align`` instead, and it is an error if
    that leaves 0 bytes. ``ranks`` must be a positive int.
    """
    total_bytes = to_bytes(total, field="total", where=where)
    check_int(ranks, "ranks", where, minimum=1)
    share, remainder = divmod(total_bytes, ranks)
    if align is None:
        if remainder:
            down, up = _dividing_totals(total_bytes, ranks)
            raise PdError(
                where,
                "total",
                f"{_shown(total)} ({total_bytes} bytes) does not divide over {ranks} ranks "
                f"(remainder {remainder} bytes)",
                f"use a total that divides, e.g. {to_human(down)} ({down} bytes) or {to_human(up)} ({up} bytes), "
                f"or pass align (e.g. '2MiB') to round each rank's share down to a multiple of it",
            )
        return share
    align_bytes = to_bytes(align, field="align", where=where)
    if align_bytes == 0:
        raise PdError(
            where, "align", "0 is not an alignment", "give a positive size such as '2MiB', or leave align unset"
        )
    aligned = share // align_bytes * align_bytes
    if aligned == 0:
        raise PdError(
            where,
            "align",
            f"{_shown(total)} over {ranks} ranks is {share} bytes per rank, less than one align unit "
            f"({align_bytes} bytes), so each rank would get 0",
            "raise the total or use a smaller align",
        )
    return aligned


def _dividing_totals(total, ranks):
    """Two round totals near ``total`` that split evenly over ``ranks``: (below, above).

    Round means a whole number of GiB per rank when the total allows it, else MiB, KiB, bytes.
    """
    for unit in (1024**3, 1024**2, 1024, 1):
        step = ranks * unit
        if total >= step or unit == 1:
            down = total // step * step
            return down, down + step
    raise AssertionError("unreachable: unit 1 always returns")  # pragma: no cover


def to_human(n, where="pd_to_human"):
    """Return a short binary size string for summaries: ``200GiB``, ``25GiB``, ``1.5GiB``, ``512B``.

    Uses the largest unit the size reaches, with at most two decimals (trailing zeros dropped), so
    it is exact for round sizes and an approximation otherwise (``1.33GiB``). Accepts anything
    ``to_bytes`` accepts.
    """
    size = to_bytes(n, field="n", where=where)
    for power in range(len(_HUMAN_UNITS) - 1, -1, -1):
        unit = 1024**power
        if size >= unit or power == 0:
            value = Fraction(size, unit)
            if value.denominator == 1:
                return f"{value.numerator}{_HUMAN_UNITS[power]}"
            text = f"{float(value):.2f}".rstrip("0").rstrip(".")
            if text == "1024" and power + 1 < len(_HUMAN_UNITS):
                return f"1{_HUMAN_UNITS[power + 1]}"
            return f"{text}{_HUMAN_UNITS[power]}"
    raise AssertionError("unreachable: power 0 always returns")  # pragma: no cover
