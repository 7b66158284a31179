"""Unit tests for plugin_utils.sizes: human sizes, per-rank splits, short human strings."""

import pytest
from ansible.errors import AnsibleFilterError
from hypothesis import given
from hypothesis import strategies as st
from jinja2.nativetypes import NativeEnvironment

from ansible_collections.pd.deploy.plugins.plugin_utils.shared import sizes
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.sizes import check_int, check_number, parse_size, split_per_rank, to_bytes, to_human

GiB = 1024**3
MiB = 1024**2
KiB = 1024

UNITS = {"K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}


# --- to_bytes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        ("200GiB", 200 * GiB),
        ("200gib", 200 * GiB),
        ("200 GIB", 200 * GiB),
        ("200 gib", 200 * GiB),
        ("25 GiB", 25 * GiB),
        ("  25 GiB  ", 25 * GiB),
        ("1.5GiB", 3 * GiB // 2),
        (".5KiB", KiB // 2),
        ("512MiB", 512 * MiB),
        ("1KiB", KiB),
        ("1kib", KiB),
        ("2TiB", 2 * 1024**4),
        ("1PiB", 1024**5),
        ("3B", 3),
        ("3b", 3),
        ("1024", 1024),
        ("0", 0),
        (0, 0),
        (26843545600, 26843545600),
        (1610612736.0, 1610612736),
    ],
)
def test_to_bytes_accepts(value, expected):
    assert to_bytes(value) == expected
    assert type(to_bytes(value)) is int


def test_to_bytes_article_200gb():
    # DOMAIN §5: the article's 200 GB = 200 x 1024^3 = 214,748,364,800 bytes, written 200GiB here.
    assert to_bytes("200GiB") == 200 * 1024**3 == 214748364800


@pytest.mark.parametrize("text, binary, decimal", [
    ("200G", 200 * 1024**3, 200 * 1000**3),
    ("200GB", 200 * 1024**3, 200 * 1000**3),
    ("200gb", 200 * 1024**3, 200 * 1000**3),
    ("256g", 256 * 1024**3, 256 * 1000**3),
    ("1.5T", 3 * 1024**4 // 2, 1500 * 1000**3),
    ("64 MB", 64 * 1024**2, 64 * 1000**2),
])
def test_decimal_looking_units_are_refused_with_both_readings(text, binary, decimal):
    # issue 12: 200G and 200GB were silently 200 GiB, 200gb a generic schema error; now one grammar:
    # refused, the message gives both byte counts and the binary spelling to use
    with pytest.raises(PdError) as info:
        to_bytes(text, field="decode.cpu_offload", where="c1/decode")
    assert "ambiguous" in info.value.problem
    assert str(binary) in info.value.problem and str(decimal) in info.value.problem
    assert "iB" in info.value.fix


@pytest.mark.parametrize(
    "value, words",
    [
        (None, "None"),
        (True, "boolean"),
        (False, "boolean"),
        (-1, "negative"),
        (-1.0, "negative"),
        ("-3GiB", "negative"),
        ("abc", "cannot read"),
        ("1.5.2GiB", "cannot read"),
        ("1,024", "cannot read"),
        ("1e9", "cannot read"),
        ("", "empty"),
        ("   ", "empty"),
        ("10X", "unknown unit"),
        ("10GiBs", "unknown unit"),
        ("10Bb", "unknown unit"),
        (0.3, "whole number of bytes"),
        ("0.3", "whole number of bytes"),
        ("0.1KiB", "whole number of bytes"),
        (float("nan"), "finite"),
        (float("inf"), "finite"),
        ([200], "not a size"),
        ({"size": 1}, "not a size"),
    ],
)
def test_to_bytes_refuses(value, words):
    with pytest.raises(PdError) as info:
        to_bytes(value)
    assert words in str(info.value)
    assert str(info.value).startswith("pd_to_bytes: size: ")


def test_to_bytes_error_names_where_and_field():
    with pytest.raises(PdError) as info:
        to_bytes("lots", field="prefill.cpu_offload", where="pd_normalize")
    error = info.value
    assert (error.where, error.field) == ("pd_normalize", "prefill.cpu_offload")
    assert str(error).startswith("pd_normalize: prefill.cpu_offload: ")
    assert "'lots'" in str(error)
    assert error.fix and "200GiB" in error.fix


def test_pd_error_is_a_filter_error():
    with pytest.raises(AnsibleFilterError):
        to_bytes("abc")


def test_parse_size_keeps_fractions():
    # 12.34 GiB as printed by vLLM is not a whole number of bytes; parse_size keeps it exact.
    exact = parse_size("12.34GiB")
    assert exact * 100 == 1234 * GiB
    with pytest.raises(PdError):
        to_bytes("12.34GiB")


@given(st.integers(min_value=0, max_value=2**80))
def test_to_bytes_int_and_digit_string_round_trip(n):
    assert to_bytes(n) == n
    assert to_bytes(str(n)) == n
    assert to_bytes(f"{n}B") == n


@given(
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(sorted(UNITS)),
    st.sampled_from(["{k}{u}i", "{k}{u}iB", "{k} {u}iB", "{k}{l}ib", "{k}{l}iB", "{k} {l}IB"]),
)
def test_to_bytes_unit_spellings(k, unit, pattern):
    text = pattern.format(k=k, u=unit, l=unit.lower())
    assert to_bytes(text) == k * 1024 ** UNITS[unit]


@given(st.integers(min_value=0, max_value=2**40), st.sampled_from(sorted(UNITS)))
def test_to_bytes_halves(n, unit):
    # n + 0.5 units is whole for every binary unit.
    assert to_bytes(f"{n}.5{unit}iB") == n * 1024 ** UNITS[unit] + 1024 ** UNITS[unit] // 2


@given(st.one_of(st.text(max_size=12), st.floats(allow_nan=True), st.integers(), st.none(), st.booleans()))
def test_to_bytes_only_returns_int_or_raises_pd_error(value):
    try:
        result = to_bytes(value)
    except PdError:
        return
    assert isinstance(result, int) and result >= 0


def test_to_bytes_twice_same_answer():
    assert to_bytes("200GiB") == to_bytes("200GiB")
    for bad in ("abc", "-3G"):
        messages = []
        for _ in range(2):
            with pytest.raises(PdError) as info:
                to_bytes(bad)
            messages.append(str(info.value))
        assert messages[0] == messages[1]


# --- split_per_rank -------------------------------------------------------------------------------


def test_split_article_200gib_over_8():
    # DOMAIN §5: 200 GiB over 8 cards = 26,843,545,600 per rank (25 GiB).
    total = 200 * 1024**3
    assert split_per_rank("200GiB", 8) == total // 8 == 26843545600 == 25 * GiB
    assert split_per_rank(total, 8) == total // 8


def test_split_not_dividing_names_remainder_and_fix():
    total = 200 * GiB
    remainder = total % 7
    with pytest.raises(PdError) as info:
        split_per_rank("200GiB", 7)
    text = str(info.value)
    assert text.startswith("pd_split_per_rank: total: ")
    assert f"remainder {remainder} bytes" in text
    below = total // (7 * GiB) * 7  # whole GiB per rank, rounded down: 196 GiB
    assert f"{below}GiB" in text and f"{below + 7}GiB" in text
    assert "align" in text


def test_split_with_align_rounds_down():
    total, ranks, align = 200 * GiB, 7, 2 * MiB
    assert split_per_rank("200GiB", ranks, align="2MiB") == (total // ranks) // align * align
    assert split_per_rank("200GiB", 8, align=align) == 25 * GiB


@pytest.mark.parametrize(
    "args, field",
    [
        (("200GiB", 0), "ranks"),
        (("200GiB", -8), "ranks"),
        (("200GiB", True), "ranks"),
        (("200GiB", "8"), "ranks"),
        (("200GiB", 8.0), "ranks"),
        (("lots", 8), "total"),
        ((None, 8), "total"),
        (("-200GiB", 8), "total"),
        (("200GiB", 8, 0), "align"),
        (("200GiB", 8, "2XB"), "align"),
        (("1MiB", 8, "1MiB"), "align"),  # 128 KiB per rank rounds down to 0
    ],
)
def test_split_refuses(args, field):
    with pytest.raises(PdError) as info:
        split_per_rank(*args)
    assert info.value.field == field
    assert info.value.where == "pd_split_per_rank"


def test_split_zero_total_is_zero():
    assert split_per_rank(0, 8) == 0


@given(st.integers(min_value=0, max_value=2**50), st.integers(min_value=1, max_value=128))
def test_split_exact_when_divisible(per_rank, ranks):
    total = per_rank * ranks
    assert split_per_rank(total, ranks) * ranks == total
    assert split_per_rank(str(total), ranks) == per_rank


@given(
    st.integers(min_value=1, max_value=2**50),
    st.integers(min_value=1, max_value=128),
    st.integers(min_value=1, max_value=2**24),
)
def test_split_aligned_is_multiple_and_not_above_share(total, ranks, align):
    try:
        result = split_per_rank(total, ranks, align=align)
    except PdError as error:
        assert error.field == "align"
        assert total // ranks < align
        return
    assert result % align == 0
    assert result * ranks <= total
    assert total // ranks - result < align  # rounded down to the nearest multiple, not further


@given(st.integers(min_value=1, max_value=2**50), st.integers(min_value=2, max_value=128))
def test_split_not_divisible_always_pd_error(total, ranks):
    if total % ranks == 0:
        assert split_per_rank(total, ranks) == total // ranks
    else:
        with pytest.raises(PdError) as info:
            split_per_rank(total, ranks)
        assert f"remainder {total % ranks} bytes" in str(info.value)


def test_split_twice_same_answer():
    assert split_per_rank("200GiB", 8) == split_per_rank("200GiB", 8)
    assert split_per_rank("200GiB", 7, "2MiB") == split_per_rank("200GiB", 7, "2MiB")


# --- to_human -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, expected",
    [
        (200 * GiB, "200GiB"),
        (25 * GiB, "25GiB"),
        (3 * GiB // 2, "1.5GiB"),
        (256 * GiB, "256GiB"),
        (1024**4, "1TiB"),
        (512, "512B"),
        (0, "0B"),
        (KiB, "1KiB"),
        (GiB - 1, "1GiB"),  # 1023.999... MiB rounds up into the next unit
        ("200GiB", "200GiB"),
    ],
)
def test_to_human(n, expected):
    assert to_human(n) == expected


def test_to_human_approximate_has_two_decimals():
    n = 4 * GiB // 3  # 1.333... GiB
    assert to_human(n) == f"{n / GiB:.2f}GiB"


@pytest.mark.parametrize("bad", [-1, "abc", None, True])
def test_to_human_refuses(bad):
    with pytest.raises(PdError) as info:
        to_human(bad)
    assert info.value.where == "pd_to_human"


@given(st.integers(min_value=1, max_value=1023), st.sampled_from(sorted(UNITS)))
def test_to_human_round_trip_for_round_sizes(k, unit):
    n = k * 1024 ** UNITS[unit]
    assert to_bytes(to_human(n)) == n


def test_to_human_twice_same_answer():
    assert to_human(3 * GiB // 2) == to_human(3 * GiB // 2) == "1.5GiB"


# --- shared checks --------------------------------------------------------------------------------


def test_check_int():
    assert check_int(8, "devices", "pd_x") == 8
    assert check_int(0, "n", "pd_x", minimum=0) == 0
    for bad in (0, True, "8", 8.0, None):
        with pytest.raises(PdError) as info:
            check_int(bad, "devices", "pd_x")
        assert str(info.value).startswith("pd_x: devices: ")


def test_check_number():
    assert check_number(0.85, "u", "pd_x", low=0, high=1, low_open=True) * 20 == 17
    assert check_number(1, "u", "pd_x", low=0, high=1, low_open=True) == 1
    for bad in (0, 1.2, "0.85", True, float("nan"), None):
        with pytest.raises(PdError) as info:
            check_number(bad, "u", "pd_x", low=0, high=1, low_open=True)
        assert str(info.value).startswith("pd_x: u: ")
    with pytest.raises(PdError):
        check_number(1, "u", "pd_x", high=1, high_open=True)


# --- registration ---------------------------------------------------------------------------------


def test_to_bytes_through_jinja():
    # the one filter of this module (plugins/filter/pd.py); split_per_rank and to_human are plain functions
    from ansible_collections.pd.deploy.plugins.filter import pd
    env = NativeEnvironment()
    env.filters.update(pd.FilterModule().filters())
    assert env.filters["pd_to_bytes"] is to_bytes
    assert env.from_string("{{ '25 GiB' | pd_to_bytes }}").render() == 25 * GiB
    assert env.from_string("{{ ('1.5GiB' | pd_to_bytes) + 1 }}").render() == 3 * GiB // 2 + 1
    with pytest.raises(PdError):
        env.from_string("{{ 'lots' | pd_to_bytes }}").render()


def test_no_module_level_mutable_state():
    mutable = (list, dict, set, bytearray)
    names = [
        name
        for name, value in vars(sizes).items()
        if isinstance(value, mutable) and not name.startswith("__")
    ]
    assert names == []
