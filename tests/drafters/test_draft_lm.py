"""`draft:PATH`: a small causal LM drafting for a target with the same vocabulary. Lossless greedy
and sampled decoding, full acceptance when the target drafts for itself, a cache kept in sync
across rollbacks and hybrid steps, shared-embedding folders, and the vocabulary rule.

The draft is the tiny target cut to its first layer (`tiny.save_draft_lm`: it agrees with the
target often but not always, so steps accept some drafts and reject others). Float32 throughout, so greedy ties cannot
flip between plain and speculative decoding.
"""

import math

import pytest
import torch
from tiny import VOCAB, assert_target_law, random_prompts, save_draft_lm, tiny_model, tiny_target

from draftsmith.decoding.engine import Batch, DecodeStats, Seq, generate
from draftsmith.decoding.sampling import SamplingParams, draft_stream, make_generator
from draftsmith.drafters import draft_lm, registry
from draftsmith.drafters.draft_lm import DraftLMFactory
from draftsmith.errors import UserError
from draftsmith.formats import draft_lm_format

pytestmark = pytest.mark.usefixtures("one_thread")

SCALE = 4.0  # a sharper random target, as in the other drafters' tests


def save_draft(path, layers: int = 1, seed: int = 0, vocab: int = VOCAB) -> str:
    return save_draft_lm(path, layers=layers, seed=seed, scale=SCALE, vocab=vocab)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    return save_draft(tmp_path_factory.mktemp("draft") / "d")


@pytest.fixture(scope="module")
def itself(tmp_path_factory) -> str:
    return save_draft(tmp_path_factory.mktemp("self") / "d", layers=2)


def _prompts() -> list[list[int]]:
    prompts = random_prompts(4, seed=1, lo=2, hi=24)
    assert len({len(p) for p in prompts}) > 2  # ragged rows
    return prompts


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_with_draft_model_equals_plain(small, k, monkeypatch):
    monkeypatch.setattr(draft_lm, "SPARE", 1)  # caches start short and grow while decoding
    t = tiny_target("llama", scale=SCALE)
    prompts = _prompts()
    ar = generate(t, None, prompts, max_new_tokens=20)
    out = generate(t, registry.build(f"draft:{small}"), prompts, k=k, max_new_tokens=20)
    assert [r.token_ids for r in out] == [r.token_ids for r in ar]
    stats = DecodeStats.combined(r.stats for r in out)
    assert 0 < sum(stats.accepted) < sum(stats.proposed)  # rollbacks happened


@pytest.mark.parametrize("k", [1, 3, 5])
def test_target_as_its_own_draft_accepts_every_token(itself, k):
    """Same weights: every drafted token is the target's argmax, so each step commits k + 1 tokens
    until the budget leaves less room (the first token comes from prefill)."""
    t = tiny_target("llama", scale=SCALE)
    prompts, new = _prompts(), 20
    ar = generate(t, None, prompts, max_new_tokens=new)
    out = generate(t, registry.build(f"draft:{itself}"), prompts, k=k, max_new_tokens=new)
    assert [r.token_ids for r in out] == [r.token_ids for r in ar]
    stats = DecodeStats.combined(r.stats for r in out)
    assert stats.accepted == stats.proposed
    assert stats.steps == len(prompts) * math.ceil((new - 1) / (k + 1))


def test_cache_follows_rollbacks_and_commits_without_proposals(itself):
    """After drafts rejected at several depths and commits the drafter did not propose for (the
    other side of a hybrid drafted), its q at every drafted position equals the draft model's
    softmax over the whole context computed from scratch: no stale key, no shifted position."""
    t = tiny_target("llama", scale=SCALE)
    f = registry.build(f"draft:{itself}")
    f.bind(t, SamplingParams(temperature=1.0, seed=0))
    d = f()
    prompt = random_prompts(1, seed=3)[0]
    d.start(prompt, None)
    d.commit([4], None)
    first = d.propose(4).tokens
    d.commit(first[:2] + [(first[2] + 1) % VOCAB], None)  # two accepted, the third rejected
    d.commit([7, 8], None)  # no proposal in between
    d.propose(3)
    d.commit([9], None)  # every draft rejected
    d.commit([10, 11, 12], None)
    draft = d.propose(4)
    n = len(d.context)
    with torch.no_grad():
        logits = f.model(input_ids=torch.tensor([d.context + draft.tokens[:-1]])).logits[0, n - 1 :]
    assert torch.allclose(draft.probs, torch.softmax(logits, -1), atol=1e-5)


def test_k_option_caps_the_draft(small):
    t = tiny_target("llama", scale=SCALE)
    f = registry.build(f"draft:{small}:k=2")
    assert isinstance(f, DraftLMFactory) and f.max_k == 2 and f.path == small
    out = generate(t, f, _prompts(), k=5, max_new_tokens=12)
    assert len(DecodeStats.combined(r.stats for r in out).proposed) == 2
    with pytest.raises(UserError, match="must be a positive"):
        registry.build(f"draft:{small}:k=-1")
    with pytest.raises(UserError, match="needs a model"):
        registry.build("draft")


def test_sampling_with_draft_model_keeps_target_law(tmp_path):
    """With 4 new tokens the first step drafts 2 (one slot stays for the target's own token), so new
    tokens 2 and 3 come out of draft ~ q -> min(1, p/q) -> resample or bonus. Their frequencies over
    1500 rows must match the exact marginals of the target."""
    vocab, rows = 10, 1500
    t = tiny_target("llama", seed=2, scale=SCALE, vocab=vocab)
    path = save_draft(tmp_path / "d", seed=2, vocab=vocab)
    sampling = SamplingParams(temperature=1.0, top_k=6, seed=11)
    prompt = [1, 5, 7]
    out = generate(
        t, registry.build(f"draft:{path}"), [prompt] * rows, k=3, sampling=sampling, max_new_tokens=4
    )
    assert_target_law(t, prompt, sampling, out)


def _ranked(path, seed: int, vocab: int = VOCAB) -> str:
    """The draft folder with a token ranking saved beside it (a random one: any ranking is exact)."""
    draft_lm_format.save_vocab_order(
        path, torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))
    )
    return str(path)


@pytest.mark.parametrize("options", [":vocab=40", ":min_prob=0.045", ":vocab=40:min_prob=0.06"])
def test_greedy_with_fewer_head_rows_or_a_confidence_cut_equals_plain(tmp_path, options):
    t = tiny_target("llama", scale=SCALE)
    path = _ranked(save_draft(tmp_path / "d"), seed=3)
    prompts = _prompts()
    ar = generate(t, None, prompts, max_new_tokens=20)
    f = registry.build(f"draft:{path}{options}")
    out = generate(t, f, prompts, k=4, max_new_tokens=20)
    assert [r.token_ids for r in out] == [r.token_ids for r in ar]
    stats = DecodeStats.combined(r.stats for r in out)
    assert 0 < sum(stats.accepted) < sum(stats.proposed)
    if "vocab" in options:
        assert f.head_rows.tolist() == draft_lm_format.load_vocab_order(path)[:40].tolist()
        assert f.lm.lean().head[0].shape[0] == 40 or f.lm.head.weight.shape[0] == 40
    if "min_prob" in options:  # the cut drafts fewer tokens than the plain chain
        same = options.split(":min_prob")[0]
        uncut = generate(t, registry.build(f"draft:{path}{same}"), prompts, k=4, max_new_tokens=20)
        assert stats.draft_tokens < DecodeStats.combined(r.stats for r in uncut).draft_tokens


def test_sampling_with_fewer_head_rows_and_a_cut_keeps_target_law(tmp_path):
    """As the test above it, with the draft's head cut to 6 of 10 tokens (q = 0 on the other 4) and
    chains ended below probability 0.25: the output law must stay the target's."""
    vocab, rows = 10, 1500
    t = tiny_target("llama", seed=2, scale=SCALE, vocab=vocab)
    path = _ranked(save_draft(tmp_path / "d", seed=2, vocab=vocab), seed=4, vocab=vocab)
    sampling = SamplingParams(temperature=1.0, top_k=6, seed=12)
    prompt = [1, 5, 7]
    f = registry.build(f"draft:{path}:vocab=6:min_prob=0.25")
    out = generate(t, f, [prompt] * rows, k=3, sampling=sampling, max_new_tokens=4)
    assert_target_law(t, prompt, sampling, out)
    kept = set(f.head_rows.tolist())
    assert len(kept) == 6


def test_vocab_option_needs_a_ranking(small):
    t = tiny_target("llama", scale=SCALE)
    with pytest.raises(UserError, match="vocab_order.safetensors"):
        registry.build(f"draft:{small}:vocab=8").bind(t, SamplingParams())
    with pytest.raises(UserError, match="positive token count"):
        registry.build(f"draft:{small}:vocab=-1")
    with pytest.raises(UserError, match="between 0 and 1"):
        registry.build(f"draft:{small}:min_prob=2")


def test_each_row_drafts_with_its_own_sampling(small):
    """A batch bound greedy, as the server's is: a row at temperature > 0 drafts by sampling at its
    own temperature, from a stream tied to its generator, so a seeded row reproduces whatever its
    neighbours; a greedy row drafts argmax beside it."""
    t = tiny_target("llama", scale=SCALE)
    prompts = _prompts()
    hot = SamplingParams(temperature=0.8, seed=3)

    def run(neighbours: int):
        batch = Batch(t, registry.build(f"draft:{small}"), k=3)
        seqs = [Seq(0, prompts[0], 12), Seq(1, prompts[1], 12, hot, make_generator(3, 0))]
        seqs += [Seq(2 + j, prompts[2 + j], 12, hot) for j in range(neighbours)]
        rows = batch.add(seqs)
        drafters = [row.drafter for row in rows]
        while batch.rows:
            batch.step()
        return rows, drafters

    (a, da), (b, _) = run(0), run(2)
    assert [(d.sampling, d.temperature) for d in da] == [(False, 1.0), (True, 0.8)]
    assert da[1].gen.initial_seed() == draft_stream(make_generator(3, 0)).initial_seed()
    assert a[1].stats.draft_tokens > 0 and a[1].output == b[1].output
    assert a[0].output == generate(t, None, [prompts[0]], max_new_tokens=12)[0].token_ids


def test_shared_embedding_folder_loads_and_drafts(tmp_path):
    """A folder as `draftsmith train draft-lm` writes it: one layer and the norm, no embedding or
    head (those are the target's)."""
    t = tiny_target("llama", scale=SCALE)
    config = tiny_model("llama").config
    config.num_hidden_layers = 1
    torch.manual_seed(4)
    lm = draft_lm_format.build_shared(config, t.model, torch.float32)
    draft_lm_format.save_shared(lm, tmp_path / "d", {"target": t.name}, torch.float32)
    assert draft_lm_format.shares_target_embedding(tmp_path / "d")
    f = registry.build(f"draft:{tmp_path / 'd'}")
    prompts = _prompts()
    ar = generate(t, None, prompts, max_new_tokens=16)
    out = generate(t, f, prompts, k=3, max_new_tokens=16)
    assert [r.token_ids for r in out] == [r.token_ids for r in ar]
    assert torch.equal(f.model.get_input_embeddings().weight, t.model.get_input_embeddings().weight)
    assert torch.equal(f.model.model.layers[0].mlp.up_proj.weight, lm.model.layers[0].mlp.up_proj.weight)


def test_too_few_token_rows_is_one_line(tmp_path):
    t = tiny_target("llama")
    path = save_draft(tmp_path / "d", vocab=VOCAB - 16)
    with pytest.raises(UserError) as e:
        registry.build(f"draft:{path}").bind(t, SamplingParams())
    msg = str(e.value)
    assert len(msg.splitlines()) == 1
    assert f"{VOCAB - 16} token rows" in msg and f"{VOCAB} tokens" in msg
    assert "target's tokenizer" in msg and "universal assisted decoding" in msg


def test_other_tokenizer_is_one_line(tiny_checkpoint, tmp_path, capsys):
    """Same sizes, one token more in the draft's tokenizer: refused through the CLI, in one line."""
    import shutil

    from transformers import AutoTokenizer

    from draftsmith.cli import main

    shutil.copytree(tiny_checkpoint, tmp_path / "d")
    tok = AutoTokenizer.from_pretrained(tmp_path / "d")
    n = len(tok)
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(tmp_path / "d")
    args = ["generate", "--target", tiny_checkpoint, "--dtype", "float32", "--max-new-tokens", "4"]
    assert main([*args, "--drafter", f"draft:{tmp_path / 'd'}", "abc"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"({n + 1} tokens)" in err and f"({n} tokens)" in err and "universal assisted decoding" in err
    assert main([*args, "--drafter", f"draft:{tiny_checkpoint}", "abc"]) == 0  # its own tokenizer


class _Tokenizer:
    """What the vocabulary check reads of a tokenizer: its size and its vocabulary."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def get_vocab(self) -> dict[str, int]:
        return {str(i): i for i in range(self.n)}


@pytest.mark.parametrize("rows", [VOCAB - 6, VOCAB + 32])
def test_draft_head_narrower_or_wider_than_the_target(tmp_path, rows):
    """A target head padded past its tokenizer (96 rows, 90 tokens) with a draft of exactly the
    tokenizer's rows (q padded with zeros), and a draft head with padding rows of its own (cut)."""
    t = tiny_target("llama", scale=SCALE)
    t.tokenizer = _Tokenizer(VOCAB - 6)
    path = save_draft(tmp_path / "d", vocab=rows)
    prompts = _prompts()
    ar = generate(t, None, prompts, max_new_tokens=12)
    out = generate(t, registry.build(f"draft:{path}"), prompts, k=3, max_new_tokens=12)
    assert [r.token_ids for r in out] == [r.token_ids for r in ar]
    f = registry.build(f"draft:{path}")
    f.bind(t, SamplingParams(temperature=1.0, seed=1))
    d = f()
    d.start(prompts[0], None)
    d.commit([3], None)
    draft = d.propose(3)
    assert draft.probs.shape == (3, VOCAB)
    assert torch.allclose(draft.probs.sum(-1), torch.ones(3))
    assert all(tok < min(rows, VOCAB) for tok in draft.tokens)
    if rows < VOCAB:
        assert float(draft.probs[:, rows:].abs().sum()) == 0.0


def test_greedy_with_suffix_plus_draft_equals_plain(small):
    t = tiny_target("llama", scale=SCALE)
    prompts = [p * 3 for p in random_prompts(3, seed=4, lo=3, hi=6)]  # repeats, so suffix drafts too
    ar = generate(t, None, prompts, max_new_tokens=24)
    for spec in (f"suffix:min_score=2+draft:{small}", f"draft:{small}+suffix"):
        out = generate(t, registry.build(spec), prompts, k=4, max_new_tokens=24)
        assert [r.token_ids for r in out] == [r.token_ids for r in ar], spec
        assert DecodeStats.combined(r.stats for r in out).draft_tokens > 0
