"""The engine: prefill, then (draft -> one target forward verifies -> accept -> commit)* per batch.

Plain autoregressive decoding is the same loop with no drafter (every draft is empty). Rows of a
batch have their own prompt length, draft length, sampling settings and number of accepted tokens;
the `RaggedCache` makes that free. A `Batch` is the step-level API: `add` prefills requests that join
it, `step` runs one verify round over every live row, `remove` drops cancelled rows, and rows that
finish leave by themselves; that is all continuous batching (`draftsmith serve`) needs. `generate`
is a loop over it for one fixed set of prompts.

Hybrid targets (linear-attention layers) cannot roll back their recurrent state by moving a length,
so after a partial acceptance the engine restores the state saved before the step and replays the
accepted tokens (a second, short forward; only for those targets).

The engine knows nothing about tokenization: stop strings arrive as a callback over token ids, and
streaming leaves as a callback with the newly committed ids of a row.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from draftsmith.decoding.sampling import SamplingParams, draft_stream, make_generator, target_probs
from draftsmith.decoding.verify import verify_greedy, verify_sampling, verify_tree
from draftsmith.drafters.base import Draft, Drafter, DrafterFactory, node_depths
from draftsmith.errors import UserError
from draftsmith.target.model import Target

StopFn = Callable[[int, list[int]], bool]  # (row index, output ids so far) -> stop now?
StreamFn = Callable[[int, list[int]], None]  # (row index, newly committed ids)


@dataclass
class DecodeStats:
    """Counts and times of decoding, for a whole batch (`Batch.stats`) or one row (`Row.stats`,
    which is also `Result.stats`).

    Counts: a batch's are the sums of its rows' (`steps` counts row-steps, so tau is per row).
    Times split a decode step by who spent it: `draft_s` the drafters (propose, and commit of the
    accepted tokens), `verify_s` the target (its forward, the hybrid-target replay, the acceptance
    test), `other_s` the rest (cache bookkeeping, commit, stop-string and streaming callbacks).
    `prefill_s` is the prefill that admitted the rows, the drafters' `start` included.
    A row's times are those of the steps it took part in (shared with its batch), its `decode_s`
    their sum; a batch's `decode_s` is set by `generate` to the decode loop's wall time, so
    draft_s + verify_s + other_s <= decode_s. Merging the rows of one batch therefore sums its
    counts exactly but its times more than once: merge times only over runs that followed one
    another (bench's prompts).
    """

    steps: int = 0
    decode_tokens: int = 0  # tokens committed by decode steps (the first token comes from prefill)
    proposed: list[int] = field(default_factory=list)  # [i]: steps whose draft reached position i+1
    accepted: list[int] = field(default_factory=list)  # [i]: ... and whose token i+1 was accepted
    drafts: int = 0  # steps that verified a non-empty draft
    draft_tokens: int = 0  # drafted tokens (tree nodes for trees) sent to verification
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    decode_s: float = 0.0
    other_s: float = 0.0

    @property
    def tau(self) -> float:
        """Mean tokens committed per verify step, including the target's own token."""
        return self.decode_tokens / self.steps if self.steps else 0.0

    @property
    def accept_per_pos(self) -> list[float]:
        return [a / p for a, p in zip(self.accepted, self.proposed, strict=True) if p]

    def record(self, draft_len: int, n_accepted: int) -> None:
        while len(self.proposed) < draft_len:
            self.proposed.append(0)
            self.accepted.append(0)
        for i in range(min(draft_len, n_accepted + 1)):
            self.proposed[i] += 1
        for i in range(n_accepted):
            self.accepted[i] += 1

    def count_step(self, draft: Draft, n_accepted: int, committed: int) -> None:
        """One row's verify step: its draft, how much of it was accepted, how many tokens it committed."""
        self.record(draft.depth, n_accepted)
        self.steps += 1
        self.decode_tokens += committed
        self.drafts += len(draft) > 0
        self.draft_tokens += len(draft)

    def count_time(self, draft_s: float, verify_s: float, other_s: float) -> None:
        """One decode step's time, split by who spent it."""
        self.draft_s += draft_s
        self.verify_s += verify_s
        self.other_s += other_s
        self.decode_s += draft_s + verify_s + other_s

    def merge(self, other: DecodeStats) -> None:
        names = ("steps", "decode_tokens", "drafts", "draft_tokens", "prefill_s", "draft_s", "verify_s")
        for name in (*names, "decode_s", "other_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        grow = len(other.proposed) - len(self.proposed)
        self.proposed += [0] * grow
        self.accepted += [0] * grow
        for i in range(len(other.proposed)):
            self.proposed[i] += other.proposed[i]
            self.accepted[i] += other.accepted[i]

    @classmethod
    def combined(cls, parts: Iterable[DecodeStats]) -> DecodeStats:
        """The merge of `parts`: for the rows of one batch, the batch's counts (see the class note)."""
        total = cls()
        for part in parts:
            total.merge(part)
        return total


@dataclass
class Result:
    token_ids: list[int]  # generated ids only
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    stats: DecodeStats  # this row's; DecodeStats.combined over the results gives the batch's counts


@dataclass
class Seq:
    """A request entering a batch. `index` names its row in callbacks and must be unique in the batch."""

    index: int
    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    generator: torch.Generator | None = None  # sampling only; default make_generator(seed, index)


@dataclass
class Row:
    index: int
    prompt: list[int]
    drafter: Drafter | None
    sampling: SamplingParams
    generator: torch.Generator | None
    budget: int
    output: list[int] = field(default_factory=list)
    pending: int = -1  # last committed token, not yet in the cache
    finish: str | None = None  # set when the row leaves the batch: "stop", "length" or "cancelled"
    stats: DecodeStats = field(default_factory=DecodeStats)  # this row's steps and acceptance


class Batch:
    """A running ragged batch. Rows join with `add` (prefilled at once, in one forward), advance
    together with `step`, and leave when they finish or are `remove`d; row b of `rows` is row b of
    the cache. Stats in `stats` cover the whole batch, a row's own in `row.stats`.

    The factory is bound once (`sampling` is only its default); each row's drafter is made with the
    row's own sampling and a draft stream derived from the row's generator (`draft_stream`), so a
    request at temperature > 0 drafts by sampling at its temperature (EAGLE-3, MTP, draft LM) and
    a seeded one reproduces whatever the batch. Verification uses each row's settings too."""

    def __init__(
        self,
        target: Target,
        factory: DrafterFactory | None,
        *,
        k: int = 8,
        sampling: SamplingParams | None = None,
        stop: StopFn | None = None,
        on_tokens: StreamFn | None = None,
    ) -> None:
        if k <= 0:
            raise UserError(f"--k {k} must be a positive number of drafted tokens")
        if factory is not None:
            factory.bind(target, sampling or SamplingParams())
        self.target, self.factory, self.k = target, factory, k
        self.stop, self.on_tokens = stop, on_tokens
        self.feature_layers = tuple(factory.needs_features) if factory is not None else ()
        # Tree drafters may verify more nodes than k per step; they say how many at most.
        self.widest = max(k, factory.max_draft_tokens if factory is not None else 0)
        self.cache = target.new_cache(0, 0)
        self.rows: list[Row] = []
        self.stats = DecodeStats()

    @torch.inference_mode()
    def add(self, seqs: list[Seq]) -> list[Row]:
        """Prefill `seqs` and let them join; returns their rows. A row that ends on its first token
        (EOS, stop, a budget of one) has already left again, with `finish` set."""
        for s in seqs:
            _check(self.target, [s.prompt], s.max_new_tokens)
        t0 = time.perf_counter()
        need = max(len(s.prompt) + s.max_new_tokens for s in seqs) + self.widest + 2
        if need > self.cache.capacity:  # grow geometrically so later joins rarely widen the buffers
            limit = self.target.max_context + self.widest + 2
            need = max(need, min(2 * self.cache.capacity, limit))
        first = self.cache.batch
        self.cache.grow(len(seqs), need)
        rows = [self._row(s) for s in seqs]
        slots = list(range(first, first + len(seqs)))
        logits, feats = _prefill(
            self.target, self.cache, slots, [r.prompt for r in rows], self.feature_layers
        )
        for r, row in enumerate(rows):
            first_tok = _pick(logits[r], row.sampling, row.generator)
            row_feats = feats[r, : len(row.prompt)] if feats is not None else None
            _commit(row, [first_tok], self.target, self.stop, self.on_tokens)
            if row.drafter is not None:
                row.drafter.start(list(row.prompt), row_feats)
                # No token entered the cache with `first_tok`: its features arrive with the next step.
                row.drafter.commit([first_tok], None if row_feats is None else row_feats[:0])
        self.rows += rows
        self._drop_finished()
        self.target.sync()
        elapsed = time.perf_counter() - t0
        for st in (self.stats, *(row.stats for row in rows)):
            st.prefill_s += elapsed
        return rows

    def _row(self, s: Seq) -> Row:
        gen = _generator(s)
        drafter = None
        if self.factory is not None:
            drafter = self.factory(s.sampling, None if gen is None else draft_stream(gen))
        return Row(s.index, list(s.prompt), drafter, s.sampling, gen, budget=s.max_new_tokens)

    @torch.inference_mode()
    def step(self) -> list[Row]:
        """One draft -> verify -> accept -> commit round for every live row; returns the rows that
        finished in it (they have left the batch)."""
        live, cache = self.rows, self.cache
        t0 = time.perf_counter()
        drafts = [_propose(row, self.k) for row in live]
        t1 = time.perf_counter()

        ids, tree = _layout(live, drafts)  # ids [b, q]: pending token, then the draft
        if tree is not None and cache.has_recurrent_state:
            raise UserError("tree drafts are not supported on hybrid targets yet: use a chain drafter")
        snap = cache.snapshot_state() if cache.has_recurrent_state else None
        out = self.target.forward(cache, ids, feature_layers=self.feature_layers, tree=tree)
        paths = _verify(out.logits, drafts, live)
        if snap is not None:
            _replay(self.target, cache, snap, ids, [len(path) for path, _ in paths], ids.shape[1])
        self.target.sync()
        t2 = time.perf_counter()

        drafter_s = 0.0  # the drafters' share of the commit loop
        for b, (row, d, (path, nxt)) in enumerate(zip(live, drafts, paths, strict=True)):
            n = len(path)
            if path != list(range(n)):  # a tree branch: its entries move next to the committed ones
                cache.move(b, [1 + i for i in path], list(range(1, n + 1)))
            cache.advance(b, n + 1)  # the pending token and n accepted drafts now stand in the cache
            accepted = [d.tokens[i] for i in path] + [nxt]
            committed = _commit(row, accepted, self.target, self.stop, self.on_tokens)
            for st in (self.stats, row.stats):
                st.count_step(d, n, committed)
            if row.drafter is not None and row.finish is None:
                row_feats = out.features[b, [0] + [1 + i for i in path]] if out.features is not None else None
                t = time.perf_counter()
                row.drafter.commit(accepted, row_feats)
                drafter_s += time.perf_counter() - t
        t3 = time.perf_counter()
        for st in (self.stats, *(row.stats for row in live)):
            st.count_time(t1 - t0 + drafter_s, t2 - t1, t3 - t2 - drafter_s)
        return self._drop_finished()

    def remove(self, indices: set[int]) -> list[Row]:
        """Drop the rows with these indices (cancelled requests); returns them."""
        for row in self.rows:
            if row.index in indices and row.finish is None:
                row.finish = "cancelled"
        return self._drop_finished()

    def _drop_finished(self) -> list[Row]:
        keep = [b for b, row in enumerate(self.rows) if row.finish is None]
        if len(keep) == len(self.rows):
            return []
        done = [row for row in self.rows if row.finish is not None]
        if keep:
            keep = fill_holes(keep)
            self.cache.keep_rows(keep)
        else:  # an empty batch starts over: a long request's capacity is not kept for the next ones
            self.cache = self.target.new_cache(0, 0)
        self.rows = [self.rows[b] for b in keep]
        return done


def fill_holes(keep: list[int]) -> list[int]:
    """The new order of the kept rows (ascending indices) that moves the fewest: kept rows past the
    new batch size fill the holes left before it, so the cache copies only those rows.

    >>> fill_holes([0, 2, 3, 5])
    [0, 5, 2, 3]
    """
    n = len(keep)
    movers = iter([b for b in keep if b >= n])
    kept = set(keep)
    return [b if b in kept else next(movers) for b in range(n)]


@torch.inference_mode()
def generate(
    target: Target,
    drafter: DrafterFactory | None,
    prompts: list[list[int]],
    *,
    k: int = 8,
    sampling: SamplingParams | None = None,
    max_new_tokens: int = 256,
    stop: StopFn | None = None,
    on_tokens: StreamFn | None = None,
) -> list[Result]:
    """Generate for a batch of prompts; one Result per prompt, in order, each with its row's stats."""
    sampling = sampling or SamplingParams()
    _check(target, prompts, max_new_tokens)
    batch = Batch(target, drafter, k=k, sampling=sampling, stop=stop, on_tokens=on_tokens)
    rows = batch.add([Seq(i, p, max_new_tokens, sampling) for i, p in enumerate(prompts)])
    t_decode = time.perf_counter()
    while batch.rows:
        batch.step()
    target.sync()
    batch.stats.decode_s = time.perf_counter() - t_decode
    if drafter is not None:
        for row in rows:
            drafter.finish(row.prompt, row.output)
    return [
        Result(token_ids=row.output, finish_reason=row.finish or "length", stats=row.stats) for row in rows
    ]


def _check(target: Target, prompts: list[list[int]], max_new_tokens: int) -> None:
    if not prompts:
        raise UserError("no prompts given")
    if any(len(p) == 0 for p in prompts):
        raise UserError("empty prompt: give at least one token of input")
    if max_new_tokens <= 0:
        raise UserError(f"--max-new-tokens {max_new_tokens} must be positive")
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens > target.max_context:
        raise UserError(
            f"prompt of {longest} tokens plus {max_new_tokens} new tokens exceeds the target's context of "
            f"{target.max_context}: shorten the prompt or lower --max-new-tokens"
        )


def _prefill(
    target: Target, cache, slots: list[int], prompts: list[list[int]], feature_layers: tuple[int, ...]
):
    """Run prompts into empty cache rows `slots`; return last-position logits [n, V] and features."""
    lens = torch.tensor([len(p) for p in prompts])
    groups = prefill_groups(lens.tolist(), equal_only=target.is_hybrid)
    logits = torch.empty(len(prompts), target.vocab_size)
    feats = None
    for group in groups:
        width = max(len(prompts[i]) for i in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)
        for b, i in enumerate(group):
            ids[b, : len(prompts[i])] = torch.tensor(prompts[i], dtype=torch.long)
        idx = torch.tensor(group)
        # Only the group's own rows; None (all rows, in order) lets the cache write without gathers.
        dest = [slots[i] for i in group]
        rows = None if dest == list(range(cache.batch)) else torch.tensor(dest)
        out = target.forward(cache, ids, rows=rows, logit_index=lens[idx] - 1, feature_layers=feature_layers)
        logits[idx] = out.logits[:, 0].to(logits.device)  # kept on the host, where rows pick tokens
        if out.features is not None:
            if feats is None:
                feats = out.features.new_zeros(len(prompts), int(lens.max()), *out.features.shape[2:])
            feats[idx, :width] = out.features
    for slot, n in zip(slots, lens.tolist(), strict=True):
        cache.advance(slot, n)
    return logits, feats


def prefill_groups(lens: list[int], equal_only: bool, budget: int = 8192) -> list[list[int]]:
    """Prompts that prefill together in one padded forward, shortest first.

    A hybrid target's recurrent state would absorb right padding, so it only groups equal lengths.
    Otherwise a group grows while its padded size (rows x longest) stays within `budget` tokens or
    within 25% of its real tokens: one forward per prompt wastes calls, one padded batch of ragged
    prompts wastes compute on padding (16 chat prompts of 100..3000 tokens pad to 6x their size).

    >>> prefill_groups([5, 3, 5, 9], equal_only=True)
    [[1], [0, 2], [3]]
    >>> prefill_groups([3000, 100, 120, 2900], equal_only=False, budget=1000)
    [[1, 2], [3, 0]]
    """
    order = sorted(range(len(lens)), key=lambda i: (lens[i], i))
    groups: list[list[int]] = []
    for i in order:
        cur = groups[-1] if groups else None
        if cur is not None and equal_only and lens[cur[0]] == lens[i]:
            cur.append(i)
            continue
        if cur is not None and not equal_only:
            padded = lens[i] * (len(cur) + 1)  # sorted: i is the longest so far
            if padded <= budget or padded <= 1.25 * (sum(lens[j] for j in cur) + lens[i]):
                cur.append(i)
                continue
        groups.append([i])
    return groups


def _propose(row: Row, k: int) -> Draft:
    # One slot of the budget is always the target's own token, so draft at most budget - 1.
    room = min(k, row.budget - len(row.output) - 1)
    if row.drafter is None or room <= 0:
        return Draft(tokens=[])
    d = row.drafter.propose(room)
    if d.parents is not None:
        if d.depth > room:  # keep nodes within the budget; parents come first, so ancestors stay
            keep = [i for i, dep in enumerate(node_depths(d.parents)) if dep <= room]
            remap = {old: new for new, old in enumerate(keep)}
            d = Draft(tokens=[d.tokens[i] for i in keep], parents=[remap.get(d.parents[i], -1) for i in keep])
        return d
    if len(d) > room:
        d = Draft(tokens=d.tokens[:room], probs=None if d.probs is None else d.probs[:room])
    return d


def _generator(s: Seq) -> torch.Generator | None:
    if s.sampling.greedy:
        return None
    return s.generator if s.generator is not None else make_generator(s.sampling.seed, s.index)


def _pick(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None) -> int:
    if sampling.greedy:
        return int(logits.argmax())
    p = target_probs(logits, sampling)
    return int(torch.multinomial(p, 1, generator=generator))


def _verify(logits: torch.Tensor, drafts: list[Draft], live: list[Row]):
    """logits [b, q, V] -> one (accepted node indices, next token) per row, each with its own sampling."""
    out = []
    argmax = logits.argmax(-1).tolist() if any(row.sampling.greedy for row in live) else None
    for b, (d, row) in enumerate(zip(drafts, live, strict=True)):
        greedy = row.sampling.greedy
        if d.parents is not None:
            rows = logits[b, : len(d) + 1]
            target = rows if greedy else target_probs(rows, row.sampling)
            out.append(verify_tree(d.tokens, d.parents, target, row.generator))
            continue
        if greedy:
            n, nxt = verify_greedy(d.tokens, argmax[b])
        else:
            p = target_probs(logits[b, : len(d) + 1], row.sampling)
            n, nxt = verify_sampling(d.tokens, d.probs, p, row.generator)
        out.append((list(range(n)), nxt))
    return out


def _layout(live: list[Row], drafts: list[Draft]) -> tuple[torch.Tensor, tuple | None]:
    """Input ids [b, q] (each row's pending token, then its draft, right-padded) and the tree layout."""
    q = 1 + max(len(d) for d in drafts)
    ids = torch.zeros(len(live), q, dtype=torch.long)
    for b, (row, d) in enumerate(zip(live, drafts, strict=True)):
        ids[b, 0] = row.pending
        ids[b, 1 : 1 + len(d)] = torch.tensor(d.tokens, dtype=torch.long)
    return ids, _tree_layout(drafts, q)


def _tree_layout(drafts: list[Draft], q: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """For batches holding a tree: (depth [b, q], ancestor-or-self [b, q, q]); None for chains."""
    if all(d.parents is None for d in drafts):
        return None
    depth = torch.zeros(len(drafts), q, dtype=torch.long)
    anc = torch.eye(q, dtype=torch.bool).repeat(len(drafts), 1, 1)
    anc[:, :, 0] = True  # everything descends from the committed (pending) token
    for b, d in enumerate(drafts):
        parents = d.parents if d.parents is not None else list(range(-1, len(d) - 1))
        depth[b, 1 : 1 + len(d)] = torch.tensor(node_depths(parents), dtype=torch.long)
        for i, par in enumerate(parents):
            if par >= 0:
                anc[b, 1 + i] |= anc[b, 1 + par]
    return depth, anc


def _commit(
    row: Row, tokens: list[int], target: Target, stop: StopFn | None, on_tokens: StreamFn | None
) -> int:
    """Append tokens to a row's output, cutting at EOS, a stop string or the budget. Returns the count."""
    taken = 0
    for tok in tokens:
        row.output.append(tok)
        taken += 1
        if tok in target.eos_ids or (stop is not None and stop(row.index, row.output)):
            row.finish = "stop"
            break
        if len(row.output) >= row.budget:
            row.finish = "length"
            break
    row.pending = row.output[-1]
    if on_tokens is not None:
        on_tokens(row.index, row.output[-taken:])
    return taken


def _replay(target: Target, cache, snap, ids: torch.Tensor, accepted: list[int], q: int) -> None:
    """Hybrid targets: rows that kept fewer than q tokens get their recurrent state recomputed."""
    keep = [n + 1 for n in accepted]
    redo = [b for b, m in enumerate(keep) if m < q]
    if not redo:
        return
    cache.restore_state(snap, redo)
    for m in sorted({keep[b] for b in redo}):
        group = [b for b in redo if keep[b] == m]
        target.forward(cache, ids[group, :m], rows=torch.tensor(group))
