"""`dflash:PATH` in the engine: one draft forward per block, chain verification.

The engine hands over the features of exactly the tokens that entered the target's cache (at
start: the whole prompt; at each commit: the previously pending token and the accepted drafts), so
after n such tokens the drafter's context holds positions 0..n-1 and the last committed token (the
target's own, not yet in its cache) sits at position n. Each commit fuses the new features once and
appends every layer's context keys/values at their absolute positions; nothing is ever recomputed.

A proposal runs the block [last committed token, MASK x (B-1)] at positions n..n+B-1 through the
layers, attending to the context cache and bidirectionally to itself. The block's own keys/values
live only inside that forward, so they are dropped by construction. Slot j (1..B-1) predicts the
token at n+j; a `k` below B-1 takes the first k of the same block (the model is always run at the
block size it was trained with, as a shorter block would change what the slots see). On a CPU both
forwards (the context K/V of a commit, the block of a proposal) run on packed weights and compiled
(`dflash_fast.py`); elsewhere, or with `DRAFTSMITH_FAST=0`, they are the model's own modules.

Draft tokens are the argmax and the draft is deterministic (`probs=None`, a one-hot q): at
temperature > 0 verification then accepts x with probability p(x) and resamples from p with x
removed, which is exact (see `decoding/verify.py`).

`dflash:PATH:min_prob=P` cuts the block at the first slot whose argmax has a draft probability
below P, so verification is not spent on slots the draft does not believe in; the cut depends on
the draft alone, so it stays exact.

`dflash:PATH:vocab=N` drafts over the N tokens most frequent in the speculator's training data
(the ranking its training saves, `vocab_order.json`) instead of the target's whole vocabulary: the
head read for every slot of every block shrinks by V/N (SmolLM2: 49,152 rows, 56 MB in bf16, a third
of a block's drafting time). A token outside those N is never drafted; verification is unchanged,
so the output stays exact.

`dflash-tree:PATH[:topk=4][:size=24]` verifies a tree instead of one chain, built from the same
single block forward: slot j's `topk` most likely tokens are the candidates at depth j, under every
kept node of depth j-1 (the slots are predicted in parallel from the anchor, so a slot's candidates
do not depend on the path above them, as with Medusa heads). The `size` nodes of highest summed
log-probability are kept; drafting costs what the chain costs, verification reads `size` + 1
positions. Trees are deterministic drafts, exact at any temperature (`verify_tree`).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import torch
from torch import nn

from draftsmith.drafters.base import Draft, FactoryBase, parents_first
from draftsmith.drafters.dflash import DFlashModel, load_dflash
from draftsmith.drafters.dflash_fast import FastDFlash, available
from draftsmith.drafters.draft_kv import DraftKV
from draftsmith.drafters.options import check_probability, split_path_options
from draftsmith.errors import UserError
from draftsmith.formats import vocab_order
from draftsmith.target.model import linear_rows
from draftsmith.target.packed import use_fast_linear

if TYPE_CHECKING:
    from draftsmith.decoding.sampling import SamplingParams


class DFlashDrafter:
    def __init__(self, factory: DFlashFactory) -> None:
        self.model = factory.model
        self.needs_features = factory.needs_features
        p = next(self.model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.ctx = DraftKV(len(self.model.layers))  # every layer's context keys/values
        self.length = 0  # context positions held
        self.last: int | None = None  # the last committed token: the block's first slot
        self.min_prob = factory.min_prob
        self.fast = factory.fast
        self.head, self.head_rows = factory.head, factory.head_rows  # None: the target's whole head
        self.tree = factory.tree

    def start(self, prompt_ids: list[int], features: torch.Tensor | None) -> None:
        self.last = prompt_ids[-1]
        self._extend(features)

    def commit(self, accepted_ids: list[int], features: torch.Tensor | None) -> None:
        if accepted_ids:
            self.last = accepted_ids[-1]
        self._extend(features)

    @torch.inference_mode()
    def _extend(self, features: torch.Tensor | None) -> None:
        """Append the context K/V of the tokens these features belong to ([n, K, H])."""
        if features is None or features.shape[0] == 0:
            return
        n = features.shape[0]
        features = features.to(self.device, self.dtype)
        pos = torch.arange(self.length, self.length + n, device=self.device)[None]
        if self.fast is not None:
            kvs = self.fast.context_kv(features[None], *self.model.rope(features, pos))
        else:
            kvs = self.model.context_kv(self.model.fuse(features)[None], pos)  # fused: [1, n, H]
        for layer, (k, v) in enumerate(kvs):
            self.ctx.write(self.length, k, v, layer)
        self.length += n

    @torch.inference_mode()
    def block_logits(self) -> torch.Tensor:
        """[B-1, V] logits of the mask slots for the block at the current frontier (V: the head's rows,
        which are `head_rows` with `vocab=N`)."""
        B = self.model.block_size
        ids = torch.full((1, B), self.model.mask_token_id, dtype=torch.long, device=self.device)
        ids[0, 0] = self.last
        pos = torch.arange(self.length, self.length + B, device=self.device)[None]
        context = [self.ctx.view(self.length, layer) for layer in range(len(self.model.layers))]
        if self.fast is not None:
            h = self.model.embed(ids, self.dtype)
            hidden = self.fast.block(h, *self.model.rope(h, pos), context)
        else:
            hidden = self.model(ids, pos, context)  # [1, B, H]
        if self.head is not None:
            return self.head(hidden[0, 1:].to(self.head.weight.dtype))
        return self.model.logits(hidden[0, 1:])

    def propose(self, k: int) -> Draft:
        if self.last is None or k <= 0 or self.length == 0:
            return Draft(tokens=[])
        logits = self.block_logits()[:k]
        if self.tree is not None:
            top = torch.topk(torch.log_softmax(logits.float(), -1), min(self.tree[0], logits.shape[-1]))
            tokens, parents = slot_tree(top.values.tolist(), self._ids(top.indices), self.tree[1])
            return Draft(tokens=tokens, parents=parents)
        if not self.min_prob:
            return Draft(tokens=self._ids(logits.argmax(-1)))
        # Over a cut head this is the probability among the kept tokens: a cut that trusts a little
        # more, never a change to what verification accepts.
        confidence, tokens = torch.softmax(logits.float(), -1).max(-1)
        low = (confidence < self.min_prob).nonzero()
        keep = int(low[0]) if len(low) else len(tokens)
        return Draft(tokens=self._ids(tokens[:keep]))

    def _ids(self, rows: torch.Tensor) -> list[int]:
        """Head rows -> target token ids (nested lists for a 2-d `rows`)."""
        return (rows if self.head_rows is None else self.head_rows[rows]).tolist()


def slot_tree(logp: list[list[float]], ids: list[list[int]], size: int) -> tuple[list[int], list[int]]:
    """The `size` best nodes of the tree whose depth-j candidates are slot j's (`ids[j-1]`, with
    log-probabilities `logp[j-1]`, best first) under every node of depth j-1; a node scores the sum
    of its path's log-probabilities. Return (tokens, parents), parents first.

    Children score at most their parent, so expanding best-first keeps the kept set closed under
    ancestors; a node's children are pushed only when it is kept, so the heap stays small.

    >>> slot_tree([[-0.1, -2.0], [-0.5, -1.0]], [[7, 8], [5, 6]], 3)
    ([7, 5, 6], [-1, 0, 0])
    """
    heap = [(-lp, 0, rank, -1) for rank, lp in enumerate(logp[0])]  # (-score, depth-1, rank, parent)
    tokens: list[int] = []
    parents: list[int] = []
    depth_of: list[int] = []
    while heap and len(tokens) < size:
        neg, slot, rank, parent = heapq.heappop(heap)
        tokens.append(ids[slot][rank])
        parents.append(parent)
        depth_of.append(slot)
        if slot + 1 < len(logp):
            node = len(tokens) - 1
            for r, lp in enumerate(logp[slot + 1]):
                heapq.heappush(heap, (neg - lp, slot + 1, r, node))
    tree = parents_first(list(range(len(tokens))), tokens, parents, depth_of)
    return tree.tokens, tree.parents


class DFlashFactory(FactoryBase):
    """Loads the model once (bound to the target's embedding and LM head); one drafter per request."""

    name = "dflash"

    def __init__(
        self, path: str, min_prob: float = 0.0, vocab: int = 0, tree: tuple[int, int] | None = None
    ) -> None:
        self.path = path
        self.tree = tree  # (topk per slot, nodes kept) for dflash-tree; None: a chain
        self.max_draft_tokens = 0 if tree is None else tree[1]
        self.min_prob = min_prob  # blocks are cut at the first slot the model gives less
        self.vocab = vocab  # 0: the target's whole head; else its rows for the `vocab` most frequent tokens
        self.model: DFlashModel | None = None
        self.needs_features: tuple[int, ...] = ()
        self.fast: FastDFlash | None = None
        self.head: nn.Linear | None = None  # the cut head (vocab > 0)
        self.head_rows: torch.Tensor | None = None  # the target ids of its rows

    @property
    def block_size(self) -> int:
        return self.model.block_size if self.model is not None else 0

    def bind(self, target, sampling) -> None:
        if self.model is not None:
            return
        embed, head = target.model.get_input_embeddings(), target.model.get_output_embeddings()
        self.model = load_dflash(self.path, embed, head, dtype=target.dtype).to(target.device)
        use_fast_linear(self.model)  # the block's products, as the target's (its head is the target's)
        if self.vocab:
            rows = vocab_order.head_rows("dflash", self.path, self.vocab, target.vocab_size)
            self.head_rows = rows.to(head.weight.device)  # indexed by the argmax, on the draft's device
            self.head = linear_rows(head, self.head_rows)  # a copy: the target's head stays whole
            use_fast_linear(self.head)
        if available(self.model):
            self.fast = FastDFlash(self.model)  # packed and compiled (see dflash_fast.py)
        self.needs_features = tuple(self.model.target_layer_ids)
        if max(self.needs_features) >= target.num_layers or min(self.needs_features) < 0:
            raise UserError(
                f"DFlash drafter at {self.path} reads target layers {list(self.needs_features)} but the target "
                f"has {target.num_layers} layers: use a drafter trained for this target"
            )

    def __call__(
        self, sampling: SamplingParams | None = None, generator: torch.Generator | None = None
    ) -> DFlashDrafter:
        # A block is drafted deterministically (q one-hot), exact at any temperature.
        if self.model is None:
            raise RuntimeError("DFlashFactory.bind(target, sampling) must run before drafting")
        return DFlashDrafter(self)


def build(arg: str | None) -> DFlashFactory:
    """`dflash:PATH[:min_prob=0][:vocab=0]`: one block per step, cut at the first slot below
    min_prob, drafted over the `vocab` most frequent tokens (0: all)."""
    if not arg:
        raise UserError("dflash needs a checkpoint: use dflash:PATH[:min_prob=P][:vocab=N]")
    path, o = split_path_options(arg, {"min_prob": 0.0, "vocab": 0})
    if o["vocab"] < 0:
        raise UserError(f"dflash option vocab={o['vocab']} must be a positive token count (or 0 for all)")
    return DFlashFactory(path, min_prob=check_probability("min_prob", o["min_prob"]), vocab=int(o["vocab"]))


def build_tree(arg: str | None) -> DFlashFactory:
    """`dflash-tree:PATH[:topk=4][:size=24][:vocab=0]`: one block per step, verified as a tree of
    the `size` likeliest paths through each slot's `topk` candidates."""
    if not arg:
        raise UserError("dflash-tree needs a checkpoint: use dflash-tree:PATH[:topk=4][:size=24][:vocab=N]")
    path, o = split_path_options(arg, {"topk": 4, "size": 24, "vocab": 0})
    if o["topk"] < 1 or o["size"] < 1 or o["vocab"] < 0:
        raise UserError("dflash-tree options topk and size must be positive, vocab a token count (0 for all)")
    return DFlashFactory(path, vocab=int(o["vocab"]), tree=(int(o["topk"]), int(o["size"])))
