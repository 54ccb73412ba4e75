"""Every rule's long form: written for each registered rule, printed by `rules ID`, published in docs/rules.md.

A new rule registered without its What it does / Why it matters / Example sections fails here.
"""

from __future__ import annotations

import re

from click.testing import CliRunner

from lilicorr_ckpt.checks import RULES
from lilicorr_ckpt.checks.findings import RETIRED
from lilicorr_ckpt.cli import cli, rules_page
from lilicorr_ckpt.errors import UsageError

from helpers import REPO

SECTIONS = ("What it does", "Why it matters", "Example", "Fix")
# documents outside this repository, which the docs must not cite
FOREIGN = re.compile(r"format\.md|modelopt_nvfp4\.md|sibling_heads\.md|shared/")


def rules(*args: str):
    return CliRunner().invoke(cli, ["rules", *args])


def test_every_rule_has_what_why_and_example():
    # a sentence for what and why; an example may be one config line or one tensor name
    least = {"doc": 40, "why": 40, "example": 12}
    undocumented = {rid: [f for f, n in least.items() if len(getattr(r, f).strip()) < n] for rid, r in RULES.items()}
    assert {rid: f for rid, f in undocumented.items() if f} == {}, "write doc=/why=/example= in the rule() row"
    for r in RULES.values():
        assert [title for title, _ in r.sections()] == list(SECTIONS), r.id


def test_rule_docs_cite_nothing_outside_the_repository():
    cited = {r.id for r in RULES.values() if FOREIGN.search(r.doc + r.why + r.example + r.fix)}
    assert cited == set()


def test_rules_id_prints_the_sections_in_order():
    result = rules("lc201")
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.startswith("LC201 head-missing (error, coverage)\n")
    positions = [out.index(f"\n{title}:\n") for title in SECTIONS]
    assert positions == sorted(positions)
    assert RULES["LC201"].fix.split()[0] in out.split("\nFix:\n", 1)[1]
    # prose is filled for a terminal; the example's verbatim block (four-space indent) is kept line for line
    assert all(len(line) <= 102 for line in out.splitlines() if not line.startswith("    "))
    example = out.split("\nExample:\n", 1)[1].split("\nFix:\n", 1)[0]
    block = [line[6:] for line in example.splitlines() if line.startswith("      ")]
    assert block and block == [line[4:] for line in RULES["LC201"].example.splitlines() if line.startswith("    ")]


def test_rules_id_markdown_is_the_docs_page_section():
    result = rules("LC306", "-f", "markdown")
    assert result.exit_code == 0
    assert result.output == RULES["LC306"].markdown()
    assert result.output in rules_page()


def test_retired_id_says_what_replaced_it():
    result = rules("LC403")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("LC403 own-head-unconfirmed (retired")
    assert "LC404" in result.output.split("Replaced by:", 1)[1]
    assert rules("LC403", "-f", "json").output.count('"retired"') == 1
    assert isinstance(rules("LC999").exception, UsageError)  # exit 4 from the console entry point


def test_docs_page_has_a_section_per_rule_and_per_retired_id():
    page = (REPO / "docs" / "rules.md").read_text()
    assert page == rules_page(), "docs/rules.md is stale: run python scripts/sync_docs.py"
    for r in RULES.values():
        section = page.split(f'<a id="{r.id.lower()}"></a>', 1)[1].split("<a id=", 1)[0]
        assert all(f"**{title}.**" in section for title in SECTIONS), r.id
    for rule_id in RETIRED:
        assert f'<a id="{rule_id.lower()}"></a>' in page and f"### {rule_id} " in page
