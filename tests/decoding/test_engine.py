"""The engine against plain decoding: equal tokens at temperature 0 (float32), equal distributions
at temperature > 0, rows independent, limits respected, bad input refused."""

import time

import pytest
import torch
from tiny import OracleFactory, SkewedFactory, random_prompts, tiny_target

from draftsmith.decoding.engine import Batch, DecodeStats, Seq, generate
from draftsmith.decoding.sampling import SamplingParams
from draftsmith.drafters.base import FactoryBase
from draftsmith.errors import UserError

KINDS = ["llama", "qwen3", "qwen3_moe", "qwen3_5"]


@pytest.fixture(scope="module", params=KINDS)
def target(request):
    return tiny_target(request.param)


def _references(target, prompts, max_new):
    ar = generate(target, None, prompts, max_new_tokens=max_new)
    return ar, {tuple(p): r.token_ids for p, r in zip(prompts, ar, strict=True)}


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_speculative_equals_plain(target, k):
    prompts = random_prompts(3, seed=k)
    ar, refs = _references(target, prompts, 24)
    for noise in (0.0, 0.4):
        out = generate(target, OracleFactory(refs, noise=noise, seed=k), prompts, k=k, max_new_tokens=24)
        assert [r.token_ids for r in out] == [r.token_ids for r in ar]
        assert all(len(r.token_ids) == 24 and r.finish_reason == "length" for r in out)
        if noise == 0.0 and k > 1:  # whole drafts were accepted, not just the bonus token
            assert DecodeStats.combined(r.stats for r in out).tau > 1.5


def test_rows_do_not_influence_each_other(target):
    prompts = random_prompts(4, seed=11, lo=2, hi=30)
    ar, refs = _references(target, prompts, 16)
    batched = generate(target, OracleFactory(refs, noise=0.5, seed=2), prompts, k=4, max_new_tokens=16)
    for p, b in zip(prompts, batched, strict=True):
        alone = generate(target, None, [p], max_new_tokens=16)[0]
        assert b.token_ids == alone.token_ids


def test_plain_decoding_has_tau_one():
    t = tiny_target("llama")
    res = generate(t, None, random_prompts(1), max_new_tokens=10)[0]
    assert res.stats.tau == 1.0 and res.stats.steps == 9  # the first token comes from prefill


def test_eos_and_stop_callback_end_rows():
    t = tiny_target("llama")
    prompts = random_prompts(2, seed=5)
    ar, refs = _references(t, prompts, 20)
    t.eos_ids = {ar[0].token_ids[6]}
    out = generate(t, OracleFactory(refs, noise=0.0), prompts, k=5, max_new_tokens=20)
    first_eos = ar[0].token_ids.index(ar[0].token_ids[6])
    assert out[0].token_ids == ar[0].token_ids[: first_eos + 1] and out[0].finish_reason == "stop"
    t.eos_ids = set()
    stop_after = ar[1].token_ids[:4]
    out = generate(
        t,
        OracleFactory(refs, noise=0.0),
        prompts,
        k=5,
        max_new_tokens=20,
        stop=lambda row, ids: ids[-4:] == stop_after,
    )
    assert out[1].token_ids == stop_after and out[1].finish_reason == "stop"


def test_streaming_reports_every_token_once():
    t = tiny_target("llama")
    prompts = random_prompts(2, seed=8)
    ar, refs = _references(t, prompts, 12)
    seen: dict[int, list[int]] = {0: [], 1: []}
    generate(
        t,
        OracleFactory(refs, noise=0.2),
        prompts,
        k=4,
        max_new_tokens=12,
        on_tokens=lambda row, ids: seen[row].extend(ids),
    )
    assert [seen[0], seen[1]] == [r.token_ids for r in ar]


def test_each_result_carries_its_own_rows_stats():
    t = tiny_target("llama")
    prompts = random_prompts(2, seed=5)
    ar, refs = _references(t, prompts, 16)
    only_first = {tuple(prompts[0]): refs[tuple(prompts[0])]}  # the second row never drafts
    out = generate(t, OracleFactory(only_first, noise=0.0, seed=1), prompts, k=4, max_new_tokens=16)
    assert out[0].stats is not out[1].stats
    assert out[0].stats.tau > 1.0 and out[0].stats.drafts > 0
    assert out[1].stats.tau == 1.0 and out[1].stats.drafts == 0 and out[1].stats.steps == 15
    batch = Batch(t, OracleFactory(only_first, noise=0.0, seed=1), k=4)
    rows = batch.add([Seq(i, p, 16) for i, p in enumerate(prompts)])
    while batch.rows:
        batch.step()
    total, whole = DecodeStats.combined(row.stats for row in rows), batch.stats
    counts = ("steps", "decode_tokens", "drafts", "draft_tokens", "proposed", "accepted")
    assert [getattr(total, c) for c in counts] == [getattr(whole, c) for c in counts]
    assert [(r.stats.tau, r.stats.proposed) for r in rows] == [(r.stats.tau, r.stats.proposed) for r in out]


def _timed(spent: dict, kind: str, nap: float, fn):
    """fn, sleeping `nap` first; the call's whole duration is added to spent[kind]."""

    def call(*args, **kw):
        t = time.perf_counter()
        time.sleep(nap)
        try:
            return fn(*args, **kw)
        finally:
            spent[kind] += time.perf_counter() - t

    return call


class _Napping(FactoryBase):
    """Wraps a drafter factory: every propose and commit of its drafters sleeps and is timed."""

    name, needs_features = "napping", ()

    def __init__(self, inner, nap: float, spent: dict):
        self.inner, self.nap, self.spent = inner, nap, spent

    def __call__(self, sampling=None, generator=None):
        d = self.inner()
        d.propose = _timed(self.spent, "drafter", self.nap, d.propose)
        d.commit = _timed(self.spent, "drafter", self.nap, d.commit)
        return d


def test_step_time_lands_where_it_was_spent():
    """The drafters' time in draft_s; the target's forwards in verify_s, the hybrid target's replay
    after a partial acceptance included; stop callbacks (the commit loop) in other_s. The three add
    up to the steps' time, decode_s (generate sets a batch's to the loop's wall time, no less)."""
    t = tiny_target("qwen3_5")  # hybrid: a partial acceptance replays the accepted tokens
    prompts = random_prompts(2, seed=3)
    ar, refs = _references(t, prompts, 12)
    spent = {"drafter": 0.0, "forward": 0.0, "stop": 0.0}
    calls = {"forward": 0}

    def forward(*args, **kw):
        calls["forward"] += 1
        return plain_forward(*args, **kw)

    plain_forward = t.forward
    t.forward = _timed(spent, "forward", 0.01, forward)
    stop = _timed(spent, "stop", 0.02, lambda row, ids: False)
    batch = Batch(t, _Napping(OracleFactory(refs, noise=0.5, seed=4), 0.002, spent), k=4, stop=stop)
    rows = batch.add([Seq(i, p, 12) for i, p in enumerate(prompts)])
    spent.update(drafter=0.0, forward=0.0, stop=0.0)  # the decode steps only
    calls["forward"] = steps = 0
    while batch.rows:
        batch.step()
        steps += 1
    assert [r.output for r in rows] == [r.token_ids for r in ar]
    assert calls["forward"] > steps  # some steps replayed
    s = batch.stats
    assert s.draft_s >= spent["drafter"] and s.verify_s >= spent["forward"] and s.other_s >= spent["stop"]
    assert s.draft_s < spent["drafter"] + spent["stop"] / 2  # the stop callbacks' time is not here
    for st in (s, *(row.stats for row in rows)):
        assert st.draft_s + st.verify_s + st.other_s == pytest.approx(st.decode_s)
        assert st.prefill_s == s.prefill_s > 0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(prompts=[[]]), "empty prompt"),
        (dict(prompts=[[1, 2]], k=0), "--k"),
        (dict(prompts=[[1] * 600]), "exceeds the target's context"),
        (dict(prompts=[[1, 2]], max_new_tokens=0), "--max-new-tokens"),
    ],
)
def test_bad_input_is_a_user_error(kwargs, match):
    t = tiny_target("llama")
    with pytest.raises(UserError, match=match):
        generate(t, None, **kwargs)


def test_negative_temperature_is_a_user_error():
    with pytest.raises(UserError, match="temperature"):
        SamplingParams(temperature=-0.5)


# ---- sampling is lossless -------------------------------------------------------------------------

SMALL_VOCAB = 12
ROWS = 3000
# Total-variation tolerance: with 3000 samples over 12 outcomes the expected TV of an exact sampler
# is about 0.03 (and its standard deviation under 0.01); 0.06 leaves > 3 sigma.
TV_TOL = 0.06


def _exact_marginals(target, prompt, steps, sampling):
    """Exact law of each of the first `steps` generated tokens, by enumerating prefixes."""
    seqs, weights = [list(prompt)], torch.ones(1)
    marginals = []
    for _ in range(steps):
        ids = torch.tensor(seqs)
        with torch.no_grad():
            logits = target.model(input_ids=ids).logits[:, -1]
        from draftsmith.decoding.sampling import target_probs

        p = target_probs(logits, sampling)  # [n_seqs, V]
        joint = weights[:, None] * p
        marginals.append(joint.sum(0))
        seqs = [s + [v] for s in seqs for v in range(p.shape[1])]
        weights = joint.reshape(-1)
    return marginals


def _empirical(results, steps, vocab):
    out = []
    for t in range(steps):
        counts = torch.zeros(vocab)
        for r in results:
            counts[r.token_ids[t]] += 1
        out.append(counts / len(results))
    return out


@pytest.mark.parametrize("kind", ["llama", "qwen3_5"])
@pytest.mark.parametrize("drafter", ["oracle", "skewed"])
def test_sampling_output_distribution_equals_target(kind, drafter):
    t = tiny_target(kind, seed=3, scale=8.0, vocab=SMALL_VOCAB)
    sampling = SamplingParams(temperature=1.0, top_k=8, seed=1234)
    prompt = [1, 5, 7]
    steps = 3
    exact = _exact_marginals(t, prompt, steps, sampling)
    greedy = generate(t, None, [prompt], max_new_tokens=steps)[0].token_ids
    factory = (
        OracleFactory({tuple(prompt): greedy}, noise=0.3, seed=9, vocab=SMALL_VOCAB)
        if drafter == "oracle"
        else SkewedFactory(SMALL_VOCAB, seed=9)
    )
    rows = ROWS if kind == "llama" else ROWS // 3
    tol = TV_TOL if kind == "llama" else TV_TOL * 1.8  # fewer samples on the slow hybrid reference
    results = generate(t, factory, [prompt] * rows, k=3, sampling=sampling, max_new_tokens=steps)
    emp = _empirical(results, steps, SMALL_VOCAB)
    for e, x in zip(emp, exact, strict=True):
        assert 0.5 * float((e - x).abs().sum()) < tol
    # The test can fail: the drafts' own law differs from p by far more than the tolerance.
    if drafter == "oracle":
        draft_law = torch.zeros(SMALL_VOCAB)
        draft_law[greedy[1]] = 1.0
        assert 0.5 * float((draft_law - exact[1]).abs().sum()) > 3 * tol


def test_prefill_groups_bound_padding():
    from draftsmith.decoding.engine import prefill_groups

    lens = [3000, 100, 120, 2900, 110, 2950]
    groups = prefill_groups(lens, equal_only=False, budget=1000)
    assert sorted(i for g in groups for i in g) == list(range(len(lens)))
    for g in groups:  # every group pads to at most 25% over its real tokens (or the budget)
        assert max(lens[i] for i in g) * len(g) <= max(1000, 1.25 * sum(lens[i] for i in g))
    assert len(groups) == 2
    assert prefill_groups(lens, equal_only=True) == [[1], [4], [2], [3], [5], [0]]
    assert prefill_groups([7, 7, 7], equal_only=False) == [[0, 1, 2]]
