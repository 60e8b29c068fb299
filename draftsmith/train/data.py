"""Training data for drafters: a conversations JSONL -> tokenized examples -> the draft vocabulary ->
seeded global batches -> per-rank shards -> packed rows.

**Input.** One JSON object per line, `{"id", "messages": [...OpenAI chat...], "finish_reasons"?}`,
as `draftsmith data regenerate` writes; each conversation is tokenized with the target's chat
template and a loss mask on assistant tokens (`data/tokenize.py`), split into windows of at most
`max_len` tokens.

**Batches.** Each epoch walks a permutation of the examples seeded by (seed, epoch); a global batch
is the longest run of consecutive examples in that order holding at most `batch_tokens` tokens (at
least one example). The data position is (epoch, index into the permutation), so a resumed run
rebuilds exactly the batches that follow. A data-parallel run splits each global batch into
disjoint per-rank shards balanced by tokens.

**Packing (the choice).** A shard's examples are packed first-fit-decreasing into rows of at most
`max_len` tokens, padded to the longest row: `segments` names each token's example (-1 on
padding) and `positions` restart at 0 per example, so attention and targets stay inside an
example (block-diagonal causal masks, built by `target_pass` and the objective). Packing wastes
almost nothing on padding, which is what the CPU's time goes to; a bounded row length keeps the
O(row^2) attention small. Targets with recurrent (linear-attention) layers cannot be packed (their
state would flow across examples) and get one example per row.

This module knows none of models, optimisers or distribution beyond rank/world numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.data.tokenize import Example, tokenize_conversation
from draftsmith.errors import UserError


def load_conversations(path: str | Path) -> list[dict]:
    """Read and check the JSONL; one-line UserErrors for a missing file, a bad line or no records."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"training data {path} not found; pass the JSONL from `draftsmith data regenerate`")
    records = []
    with open(p, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            records.append(_parse(raw, lineno, path))
    if not records:
        raise UserError(f"training data {path} is empty; regenerate conversations into it first")
    return records


def _parse(raw: bytes, lineno: int, path) -> dict:
    def bad(problem: str) -> UserError:
        return UserError(f"training data {path} line {lineno}: {problem}; fix or remove that line")

    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad(f"not valid JSON ({type(e).__name__})") from None
    if not isinstance(obj, dict):
        raise bad("expected a JSON object")
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad('"messages" must be a non-empty list of {"role", "content"} objects')
    for i, m in enumerate(messages):
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise bad(f'messages[{i}] must be an object with string "role" and "content"')
    reasons = obj.get("finish_reasons")
    n_asst = sum(m["role"] == "assistant" for m in messages)
    if reasons is not None and (not isinstance(reasons, list) or len(reasons) != n_asst):
        raise bad(f'"finish_reasons" must list one reason per assistant turn ({n_asst})')
    return {"id": obj.get("id", f"line-{lineno}"), "messages": messages, "finish_reasons": reasons}


def tokenize_dataset(tokenizer, records: list[dict], max_len: int, progress: bool = False) -> list[Example]:
    """Every conversation's windows, in file order; refuses data with no assistant token at all."""
    from tqdm import tqdm

    examples: list[Example] = []
    for r in tqdm(records, desc="tokenize", unit="conv", disable=not progress, leave=False):
        examples += tokenize_conversation(
            tokenizer, r["messages"], max_len, split=True, finish_reasons=r["finish_reasons"]
        )
    if not examples:
        raise UserError('the training data has no assistant turn to train on; check its "messages"')
    return examples


def draft_vocab(
    examples: list[Example], n: int, vocab_size: int, prefer: torch.Tensor | None = None
) -> torch.Tensor:
    """[min(n, V)] target ids: the most frequent among assistant tokens, ties broken by `prefer`
    (target ids to keep when counts are equal: a speculator's old vocabulary, so that a small new
    dataset does not fill the rest of the vocabulary in id order), then by token id.

    With n >= V this is the identity (the full vocabulary, in id order).

    >>> ex = [Example([5, 5, 2, 7], [1, 1, 1, 0])]
    >>> draft_vocab(ex, 3, 8).tolist(), draft_vocab(ex, 3, 8, prefer=torch.tensor([6])).tolist()
    ([0, 2, 5], [2, 5, 6])
    """
    if n >= vocab_size:
        return torch.arange(vocab_size)
    order = token_ranking(examples, vocab_size, prefer)
    return order[:n].sort().values  # draft ids in target-id order (any order is valid; this reads well)


def token_ranking(
    examples: list[Example], vocab_size: int, prefer: torch.Tensor | None = None
) -> torch.Tensor:
    """[V] every target id, the most frequent among assistant tokens first; ties broken by `prefer`,
    then by token id.

    >>> token_ranking([Example([5, 5, 2, 7], [1, 1, 1, 0])], 6).tolist()
    [5, 2, 0, 1, 3, 4]
    """
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ex in examples:
        ids = torch.tensor(ex.input_ids)[torch.tensor(ex.loss_mask, dtype=torch.bool)]
        counts += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
    key = counts * 2
    if prefer is not None:
        key[prefer] += 1  # a tie-break only: one count outweighs it
    return torch.sort(-key, stable=True).indices  # stable: equal keys stay in id order


# ---------------------------------------------------------------- global batches


@dataclass(frozen=True)
class PlannedBatch:
    epoch: int
    index: int  # where this batch starts in the epoch's permutation
    examples: tuple[int, ...]  # example indices, in permutation order


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g).tolist()


def plan_batches(lengths: list[int], batch_tokens: int, epochs: int, seed: int) -> list[PlannedBatch]:
    """All global batches of the run, in order (cheap: indices only)."""
    plan: list[PlannedBatch] = []
    for epoch in range(epochs):
        order = epoch_order(len(lengths), seed, epoch)
        i = 0
        while i < len(order):
            j, used = i, 0
            while j < len(order) and (j == i or used + lengths[order[j]] <= batch_tokens):
                used += lengths[order[j]]
                j += 1
            plan.append(PlannedBatch(epoch, i, tuple(order[i:j])))
            i = j
    return plan


def shard(batch: tuple[int, ...], lengths: list[int], rank: int, world: int) -> list[int]:
    """This rank's disjoint share of a global batch: longest first, each to the lightest rank."""
    if world == 1:
        return list(batch)
    load = [0] * world
    mine = []
    for i in sorted(batch, key=lambda i: (-lengths[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        load[r] += lengths[i]
        if r == rank:
            mine.append(i)
    return mine


# ---------------------------------------------------------------- packed rows


@dataclass
class Packed:
    input_ids: torch.Tensor  # [b, T] long, 0 on padding
    loss_mask: torch.Tensor  # [b, T] long
    segments: torch.Tensor  # [b, T] long: example id within the batch, -1 on padding
    positions: torch.Tensor  # [b, T] long: position inside the example

    @property
    def num_tokens(self) -> int:
        return int((self.segments >= 0).sum())

    def to(self, device) -> Packed:
        return Packed(
            *(t.to(device) for t in (self.input_ids, self.loss_mask, self.segments, self.positions))
        )


def pack(examples: list[Example], max_len: int, packing: bool = True) -> Packed:
    """First-fit-decreasing into rows of <= max_len tokens (one example per row without packing)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(examples)), key=lambda i: (-len(examples[i].input_ids), i)):
        n = len(examples[i].input_ids)
        fit = next((r for r in range(len(rows)) if room[r] >= n), None) if packing else None
        if fit is None:
            rows.append([])
            room.append(max(max_len, n))
            fit = len(rows) - 1
        rows[fit].append(i)
        room[fit] -= n
    T = max((sum(len(examples[i].input_ids) for i in row) for row in rows), default=0)
    out = Packed(*(torch.zeros(len(rows), T, dtype=torch.long) for _ in range(4)))
    out.segments.fill_(-1)
    for b, row in enumerate(rows):
        at = 0
        for i in row:
            ex = examples[i]
            n = len(ex.input_ids)
            out.input_ids[b, at : at + n] = torch.tensor(ex.input_ids)
            out.loss_mask[b, at : at + n] = torch.tensor(ex.loss_mask)
            out.segments[b, at : at + n] = i
            out.positions[b, at : at + n] = torch.arange(n)
            at += n
    return out


def segment_runs(segments: torch.Tensor) -> list[list[tuple[int, int]]]:
    """Per row of a packed [b, T] batch, the (start, end) column ranges of its examples in order,
    covering the row (a padding run, segment -1, is one more range).

    >>> segment_runs(torch.tensor([[0, 0, 1, -1], [2, 2, 2, 2]]))
    [[(0, 2), (2, 3), (3, 4)], [(0, 4)]]
    """
    out = []
    for row in segments.tolist():
        cuts = [0] + [t for t in range(1, len(row)) if row[t] != row[t - 1]] + [len(row)]
        out.append(list(zip(cuts[:-1], cuts[1:], strict=True)))
    return out
