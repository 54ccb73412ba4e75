"""Regenerate what the docs derive from code: docs/validate.md's table of engine releases, docs/rules.md (the
rule table, then each rule's long form from its catalogue row: what it does, why it matters, an example and the
fix, then the retired ids; the page SARIF helpUri links point at) and schemas/*.json.

    python scripts/sync_docs.py
"""

from __future__ import annotations

import re
from pathlib import Path

from lilicorr_ckpt.cli import releases_markdown, rules_page
from lilicorr_ckpt.report import schemas

DOCS = Path(__file__).resolve().parents[1] / "docs"
RULES_PAGE = DOCS / "rules.md"
VALIDATE_PAGE = DOCS / "validate.md"


def main() -> None:
    page = VALIDATE_PAGE.read_text()
    page = re.sub(
        r"(<!-- releases:begin[^\n]*-->\n).*?(<!-- releases:end -->)",
        lambda m: m.group(1) + releases_markdown() + m.group(2),
        page,
        flags=re.S,
    )
    VALIDATE_PAGE.write_text(page)
    print(f"wrote {VALIDATE_PAGE}")
    RULES_PAGE.write_text(rules_page())
    print(f"wrote {RULES_PAGE}")
    for path in schemas.write():
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
