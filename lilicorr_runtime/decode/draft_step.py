"""The eager loop's draft step (`block.draft`: backbone, candidates, head, walk) with static shapes, replayed from
a CUDA graph.

The head is a long tail of small kernels, so its cost is host dispatch unless the whole step is one
graph replay (the seed PR measured -8.4% end to end when the head was forced out of the draft graph).
Everything the step reads lives in static buffers: the anchor token and row, the context length (a
device scalar: attention spans the cache's whole capacity and masks the unused rows), the sampling
uniforms and temperature. One graph is captured per (batch, speculative tokens, walk).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from ..arguments import known
from ..graphs import capture, warm_up
from ..model.drafter import Drafter, DraftKVCache
from .block import WALKS, Walk, draft

_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


class DraftStep:
    """One draft step for a fixed (batch, num_tokens, walk); `run` replays the graph, or runs eagerly."""

    def __init__(
        self,
        drafter: Drafter,
        cache: DraftKVCache,
        embed: Callable[[torch.Tensor], torch.Tensor],
        lm_head: Callable[[torch.Tensor], torch.Tensor],
        *,
        num_tokens: int,
        walk: Walk,
        batch: int = 1,
        use_graph: bool = True,
    ):
        if walk not in WALKS:
            raise ValueError(f"walk must be greedy, sample or control, not {walk!r}")
        if walk != "control" and drafter.lilicorr is None:
            raise ValueError(f"walk {walk!r} needs a LiLiCorr head")
        self.drafter, self.cache, self.embed, self.lm_head = drafter, cache, embed, lm_head
        self.num_tokens, self.walk, self.batch = num_tokens, walk, batch
        device, dtype = drafter.fc.weight.device, drafter.fc.weight.dtype
        m = known(drafter.geometry.hidden_size, "hidden_size")
        # static inputs
        self.anchor = torch.zeros(batch, dtype=torch.long, device=device)  # [b]
        self.anchor_hidden = torch.zeros(batch, m, dtype=dtype, device=device)  # [b, M]
        self.length = torch.zeros((), dtype=torch.long, device=device)
        self.uniforms = torch.zeros(batch, num_tokens, device=device)  # [b, n]
        self.temperature = torch.ones(batch, device=device)  # [b]
        self.greedy = torch.zeros(batch, dtype=torch.bool, device=device)  # [b]
        self.masks = torch.full((batch, num_tokens), drafter.mask_token_id, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: dict[str, torch.Tensor] = {}
        if use_graph and device.type == "cuda":
            self._capture()

    def _body(self) -> dict[str, torch.Tensor]:
        """`block.draft` over the static buffers (what the graph captures)."""
        _, proposed = draft(
            self.drafter,
            self.embed,
            self.lm_head,
            self.cache,
            self.length,
            self.anchor,
            self.anchor_hidden,
            self.masks,
            self.walk,
            uniforms=self.uniforms,
            temperatures=self.temperature,
            greedy=self.greedy,
        )
        return proposed

    @torch.inference_mode()
    def _capture(self) -> None:
        try:
            warm_up(self._body)
            self.graph, self.outputs = capture(self._body)
        except Exception as exc:  # a capture failure must not stop decoding; it costs speed only
            self.graph = None
            warn_once(
                "capture",
                f"CUDA graph capture of the draft step failed ({type(exc).__name__}: {exc}); "
                "the step runs eagerly: dozens of small kernel launches per block, which SGLang measured "
                "at -8.4% end-to-end throughput",
            )

    @torch.inference_mode()
    def run(
        self,
        anchor_tokens: torch.Tensor,
        anchor_hidden: torch.Tensor,
        length: int,
        uniforms: torch.Tensor | None = None,
        temperature: float | None = None,
    ) -> dict[str, torch.Tensor]:
        """anchor_tokens [b'], anchor_hidden [b', M] with b' <= batch -> outputs (views of static buffers for
        the first b' rows; copy what must outlive the next call)."""
        rows = anchor_tokens.shape[0]
        if rows > self.batch:
            raise ValueError(f"{rows} rows exceed this step's batch {self.batch}")
        capacity = self.cache.keys[0].shape[2]
        if not 0 <= length <= capacity - (self.num_tokens + 1):
            raise ValueError(
                f"context length {length} leaves no room for the {self.num_tokens + 1}-row block in the cache "
                f"(capacity {capacity}: the length must be at most {capacity - self.num_tokens - 1})"
            )
        self.anchor[:rows].copy_(anchor_tokens)
        self.anchor_hidden[:rows].copy_(anchor_hidden)
        self.length.fill_(length)
        if uniforms is not None:
            self.uniforms[:rows].copy_(uniforms)
        if temperature is not None:
            self.temperature.fill_(temperature)
        if self.graph is not None:
            self.graph.replay()
            out = self.outputs
        else:
            out = self._body()
        return {name: value[:rows] for name, value in out.items()}
