"""Any Hugging Face causal LM through transformers, with a DynamicCache cropped on rollback."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from .base import Backend


class TransformersBackend(Backend):
    """Runs a `transformers` causal LM one sequence at a time.

    Rollback crops the cache (`DynamicCache.crop` with a negative count). Sliding-window layers
    (Gemma-3) record their past, so a crop by up to the tokens of the last forward is exact; they
    forget what lies further back, which `oldest_reachable` reports."""

    path = "transformers"

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.model = model.eval()
        self.device = model.device
        text_config = model.config.get_text_config()
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_length = getattr(text_config, "max_position_embeddings", None)
        sliding = any(t == "sliding_attention" for t in getattr(text_config, "layer_types", None) or ())
        self.sliding_window = getattr(text_config, "sliding_window", None) if sliding else None
        self._reset()

    def _reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.cache.activate_past_recording()
        self._since_crop = 0  # tokens appended since the last crop: how far back a sliding window can go

    @torch.inference_mode()
    def _forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        n = ids.shape[0]
        positions = torch.arange(start, start + n, device=self.device)[None]  # (1, n)
        out = self.model(
            input_ids=ids.to(self.device)[None], position_ids=positions, past_key_values=self.cache, use_cache=True,
            output_hidden_states=self.record_hidden,
        )
        if self.record_hidden:  # the last entry is the final norm's output, what the LM head reads
            self._store_hidden(start, out.hidden_states[-1][0])
        self._since_crop += n
        return out.logits[0].float()  # (n, V)

    def _rollback(self, length: int) -> None:
        if self.length:  # an empty cache has no layers to crop yet
            self.cache.crop(length - self.length)
        self._since_crop = 0

    def oldest_reachable(self) -> int:
        if self.sliding_window is None or self.length < self.sliding_window:
            return 0
        return self.length - self._since_crop
