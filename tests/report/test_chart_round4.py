"""A profile shaped to make the picture huge: `card --profile` drew every category and every draft position, so 18,000
small categories (a 15 MB profile, under the 16 MiB limit) took 5.8 s and 500 MB for a 72 MB SVG, and 100,000 draft
positions 17.7 s and 1.2 GB for a 200 MB SVG. The chart draws at most MAX_CATEGORIES panels of MAX_POSITIONS
positions and names what it left out; a profile with more draft positions than its block has is refused as numbers
no smoke run writes."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET

import pytest
from test_chart import SVG, TARGET, TINY, bars, profile_of, synthetic

from lilicorr_ckpt.cli import main
from lilicorr_ckpt.report.chart import MAX_CATEGORIES, MAX_POSITIONS, acceptance_svg, smoke_html


def _many(categories: int, positions: int) -> dict:
    doc = synthetic()
    rates = [0.5] * positions
    arm = {
        "requests": 1,
        "blocks": 1,
        "tokens": 1,
        "mean_accept_length": 1.0,
        "mean_accept_length_per_request": 1.0,
        "conditional_accept_rates": rates,
        "marginal_accept_rates": rates,
        "acceptance_length_histogram": {},
        "wall_time_s": 0.0,
        "tokens_per_second": 0.0,
        "speedup_vs_ar": None,
    }
    for a in doc["arms"].values():
        a.update(conditional_accept_rates=rates, marginal_accept_rates=rates, position_counts=[])
    entry = {
        "requests": 1,
        "mean_accept_length": 1.0,
        "mean_accept_length_per_request": 1.0,
        "conditional_accept_rates": rates,
        "marginal_accept_rates": rates,
        "acceptance_length_histogram": {},
        "arms": {"head": arm, "control": arm},
    }
    doc["per_category"] = {f"<c{i}>": entry for i in range(categories)}
    doc["block_size"] = positions + 1
    return doc


def test_a_picture_of_thousands_of_categories_and_positions_stays_small():
    profile = profile_of(_many(300, 200))
    began = time.monotonic()
    svg = acceptance_svg(profile)
    page = smoke_html(profile)
    assert time.monotonic() - began < 1.0
    assert len(svg) < 1_000_000  # all of it drawn: 7 MB here, 72 MB for 18,000 categories
    root = ET.fromstring(svg)
    drawn = bars(root)
    assert len(drawn) == (1 + MAX_CATEGORIES) * 2 * MAX_POSITIONS
    assert {scope for scope, _, _ in drawn} == {"all", *(f"<c{i}>" for i in range(MAX_CATEGORIES))}
    note = next(t for t in root.iter(f"{SVG}text") if "left-out" in (t.get("class") or ""))
    assert note.text == (
        f"not drawn: draft positions {MAX_POSITIONS + 1}-200, {300 - MAX_CATEGORIES} more categories "
        "(the profile holds them)"
    )
    assert svg in page and "&lt;c299&gt;" in page  # the page's τ table still lists every category


def test_a_profile_drawn_whole_has_no_note():
    svg = acceptance_svg(profile_of(synthetic()))
    assert "not drawn" not in svg


def test_card_refuses_more_draft_positions_than_the_block_has(tmp_path, capsys):
    doc = synthetic()
    doc["block_size"] = 8
    doc["arms"]["head"]["marginal_accept_rates"] = [0.5] * 100_000
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(doc))
    out = tmp_path / "card"
    out.mkdir()
    with pytest.raises(SystemExit) as exc:
        main(
            ["card", str(TINY), "-t", str(TARGET), "--profile", str(profile), "--allow-unverified"]
            + ["-o", str(out / "README.md")]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "$.arms.head.marginal_accept_rates: 100000 draft positions in blocks of 8" in err
    assert not any(out.iterdir())
