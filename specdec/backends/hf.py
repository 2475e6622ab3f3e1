"""Any Hugging Face causal LM through transformers, with a DynamicCache cropped on rollback."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from .base import Backend


class TransformersBackend(Backend):
    """Runs a `transformers` causal LM one sequence at a time.

    Rollback crops the cache (`DynamicCache.crop` with a negative count). Sliding-window layers
    (Gemma-3) record their past so that a crop below the window is still exact."""

    path = "transformers"

    def __init__(self, model: PreTrainedModel):
        self.model = model.eval()
        self.device = model.device
        text_config = model.config.get_text_config()
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_length = getattr(text_config, "max_position_embeddings", None)
        self.reset()

    @property
    def length(self) -> int:
        return self._length

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.cache.activate_past_recording()
        self._length = 0

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[0]
        positions = torch.arange(self._length, self._length + n, device=self.device)[None]  # (1, n)
        out = self.model(
            input_ids=ids.to(self.device)[None], position_ids=positions, past_key_values=self.cache, use_cache=True
        )
        self._length += n
        return out.logits[0].float()  # (n, V)

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot roll back to {length}: the cache holds {self._length} tokens")
        self.cache.crop(length - self._length)
        self._length = length
