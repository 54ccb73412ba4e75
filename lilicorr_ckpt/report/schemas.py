"""JSON Schemas of every machine-readable output, generated from the msgspec types.

`lilicorr-ckpt schema NAME` prints one (any install). In a source checkout `python -m lilicorr_ckpt.report.schemas`
rewrites schemas/ (or `--out DIR`); tests/report/test_reports.py fails when they drift.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import msgspec

from lilicorr_ckpt.report.inspect import Inspection
from lilicorr_ckpt.results import Report
from lilicorr_ckpt.smoke.engine.profile import EngineReport
from lilicorr_ckpt.smoke.profile import SmokeReport

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"


def _schema(kind: Any, title: str) -> dict[str, Any]:
    schema = msgspec.json.schema(kind)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title, **schema}


def all_schemas() -> dict[str, dict[str, Any]]:
    return {
        "validate-report.schema.json": _schema(Report, "lilicorr-ckpt validate report"),
        "inspect.schema.json": _schema(Inspection, "lilicorr-ckpt inspect output"),
        "smoke-profile.schema.json": _schema(SmokeReport, "lilicorr-ckpt smoke profile"),
        "smoke-engine.schema.json": _schema(EngineReport, "lilicorr-ckpt smoke --engine report"),
    }


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m lilicorr_ckpt.report.schemas",
        description="Write the JSON Schemas of the machine-readable outputs.",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="where to write them (default: schemas/ of the source checkout this module is in)",
    )
    args = parser.parse_args(argv)
    out = args.out
    if out is None:
        if not (SCHEMA_DIR.parent / "pyproject.toml").is_file():
            parser.error(
                "not running from a source checkout; pass --out DIR (or print one with "
                "`lilicorr-ckpt schema NAME`)"
            )
        out = SCHEMA_DIR
    for p in write(out):
        print(f"wrote {p}")


if __name__ == "__main__":
    main()
