"""Tiny random targets (Llama, Qwen3, Qwen3-MoE, Qwen3.5 hybrid) and test drafters, built in-process.

Float32 throughout so greedy ties cannot flip between plain and speculative decoding.
"""

from __future__ import annotations

import random

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from draftsmith.decoding.engine import DecodeStats
from draftsmith.decoding.sampling import target_probs
from draftsmith.drafters.base import Draft, FactoryBase
from draftsmith.drafters.eagle3 import Eagle3Model, make_config
from draftsmith.target.model import Target

VOCAB = 96

_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    eos_token_id=None,
    bos_token_id=None,
    pad_token_id=None,
)

CONFIGS = {
    "llama": dict(model_type="llama", num_hidden_layers=2, **_COMMON),
    "qwen3": dict(model_type="qwen3", num_hidden_layers=2, head_dim=16, **_COMMON),
    "qwen3_moe": dict(
        model_type="qwen3_moe",
        num_hidden_layers=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        decoder_sparse_step=1,
        **_COMMON,
    ),
    "qwen3_5": dict(
        model_type="qwen3_5_text",
        num_hidden_layers=4,
        head_dim=16,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        **_COMMON,
    ),
}


def tiny_model(kind: str, seed: int = 0, scale: float = 1.0, vocab: int = VOCAB):
    """A random float32 model; `scale` multiplies the LM head so distributions are less flat."""
    cfg = dict(CONFIGS[kind], vocab_size=vocab)
    model_type = cfg.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)
    return model.eval()


def tiny_target(kind: str = "llama", seed: int = 0, scale: float = 1.0, vocab: int = VOCAB) -> Target:
    return Target(tiny_model(kind, seed, scale, vocab), tokenizer=None, name=f"tiny-{kind}")


def save_draft_lm(path, layers: int = 1, seed: int = 0, scale: float = 1.0, vocab: int = VOCAB) -> str:
    """A draft model for `draft:PATH`: the tiny Llama target of this seed cut to its first `layers`
    layers, saved as an HF folder (one layer agrees with the two-layer target often, not always)."""
    model = tiny_model("llama", seed=seed, scale=scale, vocab=vocab)
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    model.save_pretrained(path)
    return str(path)


def save_eagle3(target, path, draft_vocab=40, seed=0):
    """A random EAGLE-3 drafter for `target` over `draft_vocab` random tokens, saved at `path`
    (feature layers 0, 0, 1 of the two-layer tiny targets)."""
    torch.manual_seed(seed)
    cfg = make_config(target.model.config, draft_vocab, feature_layers=[0, 0, 1])
    model = Eagle3Model(cfg, target.model.get_input_embeddings())
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    model.set_vocab_map(torch.randperm(VOCAB)[:draft_vocab])
    model.save(path, extra={"target": target.name})
    return model


def assert_target_law(t, prompt: list[int], sampling, out) -> None:
    """New tokens 2 and 3 of the rows in `out` (4 new tokens each: the first step drafts 2, so both
    come out of draft ~ q -> min(1, p/q) -> resample or bonus) follow the target's exact marginals,
    and some drafts were accepted, some rejected."""
    vocab, rows = t.vocab_size, len(out)
    with torch.no_grad():
        p1 = target_probs(t.model(input_ids=torch.tensor([prompt])).logits[0, -1], sampling)  # [V]
        two = torch.tensor([prompt + [a] for a in range(vocab)])
        p2 = target_probs(t.model(input_ids=two).logits[:, -1], sampling)  # [V, V]
        three = torch.tensor([prompt + [a, b] for a in range(vocab) for b in range(vocab)])
        p3 = target_probs(t.model(input_ids=three).logits[:, -1], sampling)  # [V * V, V]
    joint12 = p1[:, None] * p2  # [V, V]
    wants = {1: joint12.sum(0), 2: joint12.reshape(-1) @ p3}
    # Sampling error alone gives a total variation of about 0.03 over 1500 rows; a wrong rule gives more.
    for pos, want in wants.items():
        got = torch.bincount(torch.tensor([r.token_ids[pos] for r in out]), minlength=vocab).float() / rows
        assert 0.5 * float((got - want).abs().sum()) < 0.07, pos
    stats = DecodeStats.combined(r.stats for r in out)
    assert 0 < sum(stats.accepted) < sum(stats.proposed)


def random_prompts(n: int, seed: int = 0, lo: int = 3, hi: int = 20) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


class OracleFactory(FactoryBase):
    """Drafts from a known continuation, corrupting each token with probability `noise`.

    Exercises full acceptance, rejection at every position and variable draft lengths.
    """

    name = "oracle"
    needs_features: tuple[int, ...] = ()

    def __init__(
        self,
        references: dict[tuple[int, ...], list[int]],
        noise: float = 0.3,
        seed: int = 0,
        vocab: int = VOCAB,
    ):
        self.references = references
        self.vocab = vocab
        self.noise = noise
        self.rng = random.Random(seed)

    def __call__(self, sampling=None, generator=None):
        return _Oracle(self)


class _Oracle:
    needs_features: tuple[int, ...] = ()

    def __init__(self, factory: OracleFactory):
        self.f = factory
        self.ref: list[int] = []
        self.pos = 0

    def start(self, prompt_ids, features) -> None:
        self.ref = self.f.references.get(tuple(prompt_ids), [])
        self.pos = 0

    def propose(self, k: int) -> Draft:
        k = self.f.rng.randint(0, k)  # variable draft length, sometimes empty
        toks = list(self.ref[self.pos : self.pos + k])
        toks = [self.f.rng.randrange(self.f.vocab) if self.f.rng.random() < self.f.noise else t for t in toks]
        return Draft(tokens=toks)

    def commit(self, accepted_ids, features) -> None:
        self.pos += len(accepted_ids)


class SkewedFactory(FactoryBase):
    """A sampling drafter with its own distribution q (a tempered, perturbed copy of uniform noise).

    It proposes tokens sampled from q and returns q, so verification must use min(1, p/q).
    """

    name = "skewed"
    needs_features: tuple[int, ...] = ()

    def __init__(self, vocab: int, seed: int = 0):
        self.vocab = vocab
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, sampling=None, generator=None):
        return _Skewed(self)


class _Skewed:
    needs_features: tuple[int, ...] = ()

    def __init__(self, f: SkewedFactory):
        self.f = f

    def start(self, prompt_ids, features) -> None:
        pass

    def propose(self, k: int) -> Draft:
        q = torch.softmax(torch.randn(k, self.f.vocab, generator=self.f.gen) * 2.0, dim=-1)
        toks = torch.multinomial(q, 1, generator=self.f.gen)[:, 0].tolist()
        return Draft(tokens=toks, probs=q)

    def commit(self, accepted_ids, features) -> None:
        pass


class TreeOracleFactory(FactoryBase):
    """Drafts a tree: along the known continuation, each level also carries `width - 1` wrong
    siblings, and with probability `noise` the right child is left out (so branches get rejected)."""

    name = "tree-oracle"
    needs_features: tuple[int, ...] = ()
    max_draft_tokens = 64

    def __init__(
        self,
        references: dict[tuple[int, ...], list[int]],
        width: int = 3,
        noise: float = 0.2,
        seed: int = 0,
        vocab: int = VOCAB,
    ):
        self.references, self.width, self.noise, self.vocab = references, width, noise, vocab
        self.rng = random.Random(seed)

    def __call__(self, sampling=None, generator=None):
        return _TreeOracle(self)


class _TreeOracle(_Oracle):
    def propose(self, k: int) -> Draft:
        f, rng = self.f, self.f.rng
        tokens: list[int] = []
        parents: list[int] = []
        parent = -1
        for depth in range(k):
            if self.pos + depth >= len(self.ref):
                break
            right = self.ref[self.pos + depth]
            wrong = [t for t in rng.sample(range(f.vocab), f.width + 1) if t != right][: f.width - 1]
            keep_right = rng.random() >= f.noise
            level = ([right] if keep_right else []) + wrong
            rng.shuffle(level)
            nxt_parent = -1
            for tok in level:
                tokens.append(tok)
                parents.append(parent)
                if tok == right:
                    nxt_parent = len(tokens) - 1
            if nxt_parent < 0:
                break
            parent = nxt_parent
        return Draft(tokens=tokens, parents=parents)
