"""Request bodies of the OpenAI API subset specdec serves (pydantic), with extensions: `top_k`,
`gamma` (draft tokens per round for this request: an integer or "auto") and vLLM's `ignore_eos`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown OpenAI fields (user, logit_bias, ...) are ignored

    model: str | None = None
    max_tokens: int | None = Field(default=None, description="new tokens at most; must be >= 1")
    temperature: float = Field(default=1.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="specdec extension: keep the k most likely tokens; 0 = off")
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    gamma: int | Literal["auto"] | None = Field(default=None, description="specdec extension")
    ignore_eos: bool = Field(default=False, description="extension (as in vLLM): keep generating past end-of-sequence")

    @field_validator("n")
    @classmethod
    def _only_one(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop):
        stops = [stop] if isinstance(stop, str) else (stop or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return stops

    @field_validator("gamma")
    @classmethod
    def _gamma(cls, gamma):
        if isinstance(gamma, int) and gamma < 0:
            raise ValueError("gamma must be >= 0 or 'auto'")
        return gamma


class CompletionRequest(SamplingFields):
    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt):
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise ValueError("give exactly one prompt")
            prompt = prompt[0]
        if not prompt.strip():
            raise ValueError("the prompt is empty")
        return prompt


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "developer"]
    content: str


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None

    @field_validator("messages")
    @classmethod
    def _not_empty(cls, messages):
        if not messages:
            raise ValueError("messages are empty: give at least one message")
        return messages
