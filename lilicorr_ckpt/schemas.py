"""JSON Schemas of every machine-readable output, generated from the msgspec types.

`python -m lilicorr_ckpt.schemas` rewrites schemas/; tests/test_reports.py fails when they drift.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"


def _schema(kind: Any, title: str) -> dict[str, Any]:
    schema = msgspec.json.schema(kind)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title, **schema}


def all_schemas() -> dict[str, dict[str, Any]]:
    from .inspect import Inspection
    from .validate import Report

    out = {
        "validate-report.schema.json": _schema(Report, "lilicorr-ckpt validate report"),
        "inspect.schema.json": _schema(Inspection, "lilicorr-ckpt inspect output"),
    }
    try:
        from .smoke_report import SmokeReport  # added with the smoke command
    except ImportError:
        pass
    else:
        out["smoke-profile.schema.json"] = _schema(SmokeReport, "lilicorr-ckpt smoke profile")
    return out


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write(directory: Path = SCHEMA_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in all_schemas().items():
        path = directory / name
        path.write_text(render(schema))
        written.append(path)
    return written


if __name__ == "__main__":
    for p in write(Path(sys.argv[1]) if len(sys.argv) > 1 else SCHEMA_DIR):
        print(f"wrote {p}")
