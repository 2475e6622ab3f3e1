"""One worker runs the model: a continuous batch of the running requests, fed from a bounded
queue. `specdec serve` runs it in the main thread (the HTTP server in another): on a CPU every torch
call should come from the one thread that loaded the model, since a second thread issuing OpenMP
work made plain decoding ~1.4x slower on the EPYC (oneDNN's packed products; 16-18 tok/s against
23-26). Tests and embedders may start it in a thread of its own (`start()`).

Each step the worker admits waiting requests while the batch has room, drops those whose client
left, and runs one batch step (`specdec.decoding.batching`: one target pass for every running request, each
with its own drafts, cache and generator). The HTTP side talks to a job through an asyncio queue of
events: ("text", piece), then ("done", summary), ("cancelled", None), ("error", message) or, for a
request still queued when a shutdown's drain time ran out, ("unavailable", message). A
job's queue slot is free before its last event is sent, so a client that asks again at once finds
room.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field

from ..config import SamplingParams, SpecConfig
from ..decoding.batching import Batch, Member
from ..decoding.engine import TokenLogprob
from ..text import TextStream


@dataclass
class Job:
    prompt_ids: list[int]
    sampling: SamplingParams
    spec: SpecConfig
    stops: list[str]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)
    started: float | None = None
    first_text: float | None = None

    def emit(self, kind: str, payload) -> None:
        if kind == "text" and self.first_text is None:
            self.first_text = time.perf_counter()
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))


def find_stop(text: str, stops: list[str]) -> int | None:
    """Index of the earliest stop string in text, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


class Output:
    """A running job's text: decoded as tokens arrive, sent on as far as no stop string can still
    begin in it, cut at the first stop string. Text events carry (text, log-probability entries of
    the tokens not yet described, or None when the request asked for none)."""

    def __init__(self, job: Job, member: Member, tokenizer, tokenizer_lock: threading.Lock):
        self.job, self.member, self.tokenizer, self.lock = job, member, tokenizer, tokenizer_lock
        self.text = TextStream(tokenizer)
        self.full, self.sent = "", 0
        self.described: list[dict] = []  # log-probability entries sent so far, a token each
        self.stopped_at: int | None = None  # characters through the end of the stop string
        self.hold = max((len(s) for s in job.stops), default=1) - 1  # a stop string may straddle two chunks

    def _logprobs(self, through: int | None = None) -> list[dict] | None:
        """Entries of the tokens after those already sent, up to `through` tokens in all."""
        if self.member.logprobs is None:
            return None
        with self.lock:
            entries = [describe(entry, self.tokenizer) for entry in self.member.logprobs[len(self.described) : through]]
        self.described += entries
        return entries

    def push(self, tokens: list[int]) -> bool:
        """Take a round's tokens; True when a stop string has ended the answer."""
        with self.lock:
            self.full += self.text.push(tokens)
        stop_at = find_stop(self.full, self.job.stops)
        if stop_at is not None:
            stop = next(s for s in self.job.stops if self.full.startswith(s, stop_at))
            self.stopped_at = stop_at + len(stop)
            self.full = self.full[:stop_at]
            return True
        safe = len(self.full) - self.hold
        if safe > self.sent:
            self.job.emit("text", (self.full[self.sent : safe], self._logprobs()))
            self.sent = safe
        return False

    def flush(self, tokens: int) -> list[dict] | None:
        """Send the rest of the text; returns the entries of all `tokens` the answer used."""
        rest = self._logprobs(tokens)
        if len(self.full) > self.sent or rest:
            self.job.emit("text", (self.full[self.sent :], rest))
            self.sent = len(self.full)
        return None if self.member.logprobs is None else self.described[:tokens]

    def completion_tokens(self, tokens: list[int]) -> int:
        """Tokens the answer used: all of them, or the fewest whose text reaches the end of the stop
        string (tokens generated after it in the same round are not counted)."""
        if self.stopped_at is None:
            return len(tokens)
        low, high = 1, len(tokens)
        with self.lock:
            while low < high:
                middle = (low + high) // 2
                if len(self.tokenizer.decode(tokens[:middle], skip_special_tokens=True)) >= self.stopped_at:
                    high = middle
                else:
                    low = middle + 1
        return low


def describe(entry: TokenLogprob, tokenizer) -> dict:
    """A token's log-probabilities as OpenAI's chat API writes them (text, bytes, alternatives)."""
    def one(token: int, logprob: float) -> dict:
        text = tokenizer.decode([token])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
    return {**one(entry.token, entry.logprob), "top_logprobs": [one(t, lp) for t, lp in entry.top]}


class Worker:
    def __init__(self, sd, metrics, max_queue: int, tokenizer_lock: threading.Lock, max_batch: int = 8,
                 row_budget: int = 16, spec_off_at: int | None = None, prefill_chunk: int = 128):
        self.sd = sd
        self.metrics = metrics
        self.max_queue = max_queue
        self.tokenizer_lock = tokenizer_lock
        self.batch = Batch(sd.engine, max_batch=max_batch, row_budget=row_budget, prefill_chunk=prefill_chunk,
                           spec_off_at=spec_off_at)
        self.jobs: queue.Queue[Job] = queue.Queue()
        self.depth = 0  # waiting or running
        self.running: dict[Member, Output] = {}
        self._lock = threading.Lock()
        self.seconds_per_request: float | None = None  # running mean of served requests, for Retry-After
        self.draining = False
        self.abort_at: float | None = None  # when draining: the time the unfinished requests are ended

    def start(self) -> threading.Thread:
        """Run the worker in a daemon thread of its own."""
        thread = threading.Thread(target=self.run, name="specdec-worker", daemon=True)
        thread.start()
        return thread

    def _gauges(self) -> None:
        """Call with the lock held."""
        self.metrics.queue_depth.set(self.depth)
        self.metrics.running.set(len(self.running))
        self.metrics.waiting.set(self.depth - len(self.running))

    def submit(self, job: Job) -> bool:
        """Queue a job; False when the queue is full."""
        with self._lock:
            if self.depth >= self.max_queue:
                return False
            self.depth += 1
            self._gauges()
        self.jobs.put(job)
        return True

    def current_depth(self) -> int:
        with self._lock:
            return self.depth

    def retry_after(self) -> int:
        """Seconds until a queue slot is likely free: a slot frees when a running request ends, so
        what the oldest running request has left of the mean request time."""
        mean = self.seconds_per_request if self.seconds_per_request is not None else 1.0
        with self._lock:
            starts = [out.job.started for out in self.running.values() if out.job.started is not None]
        elapsed = time.perf_counter() - min(starts) if starts else 0.0
        return max(1, round(mean - elapsed))

    def drain(self, seconds: float) -> None:
        """Shut down gracefully: new requests are refused (the app answers 503), the accepted ones run
        on; those not finished within `seconds` end with finish_reason "abort" (a queued one that never
        started gets a 503). Called from a signal handler, so it only sets the clock."""
        self.draining = True
        deadline = time.perf_counter() + seconds
        self.abort_at = deadline if self.abort_at is None else min(self.abort_at, deadline)

    def _abort_all(self) -> None:
        """The drain's time is up: end every running request with what it has, refuse every waiting one."""
        for member, out in list(self.running.items()):
            self.batch.cancel(member)
            used = len(member.tokens)
            self._finish(out.job, ("done", {"finish_reason": "abort", "prompt_tokens": len(out.job.prompt_ids),
                                            "completion_tokens": used, "stats": member.stats,
                                            "logprobs": out.flush(used)}), member)
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                return
            self._finish(job, ("unavailable", "the server shut down before this request started; retry"))

    def _finish(self, job: Job, last: tuple[str, object], member: Member | None = None) -> None:
        """Free the job's slot, then send its last event."""
        with self._lock:
            self.depth -= 1
            if member is not None:
                self.running.pop(member, None)
            self._gauges()
        job.emit(*last)

    def run(self, until=lambda: False) -> None:
        """Serve jobs until `until()` is true (checked at least twice a second)."""
        while not until():
            if self.abort_at is not None and time.perf_counter() >= self.abort_at:
                self._abort_all()
            self._admit(block=not self.running)
            for member, out in list(self.running.items()):
                if out.job.cancelled.is_set():
                    self.batch.cancel(member)
                    self.metrics.cancelled.inc()
                    self._finish(out.job, ("cancelled", None), member)
            if not self.running:
                continue
            self.metrics.batch_size.observe(len(self.running))
            try:
                emitted = self.batch.step()
            except Exception as exc:  # a bug must not kill the worker: the running requests get a 500 body
                for member, out in list(self.running.items()):
                    self.batch.cancel(member)
                    self._finish(out.job, ("error", f"{type(exc).__name__}: {exc}"), member)
                continue
            if self.batch.draft_cap(len(self.running)) == 0:
                self.metrics.speculation_off.inc()
            for member, tokens in emitted:
                out = self.running.get(member)
                if out is not None and out.stopped_at is None and out.push(tokens):
                    self.batch.cancel(member)  # its stop string ended it
            for member, out in list(self.running.items()):
                if member.done:
                    self._done(member, out)

    def _admit(self, block: bool) -> None:
        """Move waiting jobs into the batch while it has room (wait for one when nothing runs)."""
        while not self.batch.full:
            try:
                job = self.jobs.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                return
            block = False
            if job.cancelled.is_set():  # its client left while it waited
                self.metrics.cancelled.inc()
                self._finish(job, ("cancelled", None))
                continue
            try:
                member = self.batch.add(job.prompt_ids, job.sampling, job.spec)
            except Exception as exc:
                self._finish(job, ("error", f"{type(exc).__name__}: {exc}"))
                continue
            job.started = time.perf_counter()
            self.metrics.queue_wait.observe(job.started - job.submitted)
            with self._lock:
                self.running[member] = Output(job, member, self.sd.tokenizer, self.tokenizer_lock)
                self._gauges()

    def _done(self, member: Member, out: Output) -> None:
        job, stats = out.job, member.stats
        used = out.completion_tokens(member.tokens)
        logprobs = out.flush(used)
        now = time.perf_counter()
        if job.first_text is not None:
            self.metrics.time_to_first_token.observe(job.first_text - job.submitted)
        self.metrics.request_seconds.observe(now - job.submitted)
        took = now - job.started
        mean = self.seconds_per_request
        self.seconds_per_request = took if mean is None else 0.8 * mean + 0.2 * took
        self.metrics.record_generation(stats)
        finish = "stop" if out.stopped_at is not None else stats.finish_reason
        self._finish(job, ("done", {"finish_reason": finish, "prompt_tokens": len(job.prompt_ids),
                                    "completion_tokens": used, "stats": stats, "logprobs": logprobs}), member)
