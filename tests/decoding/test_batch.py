"""The step-level API (continuous batching): rows that join a running batch, leave it early or carry
their own sampling settings decode exactly as they would alone."""

import pytest
import torch
from tiny import OracleFactory, random_prompts, tiny_target

from draftsmith.decoding.engine import Batch, Seq, generate
from draftsmith.decoding.sampling import SamplingParams


@pytest.fixture(scope="module", params=["llama", "qwen3_5"])
def target(request):
    return tiny_target(request.param)


def _solo(target, prompts, max_new):
    return [generate(target, None, [p], max_new_tokens=max_new)[0].token_ids for p in prompts]


def test_rows_joining_mid_flight_equal_their_solo_runs(target):
    prompts = random_prompts(5, seed=21, lo=2, hi=25)
    budgets = [12, 5, 20, 9, 14]
    solo = [
        generate(target, None, [p], max_new_tokens=n)[0].token_ids
        for p, n in zip(prompts, budgets, strict=True)
    ]
    refs = {tuple(p): s for p, s in zip(prompts, solo, strict=True)}
    batch = Batch(target, OracleFactory(refs, noise=0.4, seed=3), k=4)
    finished = batch.add([Seq(0, prompts[0], budgets[0])])
    joins = {2: [1], 3: [2, 3], 6: [4]}  # step -> rows that join before it
    step = 0
    while batch.rows or any(s > step for s in joins):
        if step in joins:
            finished += batch.add([Seq(i, prompts[i], budgets[i]) for i in joins[step]])
        if batch.rows:
            finished += batch.step()
        step += 1
    out = {row.index: row for row in finished}
    assert sorted(out) == [0, 1, 2, 3, 4]
    for i in range(5):
        assert out[i].output == solo[i], i
        assert out[i].finish == "length"
    assert batch.cache.batch == 0  # every finished row left the cache


def test_removed_rows_leave_and_the_rest_are_unaffected(target):
    prompts = random_prompts(3, seed=4)
    solo = _solo(target, prompts, 10)
    batch = Batch(target, None, k=4)
    batch.add([Seq(i, p, 10) for i, p in enumerate(prompts)])
    batch.step()
    gone = batch.remove({1})
    assert [r.index for r in gone] == [1] and gone[0].finish == "cancelled"
    rows = {r.index: r for r in batch.rows}
    while batch.rows:
        batch.step()
    assert rows[0].output == solo[0] and rows[2].output == solo[2]


def test_per_row_sampling_greedy_rows_stay_greedy_and_seeds_reproduce():
    t = tiny_target("llama", seed=1, scale=4.0)
    prompts = random_prompts(2, seed=9)
    solo = _solo(t, prompts[:1], 12)[0]
    hot = SamplingParams(temperature=1.0, seed=7)

    def run(extra_rows):
        batch = Batch(t, None, k=4)
        seqs = [Seq(0, prompts[0], 12), Seq(1, prompts[1], 12, hot, torch.Generator().manual_seed(5))]
        seqs += [Seq(2 + j, prompts[1], 12, hot) for j in range(extra_rows)]
        rows = batch.add(seqs)
        while batch.rows:
            batch.step()
        return rows

    a, b = run(0), run(3)
    assert a[0].output == solo and b[0].output == solo  # greedy row untouched by sampled neighbours
    assert a[1].output == b[1].output  # same generator, same sample, whatever the batch
    assert a[1].stats.steps == 11 and a[1].stats.tau == 1.0


def test_first_token_finish_leaves_at_once():
    t = tiny_target("llama")
    prompts = random_prompts(2, seed=2)
    batch = Batch(t, None, k=2)
    rows = batch.add([Seq(0, prompts[0], 1), Seq(1, prompts[1], 6)])
    assert rows[0].finish == "length" and len(rows[0].output) == 1
    assert [r.index for r in batch.rows] == [1] and batch.cache.batch == 1
    while batch.rows:
        batch.step()
    assert rows[1].output == _solo(t, prompts[1:], 6)[0]


def test_generate_with_a_row_ending_on_its_first_token():
    # Before the Batch API, such a row stayed in the cache while leaving the live rows: a shape error.
    t = tiny_target("llama")
    prompts = random_prompts(2, seed=5)
    solo = _solo(t, prompts, 6)
    t.eos_ids = {solo[0][0]}
    out = generate(t, None, prompts, max_new_tokens=6)
    assert (out[0].token_ids, out[0].finish_reason) == (solo[0][:1], "stop")
    assert out[1].token_ids == _solo(t, prompts[1:], 6)[0]
