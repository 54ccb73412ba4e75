"""The DSpark and Domino keys as each release's parsers read them (siblings.py _dspark_parsed, _domino;
RuntimeProfile dspark_reads / config_reads): SGLang's parse_dspark_draft_config reads the prefixed dspark_* keys
first, then dspark_config (0.5.23: with dflash_config merged under it), then the top level, casting with int() and
str(); its Domino parser casts gru_hidden_dim, pure_draft_prefix_len and emb_dim with int(). The fuzzer's corpus
rows (corpus_siblings.py) show each release agreeing; these pin the message and the severity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lilicorr_ckpt import fixtures

from ._support import edit_config, run


def _dspark(tmp: Path, layout: str = "dspark-deepspec", **top: Any) -> Path:
    path = fixtures.write_checkpoint(tmp / "draft", fixtures.sibling_config(layout))
    nested = top.pop("dflash_config", {})

    def apply(cfg: dict[str, Any]) -> None:
        cfg.update(top)
        cfg["dflash_config"].update(nested)

    edit_config(path, apply)
    return path


def _findings(path: Path, release: str, severity: str = "error") -> dict[str, str]:
    report = run(path, runtime=release)
    return {f.rule: f.message for f in report.findings if f.severity == severity and f.rule != "LC015"}


def test_a_true_noise_token_is_token_1_in_every_mask_slot(tmp_path: Path) -> None:
    path = _dspark(tmp_path, dspark_noise_token_id=True)
    for release in ("sglang==0.5.21", "sglang==0.5.23"):
        message = _findings(path, release)["LC163"]
        assert "dspark_noise_token_id" in message and "token 1 in every mask slot" in message
        assert "trained with 511" in message
    assert _findings(path, "vllm==0.34.0") == {}  # vLLM reads no dspark_noise_token_id


def test_a_null_top_level_mask_token_is_read_up_to_0_5_22_only(tmp_path: Path) -> None:
    path = _dspark(tmp_path, mask_token_id=None)
    assert "no mask token" in _findings(path, "sglang==0.5.22")["LC163"]
    assert "LC163" not in _findings(path, "sglang==0.5.23")  # dflash_config's 511 wins


def test_prefixed_markov_head_type_through_str_lower(tmp_path: Path) -> None:
    assert (
        "'true'"
        in _findings(_dspark(tmp_path / "a", dspark_markov_head_type=True), "sglang==0.5.21")["LC153"]
    )
    assert (
        _findings(_dspark(tmp_path / "b", dspark_markov_head_type="Gated"), "sglang==0.5.21").get("LC153")
        is None
    )


@pytest.mark.parametrize(
    ("value", "old", "new"),
    [
        (0, None, "LC152"),  # 0.5.23 reads dflash_config's rank first: "requires markov_rank > 0"
        (-1, None, "LC152"),
        ("8", None, None),  # int("8")
        (None, None, "LC152"),  # null: 0
    ],
)
def test_nested_markov_rank_is_read_from_0_5_23(
    tmp_path: Path, value: Any, old: str | None, new: str | None
) -> None:
    path = _dspark(tmp_path, dflash_config={"markov_rank": value})
    assert ("LC152" in _findings(path, "sglang==0.5.21")) == (old is not None)
    assert ("LC152" in _findings(path, "sglang==0.5.23")) == (new is not None)
    assert "LC001" not in _findings(path, "sglang==0.5.21")  # not read there: no type to judge
    assert _findings(path, "vllm==0.34.0") == {}  # vLLM reads the top-level rank only


def test_nested_markov_head_type_is_read_from_0_5_23(tmp_path: Path) -> None:
    path = _dspark(tmp_path, dflash_config={"markov_head_type": True})
    assert _findings(path, "sglang==0.5.22") == {}
    assert "'true'" in _findings(path, "sglang==0.5.23")["LC153"]
    null = _dspark(tmp_path / "null", dflash_config={"markov_head_type": None})
    assert "dflash_config.markov_head_type is null" in _findings(null, "sglang==0.5.23")["LC162"]


def test_a_numeric_string_markov_rank_is_a_warning_where_int_reads_it(tmp_path: Path) -> None:
    path = _dspark(tmp_path, markov_rank="8")
    assert _findings(path, "sglang==0.5.21") == {}
    assert "int()" in _findings(path, "sglang==0.5.21", "warning")["LC004"]
    assert "LC001" in _findings(path, "vllm==0.34.0")  # qwen3_dspark.py uses it uncast
    true = _dspark(tmp_path / "true", markov_rank=True)  # int(true) == 1: a rank-1 head no tensor fits
    assert "LC001" in _findings(true, "sglang==0.5.21")


def test_an_empty_markov_head_type_is_not_vanilla(tmp_path: Path) -> None:
    path = _dspark(tmp_path, markov_head_type="")
    assert "LC153" in _findings(path, "sglang==0.5.21")
    assert "builds only vanilla" in _findings(path, "vllm==0.34.0")["LC153"]


def test_dspark_draft_topk_within_the_draft_vocabulary(tmp_path: Path) -> None:
    assert (
        "between 1 and the draft vocabulary size (512)"
        in (_findings(_dspark(tmp_path / "a", dspark_draft_topk=513), "vllm==0.34.0")["LC001"])
    )
    assert _findings(_dspark(tmp_path / "b", dspark_draft_topk=512), "vllm==0.34.0") == {}
    assert "LC001" in _findings(_dspark(tmp_path / "c", dspark_draft_topk=True), "vllm==0.34.0")


def test_domino_keys_as_sglang_casts_them(tmp_path: Path) -> None:
    conflict = _dspark(tmp_path / "a", "domino", emb_dim=True)  # int(true) == 1 against dflash_config's 8
    assert "(int(): 8 and 1)" in _findings(conflict, "sglang==0.5.23")["LC158"]
    text = _dspark(
        tmp_path / "b", "domino", dflash_config={"pure_draft_prefix_len": "1", "gru_hidden_dim": "16"}
    )
    assert _findings(text, "sglang==0.5.23") == {}
    assert "int()" in _findings(text, "sglang==0.5.23", "warning")["LC004"]
    # a top-level gru_hidden_dim is read only where dflash_config has none
    beside = _dspark(tmp_path / "c", "domino", gru_hidden_dim="")
    assert _findings(beside, "sglang==0.5.23") == {}
    alone = _dspark(tmp_path / "d", "domino", gru_hidden_dim="")
    edit_config(alone, lambda c: c["dflash_config"].pop("gru_hidden_dim"))
    assert "LC001" in _findings(alone, "sglang==0.5.23")
    one = _dspark(tmp_path / "e", "domino", dflash_config={"block_size": True})
    assert "block_size is `true` (int(): 1)" in _findings(one, "sglang==0.5.23")["LC159"]
