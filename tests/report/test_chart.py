"""Pictures of a smoke profile (issue 40): the SVG chart's bars and gates are the profile's numbers, `smoke --html`
writes it through the output rule, and `card --profile` writes it beside the card and links it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import msgspec
import pytest

from lilicorr_ckpt.cli import main
from lilicorr_ckpt.report.chart import CHART_FILE, PLOT_HEIGHT, acceptance_svg, smoke_html
from lilicorr_ckpt.smoke.profile import SmokeReport

from helpers import REPO

SVG = "{http://www.w3.org/2000/svg}"
TINY = REPO / "examples" / "tiny-lilicorr"
TARGET = REPO / "examples" / "tiny-target"
COMMITTED = json.loads((REPO / "tests" / "report" / "data" / "tiny-smoke-profile.json").read_text())


def synthetic() -> dict:
    """The committed CPU profile with distinct, non-zero rates per arm, category and position (an untrained drafter
    accepts almost nothing, which would leave every bar at 0), one gate inconclusive and a hostile category."""
    doc = json.loads(json.dumps(COMMITTED))
    k = len(doc["arms"]["head"]["marginal_accept_rates"])
    for n, arms in enumerate([doc["arms"]] + [c["arms"] for c in doc["per_category"].values()]):
        arms["head"]["marginal_accept_rates"] = [round(0.9 / (i + 1) * (1 - 0.1 * n), 4) for i in range(k)]
        arms["control"]["marginal_accept_rates"] = [round(0.6 / (i + 1) * (1 - 0.1 * n), 4) for i in range(k)]
    doc["per_category"]['<b>"x"&</b>'] = doc["per_category"].pop("math")
    doc["gates"][2]["inconclusive"] = True
    return doc


def profile_of(doc: dict) -> SmokeReport:
    return msgspec.convert(doc, SmokeReport, strict=False)


def bars(root: ET.Element) -> dict[tuple[str, str, int], ET.Element]:
    return {
        (r.get("data-scope"), r.get("data-arm"), int(r.get("data-position"))): r
        for r in root.iter(f"{SVG}rect")
        if r.get("class") == "bar"
    }


def test_every_bar_is_the_profiles_rate_at_its_height():
    doc = synthetic()
    root = ET.fromstring(acceptance_svg(profile_of(doc)))
    drawn = bars(root)
    scopes = {"all": doc["arms"], **{name: c["arms"] for name, c in doc["per_category"].items()}}
    k = len(doc["arms"]["head"]["marginal_accept_rates"])
    assert len(drawn) == len(scopes) * 2 * k  # head and control at every position, in every panel
    for scope, arms in scopes.items():
        for arm in ("head", "control"):
            rates = arms[arm]["marginal_accept_rates"]
            for i in range(k):
                rect = drawn[(scope, arm, i + 1)]
                assert float(rect.get("data-value")) == pytest.approx(rates[i], abs=1e-6)
                assert float(rect.get("height")) == pytest.approx(rates[i] * PLOT_HEIGHT, abs=0.01)
                assert rect.find(f"{SVG}title").text.startswith(f"{scope}, {arm}, position {i + 1}: ")
            heads = [float(drawn[(scope, "head", i + 1)].get("height")) for i in range(k)]
            assert heads == sorted(heads, reverse=True)  # marginal rates fall with the position
    # every bar of a panel stands on the same baseline
    for scope in scopes:
        bottoms = {
            round(float(r.get("y")) + float(r.get("height")), 2)
            for key, r in drawn.items()
            if key[0] == scope
        }
        assert len(bottoms) == 1


def test_the_gates_and_the_titles_are_the_profiles():
    doc = synthetic()
    root = ET.fromstring(acceptance_svg(profile_of(doc)))
    gates = {g.get("data-gate"): g.get("data-status") for g in root.iter(f"{SVG}g") if g.get("data-gate")}
    assert gates == {
        "measured": "pass",
        "lossless": "pass",
        "head-loaded": "inconclusive",
        "kernel-parity": "skip",
    }
    text = "".join(root.itertext())
    assert "INCONCLUSIVE head-loaded" in text and "examples/tiny-lilicorr on examples/tiny-target" in text
    assert f"τ head {doc['arms']['head']['mean_accept_length']:.3f}" in text
    assert '<b>"x"&</b> (2)' in text  # a category name is text, never markup


def test_a_head_free_profile_draws_its_one_arm():
    doc = synthetic()
    for arms in [doc["arms"]] + [c["arms"] for c in doc["per_category"].values()]:
        del arms["head"]
    doc.update(method="dflash", primary_arm="control")
    drawn = bars(ET.fromstring(acceptance_svg(profile_of(doc))))
    assert drawn and {arm for _, arm, _ in drawn} == {"control"}


def test_the_page_holds_the_chart_the_gates_and_tau():
    profile = profile_of(synthetic())
    page = smoke_html(profile)
    svg = re.search(r"<svg .*?</svg>", page, re.S).group(0)
    assert svg + "\n" == acceptance_svg(profile)
    assert "<title>lilicorr-ckpt smoke examples/tiny-lilicorr: FAIL</title>" in page
    assert 'data-gate="head-loaded"><td style="color:#d97706"><b>INCONCLUSIVE</b>' in page
    assert "&lt;b&gt;&quot;x&quot;&amp;&lt;/b&gt;" in page and '<b>"x"' not in page


@pytest.fixture
def fake_smoke(monkeypatch):
    """smoke's runner replaced by one that returns the synthetic profile (no torch, no model)."""
    from lilicorr_ckpt.smoke import options as smoke_options

    profile = profile_of(synthetic())
    monkeypatch.setattr(smoke_options, "runner", lambda: lambda options, progress, started=None: profile)
    return profile


def _smoke(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["smoke", str(TINY), "-t", str(TARGET), "-q", *args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_smoke_html_writes_the_page(fake_smoke, tmp_path, capsys):
    page = tmp_path / "smoke.html"
    code, out, err = _smoke(capsys, "--html", str(page), "--output", str(tmp_path / "p.json"))
    assert code == 1, err  # the synthetic profile's head gate failed: the exit code is still the gates'
    assert page.read_text() == smoke_html(fake_smoke)
    assert json.loads((tmp_path / "p.json").read_text())["gates"][2]["inconclusive"] is True
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_smoke_html_never_writes_over_an_input(fake_smoke, tmp_path, capsys):
    baseline = tmp_path / "base.json"
    baseline.write_text(json.dumps(COMMITTED))
    before = baseline.read_bytes()
    code, _, err = _smoke(capsys, "--baseline", str(baseline), "--html", str(baseline))
    assert code == 4 and "--html" in err and "an input of this command" in err
    assert baseline.read_bytes() == before
    drafter = shutil.copytree(TINY, tmp_path / "drafter")
    config = (drafter / "config.json").read_bytes()
    with pytest.raises(SystemExit) as exc:
        main(["smoke", str(drafter), "-t", str(TARGET), "--html", str(drafter / "config.json")])
    assert exc.value.code == 4 and (drafter / "config.json").read_bytes() == config
    same = tmp_path / "same"
    code, _, err = _smoke(capsys, "--html", str(same), "--output", str(same))
    assert code == 4 and "give each its own file" in err and not same.exists()
    code, _, err = _smoke(capsys, "--html", str(tmp_path / "missing" / "x.html"))
    assert code == 4 and "does not exist" in err


def gpu_profile() -> dict:
    doc = synthetic()
    doc["measurement_conditions"].update(device="NVIDIA H200", dtype="bfloat16", kernel_backend="triton")
    doc["gates"] = [{**g, "status": "pass", "inconclusive": False} for g in doc["gates"]]
    doc["passed"] = True
    return doc


def _card(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["card", *map(str, args)])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_the_card_links_the_chart_it_writes_beside_it(tmp_path, capsys):
    drafter = shutil.copytree(TINY, tmp_path / "drafter")
    doc = gpu_profile()
    (tmp_path / "profile.json").write_text(json.dumps(doc))
    code, _, err = _card(capsys, drafter, "--target", TARGET, "--profile", tmp_path / "profile.json")
    assert code == 0, err
    chart = drafter / CHART_FILE
    assert chart.read_text() == acceptance_svg(profile_of(doc)) and f"wrote {chart}" in err
    card = (drafter / "README.md").read_text()
    section = card[card.index("### Acceptance") :]
    assert f"]({CHART_FILE})" in section.split("|", 1)[0]  # the picture comes before the tables
    # elsewhere (-o): beside that file; on stdout: no file to link, so no link
    out_dir = tmp_path / "cards"
    out_dir.mkdir()
    code, _, err = _card(
        capsys, drafter, "--target", TARGET, "--profile", tmp_path / "profile.json", "-o", out_dir / "c.md"
    )
    assert (
        code == 0
        and (out_dir / CHART_FILE).is_file()
        and f"]({CHART_FILE})" in (out_dir / "c.md").read_text()
    )
    code, out, err = _card(
        capsys, drafter, "--target", TARGET, "--profile", tmp_path / "profile.json", "-o", "-"
    )
    assert code == 0 and CHART_FILE not in out


def test_the_cards_chart_never_writes_over_an_input(tmp_path, capsys):
    drafter = shutil.copytree(TINY, tmp_path / "drafter")
    profile = drafter / CHART_FILE  # the profile given where the chart would go
    profile.write_text(json.dumps(gpu_profile()))
    before = profile.read_bytes()
    code, _, err = _card(capsys, drafter, "--target", TARGET, "--profile", profile)
    assert code == 4 and "an input of this command" in err, err
    assert profile.read_bytes() == before and not (drafter / "README.md").exists()


def test_validate_never_imports_the_chart():
    code = (
        "import sys\nfrom lilicorr_ckpt.cli import main\n"
        "try:\n    main(['validate', 'examples/tiny-lilicorr', '-q'])\nexcept SystemExit:\n    pass\n"
        "print('lilicorr_ckpt.report.chart' in sys.modules)"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert ran.stdout.strip().splitlines()[-1] == "False", ran.stdout + ran.stderr
