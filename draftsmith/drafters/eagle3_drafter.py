"""`eagle3:PATH` in the engine: chain drafting with a trained EAGLE-3 model.

Draft position t pairs the target's features at t with the token x_{t+1} that follows; the engine
hands features and tokens over in matching order (at start: the prompt's features with the prompt's
tokens from the second on; at each commit: the features of the tokens that entered the target's
cache with the committed ids), so the drafter keeps two FIFO queues and pairs them as they fill.

Each paired position is run once through the draft layer and its keys/values kept. A proposal then
unrolls k steps past the last paired position, each feeding the layer's own hidden state and its
argmax token; those speculative keys/values are written past the committed length and simply
overwritten next time (the same zero-copy rollback as the target's cache).

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
from draftsmith.drafters.base import Draft, FactoryBase
from draftsmith.drafters.eagle3 import Eagle3Model, load_eagle3
from draftsmith.drafters.options import check_probability, split_path_options
from draftsmith.errors import UserError
from draftsmith.target.packed import use_fast_linear


class _KV:
    """Growable per-request key/value store written at absolute draft positions."""

    def __init__(self, model: Eagle3Model, device, dtype) -> None:
        cfg = model.config
        self.k = torch.zeros(1, cfg.num_key_value_heads, 256, cfg.head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        end = start + k.shape[2]
        if end > self.k.shape[2]:
            grow = max(end, 2 * self.k.shape[2])
            self.k = torch.cat(
                [self.k, self.k.new_zeros(*self.k.shape[:2], grow - self.k.shape[2], self.k.shape[3])], 2
            )
            self.v = torch.cat(
                [self.v, self.v.new_zeros(*self.v.shape[:2], grow - self.v.shape[2], self.v.shape[3])], 2
            )
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v


class Eagle3Drafter:
    def __init__(self, factory: Eagle3Factory, sampling: SamplingParams, gen: torch.Generator) -> None:
        self.f = factory
        self.sampling = not sampling.greedy  # drafts x ~ q at the request's temperature, else argmax
        self.temperature = sampling.temperature or 1.0
        self.model = factory.model
        self.needs_features = factory.needs_features
        p = next(self.model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.kv = _KV(self.model, self.device, self.dtype)
        self.feats: list[torch.Tensor] = []  # unpaired fused features g_t, each [H]
        self.tokens: list[int] = []  # unpaired tokens x_{t+1}
        self.length = 0  # draft positions with real (paired) keys/values
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None  # (logits [Vd], h [H]) at the frontier
        self.gen = gen

    def start(self, prompt_ids: list[int], features: torch.Tensor | None) -> None:
        self.tokens = list(prompt_ids[1:])
        self._add_features(features)
        self._advance()

    def commit(self, accepted_ids: list[int], features: torch.Tensor | None) -> None:
        self.tokens.extend(accepted_ids)
        self._add_features(features)
        self._advance()

    def _add_features(self, features: torch.Tensor | None) -> None:
        if features is None or features.shape[0] == 0:
            return
        g = self.model.fuse(features.to(self.device, self.dtype))  # [n, H]
        self.feats.extend(g.unbind(0))

    @torch.inference_mode()
    def _advance(self) -> None:
        """Run every newly paired position through the layer, keeping its keys/values."""
        n = min(len(self.feats), len(self.tokens))
        if n == 0:
            return
        hidden = torch.stack(self.feats[:n])[None]
        ids = torch.tensor([self.tokens[:n]], device=self.device)
        pos = torch.arange(self.length, self.length + n, device=self.device)[None]
        keys, values = self.kv.k[:, :, : self.length], self.kv.v[:, :, : self.length]
        mask = _causal_mask(self.length, n, self.device)
        logits, h, k, v = self.model(ids, hidden, pos, keys, values, mask)
        self.kv.write(self.length, k, v)
        self.length += n
        del self.feats[:n], self.tokens[:n]
        self.last = (logits[0, -1], h[0, -1])

    @torch.inference_mode()
    def propose(self, k: int) -> Draft:
        if self.last is None or k <= 0:
            return Draft(tokens=[])
        if self.f.tree is not None:
            return self._propose_tree(k, self.f.tree[0], self.f.tree[1])
        logits, h = self.last
        d2t = self.f.draft_to_target
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        for i in range(k):
            if self.sampling:
                q = torch.softmax(logits.float() / self.temperature, -1)
                # The cut looks at q's top probability, never at the sampled token: cutting on q(x)
                # would leave x distributed as q truncated, and verification against q inexact.
                if float(q.max()) < self.f.min_prob:
                    break
                # Exact speculative sampling needs x ~ q, so sample rather than take the argmax.
                draft_id = int(torch.multinomial(q.cpu(), 1, generator=self.gen))
                qs.append(q)
            else:
                if self.f.min_prob and float(torch.softmax(logits.float(), -1).max()) < self.f.min_prob:
                    break
                draft_id = int(logits.argmax())
            tokens.append(int(d2t[draft_id]))
            if i == k - 1:
                break
            # Position length + i pairs the layer's own h (standing in for the target's feature)
            # with the token just drafted; it sees every paired position and the chain so far.
            pos = self.length + i
            ids = torch.tensor([[tokens[-1]]], device=self.device)
            out_logits, out_h, kk, vv = self.model(
                ids,
                h[None, None],
                torch.tensor([[pos]], device=self.device),
                self.kv.k[:, :, :pos],
                self.kv.v[:, :, :pos],
            )
            self.kv.write(pos, kk, vv)
            logits, h = out_logits[0, -1], out_h[0, -1]
        probs = None
        if qs:
            probs = torch.zeros(len(qs), self.f.vocab_size)
            probs[:, d2t.cpu()] = torch.stack(qs).cpu()
        return Draft(tokens=tokens, probs=probs)

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
            out_logits, out_h, kk, vv = self.model(
                ids, hid, pos, self.kv.k[:, :, :base], self.kv.v[:, :, :base], mask
            )
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
        order = sorted(kept, key=lambda i: (nodes[i][3], i))
        index = {old: new for new, old in enumerate(order)}
        return Draft(
            tokens=[nodes[i][0] for i in order],
            parents=[index[nodes[i][1]] if nodes[i][1] >= 0 else -1 for i in order],
        )

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


def _causal_mask(past: int, q: int, device) -> torch.Tensor:
    keys = torch.arange(past + q, device=device)
    rows = past + torch.arange(q, device=device)
    return (keys[None, :] <= rows[:, None])[None, None]


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
