"""DFlash drafting: the incremental context cache equals a recompute, shorter drafts are prefixes of
the block, and the engine stays lossless (greedy equality, sampling law) with a random drafter on
Llama, Qwen3 and a hybrid Qwen3.5 target."""

import pytest
import torch
from tiny import VOCAB, random_prompts, tiny_target

from draftsmith.decoding.engine import DecodeStats, generate
from draftsmith.decoding.sampling import SamplingParams
from draftsmith.drafters import registry
from draftsmith.drafters.base import node_depths
from draftsmith.drafters.dflash import DFlashModel, make_config
from draftsmith.drafters.dflash_drafter import slot_tree
from draftsmith.errors import UserError
from draftsmith.formats import vocab_order

LAYER_IDS = {"llama": [0, 1], "qwen3": [0, 1], "qwen3_5": [0, 1, 3]}


pytestmark = pytest.mark.usefixtures("one_thread")


def make_drafter(target, path, kind="llama", block_size=5, layers=2, seed=0, std=0.2):
    torch.manual_seed(seed)
    cfg = make_config(
        target.model.config,
        layers=layers,
        block_size=block_size,
        mask_token_id=VOCAB - 1,
        target_layer_ids=LAYER_IDS[kind],
    )
    model = DFlashModel(cfg, target.model.get_input_embeddings(), target.model.get_output_embeddings())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                torch.nn.init.normal_(p, std=std)
    model.save(path, extra={"target": target.name})
    return model


def _features(target, ids, layers):
    with torch.no_grad():
        hs = target.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    return torch.stack([hs[i + 1][0] for i in layers], dim=1)  # [len, K, H]


def test_incremental_context_equals_recompute(tmp_path):
    t = tiny_target("llama")
    make_drafter(t, tmp_path / "d")
    f = registry.build(f"dflash:{tmp_path / 'd'}")
    f.bind(t, SamplingParams())
    d = f()
    prompt = random_prompts(1, seed=3)[0]
    seq = prompt + [5, 6, 7, 8, 9]
    feats = _features(t, seq, f.needs_features)
    n = len(prompt)
    d.start(prompt, feats[:n])
    d.commit([seq[n]], feats[:0])  # the engine's first token: no features yet
    d.propose(4)  # the block's own K/V must not leak into what follows
    d.commit(seq[n + 1 : n + 3], feats[n : n + 2])
    d.commit(seq[n + 3 : n + 5], feats[n + 2 : n + 4])
    got = d.block_logits()

    m = f.model
    ctx = n + 4  # tokens whose features are known; seq[ctx] is the last committed token
    with torch.no_grad():
        kv = m.context_kv(m.fuse(feats[:ctx])[None], torch.arange(ctx)[None])
        ids = torch.tensor([[seq[ctx]] + [m.mask_token_id] * (m.block_size - 1)])
        hidden = m(ids, torch.arange(ctx, ctx + m.block_size)[None], kv)
        want = m.logits(hidden[0, 1:])
    assert torch.allclose(got, want, atol=1e-5)


def test_shorter_k_is_a_prefix_of_the_block(tmp_path):
    t = tiny_target("llama")
    make_drafter(t, tmp_path / "d", block_size=8)
    f = registry.build(f"dflash:{tmp_path / 'd'}")
    f.bind(t, SamplingParams())
    prompt = random_prompts(1, seed=5)[0]
    feats = _features(t, prompt, f.needs_features)
    drafts = []
    for k in (2, 7, 20):
        d = f()
        d.start(prompt, feats)
        d.commit([4], feats[:0])
        drafts.append(d.propose(k).tokens)
    assert len(drafts[0]) == 2 and len(drafts[1]) == 7 and drafts[2] == drafts[1]
    assert drafts[1][:2] == drafts[0]


def test_min_prob_cuts_the_block_at_the_first_unsure_slot(tmp_path):
    t = tiny_target("llama")
    make_drafter(t, tmp_path / "d", block_size=8)
    prompt = random_prompts(1, seed=5)[0]
    blocks = {}
    for p in (0.0, 0.5, 1.0):
        f = registry.build(f"dflash:{tmp_path / 'd'}:min_prob={p}")
        f.bind(t, SamplingParams())
        d = f()
        d.start(prompt, _features(t, prompt, f.needs_features))
        blocks[p] = d.propose(7).tokens
        if p == 0.0:
            confidence = torch.softmax(d.block_logits().float(), -1).max(-1).values
    assert len(blocks[0.0]) == 7 and blocks[1.0] == []
    first_low = next((i for i, c in enumerate(confidence.tolist()) if c < 0.5), 7)
    assert blocks[0.5] == blocks[0.0][:first_low]


def test_a_cut_head_drafts_the_kept_tokens_argmax(tmp_path):
    t = tiny_target("llama")
    make_drafter(t, tmp_path / "d", block_size=8)
    order = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1))
    vocab_order.save(tmp_path / "d", order, as_json=True)
    prompt = random_prompts(1, seed=5)[0]
    full = registry.build(f"dflash:{tmp_path / 'd'}")
    cut = registry.build(f"dflash:{tmp_path / 'd'}:vocab=20")
    drafts = {}
    for name, f in (("full", full), ("cut", cut)):
        f.bind(t, SamplingParams())
        d = f()
        d.start(prompt, _features(t, prompt, f.needs_features))
        drafts[name] = d.propose(7).tokens
        if name == "full":
            logits = d.block_logits()
    kept = order[:20]
    want = kept[logits[:7, kept].argmax(-1)].tolist()
    assert drafts["cut"] == want and set(want) <= set(kept.tolist())


def test_a_cut_head_needs_the_saved_ranking(tmp_path):
    t = tiny_target("llama")
    make_drafter(t, tmp_path / "d")
    f = registry.build(f"dflash:{tmp_path / 'd'}:vocab=20")
    with pytest.raises(UserError, match="vocab_order.json"):
        f.bind(t, SamplingParams())
    with pytest.raises(UserError, match="vocab=-1"):
        registry.build(f"dflash:{tmp_path / 'd'}:vocab=-1")


def test_tree_holds_the_likeliest_paths_through_the_slots(tmp_path):
    t = tiny_target("llama")
    make_drafter(t, tmp_path / "d", block_size=8)
    prompt = random_prompts(1, seed=5)[0]
    drafts = {}
    for spec in ("dflash:{}", "dflash-tree:{}:topk=1:size=30", "dflash-tree:{}:topk=3:size=12"):
        f = registry.build(spec.format(tmp_path / "d"))
        f.bind(t, SamplingParams())
        d = f()
        d.start(prompt, _features(t, prompt, f.needs_features))
        drafts[spec.split(":")[-1]] = d.propose(5)
        logp = torch.log_softmax(d.block_logits()[:5].float(), -1)
    chain, one, tree = drafts["{}"], drafts["size=30"], drafts["size=12"]
    assert one.tokens == chain.tokens and one.parents == [-1, 0, 1, 2, 3]  # topk=1: the chain itself
    assert len(tree) == 12 and tree.depth <= 5 and f.max_draft_tokens == 12
    depths = node_depths(tree.parents)
    top3 = torch.topk(logp, 3).indices.tolist()
    scores = []
    for i, tok in enumerate(tree.tokens):
        assert tok in top3[depths[i] - 1]  # each node is one of its slot's 3 best
        parent = tree.parents[i]
        scores.append(float(logp[depths[i] - 1, tok]) + (scores[parent] if parent >= 0 else 0.0))
    # Kept: the 12 best of every path through the slots' 3 best (3 + 9 + ... + 243 of them).
    top = torch.topk(logp, 3).values.tolist()
    every = list(top[0])
    level = list(top[0])
    for slot in top[1:]:
        level = [a + b for a in level for b in slot]
        every += level
    assert sorted(scores, reverse=True) == pytest.approx(sorted(every, reverse=True)[:12])
    assert tree.tokens[0] == chain.tokens[0] and tree.parents[0] == -1


def test_slot_tree_keeps_the_best_scores_in_order():
    logp = [[-0.1, -1.0, -3.0], [-0.2, -0.4, -5.0], [-0.3, -2.5, -2.6]]
    ids = [[10, 11, 12], [20, 21, 22], [30, 31, 32]]
    tokens, parents = slot_tree(logp, ids, 6)
    # Paths by score: 10 (-0.1), 10-20 (-0.3), 10-21 (-0.5), 10-20-30 (-0.6), 10-21-30 (-0.8), 11 (-1.0)
    assert tokens == [10, 11, 20, 21, 30, 30] and parents == [-1, -1, 0, 0, 2, 3]
    assert slot_tree(logp, ids, 100)[0].count(30) == 9  # one under each depth-2 node
    assert len(slot_tree(logp, ids, 100)[0]) == 39


def test_tree_options_are_checked(tmp_path):
    for spec in ("dflash-tree", "dflash-tree:x:topk=0", "dflash-tree:x:size=0", "dflash-tree:x:vocab=-2"):
        with pytest.raises(UserError, match="dflash-tree"):
            registry.build(spec)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_greedy_with_dflash_tree_equals_plain(tmp_path, kind):
    t = tiny_target(kind)
    make_drafter(t, tmp_path / "d", kind=kind, block_size=8)
    prompts = random_prompts(3, seed=2)
    vocab_order.save(tmp_path / "d", torch.randperm(VOCAB, generator=torch.Generator().manual_seed(2)), True)
    ar = generate(t, None, prompts, max_new_tokens=20)
    for options in (":topk=3:size=10", f":topk=2:size=6:vocab={VOCAB // 3}"):
        out = generate(
            t, registry.build(f"dflash-tree:{tmp_path / 'd'}{options}"), prompts, k=7, max_new_tokens=20
        )
        assert [r.token_ids for r in out] == [r.token_ids for r in ar], options


@pytest.mark.parametrize("kind", ["llama", "qwen3", "qwen3_5"])
@pytest.mark.parametrize("k", [2, 15])
def test_greedy_with_dflash_equals_plain(tmp_path, kind, k):
    t = tiny_target(kind)
    make_drafter(t, tmp_path / "d", kind=kind, block_size=16)
    prompts = random_prompts(2 if kind == "qwen3_5" else 3, seed=k)
    vocab_order.save(tmp_path / "d", torch.randperm(VOCAB, generator=torch.Generator().manual_seed(k)), True)
    ar = generate(t, None, prompts, max_new_tokens=20)
    for options in ("", f":vocab={VOCAB // 3}"):
        out = generate(
            t, registry.build(f"dflash:{tmp_path / 'd'}{options}"), prompts, k=k, max_new_tokens=20
        )
        assert [r.token_ids for r in out] == [r.token_ids for r in ar], options


@pytest.mark.parametrize("options", ["", ":min_prob=0.4", ":vocab=6", "tree:topk=3:size=6"])
def test_sampling_with_dflash_keeps_target_law(tmp_path, options):
    vocab = 12
    t = tiny_target("llama", seed=3, scale=8.0, vocab=vocab)
    torch.manual_seed(0)
    cfg = make_config(
        t.model.config, layers=1, block_size=4, mask_token_id=vocab - 1, target_layer_ids=[0, 1]
    )
    DFlashModel(cfg, t.model.get_input_embeddings(), t.model.get_output_embeddings()).save(tmp_path / "d")
    vocab_order.save(tmp_path / "d", torch.arange(vocab).flip(0), as_json=True)  # for vocab=6: ids 11..6
    prompt = [1, 5, 7]
    rows = 2000
    name, tree_options = ("dflash-tree", options[4:]) if options.startswith("tree") else ("dflash", options)
    spec = generate(
        t,
        registry.build(f"{name}:{tmp_path / 'd'}{tree_options}"),
        [prompt] * rows,
        k=3,
        sampling=SamplingParams(temperature=1.0, seed=7),
        max_new_tokens=3,
    )
    plain = generate(
        t, None, [prompt] * rows, sampling=SamplingParams(temperature=1.0, seed=99), max_new_tokens=3
    )
    stats = DecodeStats.combined(r.stats for r in spec)
    assert stats.tau > 1.0  # some drafts were accepted, so the accept path is exercised
    # Each row drafts one token (the budget leaves room for one); the cut at max q < 0.4 drops some.
    drafted = stats.draft_tokens / rows
    if "min_prob" in options:
        assert 0.1 < drafted < 0.9
    else:  # a chain drafts its one token; a tree its slot-1 candidates (depth 1 is all that fits)
        assert drafted == (3.0 if "tree" in options else 1.0)
    # Tolerance: two independent samples of 2000 over 12 outcomes differ by TV ~0.05 on average.
    for pos in range(3):
        a = torch.bincount(torch.tensor([r.token_ids[pos] for r in spec]), minlength=vocab).float() / rows
        b = torch.bincount(torch.tensor([r.token_ids[pos] for r in plain]), minlength=vocab).float() / rows
        assert 0.5 * float((a - b).abs().sum()) < 0.09
