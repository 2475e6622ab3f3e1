"""Any Hugging Face causal LM through transformers, with a DynamicCache cropped on rollback."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from .base import Backend


class TransformersBackend(Backend):
    """Runs a `transformers` causal LM one sequence at a time.

    Rollback crops the cache (`DynamicCache.crop` with a negative count). Sliding-window layers
    (Gemma-3) record their past, so a crop by up to the tokens of the last forward is exact; they
    forget what lies further back, which `oldest_reachable` reports.

    Token trees go through transformers' custom 4-D attention mask (an additive float mask, so
    every attention implementation reads it alike) with position ids by depth, and the accepted
    path's keys and values are moved into place layer by layer. Models with sliding-window layers
    keep a per-layer cache of another length and take one mask for all layers, so they verify a
    tree's first chain instead (`supports_trees` is False)."""

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
        if self.record_hidden:
            self._store_hidden(start, self._features(out.hidden_states))
        self._since_crop += n
        return out.logits[0].float()  # (n, V)

    def _features(self, hidden_states: tuple) -> torch.Tensor:
        """What record_hidden keeps from transformers' hidden states: the last entry is the final
        norm's output (what the LM head reads); entry i < N is what enters layer i."""
        if self.hidden_layers:
            return torch.cat([hidden_states[i][0] for i in self.hidden_layers], dim=-1)
        return hidden_states[-1][0]

    @property
    def supports_trees(self) -> bool:
        return self.sliding_window is None

    @torch.inference_mode()
    def _forward_tree(self, ids: torch.Tensor, layout, start: int) -> torch.Tensor:
        n = ids.shape[0]
        dtype = next(self.model.parameters()).dtype
        mask = torch.zeros(1, 1, n, start + n, dtype=dtype).masked_fill(~layout.visible(start), torch.finfo(dtype).min)
        out = self.model(
            input_ids=ids.to(self.device)[None], position_ids=(start + layout.depth).to(self.device)[None],
            attention_mask=mask.to(self.device), past_key_values=self.cache, use_cache=True,
            output_hidden_states=self.record_hidden,
        )
        if self.record_hidden:
            self._store_hidden(start, self._features(out.hidden_states))
        self._since_crop += n
        return out.logits[0].float()  # (n, V)

    def _keep(self, start: int, slots: list[int]) -> None:
        source = torch.tensor(slots, dtype=torch.long, device=self.device)
        for layer in self.cache.layers:
            if slots:
                layer.keys[:, :, start : start + len(slots)] = layer.keys[:, :, source]
                layer.values[:, :, start : start + len(slots)] = layer.values[:, :, source]
        drop = self.length - (start + len(slots))  # the cache still holds every row of the tree pass
        if drop:
            self.cache.crop(-drop)
        self._since_crop = 0

    def _rollback(self, length: int) -> None:
        if self.length:  # an empty cache has no layers to crop yet
            self.cache.crop(length - self.length)
        self._since_crop = 0

    def oldest_reachable(self) -> int:
        if self.sliding_window is None or self.length < self.sliding_window:
            return 0
        return self.length - self._since_crop
