"""The HTTP API: OpenAI-style /v1/completions, /v1/chat/completions (streaming or not),
/v1/models, /health and /metrics. Every error is an OpenAI-style body with a 4xx status.

With an API key, everything but /health needs it (/metrics and the generated docs too); the Host
header must name an allowed host (by default the loopback names when the server listens on
loopback: a web page cannot reach a keyless local server through DNS rebinding)."""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import SamplingParams, SpecConfig
from ..errors import SpecdecError
from .metrics import ServerMetrics
from .schemas import ChatCompletionRequest, CompletionRequest, clean_location
from .worker import Job, Worker


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        self.status, self.message, self.type, self.param, self.code, self.headers = status, message, type_, param, code, headers


def error_response(status: int, message: str, type_: str = "invalid_request_error", param=None, code=None,
                   headers=None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def choice_seed(seed: int | None, choice: int) -> int | None:
    """The seed of choice `choice` of a request: its own seed for the first, then seeds derived
    from it (the same request gives the same n answers; they differ from one another)."""
    if seed is None or choice == 0:
        return seed
    return (seed + choice * 0x9E3779B97F4A7C15) % (1 << 64)


class BodyLimit:
    """ASGI middleware: refuse request bodies over `limit` bytes with 413, declared or streamed."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_big = error_response(413, f"request body is larger than {self.limit} bytes", code="body_too_large")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await too_big(scope, receive, send)
        body, more = [], True
        size = 0
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                return await too_big(scope, receive, send)
            body.append(message.get("body", b""))
            more = message.get("more_body", False)
        data = b"".join(body)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": data, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/docs", "/redoc",
             "/openapi.json")


def endpoint_label(path: str) -> str:
    """A bounded label for metrics: a known route, /v1/models/{id}, or "other"."""
    if path in ENDPOINTS:
        return path
    return "/v1/models/{id}" if path.startswith("/v1/models/") else "other"


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1")


class Guard:
    """ASGI middleware: the Host header check and the API key (pure ASGI, so a handler can still see
    its client disconnect, which Starlette's BaseHTTPMiddleware hides)."""

    def __init__(self, app, api_key: str | None, allowed_hosts: tuple[str, ...] | None, metrics):
        self.app, self.api_key, self.allowed_hosts, self.metrics = app, api_key, allowed_hosts, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        path = scope.get("path", "")
        if self.allowed_hosts is not None:
            host = headers.get(b"host", b"").decode("latin-1")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if name not in self.allowed_hosts:
                self.metrics.requests.labels(endpoint=endpoint_label(path), status="400").inc()
                response = error_response(400, f"host {host!r} is not allowed: this server answers "
                                          f"{', '.join(self.allowed_hosts)} (see --allowed-hosts)", code="host_not_allowed")
                return await response(scope, receive, send)
        if self.api_key and path != "/health":
            scheme, _, given = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
            # the scheme is case-insensitive (RFC 9110 11.1); the key is compared in constant time
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode("utf-8", "replace"),
                                                                     self.api_key.encode()):
                self.metrics.requests.labels(endpoint=endpoint_label(path), status="401").inc()
                response = error_response(401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                                          type_="authentication_error", code="invalid_api_key")
                return await response(scope, receive, send)
        return await self.app(scope, receive, send)


def create_app(sd, model_name: str, api_key: str | None = None, max_queue: int = 16, spec_off_depth: int | None = None,
               max_body_bytes: int = 1 << 20, gamma="auto", default_chat_tokens: int = 512,
               allowed_hosts: tuple[str, ...] | None = None, cors_origins: tuple[str, ...] = (), max_batch: int = 8,
               row_budget: int = 16, worker_thread: bool = True) -> FastAPI:
    """The app around a loaded SpecDec; one worker runs the model, batching up to `max_batch`
    requests a step (see specdec.batching for row_budget and spec_off_depth): in a thread of its
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

    def admit(body, prompt_ids: list[int], max_tokens: int | None, endpoint: str) -> list[Job]:
        """Check the request against the model and queue one job per choice (`n`)."""
        if worker.draining:
            raise APIError(503, "the server is shutting down; retry on another instance or later",
                           type_="server_error", code="shutting_down")
        if body.model not in (None, "", model_name):
            raise APIError(404, f"the model '{body.model}' does not exist; this server serves '{model_name}'",
                           param="model", code="model_not_found")
        room = context - len(prompt_ids) if context else None
        if room is not None and room < 1:
            raise APIError(400, f"the prompt has {len(prompt_ids)} tokens but the context holds {context}",
                           param="messages" if endpoint == "chat" else "prompt", code="context_length_exceeded")
        if max_tokens is None:
            max_tokens = 16 if endpoint == "completions" else min(default_chat_tokens, room or default_chat_tokens)
        if max_tokens < 1:
            raise APIError(400, f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
        if room is not None and max_tokens > room:
            raise APIError(400, f"max_tokens {max_tokens} is too large: the prompt has {len(prompt_ids)} tokens and "
                           f"the context holds {context}, so at most {room} can be generated",
                           param="max_tokens", code="context_length_exceeded")
        if body.n > max_queue:
            raise APIError(400, f"n={body.n} choices need {body.n} queue slots but the server has {max_queue} "
                           "(--max-queue)", param="n")
        bias = body.bias_pairs()
        if any(token >= sd.engine.target.vocab_size for token, _ in bias):
            raise APIError(400, f"logit_bias names a token id the model does not have (ids are < "
                           f"{sd.engine.target.vocab_size})", param="logit_bias")
        jobs = []
        try:
            for choice in range(body.n):
                # a seeded request draws by noise keyed by (seed, position): the same answer streamed or not, alone
                # or under load, with or without speculation; each further choice draws with a seed of its own
                sampling = SamplingParams.for_request(
                    body.temperature, body.top_k, body.top_p, choice_seed(body.seed, choice), logit_bias=bias,
                    presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
                    logprobs=body.logprobs_wanted())
                # gamma="auto" drafts less as the batch fills (specdec.batching); a request's own gamma stands
                request_gamma = gamma if body.gamma is None else body.gamma
                spec = SpecConfig(gamma=request_gamma, max_new_tokens=max_tokens, stop_at_eos=not body.ignore_eos)
                jobs.append(Job(prompt_ids, sampling, spec, body.stop or [], asyncio.get_running_loop()))
        except SpecdecError as exc:
            raise APIError(400, str(exc)) from None
        for i, job in enumerate(jobs):
            if not worker.submit(job):
                for queued in jobs[:i]:
                    queued.cancelled.set()  # the worker drops them unrun
                metrics.rejected.inc()
                raise APIError(429, "the server is busy: too many requests are waiting; retry later",
                               type_="rate_limit_exceeded", code="queue_full",
                               headers={"Retry-After": str(worker.retry_after())})
        return jobs

    def speculation(summaries: list[dict], jobs: list[Job]) -> dict:
        """What speculation did, over all choices."""
        stats = [summary["stats"] for summary in summaries]
        drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
        calls, tokens = sum(s.target_calls for s in stats), sum(s.new_tokens for s in stats)
        out = {"enabled": jobs[0].spec.gamma != 0, "gamma": jobs[0].spec.gamma, "drafter": stats[0].drafter,
               "drafted": drafted, "accepted": accepted, "alpha": accepted / drafted if drafted else None,
               "tau": tokens / calls if calls else None, "target_calls": calls}
        if len(stats) == 1:
            out["acceptance_by_position"] = stats[0].acceptance_by_position()
        return out

    def usage(summaries: list[dict]) -> dict:
        prompt, completion = summaries[0]["prompt_tokens"], sum(s["completion_tokens"] for s in summaries)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    async def watch(request: Request, jobs: list[Job]) -> None:
        """Flag the jobs when their client goes away (queued or running), and wake the collectors."""
        while not all(job.cancelled.is_set() for job in jobs):
            if await request.is_disconnected():
                for job in jobs:
                    job.cancelled.set()
                    job.events.put_nowait(("cancelled", None))
                return
            await asyncio.sleep(0.1)

    async def collect(request: Request, jobs: list[Job]) -> list[tuple[str, dict]]:
        """Each choice's text and summary, once all have finished."""
        async def one(job: Job) -> tuple[str, dict]:
            pieces = []
            while True:
                kind, payload = await job.events.get()
                if kind == "text":
                    pieces.append(payload[0])
                elif kind == "error":
                    raise APIError(500, f"generation failed: {payload}", type_="server_error")
                elif kind == "cancelled":
                    raise APIError(499, "client disconnected")
                elif kind == "unavailable":
                    raise APIError(503, payload, type_="server_error", code="shutting_down")
                else:
                    return "".join(pieces), payload

        watcher = asyncio.create_task(watch(request, jobs))
        try:
            return await asyncio.gather(*(one(job) for job in jobs))
        finally:
            watcher.cancel()
            for job in jobs:
                job.cancelled.set()  # no-op for finished ones; stops the others when one failed

    def sse(obj) -> str:
        return f"data: {json.dumps(obj)}\n\n"

    async def stream(jobs: list[Job], make_chunk, endpoint: str):
        """Server-sent events of every choice, as their text comes; the last chunk carries the usage
        and what speculation did."""
        try:
            for index in range(len(jobs)):
                first = make_chunk(index, None, None, None, first=True)
                if first:
                    yield sse(first)
            waiting = {asyncio.ensure_future(job.events.get()): index for index, job in enumerate(jobs)}
            summaries: list[dict | None] = [None] * len(jobs)
            while waiting:
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    index = waiting.pop(task)
                    kind, payload = task.result()
                    if kind == "text":
                        yield sse(make_chunk(index, payload[0], payload[1], None))
                        waiting[asyncio.ensure_future(jobs[index].events.get())] = index
                    elif kind in ("error", "unavailable"):
                        message = f"generation failed: {payload}" if kind == "error" else payload
                        yield sse({"error": {"message": message, "type": "server_error",
                                             "code": "shutting_down" if kind == "unavailable" else None}})
                        yield "data: [DONE]\n\n"
                        return
                    elif kind == "cancelled":
                        return
                    else:
                        summaries[index] = payload
                        final = make_chunk(index, None, None, payload["finish_reason"])
                        if not waiting:
                            final["usage"] = usage(summaries)
                            final["speculation"] = speculation(summaries, jobs)
                        yield sse(final)
            yield "data: [DONE]\n\n"
            metrics.requests.labels(endpoint=endpoint, status="200").inc()
        finally:
            for job in jobs:
                job.cancelled.set()  # no-op when finished; stops the generation when the client left

    def completion_logprobs(entries: list[dict] | None, offset: int = 0) -> dict | None:
        """Chat-style entries in the completions API's layout."""
        if entries is None:
            return None
        offsets, at = [], offset
        for entry in entries:
            offsets.append(at)
            at += len(entry["token"])
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
                "text_offset": offsets}

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
        jobs = admit(body, prompt_ids, body.max_tokens, "completions")
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
            return StreamingResponse(stream(jobs, chunk, "/v1/completions"), media_type="text/event-stream")
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
        jobs = admit(body, await asyncio.to_thread(encode_chat, body.messages), max_tokens, "chat")
        ident, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())

        def chunk(index, text, logprobs, finish, first=False):
            delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
            return {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model_name,
                    "choices": [{"index": index, "delta": delta, "finish_reason": finish,
                                 "logprobs": None if logprobs is None else {"content": logprobs}}]}

        if body.stream:
            return StreamingResponse(stream(jobs, chunk, "/v1/chat/completions"), media_type="text/event-stream")
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
