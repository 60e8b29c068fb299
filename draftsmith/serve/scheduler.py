"""Continuous batching: one background thread drives the engine's `Batch`, and requests join it at
every decode step instead of waiting for the batch to drain.

The loop, once per step: drop rows whose client went away, admit waiting requests while the batch
has room (one prefill forward for all that join), run one verify step over every live row, hand each
request its newly committed ids. Requests talk to the thread through a bounded queue (`submit`,
which refuses when full: the HTTP layer answers 429) and receive events on their own asyncio queue:
`("tokens", ids)`, then `("done", finish_reason, row)` or `("error", message)`.

What this module does not do: tokenize, format responses or know about HTTP (app.py does). It does
not preempt: a request, once admitted, keeps its row until it finishes or its client leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from draftsmith.decoding.engine import Batch, Row, Seq
from draftsmith.decoding.sampling import SamplingParams
from draftsmith.drafters.base import DrafterFactory
from draftsmith.serve.metrics import Metrics
from draftsmith.target.model import Target

log = logging.getLogger("draftsmith.serve")


class QueueFull(Exception):
    pass


@dataclass(eq=False)  # identity: `job in waiting` must not compare prompts
class Job:
    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams
    generator: torch.Generator | None
    stop: Callable[[list[int]], bool] | None
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    id: int = -1
    arrived: float = field(default_factory=time.perf_counter)
    first_at: float | None = None
    last_at: float | None = None
    n_tokens: int = 0
    cancelled: bool = False

    def send(self, *event) -> None:
        # A closed event loop (the server shutting down) has nobody left to listen.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class Scheduler:
    def __init__(
        self,
        target: Target,
        factory: DrafterFactory | None,
        *,
        k: int,
        max_batch: int,
        max_queue: int,
        metrics: Metrics,
    ) -> None:
        self.target, self.factory, self.k = target, factory, k
        self.max_batch, self.max_queue = max_batch, max_queue
        self.metrics = metrics
        self.batch = self._new_batch()
        self.jobs: dict[int, Job] = {}  # admitted, by row index
        self.waiting: deque[Job] = deque()
        self.to_cancel: set[int] = set()
        self.cond = threading.Condition()
        self.ids = itertools.count()
        self.stopping = False
        self.peak_rows = 0  # most rows decoded together so far (tests and logs)
        self.thread: threading.Thread | None = None
        metrics.watch(lambda: len(self.jobs), lambda: len(self.waiting))

    def _new_batch(self) -> Batch:
        # Bound without sampling settings: each request's drafter drafts with the request's own
        # (sampled drafts at temperature > 0, from a stream tied to the request's seed).
        return Batch(self.target, self.factory, k=self.k, stop=self._stop, on_tokens=self._on_tokens)

    # ---- called from the event loop ----------------------------------------------------------------

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="draftsmith-engine", daemon=True)
        self.thread.start()

    def shutdown(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify()
        if self.thread is not None:
            self.thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def submit(self, job: Job) -> None:
        with self.cond:
            # Free rows take requests at the next step; `max_queue` more may wait for a row.
            free = max(0, self.max_batch - len(self.jobs))
            if len(self.waiting) >= self.max_queue + free:
                self.metrics.rejected()
                raise QueueFull
            job.id = next(self.ids)
            self.waiting.append(job)
            self.cond.notify()

    def cancel(self, job: Job) -> None:
        """The client went away: forget a waiting job, or drop its row before the next step."""
        with self.cond:
            job.cancelled = True
            if job in self.waiting:
                self.waiting.remove(job)
            else:
                self.to_cancel.add(job.id)
            self.cond.notify()

    # ---- the engine thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self.cond:
                while not self.stopping and not self.waiting and not self.batch.rows and not self.to_cancel:
                    self.cond.wait()
                if self.stopping:
                    break
                cancel, self.to_cancel = self.to_cancel, set()
                admit = []
                while self.waiting and len(self.batch.rows) + len(admit) < self.max_batch:
                    admit.append(self.waiting.popleft())
                for job in admit:
                    self.jobs[job.id] = job
            try:
                for row in self.batch.remove(cancel):
                    self._finished(row)
                if admit:
                    seqs = [Seq(j.id, j.prompt, j.max_tokens, j.sampling, j.generator) for j in admit]
                    for row in self.batch.add(seqs):
                        if row.finish is not None:
                            self._finished(row)
                    self.peak_rows = max(self.peak_rows, len(self.batch.rows))
                if self.batch.rows:
                    for row in self.batch.step():
                        self._finished(row)
            except Exception as e:  # an engine failure (a bug, out of memory): fail the batch, keep serving
                log.exception("engine step failed")
                for job in self.jobs.values():
                    job.send("error", f"generation failed: {type(e).__name__}: {e}")
                self.jobs.clear()
                self.batch = self._new_batch()

    def _stop(self, index: int, ids: list[int]) -> bool:
        job = self.jobs[index]
        return job.stop is not None and job.stop(ids)

    def _on_tokens(self, index: int, ids: list[int]) -> None:
        job = self.jobs[index]
        now = time.perf_counter()
        if job.first_at is None:
            job.first_at = now
            self.metrics.first_token(now - job.arrived)
        job.last_at = now
        job.n_tokens += len(ids)
        if not job.cancelled:
            job.send("tokens", list(ids))

    def _finished(self, row: Row) -> None:
        job = self.jobs.pop(row.index)
        if self.factory is not None and row.finish != "cancelled":
            self.factory.finish(row.prompt, row.output)
        tpot = None
        if job.n_tokens > 1 and job.first_at is not None and job.last_at is not None:
            tpot = (job.last_at - job.first_at) / (job.n_tokens - 1)
        self.metrics.finished(row.stats, len(row.prompt), len(row.output), row.finish or "length", tpot)
        if not job.cancelled:
            job.send("done", row.finish or "length", row)
