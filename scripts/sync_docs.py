"""Regenerate what the docs derive from code: the README rule table and schemas/*.json.

    python scripts/sync_docs.py
"""

from __future__ import annotations

import re
from pathlib import Path

from lilicorr_ckpt.cli import rules_markdown
from lilicorr_ckpt.report import schemas

README = Path(__file__).resolve().parents[1] / "README.md"


def main() -> None:
    text = README.read_text()
    text = re.sub(r"(<!-- rules:begin[^\n]*-->\n).*?(<!-- rules:end -->)",
                  lambda m: m.group(1) + rules_markdown() + m.group(2), text, flags=re.S)
    README.write_text(text)
    for path in schemas.write():
        print(f"wrote {path}")
    print(f"wrote {README}")


if __name__ == "__main__":
    main()
