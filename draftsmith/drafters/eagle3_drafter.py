"""`eagle3:PATH` in the engine: chain drafting with a trained EAGLE-3 model.

Pairing, caching and chain unrolling are `feature_chain.py`'s (shared with MTP): here the model's
input per position is the fused feature g_t of three target layers, and draft ids map onto target
ids through the checkpoint's vocabulary (`d2t`).

Draft probabilities q are the draft model's softmax mapped onto the target vocabulary, so
verification at temperature > 0 uses min(1, p/q) and stays exact.

`eagle3:PATH:min_prob=P` ends a chain where the draft distribution's top probability falls below
P (possibly before the first token): a weak draft then spends neither draft steps nor verification
width on tokens it does not believe in. The cut depends on the draft distribution alone, never on
the sampled token or the target, so each drafted token is still x ~ q and verification stays exact.
"""

from __future__ import annotations

import itertools

import torch

from draftsmith.decoding.sampling import SamplingParams, draft_generator
from draftsmith.drafters.base import Draft, FactoryBase, parents_first
from draftsmith.drafters.draft_kv import causal_mask
from draftsmith.drafters.eagle3 import Eagle3Model, load_eagle3
from draftsmith.drafters.feature_chain import FeatureChainDrafter
from draftsmith.drafters.options import check_probability, split_path_options
from draftsmith.errors import UserError
from draftsmith.target.packed import use_fast_linear


class Eagle3Drafter(FeatureChainDrafter):
    def __init__(self, factory: Eagle3Factory, sampling: SamplingParams, gen: torch.Generator) -> None:
        p = next(factory.model.parameters())
        super().__init__(factory.needs_features, sampling, gen, p.device, p.dtype)
        self.f = factory
        self.model = factory.model
        self.min_prob = factory.min_prob
        self.temperature = sampling.temperature or 1.0

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        return self.model.fuse(features)

    def run(self, ids: torch.Tensor, hidden: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        q = ids.shape[1]
        pos = torch.arange(start, start + q, device=self.device)[None]
        keys, values = self.kv.view(start) if start else (None, None)
        logits, h, k, v = self.model(ids, hidden, pos, keys, values, causal_mask(start, q, self.device))
        self.kv.write(start, k, v)
        return logits[0, -1], h[0, -1]

    def draft_probs(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits.float() / self.temperature, -1)

    def to_target_id(self, draft_id: int) -> int:
        return int(self.f.draft_to_target[draft_id])

    def target_probs(self, qs: list[torch.Tensor]) -> torch.Tensor:
        probs = torch.zeros(len(qs), self.f.vocab_size)
        probs[:, self.f.draft_to_target.cpu()] = torch.stack(qs)
        return probs

    @torch.inference_mode()
    def propose(self, k: int) -> Draft:
        if self.f.tree is not None and self.last is not None and k > 0:
            return self._propose_tree(k, self.f.tree[0], self.f.tree[1])
        return super().propose(k)

    def _propose_tree(self, depth: int, topk: int, size: int) -> Draft:
        """EAGLE-2 dynamic tree: expand the `topk` best nodes per depth by cumulative log-probability,
        then keep the `size` best nodes overall (a node's score never exceeds its parent's, so the
        kept set is closed under ancestors)."""
        d2t = self.f.draft_to_target
        logits, h = self.last
        logp = torch.log_softmax(logits.float(), -1)
        top = torch.topk(logp, min(topk, logp.shape[-1]))
        # node: (target token, parent index, score, depth); hidden_in[i] = the h its parent produced
        nodes: list[tuple[int, int, float, int]] = []
        hidden_in: list[torch.Tensor] = []
        for lp, did in zip(top.values.tolist(), top.indices.tolist(), strict=True):
            nodes.append((int(d2t[did]), -1, lp, 1))
            hidden_in.append(h)
        frontier = list(range(len(nodes)))
        slot_of: dict[int, int] = {}  # fed node -> its speculative draft KV slot
        for level in range(2, depth + 1):
            fed = frontier
            base = self.length + len(slot_of)
            for j, node in enumerate(fed):
                slot_of[node] = base + j
            ids = torch.tensor([[nodes[i][0] for i in fed]], device=self.device)
            hid = torch.stack([hidden_in[i] for i in fed])[None]
            pos = torch.full((1, len(fed)), self.length + level - 2, device=self.device)
            mask = self._tree_mask(fed, nodes, slot_of, base)
            out_logits, out_h, kk, vv = self.model(ids, hid, pos, *self.kv.view(base), mask)
            self.kv.write(base, kk, vv)
            logp = torch.log_softmax(out_logits[0].float(), -1)  # [F, Vd]
            top = torch.topk(logp, min(topk, logp.shape[-1]), dim=-1)
            children = []
            for j, parent in enumerate(fed):
                for lp, did in zip(top.values[j].tolist(), top.indices[j].tolist(), strict=True):
                    nodes.append((int(d2t[did]), parent, nodes[parent][2] + lp, level))
                    hidden_in.append(out_h[0, j])
                    children.append(len(nodes) - 1)
            frontier = sorted(children, key=lambda i: -nodes[i][2])[:topk]
        keep = sorted(sorted(range(len(nodes)), key=lambda i: -nodes[i][2])[:size])
        kept = set(keep)
        for i in list(keep):  # ties can drop an ancestor; put it back
            p = nodes[i][1]
            while p >= 0 and p not in kept:
                kept.add(p)
                p = nodes[p][1]
        token, parent, _, depth = zip(*nodes, strict=True)
        return parents_first(list(kept), list(token), list(parent), list(depth))

    def _tree_mask(self, fed: list[int], nodes, slot_of: dict[int, int], base: int) -> torch.Tensor:
        """[1, 1, F, base + F]: committed draft positions, each node's fed ancestors, and itself."""
        mask = torch.zeros(len(fed), base + len(fed), dtype=torch.bool, device=self.device)
        mask[:, : self.length] = True
        for j, node in enumerate(fed):
            mask[j, base + j] = True
            p = nodes[node][1]
            while p >= 0:
                mask[j, slot_of[p]] = True
                p = nodes[p][1]
        return mask[None, None]


class Eagle3Factory(FactoryBase):
    """Loads the model once; makes one drafter per request."""

    name = "eagle3"

    def __init__(self, path: str, tree: tuple[int, int] | None = None, min_prob: float = 0.0) -> None:
        self.path = path
        self.min_prob = min_prob  # chains end at the first draft token the model gives less
        self.tree = None if tree is None else (tree[0], tree[1])  # (topk per depth, tree size)
        self.max_draft_tokens = 0 if tree is None else tree[1]
        self.model: Eagle3Model | None = None
        self.needs_features: tuple[int, ...] = ()
        self.sampling = SamplingParams()  # for drafters made without settings of their own
        self.vocab_size = 0
        self._requests = itertools.count()

    def bind(self, target, sampling) -> None:
        """Attach to the target (its embedding, device, dtype) before the first request."""
        if self.model is None:
            embed = target.model.get_input_embeddings()
            self.model = load_eagle3(self.path, embed, dtype=target.dtype).to(target.device)
            use_fast_linear(self.model)  # draft steps are one-row products, as the target's decode steps
            self.needs_features = tuple(self.model.feature_layers)
            if len(self.needs_features) != 3:
                raise UserError(
                    f"EAGLE-3 drafter at {self.path} names {len(self.needs_features)} feature layers, not 3"
                )
            if max(self.needs_features) >= target.num_layers:
                raise UserError(
                    f"EAGLE-3 drafter at {self.path} reads target layer {max(self.needs_features)} but the target "
                    f"has {target.num_layers} layers: use a drafter trained for this target"
                )
            self.draft_to_target = self.model.draft_to_target()
            self.vocab_size = target.vocab_size
        self.sampling = sampling

    def __call__(
        self, sampling: SamplingParams | None = None, generator: torch.Generator | None = None
    ) -> Eagle3Drafter:
        if self.model is None:
            raise RuntimeError("Eagle3Factory.bind(target, sampling) must run before drafting")
        s = sampling or self.sampling
        return Eagle3Drafter(self, s, generator or draft_generator(s.seed, next(self._requests)))


def build(arg: str | None) -> Eagle3Factory:
    """`eagle3:PATH[:min_prob=0]`: a chain of up to k tokens, cut at the first one below min_prob."""
    if not arg:
        raise UserError("eagle3 needs a checkpoint: use eagle3:PATH[:min_prob=P]")
    path, o = split_path_options(arg, {"min_prob": 0.0})
    return Eagle3Factory(path, min_prob=check_probability("min_prob", o["min_prob"]))


def build_tree(arg: str | None) -> Eagle3Factory:
    """`eagle3-tree:PATH[:topk=8][:size=60]`: EAGLE-2 dynamic trees of depth k."""
    if not arg:
        raise UserError("eagle3-tree needs a checkpoint: use eagle3-tree:PATH[:topk=8][:size=60]")
    path, o = split_path_options(arg, {"topk": 8, "size": 60})
    if o["topk"] < 1 or o["size"] < 1:
        raise UserError("eagle3-tree options topk and size must be positive")
    return Eagle3Factory(path, tree=(int(o["topk"]), int(o["size"])))
