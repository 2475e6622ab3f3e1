"""The HTTP API: OpenAI-style /v1/completions, /v1/chat/completions (streaming or not),
/v1/models, /health and /metrics. Every error is an OpenAI-style body with a 4xx status.

With an API key, everything but /health needs it (/metrics and the generated docs too); the Host
header must name an allowed host (by default the loopback names when the server listens on
loopback: a web page cannot reach a keyless local server through DNS rebinding)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from .admission import Admission
from .api_errors import APIError, error_response
from .metrics import ServerMetrics
from .middleware import LOOPBACK_HOSTS, BodyLimit, Guard, endpoint_label
from .responses import collect, completion_logprobs, speculation, stream, usage
from .schemas import ChatCompletionRequest, CompletionRequest, clean_location
from .worker import Worker

__all__ = ["LOOPBACK_HOSTS", "create_app"]


def create_app(sd, model_name: str, api_key: str | None = None, max_queue: int = 16, spec_off_depth: int | None = None,
               max_body_bytes: int = 1 << 20, gamma="auto", default_chat_tokens: int = 512,
               allowed_hosts: tuple[str, ...] | None = None, cors_origins: tuple[str, ...] = (), max_batch: int = 8,
               row_budget: int = 16, worker_thread: bool = True) -> FastAPI:
    """The app around a loaded SpecDec; one worker runs the model, batching up to `max_batch`
    requests a step (see specdec.decoding.batching for row_budget and spec_off_depth): in a thread of its
    own, or, with worker_thread=False, wherever the caller runs `app.state.worker.run()`."""
    metrics = ServerMetrics()
    tokenizer_lock = threading.Lock()
    worker = Worker(sd, metrics, max_queue, tokenizer_lock, max_batch=max_batch, row_budget=row_budget,
                    spec_off_at=spec_off_depth)
    if worker_thread:
        worker.start()
    context = sd.engine.target.max_length
    app = FastAPI(title="specdec", description="OpenAI-compatible server with lossless speculative decoding")
    app.state.worker = worker
    app.state.metrics = metrics
    admission = Admission(worker, metrics, model_name, context, sd.engine.target.vocab_size, max_queue, gamma,
                          default_chat_tokens)

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        metrics.requests.labels(endpoint=endpoint_label(request.url.path), status=str(exc.status)).inc()
        return error_response(exc.status, exc.message, exc.type, exc.param, exc.code, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        metrics.requests.labels(endpoint=endpoint_label(request.url.path), status="400").inc()
        first = exc.errors()[0] if exc.errors() else {"msg": "invalid request", "loc": ()}
        if first.get("type") == "json_invalid":
            return error_response(400, "the request body is not valid JSON", code="invalid_json")
        loc = clean_location(first.get("loc", ()))
        message = first.get("msg", "invalid request").removeprefix("Value error, ")
        return error_response(400, f"{'.'.join(loc) + ': ' if loc else ''}{message}", param=".".join(loc) or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc: StarletteHTTPException):
        metrics.requests.labels(endpoint=endpoint_label(request.url.path), status=str(exc.status_code)).inc()
        return error_response(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)

    app.add_middleware(BodyLimit, limit=max_body_bytes)
    app.add_middleware(Guard, api_key=api_key, allowed_hosts=allowed_hosts, metrics=metrics)
    if cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name, "queue_depth": worker.current_depth()}

    model_card = {"id": model_name, "object": "model", "created": 0, "owned_by": "specdec"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != model_name:
            raise APIError(404, f"the model '{model_id}' does not exist; this server serves '{model_name}'",
                           param="model", code="model_not_found")
        return model_card

    @app.get("/metrics")
    async def prometheus():
        metrics.queue_depth.set(worker.current_depth())
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def encode_prompt(text: str) -> list[int]:
        with tokenizer_lock:
            return sd.tokenizer(text, add_special_tokens=True)["input_ids"]

    def encode_chat(messages) -> list[int]:
        if not sd.target.has_chat_template:
            raise APIError(400, f"the model '{model_name}' has no chat template: use /v1/completions")
        with tokenizer_lock:
            return sd.encode([{"role": m.role, "content": m.content} for m in messages], chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        prompt_ids = await asyncio.to_thread(encode_prompt, body.prompt)  # a long prompt must not stall the loop
        jobs = admission.admit(body, prompt_ids, body.max_tokens, "completions")
        ident, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        sent = [0] * len(jobs)  # characters streamed per choice, for text_offset

        def chunk(index, text, logprobs, finish, first=False):
            if first:
                return None
            entries = completion_logprobs(logprobs, sent[index])
            sent[index] += len(text or "")
            return {"id": ident, "object": "text_completion", "created": created, "model": model_name,
                    "choices": [{"index": index, "text": text or "", "finish_reason": finish, "logprobs": entries}]}

        if body.stream:
            return StreamingResponse(stream(jobs, chunk, "/v1/completions", metrics), media_type="text/event-stream")
        results = await collect(request, jobs)
        metrics.requests.labels(endpoint="/v1/completions", status="200").inc()
        choices = [{"index": i, "text": text, "finish_reason": summary["finish_reason"],
                    "logprobs": completion_logprobs(summary["logprobs"])} for i, (text, summary) in enumerate(results)]
        summaries = [summary for _, summary in results]
        return {"id": ident, "object": "text_completion", "created": created, "model": model_name, "choices": choices,
                "usage": usage(summaries), "speculation": speculation(summaries, jobs)}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        jobs = admission.admit(body, await asyncio.to_thread(encode_chat, body.messages), max_tokens, "chat")
        ident, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())

        def chunk(index, text, logprobs, finish, first=False):
            delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
            return {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model_name,
                    "choices": [{"index": index, "delta": delta, "finish_reason": finish,
                                 "logprobs": None if logprobs is None else {"content": logprobs}}]}

        if body.stream:
            return StreamingResponse(stream(jobs, chunk, "/v1/chat/completions", metrics), media_type="text/event-stream")
        results = await collect(request, jobs)
        metrics.requests.labels(endpoint="/v1/chat/completions", status="200").inc()
        summaries = [summary for _, summary in results]
        return {"id": ident, "object": "chat.completion", "created": created, "model": model_name,
                "choices": [{"index": i, "message": {"role": "assistant", "content": text},
                             "finish_reason": summary["finish_reason"],
                             "logprobs": None if summary["logprobs"] is None else {"content": summary["logprobs"]}}
                            for i, (text, summary) in enumerate(results)],
                "usage": usage(summaries), "speculation": speculation(summaries, jobs)}

    return app
