"""Prometheus metrics for `GET /metrics`, named after vLLM's so the same dashboards read both.

Counters (exposed with Prometheus' `_total` suffix):
- `spec_decode_num_drafts`: verify steps that checked a non-empty draft, summed over requests;
- `spec_decode_num_draft_tokens`: drafted tokens sent to verification;
- `spec_decode_num_accepted_tokens`: of those, accepted;
- `spec_decode_num_accepted_tokens_per_pos{position="i"}`: accepted at draft position i (0-based,
  as vLLM); accepted / drafts per position is the per-position acceptance a_{i+1}.
So mean acceptance length tau = 1 + accepted / drafts, the same formula vLLM's docs give.

Histograms: `time_to_first_token_seconds` (arrival to first token, queueing included) and
`time_per_output_token_seconds` (each request's mean gap between tokens after the first). Plus request,
token and queue gauges/counters. A request's numbers are added when it leaves the batch.
"""

from __future__ import annotations

from collections.abc import Callable

import prometheus_client as prom
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from draftsmith.decoding.engine import DecodeStats

prom.disable_created_metrics()  # no `*_created` samples: vLLM does not emit them either

TTFT_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
)
TPOT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


class Metrics:
    """One registry per server (tests start several in one process)."""

    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry
        self.num_drafts = Counter("spec_decode_num_drafts", "Verify steps with a draft.", labels, registry=r)
        self.num_draft_tokens = Counter("spec_decode_num_draft_tokens", "Drafted tokens.", labels, registry=r)
        self.num_accepted_tokens = Counter(
            "spec_decode_num_accepted_tokens", "Accepted draft tokens.", labels, registry=r
        )
        self.accepted_per_pos = Counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens by draft position (0-based).",
            [*labels, "position"],
            registry=r,
        )
        self.ttft = Histogram(
            "time_to_first_token_seconds", "Time to first token.", labels, buckets=TTFT_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            "time_per_output_token_seconds",
            "Time per output token.",
            labels,
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("prompt_tokens", "Prefilled prompt tokens.", labels, registry=r)
        self.generation_tokens = Counter("generation_tokens", "Generated tokens.", labels, registry=r)
        self.request_success = Counter(
            "request_success", "Finished requests.", [*labels, "finished_reason"], registry=r
        )
        self.request_rejected = Counter("request_rejected", "Requests refused with 429.", labels, registry=r)
        self.running = Gauge("num_requests_running", "Requests in the batch.", labels, registry=r)
        self.waiting = Gauge("num_requests_waiting", "Requests queued.", labels, registry=r)
        self.model = model

    def watch(self, running: Callable[[], int], waiting: Callable[[], int]) -> None:
        self.running.labels(self.model).set_function(running)
        self.waiting.labels(self.model).set_function(waiting)

    def first_token(self, seconds: float) -> None:
        self.ttft.labels(self.model).observe(seconds)

    def finished(
        self, stats: DecodeStats, prompt_tokens: int, tokens: int, reason: str, tpot: float | None
    ) -> None:
        m = self.model
        self.num_drafts.labels(m).inc(stats.drafts)
        self.num_draft_tokens.labels(m).inc(stats.draft_tokens)
        self.num_accepted_tokens.labels(m).inc(sum(stats.accepted))
        for pos, n in enumerate(stats.accepted):
            self.accepted_per_pos.labels(m, str(pos)).inc(n)
        self.prompt_tokens.labels(m).inc(prompt_tokens)
        self.generation_tokens.labels(m).inc(tokens)
        self.request_success.labels(m, reason).inc()
        if tpot is not None:
            self.tpot.labels(m).observe(tpot)

    def rejected(self) -> None:
        self.request_rejected.labels(self.model).inc()

    def render(self) -> bytes:
        return prom.generate_latest(self.registry)


CONTENT_TYPE = prom.CONTENT_TYPE_LATEST
