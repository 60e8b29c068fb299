"""Tree drafts verified in one forward: equal to plain decoding at temperature 0, the target's law
at temperature > 0, mixed with chains in one batch, refused on hybrid targets."""

import pytest
import torch
from tiny import OracleFactory, TreeOracleFactory, random_prompts, tiny_target

from draftsmith.decoding.engine import DecodeStats, generate
from draftsmith.decoding.sampling import SamplingParams
from draftsmith.decoding.verify import verify_tree
from draftsmith.drafters.base import FactoryBase, node_depths
from draftsmith.errors import UserError


def test_node_depths():
    assert node_depths([-1, -1, 0, 2, 1]) == [1, 1, 2, 3, 2]


def test_verify_tree_greedy_descends_matching_children():
    tokens, parents = [4, 5, 6, 7], [-1, -1, 1, 2]
    target = torch.zeros(5, 10)
    target[0, 5] = target[2, 6] = target[3, 7] = target[4, 9] = 1  # wants 5, 6, 7, then 9
    assert verify_tree(tokens, parents, target, None) == ([1, 2, 3], 9)
    target[3, 7], target[3, 8] = 0, 1
    assert verify_tree(tokens, parents, target, None) == ([1, 2], 8)


def test_verify_tree_sampling_law():
    # Root children 1 and 2; whatever the tree holds, the first token must follow p.
    p = torch.tensor([0.1, 0.5, 0.3, 0.1])
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    for _ in range(20_000):
        path, nxt = verify_tree([1, 2], [-1, -1], torch.stack([p, p, p]), g)
        counts[[1, 2][path[0]] if path else nxt] += 1
    assert torch.allclose(counts / 20_000, p, atol=0.015)  # > 4 standard errors


@pytest.mark.parametrize("kind", ["llama", "qwen3", "qwen3_moe"])
@pytest.mark.parametrize("k", [2, 6])
def test_greedy_tree_equals_plain(kind, k):
    t = tiny_target(kind)
    prompts = random_prompts(3, seed=k)
    ar = generate(t, None, prompts, max_new_tokens=24)
    refs = {tuple(p): r.token_ids for p, r in zip(prompts, ar, strict=True)}
    out = generate(t, TreeOracleFactory(refs, width=3, noise=0.3, seed=k), prompts, k=k, max_new_tokens=24)
    assert [r.token_ids for r in out] == [r.token_ids for r in ar]
    assert DecodeStats.combined(r.stats for r in out).tau > 1.3


def test_tree_and_chain_rows_in_one_batch():
    t = tiny_target("llama")
    prompts = random_prompts(4, seed=4)
    ar = generate(t, None, prompts, max_new_tokens=20)
    refs = {tuple(p): r.token_ids for p, r in zip(prompts, ar, strict=True)}
    tree, chain = TreeOracleFactory(refs, seed=1), OracleFactory(refs, noise=0.3, seed=1)

    class Mixed(FactoryBase):
        name, needs_features, max_draft_tokens = "mixed", (), 64
        n = 0

        def __call__(self, sampling=None, generator=None):
            self.n += 1
            return (tree if self.n % 2 else chain)()

    out = generate(t, Mixed(), prompts, k=5, max_new_tokens=20)
    assert [r.token_ids for r in out] == [r.token_ids for r in ar]


def test_sampling_with_trees_keeps_target_law():
    vocab = 12
    t = tiny_target("llama", seed=3, scale=8.0, vocab=vocab)
    prompt = [1, 5, 7]
    greedy = generate(t, None, [prompt], max_new_tokens=3)[0].token_ids
    rows = 3000
    sampling = SamplingParams(temperature=1.0, seed=5)
    spec = generate(
        t,
        TreeOracleFactory({tuple(prompt): greedy}, width=4, noise=0.2, vocab=vocab),
        [prompt] * rows,
        k=3,
        sampling=sampling,
        max_new_tokens=3,
    )
    plain = generate(
        t, None, [prompt] * rows, sampling=SamplingParams(temperature=1.0, seed=77), max_new_tokens=3
    )
    # Two independent samples of 3000 over 12 outcomes: mean TV about 0.04; 0.08 is > 3 sigma.
    for pos in range(3):
        a = torch.bincount(torch.tensor([r.token_ids[pos] for r in spec]), minlength=vocab).float() / rows
        b = torch.bincount(torch.tensor([r.token_ids[pos] for r in plain]), minlength=vocab).float() / rows
        assert 0.5 * float((a - b).abs().sum()) < 0.08


def test_trees_refused_on_hybrid_targets():
    t = tiny_target("qwen3_5")
    prompts = random_prompts(1)
    ar = generate(t, None, prompts, max_new_tokens=6)
    with pytest.raises(UserError, match="hybrid"):
        generate(t, TreeOracleFactory({tuple(prompts[0]): ar[0].token_ids}), prompts, k=3, max_new_tokens=6)
