"""Two presses of NVIDIA's kvpress (0.5.5), rebuilt as notebook 06 rebuilds:

    make run NB=06 ARGS="-p rebuild examples/kvpress_presses.py:knorm"
    make run NB=06 ARGS="-p rebuild examples/kvpress_presses.py:streaming_llm"

kvpress 0.5.5 declares `transformers<5.3,>=4.56.0` (the kit pins 5.17.0); examples/kvpress_real.py applies kvpress
itself (installed `--no-deps`). These follow its code line for line, with no kvpress installed: `ScorerPress.compress` scores every cached slot per KV head, keeps the
`compute_n_kept` best with `scores.topk(n_kept)` (in score order, not position order), gathers them per head, and
`BasePress.forward_hook` assigns the result to the cache layer's `.keys` / `.values`. `KnormPress` scores a slot by its
key's negative L2 norm (each head keeps its own slots); `StreamingLLMPress` scores the first `n_sink` slots and the
last ones 1 and the pruned middle 0 (every head keeps the same slots; top-k's tie order decides their order).
"""
from __future__ import annotations

import torch


def compute_n_kept(k_len: int, compression_ratio: float) -> int:
    """kvpress.utils.compute_n_kept: slots kept at `compression_ratio` (0 at 1.0, else at least 1)."""
    if compression_ratio >= 1.0:
        return 0
    return max(1, int(k_len * (1 - compression_ratio)))


def knorm_score(keys: torch.Tensor) -> torch.Tensor:
    """KnormPress.score: the key's negative L2 norm per slot and head, in at least float32."""
    return -torch.linalg.vector_norm(keys, dim=-1, dtype=torch.promote_types(keys.dtype, torch.float32))


def streaming_llm_score(keys: torch.Tensor, compression_ratio: float, n_sink: int = 4) -> torch.Tensor:
    """StreamingLLMPress.score: 1 for the sink slots and the most recent ones, 0 for the pruned middle."""
    k_len = keys.shape[2]
    assert k_len > n_sink, f"Input should contain more tokens than n_sink={n_sink}"
    n_pruned = k_len - int(k_len * (1 - compression_ratio))
    scores = torch.ones_like(keys[..., 0])
    scores[:, :, n_sink: n_sink + n_pruned] = 0
    return scores


def compress(keys: torch.Tensor, values: torch.Tensor, scores: torch.Tensor,
             compression_ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    """ScorerPress.compress: the top-k slots by score per head, gathered in top-k order."""
    if compression_ratio == 0:
        return keys, values
    n_kept = compute_n_kept(keys.shape[2], compression_ratio)
    indices = scores.topk(n_kept, dim=-1).indices
    indices = indices.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
    return keys.gather(2, indices).contiguous(), values.gather(2, indices).contiguous()


def _press(cache, score, compression_ratio: float):
    """BasePress.forward_hook's write for every attention layer: the compressed K/V assigned to the layer."""
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        layer.keys, layer.values = compress(layer.keys, layer.values, score(layer.keys), compression_ratio)
    return cache


@torch.no_grad()
def knorm(cache, model, prompt, compression_ratio: float = 0.5):
    """KnormPress(compression_ratio=0.5): each head keeps the half of its slots with the smallest key norm."""
    return _press(cache, knorm_score, compression_ratio)


@torch.no_grad()
def streaming_llm(cache, model, prompt, compression_ratio: float = 0.5, n_sink: int = 4):
    """StreamingLLMPress(compression_ratio=0.5, n_sink=4): the first 4 slots and the most recent ones."""
    return _press(cache, lambda keys: streaming_llm_score(keys, compression_ratio, n_sink), compression_ratio)
