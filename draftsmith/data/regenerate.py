"""`draftsmith data regenerate`: the target writes every assistant turn of the training conversations.

A speculator learns to predict the target, so its training answers must be the target's own. From
each source conversation only the inputs are kept (system and user turns); after each run of user
turns the target writes the answer, given the regenerated history: for [sys?, user1, asst1, user2,
asst2], asst1 is generated from [sys?, user1], asst2 from [sys?, user1, new asst1, user2]. A
conversation ends early, keeping the turns done, when the next prompt plus `--max-new-tokens` would
not fit the target's context, or after `--max-turns` answers. Each answer records its finish reason
("stop": end token; "length": cut by `--max-new-tokens`).

Sources: `sharegpt` (the train split only; the held-out split is the chat benchmark's), `humaneval`
(one user turn per problem, the same request the `code` benchmark sends: note that this overlaps the
`code` benchmark, so a speculator trained on it is measured on its training prompts), `humaneval-train`
(the 124 problems after the first 40, which a `code` benchmark of up to 40 prompts never sends), or a JSONL file
in the bench workload format (`messages` or `prompt`; its assistant turns are replaced). `--num N`
takes the first N conversations of the source; `--shard i/n` keeps those whose index in that order
is i mod n, so n processes (or machines) with `--shard 0/n` .. `--shard n-1/n` and distinct `--out`
files split the work, and concatenating their outputs (`cat a.jsonl b.jsonl > all.jsonl`) gives the
same set of records as one unsharded run (in another order).

Local mode runs our engine on B conversations at a time, one batch per turn index (a wave): decoding
is memory-bound, so a batch of 8 costs little more than one. `--drafter ngram` is lossless, so it
only changes the speed. With `--endpoint URL` the turns go to an OpenAI-compatible server (vLLM,
SGLang, ...) with C requests in flight (see `regen_endpoint`); the target is then only used for its
tokenizer (context checks) and name.

Output: one JSON line per conversation, `{"id", "source", "messages", "finish_reasons", "target",
"num_new_tokens", "new_tokens_per_turn"}`, written through `ResumableJsonl` (rerunning the same
command skips finished ids and completes a killed run), and a report (`OUT.report.json`).
Sampling (temperature > 0) is seeded per batch and turn locally and per conversation and turn on an
endpoint; a resumed sampling run is not bitwise equal to an uninterrupted one (batches differ).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from draftsmith.command import add_dtype_device_args
from draftsmith.data.conversation import Conversation, turn_seed
from draftsmith.data.regen_report import build_report, print_report, run_numbers
from draftsmith.data.resumable import ResumableJsonl
from draftsmith.errors import UserError

SOURCES = ("sharegpt", "humaneval", "humaneval-train")
# `humaneval-train` leaves out the first problems, which the `code` benchmark draws from.
HUMANEVAL_HELD_OUT = 40


# ---------------------------------------------------------------- conversations


def plan_turns(messages: list[dict]) -> list[list[dict]]:
    """Source messages -> the inputs before each assistant turn the target will write.

    Assistant messages are dropped; every run of other messages that holds a user turn gets one
    answer (consecutive user turns are answered together; a run of system messages alone is
    merged into the next run). Inputs after the last user turn with nothing to answer are dropped.

    >>> [len(s) for s in plan_turns([{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
    ...     {"role": "assistant", "content": "x"}, {"role": "user", "content": "b"}])]
    [2, 1]
    """
    segments: list[list[dict]] = []
    current: list[dict] = []
    for m in messages:
        if m["role"] != "assistant":
            current.append({"role": m["role"], "content": m["content"]})
        elif any(x["role"] == "user" for x in current):
            segments.append(current)
            current = []
    if any(x["role"] == "user" for x in current):
        segments.append(current)
    return segments


def iter_source(source: str) -> Iterator[tuple[str, list[dict]]]:
    """(id, messages) in source order; ids unique (a repeated ShareGPT id keeps its first record)."""
    from draftsmith.data.sources import iter_sharegpt
    from draftsmith.data.workloads import load_jsonl_prompts, load_workload

    if source == "sharegpt":
        seen: set[str] = set()
        for record in iter_sharegpt(split="train"):
            if record["id"] not in seen:
                seen.add(record["id"])
                yield record["id"], record["messages"]
    elif source in ("humaneval", "humaneval-train"):
        # Exactly the `code` benchmark's prompts (same CODE_REQUEST template): all 164, or the 124
        # that a `code` benchmark of up to HUMANEVAL_HELD_OUT prompts never sends.
        skip = HUMANEVAL_HELD_OUT if source == "humaneval-train" else 0
        for p in load_workload("code", 1_000_000)[skip:]:
            yield p.id, p.messages
    else:
        for p in load_jsonl_prompts(source):
            yield p.id, p.messages


def select(
    source: str, num: int, shard: tuple[int, int], done: set[str], max_turns: int
) -> tuple[list[Conversation], int]:
    """This shard's conversations among the first `num`, minus finished ids. Also returns how many
    of this shard's conversations were already done."""
    i, n = shard
    todo, already = [], 0
    for index, (cid, messages) in enumerate(iter_source(source)):
        if index >= num:
            break
        if index % n != i:
            continue
        if cid in done:
            already += 1
            continue
        segments = plan_turns(messages)[:max_turns]
        if segments:
            todo.append(Conversation(index=index, id=cid, segments=segments))
    return todo, already


def parse_shard(spec: str | None) -> tuple[int, int]:
    if spec is None:
        return 0, 1
    try:
        i_text, n_text = spec.split("/")
        i, n = int(i_text), int(n_text)
    except ValueError:
        raise UserError(
            f"--shard {spec!r} is not i/n: pass e.g. --shard 0/4 for the first of 4 shards"
        ) from None
    if n < 1 or not 0 <= i < n:
        raise UserError(f"--shard {spec}: need 0 <= i < n, e.g. --shard 0/{max(n, 1)}")
    return i, n


# ---------------------------------------------------------------- local generation


def regenerate_local(
    target,
    convs: list[Conversation],
    *,
    batch_size: int,
    max_new_tokens: int,
    sampling,
    drafter=None,
    k: int = 8,
    seed: int = 0,
    on_tokens: Callable[[int], None] | None = None,
) -> Iterator[list[Conversation]]:
    """Run the target over `convs` with up to `batch_size` turns in flight; yield conversations as
    they finish (all their turns written), a few at a time.

    Continuous batching: a row whose turn ends is replaced at once, by the conversation's next turn
    or by the next conversation, so the batch stays full. Waves of whole batches (every row waits for
    the batch's longest answer) ran at 120 tok/s on 48 rows on a 2-core CPU where a full batch
    decodes about 300. Conversations are taken shortest first. Sampling draws from one stream per (seed, conversation, turn), so a sampled
    answer does not depend on what else was in the batch."""
    from dataclasses import replace

    from draftsmith.decoding.engine import Batch, Seq
    from draftsmith.decoding.sampling import make_generator
    from draftsmith.target.chat import encode_messages

    if not convs:
        return
    tok = target.tokenizer
    stream = (lambda row, ids: on_tokens(len(ids))) if on_tokens is not None else None
    # Shortest first: the rows in flight then have similar lengths, and attention, which runs to the
    # longest row of the batch, wastes less on the short ones.
    convs = sorted(convs, key=lambda c: (sum(len(m["content"]) for m in c.segments[0]), c.index))
    batch = Batch(target, drafter, k=k, sampling=sampling, on_tokens=stream)
    queue = iter(convs)
    running: dict[int, tuple[Conversation, int]] = {}  # row index -> (conversation, turn)
    finished: list[Conversation] = []
    next_row = 0

    def prompt_of(c: Conversation, turn: int) -> list[int] | None:
        """The turn's prompt ids, or None (and the conversation ends) when it cannot fit."""
        if turn >= len(c.segments):
            return None
        ids = encode_messages(tok, c.history(turn))
        if len(ids) + max_new_tokens > target.max_context:
            c.ended_by = "context"
            return None
        return ids

    def seq(c: Conversation, turn: int, ids: list[int]) -> Seq:
        nonlocal next_row
        next_row += 1
        params = replace(sampling, seed=turn_seed(seed, c.index, turn))
        gen = None if params.greedy else make_generator(params.seed, 0)
        running[next_row] = (c, turn)
        return Seq(next_row, ids, max_new_tokens, params, generator=gen)

    def refill(pending: list[Seq]) -> None:
        while len(batch.rows) + len(pending) < batch_size:
            c = next(queue, None)
            if c is None:
                break
            ids = prompt_of(c, 0)
            if ids is None:
                finished.append(c)
            else:
                pending.append(seq(c, 0, ids))
        if pending:
            collect([row for row in batch.add(pending) if row.finish is not None])

    def collect(rows) -> None:
        follow: list[Seq] = []
        for row in rows:
            if row.index not in running:
                continue
            c, turn = running.pop(row.index)
            text = tok.decode(row.output, skip_special_tokens=True)
            c.add_reply(turn, text, row.finish or "length", len(row.output))
            ids = prompt_of(c, turn + 1)
            if ids is None:
                finished.append(c)
            else:
                follow.append(seq(c, turn + 1, ids))
        if follow:
            refill(follow)

    refill([])
    while batch.rows:
        collect(batch.step())
        refill([])
        if len(finished) >= max(1, batch_size // 2) or not batch.rows:
            yield finished
            finished = []
    if finished:
        yield finished


# ---------------------------------------------------------------- command


def add_regenerate_parser(subparsers) -> argparse.ArgumentParser:
    """Add `regenerate` to the subparsers of `draftsmith data`."""
    p = subparsers.add_parser("regenerate", help="the target writes the assistant turns of training data")
    p.add_argument("--target", default="smollm2-135m", help="smollm2-135m, HF folder, hub id or .gguf")
    add_dtype_device_args(p)
    p.add_argument("--source", required=True, help="sharegpt, humaneval, humaneval-train or a FILE.jsonl")
    p.add_argument("--num", type=int, required=True, help="take the first N conversations of the source")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8, help="conversations per engine batch (local)")
    p.add_argument("--max-turns", type=int, default=8, help="assistant turns per conversation at most")
    p.add_argument("--drafter", default="ar", help="local speculation (lossless): ar, ngram, suffix")
    p.add_argument("--k", type=int, default=8, help="drafted tokens per step with --drafter")
    p.add_argument("--endpoint", default=None, help="OpenAI-compatible server URL, e.g. http://host:8000/v1")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight with --endpoint")
    p.add_argument("--model", default=None, help="model name on the endpoint (default: its first)")
    p.add_argument("--shard", default=None, help="i/n: handle conversations whose index is i mod n")
    p.add_argument("--out", required=True, help="output .jsonl (resumable; see OUT.partial)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_regenerate)
    return p


def cmd_regenerate(args) -> int:
    """Check the arguments, open the target (local) or its tokenizer (`--endpoint`), write every
    selected conversation to the resumable output, then the report."""
    from draftsmith.decoding.sampling import SamplingParams
    from draftsmith.fileio import atomic_write_json

    check_args(args)
    shard = parse_shard(args.shard)
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    source = _source_name(args.source)
    if source == "humaneval":
        sys.stderr.write(
            "note: humaneval is also the prompt set of the `code` benchmark; a speculator trained on "
            "this data is measured there on its own training prompts\n"
        )
    name, generate = (
        local_generator(args, sampling) if args.endpoint is None else endpoint_generator(args, sampling)
    )

    out = ResumableJsonl(args.out, keys={"target": name, "source": source})
    convs, already = select(args.source, args.num, shard, out.done, args.max_turns)
    progress = Progress(len(convs), disable=args.no_progress)
    sink = Sink(out, source, name, progress)
    try:
        generate(convs, progress.on_tokens, sink)
    finally:
        out.close()
        progress.close()
    out.finish()

    run = run_numbers(sink.convs, already, time.perf_counter() - progress.t0)
    report = build_report(out.records(), run, _meta(args, name, source, shard))
    atomic_write_json(f"{args.out}.report.json", report)
    print_report(report)
    summary = {
        "out": str(args.out),
        "conversations": report["conversations"],
        "tokens_per_s": run["tokens_per_s"],
    }
    print(json.dumps(summary))
    return 0


def check_args(args) -> None:
    for flag, value in (("--num", args.num), ("--max-new-tokens", args.max_new_tokens),
                        ("--batch-size", args.batch_size), ("--max-turns", args.max_turns),
                        ("--concurrency", args.concurrency), ("--k", args.k)):  # fmt: skip
        if value <= 0:
            raise UserError(f"{flag} {value} must be positive")


# A generator runs the target over conversations: (convs, on_tokens(n), on_done(finished convs)).
Generate = Callable[[list[Conversation], Callable[[int], None], Callable[[list[Conversation]], None]], None]


def local_generator(args, sampling) -> tuple[str, Generate]:
    """(target name, generator) on our engine: loads the drafter and the target's weights."""
    from draftsmith.drafters import registry
    from draftsmith.target.model import load_target

    drafter = registry.build(args.drafter)
    target = load_target(args.target, args.dtype, args.device)

    def generate(convs, on_tokens, on_done) -> None:
        for batch in regenerate_local(
            target, convs, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
            sampling=sampling, drafter=drafter, k=args.k, seed=args.seed, on_tokens=on_tokens,
        ):  # fmt: skip
            on_done(batch)

    return target.name, generate


def endpoint_generator(args, sampling) -> tuple[str, Generate]:
    """(target name, generator) through `--endpoint`: loads the target's tokenizer only."""
    from draftsmith.data.regen_endpoint import load_tokenizer, regenerate_endpoint

    name, tokenizer, max_context = load_tokenizer(args.target)

    def generate(convs, on_tokens, on_done) -> None:
        regenerate_endpoint(
            args.endpoint, convs, model=args.model, concurrency=args.concurrency, sampling=sampling,
            max_new_tokens=args.max_new_tokens, tokenizer=tokenizer, max_context=max_context,
            seed=args.seed, on_done=on_done, on_tokens=on_tokens, flush_every=args.batch_size,
        )  # fmt: skip

    return name, generate


class Progress:
    """The conversations bar on stderr, with the run's tok/s as its postfix."""

    def __init__(self, total: int, disable: bool) -> None:
        from tqdm import tqdm

        self.tokens, self.t0, self.last_shown = 0, time.perf_counter(), 0.0
        self.bar = tqdm(total=total, desc="regenerate", unit="conv", disable=disable, file=sys.stderr)

    def on_tokens(self, n: int) -> None:
        self.tokens += n
        now = time.perf_counter()
        if now - self.last_shown > 0.5:  # a postfix refresh per token would cost more than decoding
            self.bar.set_postfix_str(f"{self.tokens / (now - self.t0):.1f} tok/s", refresh=True)
            self.last_shown = now

    def conversations_done(self, n: int) -> None:
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


class Sink:
    """Finished conversations go to the output (those with at least one answer) and are kept for the
    run's numbers."""

    def __init__(self, out: ResumableJsonl, source: str, name: str, progress: Progress) -> None:
        self.out, self.source, self.name, self.progress = out, source, name, progress
        self.convs: list[Conversation] = []

    def __call__(self, batch: list[Conversation]) -> None:
        for c in batch:
            self.convs.append(c)
            if c.finish_reasons:  # a first prompt that never fit leaves nothing to train on
                self.out.write(c.record(self.source, self.name))
        self.out.sync()
        self.progress.conversations_done(len(batch))


def _meta(args, name: str, source: str, shard: tuple[int, int]) -> dict:
    return {
        "out": str(args.out),
        "target": name,
        "source": source,
        "mode": "endpoint" if args.endpoint else "local",
        "shard": f"{shard[0]}/{shard[1]}",
        "num": args.num,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "max_turns": args.max_turns,
    }


def _source_name(source: str) -> str:
    if source in SOURCES:
        return source
    path = Path(source).expanduser()
    if not path.is_file():
        raise UserError(
            f"--source {source!r}: use sharegpt, humaneval, humaneval-train or the path of an existing .jsonl file"
        )
    # The file name, not the path as typed: `./p.jsonl` and `p.jsonl` must resume the same output.
    return os.path.basename(path)
