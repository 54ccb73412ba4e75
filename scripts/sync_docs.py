"""Regenerate what the docs derive from code: the README rule table, docs/rules.md (each rule's long form from its
catalogue row: what it does, why it matters, an example and the fix, then the retired ids; the page SARIF helpUri
links point at) and schemas/*.json.

    python scripts/sync_docs.py
"""

from __future__ import annotations

import re
from pathlib import Path

from lilicorr_ckpt.cli import rules_markdown, rules_page
from lilicorr_ckpt.report import schemas

README = Path(__file__).resolve().parents[1] / "README.md"
RULES_PAGE = README.parent / "docs" / "rules.md"


def main() -> None:
    text = README.read_text()
    text = re.sub(
        r"(<!-- rules:begin[^\n]*-->\n).*?(<!-- rules:end -->)",
        lambda m: m.group(1) + rules_markdown() + m.group(2),
        text,
        flags=re.S,
    )
    README.write_text(text)
    RULES_PAGE.write_text(rules_page())
    print(f"wrote {RULES_PAGE}")
    for path in schemas.write():
        print(f"wrote {path}")
    print(f"wrote {README}")


if __name__ == "__main__":
    main()
