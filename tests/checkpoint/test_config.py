import json
import math

import pytest

from lilicorr_ckpt.checkpoint.config import parse_config
from lilicorr_ckpt.errors import InputError
from lilicorr_ckpt.fixtures import draft_config


def parse(doc) -> object:
    return parse_config(json.dumps(doc).encode())


def test_valid_config_parses_every_field():
    p = parse(draft_config(conv=(4, 16), own_lm_head=True))
    assert p.issues == [] and p.unknown_keys == []
    d = p.config.dflash
    assert p.config.family == "lilicorr"
    assert (d.lilicorr_candidate_topk, d.lilicorr_hidden_size, d.conv_kernel_size, d.conv_group_size) == (
        4,
        32,
        4,
        16,
    )
    assert p.config.has_own_lm_head is True


def test_type_errors_name_path_value_and_expectation_and_keep_parsing():
    cfg = draft_config()
    cfg["hidden_size"] = "64"
    cfg["dflash_config"]["lilicorr_candidate_topk"] = 8.5
    cfg["dflash_config"]["target_layer_ids"] = [0, "two"]
    p = parse(cfg)
    by_path = {i.path: i for i in p.issues}
    assert set(by_path) == {
        "$.hidden_size",
        "$.dflash_config.lilicorr_candidate_topk",
        "$.dflash_config.target_layer_ids[1]",
    }
    assert by_path["$.hidden_size"].describe() == '$.hidden_size: expected an integer, found "64" (string)'
    assert "found 8.5 (number)" in by_path["$.dflash_config.lilicorr_candidate_topk"].describe()
    assert by_path["$.dflash_config.target_layer_ids[1]"].found == "two"
    # the rest of the document is still read
    assert p.config.num_hidden_layers == 2 and p.config.dflash.lilicorr_num_layers == 2
    assert p.config.hidden_size is None


def test_integral_floats_are_integers_and_unknown_keys_are_kept():
    cfg = draft_config(my_extension={"a": 1})
    cfg["num_hidden_layers"] = 2.0
    cfg["dflash_config"]["lilicorr_mlp_ratio"] = 2
    cfg["dflash_config"]["lilicorr_topk"] = 4
    p = parse(cfg)
    assert p.config.num_hidden_layers == 2 and isinstance(p.config.num_hidden_layers, int)
    assert p.config.dflash.lilicorr_mlp_ratio == 2.0
    assert set(p.unknown_keys) == {"$.my_extension", "$.dflash_config.lilicorr_topk"}
    assert p.raw["my_extension"] == {"a": 1}


def test_nan_and_infinity_literals_are_read_as_values():
    text = json.dumps(draft_config()).replace('"lilicorr_vector_eps": 1e-06', '"lilicorr_vector_eps": NaN')
    p = parse_config(text.encode())
    assert math.isnan(p.config.dflash.lilicorr_vector_eps)


def test_duplicate_keys_are_reported():
    text = '{"hidden_size": 64, "hidden_size": 128}'
    p = parse_config(text.encode())
    assert p.duplicate_keys == {"hidden_size": 2} and p.config.hidden_size == 128


@pytest.mark.parametrize(
    "data, needle",
    [
        (b"[1, 2]", "must hold a JSON object, found array"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b'{"a": ', "not valid JSON"),
        (b"null", "found null"),
    ],
)
def test_unreadable_configs_raise_input_errors(data, needle):
    with pytest.raises(InputError, match=needle):
        parse_config(data)


def test_a_whole_float_past_int64_is_a_number_not_an_integer():
    """1e308 is a whole number only as a float: it is named as the number written, never as a 309-digit integer."""
    cfg = draft_config()
    cfg["dflash_config"]["lilicorr_candidate_topk"] = 1e308
    cfg["dflash_config"]["lilicorr_mlp_ratio"] = 1e300  # a float field keeps the float
    p = parse(cfg)
    (issue,) = [i for i in p.issues if i.path == "$.dflash_config.lilicorr_candidate_topk"]
    assert "found 1e+308 (number)" in issue.describe(), issue.describe()
    assert p.config.dflash.lilicorr_mlp_ratio == 1e300
