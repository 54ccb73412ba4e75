"""Every rule's long form: written for each registered rule, printed by `rules ID`, published in docs/rules.md.

A new rule registered without its What it does / Why it matters / Example sections fails here.
"""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from lilicorr_ckpt.checks import RULES
from lilicorr_ckpt.checks.findings import RETIRED
from lilicorr_ckpt.cli import cli, rules_page
from lilicorr_ckpt.errors import UsageError

from helpers import REPO

SECTIONS = ("What it does", "Why it matters", "Example", "Fix")
# documents outside this repository, which the docs must not cite
FOREIGN = re.compile(r"format\.md|modelopt_nvfp4\.md|sibling_heads\.md|shared/")
# a reference a reader cannot follow from the text alone, or that rots: a URL, an issue or pull request number
# in any spelling (owner/repo#12, sglang#37475, #12, PR 12, pull request #12, issue 12, GH-12, .../pull/12)
REFERENCE = re.compile(
    r"\b(?:https?|ftp)://|\bwww\.\w|\b[\w.-]+\.(?:com|org|io|dev|ai)/"
    r"|(?:^|[\s(\[,;:])[\w./-]*#\d+"
    r"|\b(?:PRs?|pull(?:\s+requests?)?|MRs?|merge\s+requests?|issues?|bugs?|tickets?)\s*(?:no\.?\s*)?#?\s*\d+\b"
    r"|\bGH-\d+|/(?:pull|issues|commit)/\w",
    re.IGNORECASE,
)


def rules(*args: str):
    return CliRunner().invoke(cli, ["rules", *args])


def test_every_rule_has_what_why_and_example():
    # a sentence for what and why; an example may be one config line or one tensor name
    least = {"doc": 40, "why": 40, "example": 12}
    undocumented = {
        rid: [f for f, n in least.items() if len(getattr(r, f).strip()) < n] for rid, r in RULES.items()
    }
    assert {rid: f for rid, f in undocumented.items() if f} == {}, (
        "write doc=/why=/example= in the rule() row"
    )
    for r in RULES.values():
        assert [title for title, _ in r.sections()] == list(SECTIONS), r.id


def test_rule_docs_cite_nothing_outside_the_repository():
    cited = {r.id for r in RULES.values() if FOREIGN.search(r.doc + r.why + r.example + r.fix)}
    assert cited == set()


@pytest.mark.parametrize(
    "prose, cites",
    [
        ("wrong for 14 of 20 published checkpoints, sglang#37475)", True),
        ("as upstream fixed it (#1234).", True),
        ("see https://example.invalid/x for the layout", True),
        ("tracked in PR 881 and in pull request #12", True),
        ("reported in issue 7", True),
        ("GH-42 describes it", True),
        ("github.com/org/repo shows it", True),
        ("vllm-project/vllm#123 changed it", True),
        ("acceptance fell to 0.06 of 15 in one LMDeploy report", False),
        (
            "layers 2, L/2 and L-3 of the target; 128x128 blocks; issues a warning; fc.weight[:, 0:4096]",
            False,
        ),
        ('    "target_layer_ids": [1, 17, 33]  # three taps', False),
    ],
)
def test_the_reference_finder_tells_a_citation_from_ordinary_prose(prose, cites):
    assert bool(REFERENCE.search(prose)) is cites


def test_rule_prose_cites_no_url_issue_or_pull_request():
    fields = ("summary", "doc", "why", "example", "fix")
    texts = {
        f"{r.id} {field}": text
        for r in RULES.values()
        for field, text in zip(fields, (r.summary, r.doc, r.why, r.example, r.fix), strict=True)
    }
    texts.update({f"{rule_id} (retired)": note for rule_id, note in RETIRED.items()})
    cited = {where: m.group(0).strip() for where, text in texts.items() if (m := REFERENCE.search(text))}
    assert cited == {}, "rule texts stand alone: state the fact, not where upstream reported it"


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
    assert block and block == [
        line[4:] for line in RULES["LC201"].example.splitlines() if line.startswith("    ")
    ]


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
