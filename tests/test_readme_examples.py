import re
import shlex

from lilicorr_ckpt.checks import RULES
from lilicorr_ckpt.cli import rules_markdown, rules_page

from helpers import REPO, run_cli

README = (REPO / "README.md").read_text()


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)


def test_readme_rule_table_is_generated_from_the_catalogue():
    block = re.search(r"<!-- rules:begin[^\n]*-->\n(.*?)<!-- rules:end -->", README, flags=re.S)
    assert block, "README lost its rules markers"
    assert block.group(1) == rules_markdown(), "README rules table is stale: run python scripts/sync_docs.py"
    assert all(f"| {rid} |" in README for rid in RULES)


def test_rules_page_has_an_anchor_per_rule_for_sarif_help_links():
    page = (REPO / "docs" / "rules.md").read_text()
    assert page == rules_page(), "docs/rules.md is stale: run python scripts/sync_docs.py"
    assert all(f'<a id="{rid.lower()}"></a>' in page for rid in RULES)


def test_quick_start_has_exactly_two_commands_and_ci_runs_the_test_one():
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = _bash_blocks(quick)
    assert len(blocks) == 2 and all("\n" not in b.strip() for b in blocks)
    ci = (REPO / ".ci" / "run").read_text()
    assert blocks[1].strip() in ci
    # the main job from the first command works as written
    validate_part = blocks[0].split("&&", 1)[1].strip()
    args = shlex.split(validate_part)
    assert args[:2] == ["lilicorr-ckpt", "validate"]
    result = run_cli(*args[1:], cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS 0 errors, 0 warnings" in result.stdout


def test_every_rule_is_exercised_by_some_test():
    sources = "".join(p.read_text() for p in (REPO / "tests").rglob("test_*.py"))
    untested = [rid for rid in RULES if rid not in sources]
    assert untested == [], f"rules without a test that triggers them: {untested}"


def test_bundled_examples_are_reproducible(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_examples", REPO / "examples" / "make_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(tmp_path)
    for name in module.EXAMPLES:
        for committed in sorted((REPO / "examples" / name).iterdir()):
            fresh = tmp_path / name / committed.name
            assert fresh.read_bytes() == committed.read_bytes(), f"examples/{name}/{committed.name} drifted"


def test_modelopt_example_is_refused_for_the_documented_reasons():
    result = run_cli("validate", str(REPO / "examples" / "tiny-modelopt-nvfp4"), "--format", "json")
    assert result.returncode == 1
    import json

    fired = {f["rule"] for f in json.loads(result.stdout)["findings"]}
    assert {"LC306", "LC310", "LC322"} <= fired
