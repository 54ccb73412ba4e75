"""The training forward (lilicorr_train.objective.draft_blocks: every block of a sequence in one masked pass) computes
what decoding computes for one block, eager (Drafter.forward) and as the graph captures it (Drafter.forward_static):
the drafter over the context rows before the anchor, then [anchor, masks]. All three run Drafter._backbone."""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import small_config

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.smoke.load import load_drafter
from lilicorr_train.objective import draft_blocks


def test_training_forward_equals_the_inference_forward_on_each_block(tmp_path):
    drafter = load_drafter(fixtures.write_checkpoint(tmp_path / "d", small_config(), dtype="F32"))
    g = drafter.geometry
    width = len(g.target_layer_ids) * g.hidden_size
    torch.manual_seed(0)
    length, block = 14, g.block_size
    features = torch.randn(1, length, width)
    anchors = torch.tensor([[3, 9]])
    embeddings = torch.randn(1, 2, block, g.hidden_size)
    with torch.no_grad():
        trained, _ = draft_blocks(drafter, features, embeddings, anchors)
        for j, anchor in enumerate(anchors[0].tolist()):
            cache = drafter.new_cache(capacity=64)
            drafter.append_context(cache, drafter.project_context(features[:, :anchor]))
            decoded = drafter(cache, embeddings[:, j])  # [1, B, M]
            torch.testing.assert_close(trained[:, j], decoded, rtol=1e-5, atol=1e-5)
            # the captured step: the whole capacity, rows past the anchor (stale here: later features) masked
            static = drafter.new_cache(capacity=32)
            drafter.append_context(static, drafter.project_context(features))
            replayed = drafter.forward_static(static, torch.tensor(anchor), embeddings[:, j])
            torch.testing.assert_close(trained[:, j], replayed, rtol=1e-5, atol=1e-5)
            assert not torch.equal(trained[:, j], trained[:, 1 - j])  # the blocks differ: the masks matter


def test_training_refuses_what_its_mask_does_not_express(tmp_path):
    config = small_config(
        layer_types=["sliding_attention", "full_attention"],
        use_sliding_window=True,
        sliding_window=4,
        num_hidden_layers=2,
    )
    drafter = load_drafter(fixtures.write_checkpoint(tmp_path / "swa", config, dtype="F32"))
    g = drafter.geometry
    features = torch.randn(1, 8, len(g.target_layer_ids) * g.hidden_size)
    with pytest.raises(ValueError, match="training supports full-attention drafters without convolution"):
        draft_blocks(drafter, features, torch.randn(1, 1, g.block_size, g.hidden_size), torch.tensor([[3]]))
