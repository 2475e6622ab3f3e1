"""From the worker's events to the API's answers: every choice collected (or streamed as server-sent
events), the usage, what speculation did, and logprobs in the completions API's layout."""

from __future__ import annotations

import asyncio
import json

from fastapi import Request

from .api_errors import APIError
from .metrics import ServerMetrics
from .worker import Job


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

async def stream(jobs: list[Job], make_chunk, endpoint: str, metrics: ServerMetrics):
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
