"""--port-records: one scope for which records a port runs, in every family (dry)."""

from __future__ import annotations

import pytest

from oracles.families.port_scope import PortScope


@pytest.mark.dry
def test_sample_all_and_a_token_limit() -> None:
    sample, every, upto = PortScope.parse("sample"), PortScope.parse("all"), PortScope.parse("512")
    assert sample.selects(80, sample_tokens=80) and not sample.selects(81, sample_tokens=80)
    assert every.selects(4000, sample_tokens=80)
    assert upto.selects(512, sample_tokens=80) and not upto.selects(513, sample_tokens=1000)
    reason = upto.skip_reason("mlx", "town_almanac_4k", 2428)
    assert "'town_almanac_4k'" in reason and "--port-records 512" in reason and "2428" in reason


@pytest.mark.dry
@pytest.mark.parametrize("raw", ["", "0", "-5", "some", "1e3"])
def test_bad_values_are_refused(raw: str) -> None:
    with pytest.raises(ValueError, match=f"--port-records {raw!r}: expected 'sample', 'all' or a positive number"):
        PortScope.parse(raw)


def test_the_option_refuses_a_bad_value(pytester: pytest.Pytester) -> None:
    """``--port-records`` with a value it does not take is a usage error naming it. Not dry: an inner pytest session."""
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest("--port-records", "lots", "--no-receipt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--port-records 'lots': expected 'sample', 'all' or a positive number of tokens*"])
