"""A runtime selection whose version has a component of thousands of digits (`vllm==999...9`, `vllm>=000...0`):
int() refuses past 4,300 digits, and that ValueError was an internal error in the command line and the pre-commit
hook and a ValueError from the API. A selection longer than any real one (1,000 characters) is a usage error
everywhere, shown cut rather than echoed whole."""

from __future__ import annotations

import pytest

import lilicorr_ckpt
from lilicorr_ckpt.cli import main
from lilicorr_ckpt.errors import UsageError
from lilicorr_ckpt.precommit import main as precommit_main
from lilicorr_ckpt.runtimes import select_profiles

from helpers import REPO

TINY = REPO / "examples" / "tiny-lilicorr"
HUGE = [
    "vllm==" + "9" * 5000,
    "vllm>=" + "0" * 100_000,
    "sglang==0.5." + "1" * 4301,
    "vllm==0.33.0,<" + "7" * 9000,
]


@pytest.mark.parametrize("spec", HUGE, ids=["==", ">=", "third component", "continued clause"])
def test_a_version_of_thousands_of_digits_is_a_usage_error_in_the_api(spec):
    with pytest.raises(UsageError, match="characters long; the limit is 1000") as exc:
        select_profiles(spec)
    assert len(str(exc.value)) < 1000  # shown cut
    with pytest.raises(UsageError):
        lilicorr_ckpt.validate(str(TINY), runtime=spec)


@pytest.mark.parametrize("spec", HUGE[:2], ids=["==", ">="])
def test_a_version_of_thousands_of_digits_is_exit_4_in_the_cli_and_the_hook(capsys, spec):
    with pytest.raises(SystemExit) as exc:
        main(["validate", str(TINY), "-r", spec])
    err = capsys.readouterr().err
    assert exc.value.code == 4 and "internal error" not in err and "ValueError" not in err
    assert "characters long; the limit is 1000" in err and len(err) < 2000
    with pytest.raises(SystemExit) as exc:
        precommit_main(["-r", spec, "--", str(TINY / "config.json")])
    err = capsys.readouterr().err
    assert exc.value.code == 4 and "internal error" not in err and "ValueError" not in err


def test_a_megabyte_selection_is_shown_cut():
    with pytest.raises(UsageError) as exc:
        select_profiles("x" * 1_000_000)
    assert len(str(exc.value)) < 1000 and "(cut)" in str(exc.value)


def test_versions_of_ordinary_length_still_select():
    assert [p.release_id for p in select_profiles("vllm==0.33.0")] == ["vllm==0.33.0"]
    assert len(select_profiles("vllm>=0.32,<0.34")) == 2
    with pytest.raises(UsageError, match="no supported vLLM release"):
        select_profiles("vllm==" + "1" * 900)  # a long version of ordinary digits is just no release
