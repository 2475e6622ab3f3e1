"""One worker thread runs the model; requests wait for it in a bounded queue.

Batch size one is the regime speculative decoding is for, so requests are served one at a time in
arrival order, each with its own seeded generator (no cross-talk). The HTTP side talks to a job
through an asyncio queue of events: ("text", piece), then ("done", summary), ("cancelled", None) or
("error", message). A job whose client left is flagged; the worker skips it if it is still queued
and stops its generation at the next round if it runs. A job's queue slot is free before its last
event is sent, so a client that asks again at once finds room.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field

from ..config import SamplingParams, SpecConfig
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
    first_text: float | None = None

    def emit(self, kind: str, payload) -> None:
        if kind == "text" and self.first_text is None:
            self.first_text = time.perf_counter()
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))


def find_stop(text: str, stops: list[str]) -> int | None:
    """Index of the earliest stop string in text, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


class Worker:
    def __init__(self, sd, metrics, max_queue: int, tokenizer_lock: threading.Lock):
        self.sd = sd
        self.metrics = metrics
        self.max_queue = max_queue
        self.tokenizer_lock = tokenizer_lock
        self.jobs: queue.Queue[Job] = queue.Queue()
        self.depth = 0
        self._lock = threading.Lock()
        self.seconds_per_request: float | None = None  # running mean of served requests, for Retry-After
        self.running_since: float | None = None
        self.thread = threading.Thread(target=self._loop, name="specdec-worker", daemon=True)
        self.thread.start()

    def _gauges(self, running: int) -> None:
        """Call with the lock held."""
        self.metrics.queue_depth.set(self.depth)
        self.metrics.running.set(running)
        self.metrics.waiting.set(self.depth - running)

    def submit(self, job: Job) -> bool:
        """Queue a job; False when the queue is full."""
        with self._lock:
            if self.depth >= self.max_queue:
                return False
            self.depth += 1
            self._gauges(int(self.running_since is not None))
        self.jobs.put(job)
        return True

    def current_depth(self) -> int:
        with self._lock:
            return self.depth

    def retry_after(self) -> int:
        """Seconds until a queue slot is likely free: what the running request has left of the
        mean request time (a slot frees when it ends)."""
        mean = self.seconds_per_request if self.seconds_per_request is not None else 1.0
        since = self.running_since
        elapsed = time.perf_counter() - since if since is not None else 0.0
        return max(1, round(mean - elapsed))

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            with self._lock:
                start = self.running_since = time.perf_counter()
                self._gauges(1)
            last = ("cancelled", None)
            try:
                if job.cancelled.is_set():
                    self.metrics.cancelled.inc()
                else:
                    self.metrics.queue_wait.observe(start - job.submitted)
                    last = self._run(job)
                    if job.first_text is not None:
                        self.metrics.time_to_first_token.observe(job.first_text - job.submitted)
                    self.metrics.request_seconds.observe(time.perf_counter() - job.submitted)
                    took = time.perf_counter() - start
                    mean = self.seconds_per_request
                    self.seconds_per_request = took if mean is None else 0.8 * mean + 0.2 * took
            except Exception as exc:  # a bug must not kill the worker; the client gets a 500 body
                last = ("error", f"{type(exc).__name__}: {exc}")
            finally:
                with self._lock:
                    self.running_since = None
                    self.depth -= 1
                    self._gauges(0)
                job.emit(*last)

    def _run(self, job: Job) -> tuple[str, object]:
        """Generate, streaming text events; returns the last event for the loop to send once the
        slot is free."""
        run = self.sd.engine.generate(job.prompt_ids, job.sampling, job.spec)
        text = TextStream(self.sd.tokenizer)
        full, sent, finish = "", 0, None
        hold = max((len(s) for s in job.stops), default=1) - 1  # a stop string may straddle two chunks
        for chunk in run:
            if job.cancelled.is_set():
                self.metrics.cancelled.inc()
                finish = "cancelled"
                break
            with self.tokenizer_lock:
                full += text.push(chunk)
            stop_at = find_stop(full, job.stops)
            if stop_at is not None:
                stop = next(s for s in job.stops if full.startswith(s, stop_at))
                used = self._tokens_through(run.tokens, stop_at + len(stop))
                full, finish = full[:stop_at], "stop"
                break
            safe = len(full) - hold
            if safe > sent:
                job.emit("text", full[sent:safe])
                sent = safe
        else:
            used = None
        run.close()
        if finish == "cancelled":
            return "cancelled", None
        if len(full) > sent:
            job.emit("text", full[sent:])
        stats = run.stats
        self.metrics.record_generation(stats)
        completion = stats.new_tokens if used is None else used
        return "done", {"finish_reason": finish or stats.finish_reason, "prompt_tokens": len(job.prompt_ids),
                        "completion_tokens": completion, "stats": stats}

    def _tokens_through(self, tokens: list[int], chars: int) -> int:
        """The fewest generated tokens whose text reaches `chars` characters: what the answer used
        up to the end of its stop string (tokens generated after it in the same round are not counted)."""
        low, high = 1, len(tokens)
        with self.tokenizer_lock:
            while low < high:
                middle = (low + high) // 2
                if len(self.sd.tokenizer.decode(tokens[:middle], skip_special_tokens=True)) >= chars:
                    high = middle
                else:
                    low = middle + 1
        return low
