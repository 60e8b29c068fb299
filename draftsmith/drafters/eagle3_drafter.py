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
"""

from __future__ import annotations

import torch

from draftsmith.drafters.base import Draft
from draftsmith.drafters.eagle3 import Eagle3Model, load_eagle3
from draftsmith.drafters.registry import register
from draftsmith.errors import UserError


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
    def __init__(self, factory: Eagle3Factory) -> None:
        self.f = factory
        self.model = factory.model
        self.needs_features = factory.needs_features
        p = next(self.model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.kv = _KV(self.model, self.device, self.dtype)
        self.feats: list[torch.Tensor] = []  # unpaired fused features g_t, each [H]
        self.tokens: list[int] = []  # unpaired tokens x_{t+1}
        self.length = 0  # draft positions with real (paired) keys/values
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None  # (logits [Vd], h [H]) at the frontier
        self.gen = torch.Generator().manual_seed(factory.seed)

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
        logits, h = self.last
        d2t = self.f.draft_to_target
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        for i in range(k):
            if self.f.sampling:
                # Exact speculative sampling needs x ~ q, so sample rather than take the argmax.
                q = torch.softmax(logits.float() / self.f.temperature, -1)
                draft_id = int(torch.multinomial(q.cpu(), 1, generator=self.gen))
                qs.append(q)
            else:
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


def _causal_mask(past: int, q: int, device) -> torch.Tensor:
    keys = torch.arange(past + q, device=device)
    rows = past + torch.arange(q, device=device)
    return (keys[None, :] <= rows[:, None])[None, None]


class Eagle3Factory:
    """Loads the model once; makes one drafter per request."""

    name = "eagle3"

    def __init__(self, path: str) -> None:
        self.path = path
        self.model: Eagle3Model | None = None
        self.needs_features: tuple[int, ...] = ()
        self.sampling = False
        self.temperature = 1.0
        self.vocab_size = 0
        self.seed = 0

    def bind(self, target, sampling) -> None:
        """Attach to the target (its embedding, device, dtype) before the first request."""
        if self.model is None:
            embed = target.model.get_input_embeddings()
            self.model = load_eagle3(self.path, embed, dtype=target.dtype).to(target.device)
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
        self.sampling = not sampling.greedy
        self.temperature = sampling.temperature or 1.0
        self.seed = sampling.seed or 0

    def __call__(self) -> Eagle3Drafter:
        if self.model is None:
            raise RuntimeError("Eagle3Factory.bind(target, sampling) must run before drafting")
        return Eagle3Drafter(self)

    def finish(self, prompt_ids: list[int], output_ids: list[int]) -> None:
        pass


@register("eagle3")
def build(arg: str | None) -> Eagle3Factory:
    if not arg:
        raise UserError("eagle3 needs a checkpoint: use eagle3:PATH")
    return Eagle3Factory(arg)
