"""Admission: a request checked against the model (its name, context, vocabulary) and the queue, and
turned into one worker job per choice, or refused with the API error that says what was wrong."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..config import SamplingParams, SpecConfig
from ..errors import SpecdecError
from .api_errors import APIError
from .metrics import ServerMetrics
from .worker import Job, Worker


def choice_seed(seed: int | None, choice: int) -> int | None:
    """The seed of choice `choice` of a request: its own seed for the first, then seeds derived
    from it (the same request gives the same n answers; they differ from one another)."""
    if seed is None or choice == 0:
        return seed
    return (seed + choice * 0x9E3779B97F4A7C15) % (1 << 64)



@dataclass
class Admission:
    worker: Worker
    metrics: ServerMetrics
    model_name: str
    context: int | None
    """The target's context length in tokens (None: unbounded)."""
    vocab_size: int
    max_queue: int
    gamma: int | str
    """The server's default draft length (a request's own gamma stands)."""
    default_chat_tokens: int

    def admit(self, body, prompt_ids: list[int], max_tokens: int | None, endpoint: str) -> list[Job]:
        """Check the request against the model and queue one job per choice (`n`)."""
        if self.worker.draining:
            raise APIError(503, "the server is shutting down; retry on another instance or later",
                           type_="server_error", code="shutting_down")
        if body.model not in (None, "", self.model_name):
            raise APIError(404, f"the model '{body.model}' does not exist; this server serves '{self.model_name}'",
                           param="model", code="model_not_found")
        room = self.context - len(prompt_ids) if self.context else None
        if room is not None and room < 1:
            raise APIError(400, f"the prompt has {len(prompt_ids)} tokens but the context holds {self.context}",
                           param="messages" if endpoint == "chat" else "prompt", code="context_length_exceeded")
        if max_tokens is None:
            max_tokens = 16 if endpoint == "completions" else min(self.default_chat_tokens, room or self.default_chat_tokens)
        if max_tokens < 1:
            raise APIError(400, f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
        if room is not None and max_tokens > room:
            raise APIError(400, f"max_tokens {max_tokens} is too large: the prompt has {len(prompt_ids)} tokens and "
                           f"the context holds {self.context}, so at most {room} can be generated",
                           param="max_tokens", code="context_length_exceeded")
        if body.n > self.max_queue:
            raise APIError(400, f"n={body.n} choices need {body.n} queue slots but the server has {self.max_queue} "
                           "(--max-queue)", param="n")
        bias = body.bias_pairs()
        if any(token >= self.vocab_size for token, _ in bias):
            raise APIError(400, f"logit_bias names a token id the model does not have (ids are < "
                           f"{self.vocab_size})", param="logit_bias")
        jobs = []
        try:
            for choice in range(body.n):
                # a seeded request draws by noise keyed by (seed, position): the same answer streamed or not, alone
                # or under load, with or without speculation; each further choice draws with a seed of its own
                sampling = SamplingParams.for_request(
                    body.temperature, body.top_k, body.top_p, choice_seed(body.seed, choice), logit_bias=bias,
                    presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
                    logprobs=body.logprobs_wanted())
                # gamma="auto" drafts less as the batch fills (specdec.decoding.batching); a request's own gamma stands
                request_gamma = self.gamma if body.gamma is None else body.gamma
                spec = SpecConfig(gamma=request_gamma, max_new_tokens=max_tokens, stop_at_eos=not body.ignore_eos)
                jobs.append(Job(prompt_ids, sampling, spec, body.stop or [], asyncio.get_running_loop()))
        except SpecdecError as exc:
            raise APIError(400, str(exc)) from None
        for i, job in enumerate(jobs):
            if not self.worker.submit(job):
                for queued in jobs[:i]:
                    queued.cancelled.set()  # the worker drops them unrun
                self.metrics.rejected.inc()
                raise APIError(429, "the server is busy: too many requests are waiting; retry later",
                               type_="rate_limit_exceeded", code="queue_full",
                               headers={"Retry-After": str(self.worker.retry_after())})
        return jobs
