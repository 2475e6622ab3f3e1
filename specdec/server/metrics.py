"""Prometheus metrics of the server, in their own registry (scraped at GET /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("specdec_requests", "Requests answered, by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.generated = Counter("specdec_generated_tokens", "Tokens generated", registry=r)
        self.drafted = Counter("specdec_drafted_tokens", "Draft tokens proposed", registry=r)
        self.accepted = Counter("specdec_accepted_tokens", "Draft tokens accepted", registry=r)
        self.target_calls = Counter("specdec_target_calls", "Target forward passes while decoding", registry=r)
        self.position_tested = Counter("specdec_position_tested", "Draft positions tested, by position",
                                       ["position"], registry=r)
        self.position_accepted = Counter("specdec_position_accepted", "Draft positions accepted, by position",
                                         ["position"], registry=r)
        self.cancelled = Counter("specdec_requests_cancelled", "Generations stopped because the client left", registry=r)
        self.rejected = Counter("specdec_requests_rejected", "Requests refused with 429 because the queue was full",
                                registry=r)
        self.speculation_off = Counter("specdec_speculation_disabled", "Batch steps in which requests with gamma=auto "
                                       "did not speculate (the batch had reached --spec-off-depth or the row budget)",
                                       registry=r)
        self.batch_size = Histogram("specdec_batch_size", "Requests sharing a step (one target pass)",
                                    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64), registry=r)
        self.queue_depth = Gauge("specdec_queue_depth", "Requests waiting or running", registry=r)
        self.running = Gauge("specdec_requests_running", "Requests generating now", registry=r)
        self.waiting = Gauge("specdec_requests_waiting", "Requests waiting for the model", registry=r)
        self.prompt_tokens = Counter("specdec_prompt_tokens", "Prompt tokens of served requests", registry=r)
        self.generated_by_drafter = Counter("specdec_generated_tokens_by_drafter", "Tokens generated, by the drafter "
                                            "that ran (none: plain decoding)", ["drafter"], registry=r)
        latency = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
        self.queue_wait = Histogram("specdec_queue_wait_seconds", "Admission to the start of generation",
                                    buckets=latency, registry=r)
        self.time_to_first_token = Histogram("specdec_time_to_first_token_seconds", "Admission to the first text",
                                             buckets=latency, registry=r)
        self.request_seconds = Histogram("specdec_request_seconds", "Admission to the last token (end to end)",
                                         buckets=latency, registry=r)
        self.time_per_token = Histogram("specdec_time_per_token_seconds", "Decode time per generated token",
                                        buckets=(0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0),
                                        registry=r)

    def record_generation(self, stats) -> None:
        self.generated.inc(stats.new_tokens)
        self.generated_by_drafter.labels(drafter=stats.drafter).inc(stats.new_tokens)
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.drafted.inc(stats.drafted)
        self.accepted.inc(stats.accepted)
        self.target_calls.inc(stats.target_calls)
        for i, (tested, accepted) in enumerate(zip(stats.position_tested, stats.position_accepted)):
            self.position_tested.labels(position=str(i)).inc(tested)
            self.position_accepted.labels(position=str(i)).inc(accepted)
        if stats.new_tokens and stats.decode_seconds:
            self.time_per_token.observe(stats.decode_seconds / stats.new_tokens)
