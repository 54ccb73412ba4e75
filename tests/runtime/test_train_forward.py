"""The training forward (train.objective.draft_blocks: every block of a sequence in one masked pass) computes what
decoding computes for one block: the drafter over the context rows before the anchor, then [anchor, masks]."""

from __future__ import annotations

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
