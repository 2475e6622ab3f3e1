"""Request bodies of the OpenAI API subset specdec serves (pydantic), with extensions: `top_k`,
`gamma` (draft tokens per round for this request: an integer or "auto") and vLLM's `ignore_eos`.

Types are strict (`"max_tokens": "5"` is an error, not 5). OpenAI parameters that would change what
the client gets and that this server does not implement are refused with a 400 that names them,
never silently ignored; unknown fields that change nothing (`user`, `stream_options`, ...) pass.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..config import SEED_MAX, SEED_MIN

UNSUPPORTED = {
    # field: (is it in use?, what to say)
    "response_format": (lambda v: v not in (None, {}) and not (isinstance(v, dict) and v.get("type") == "text"),
                        "only response_format {\"type\": \"text\"} is supported"),
    "tools": (lambda v: bool(v), "tool calling is not supported"),
    "tool_choice": (lambda v: v not in (None, "none"), "tool calling is not supported"),
    "functions": (lambda v: bool(v), "function calling is not supported"),
    "function_call": (lambda v: v not in (None, "none"), "function calling is not supported"),
    "echo": (lambda v: v not in (None, False), "echo is not supported"),
    "best_of": (lambda v: v not in (None, 1), "best_of is not supported (only 1)"),
    "suffix": (lambda v: bool(v), "suffix (insertion) is not supported"),
}


def _find_bad_text(value, path: str = "") -> str | None:
    """The path of the first string in a JSON value that is not valid Unicode text, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "the body"
    elif isinstance(value, dict):
        for key, item in value.items():
            found = _find_bad_text(key, path) or _find_bad_text(item, f"{path}.{key}" if path else str(key))
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _find_bad_text(item, f"{path}.{i}")
            if found:
                return found
    return None


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data):
        """Runs before any field is validated: every string of the body, the prompt, messages and
        stop strings included, must be valid Unicode text."""
        found = _find_bad_text(data)
        if found:
            raise ValueError(f"{found} is not valid Unicode text (it holds a lone surrogate such as \\ud800)")
        return data

    model: str | None = None
    max_tokens: int | None = Field(default=None, description="new tokens at most; must be >= 1")
    temperature: float = Field(default=1.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="specdec extension: keep the k most likely tokens; 0 = off")
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=16, description="choices to generate (each a request of its own in the batch)")
    stream: bool = False
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(default=None, description="token id (as a string) -> bias in [-100, 100]")
    gamma: int | Literal["auto"] | None = Field(default=None, description="specdec extension")
    ignore_eos: bool = Field(default=False, description="extension (as in vLLM): keep generating past end-of-sequence")

    @model_validator(mode="after")
    def _refuse_unsupported(self):
        for name, value in (self.model_extra or {}).items():
            if name in UNSUPPORTED and UNSUPPORTED[name][0](value):
                raise ValueError(f"{name}: {UNSUPPORTED[name][1]}")
        return self

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, bias):
        if bias and len(bias) > 300:
            raise ValueError("logit_bias takes at most 300 tokens")
        for key, value in (bias or {}).items():
            # ASCII digits only ("²".isdigit() is true, int("²") fails) and few of them (no token id has 10)
            if not (key.isascii() and key.isdigit() and len(key) <= 9):
                raise ValueError(f"logit_bias keys are token ids such as \"50256\", got {key[:40]!r}")
            if not -100.0 <= value <= 100.0:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {value} for token {key}")
        return bias

    def bias_pairs(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(key), float(value)) for key, value in (self.logit_bias or {}).items())

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
    logprobs: int | None = Field(default=None, ge=0, le=5, description="log-probabilities of the tokens and of up to "
                                 "5 alternatives each")

    def logprobs_wanted(self) -> int | None:
        return self.logprobs

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


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[TextPart]

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content):
        if isinstance(content, list):
            kinds = {part.get("type") for part in content if isinstance(part, dict)}
            if kinds - {"text"}:
                raise ValueError(f"only text content parts are supported, not {sorted(str(k) for k in kinds - {'text'})}")
        return content

    @field_validator("content")
    @classmethod
    def _as_text(cls, content):
        return "\n".join(part.text for part in content) if isinstance(content, list) else content


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def logprobs_wanted(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @field_validator("messages")
    @classmethod
    def _not_empty(cls, messages):
        if not messages:
            raise ValueError("messages are empty: give at least one message")
        return messages


def clean_location(loc) -> list[str]:
    """A pydantic error location as the client's field path: without "body" and without the tags
    pydantic adds for union members and validators (`stop.str`, `function-after[...]`)."""
    out = []
    for part in loc:
        if part == "body":
            continue
        if isinstance(part, int):
            out.append(str(part))
        elif part.isidentifier() and part not in ("str", "int", "float", "bool", "list", "dict", "none") \
                and not part.startswith(("list[", "literal[", "function-")):
            out.append(part)
    return out
