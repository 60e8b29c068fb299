"""The engine's packed/compiled DFlash forward (drafters/dflash_fast.py) computes what the module
forward computes: context keys/values and block hidden states, eager and compiled, at several
context lengths; `DRAFTSMITH_FAST=0` keeps the module forward."""

import pytest
import torch
from test_dflash import _features, make_drafter
from tiny import random_prompts, tiny_target

from draftsmith.decoding.engine import generate
from draftsmith.decoding.sampling import SamplingParams
from draftsmith.drafters import registry

pytestmark = pytest.mark.usefixtures("one_thread")


def _bound(tmp_path, kind="llama"):
    t = tiny_target(kind)
    make_drafter(t, tmp_path / "d", kind=kind, block_size=8)
    f = registry.build(f"dflash:{tmp_path / 'd'}")
    f.bind(t, SamplingParams())
    return t, f


def _check_against_module(t, f, seed: int) -> None:
    m, fast = f.model, f.fast
    prompt = random_prompts(1, seed=seed)[0]
    feats = _features(t, prompt, f.needs_features)
    n = len(prompt)
    pos = torch.arange(n)[None]
    with torch.inference_mode():
        want_kv = m.context_kv(m.fuse(feats)[None], pos)
        got_kv = fast.context_kv(feats[None], *m.rope(feats, pos))
        for (wk, wv), (gk, gv) in zip(want_kv, got_kv, strict=True):
            assert torch.allclose(gk, wk, atol=1e-5) and torch.allclose(gv, wv, atol=1e-5)
        ids = torch.tensor([[prompt[-1]] + [m.mask_token_id] * (m.block_size - 1)])
        bpos = torch.arange(n, n + m.block_size)[None]
        want = m(ids, bpos, want_kv)
        h = m.embed(ids, t.dtype)
        got = fast.block(h, *m.rope(h, bpos), want_kv)
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_fast_forward_equals_the_module_forward(tmp_path, kind):
    t, f = _bound(tmp_path, kind)
    assert f.fast is not None
    for seed in (1, 2):
        _check_against_module(t, f, seed)


def test_compiled_forward_equals_the_module_forward_at_every_context_length(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_COMPILE", "1")
    t, f = _bound(tmp_path)
    for seed in (1, 2, 3):  # prompts of different lengths share the dynamic-shape graphs
        _check_against_module(t, f, seed)
    prompts = random_prompts(3, seed=4)
    plain = generate(t, None, prompts, max_new_tokens=24)
    out = generate(t, f, prompts, k=7, max_new_tokens=24)
    assert [r.token_ids for r in out] == [r.token_ids for r in plain]


def test_switch_off_keeps_the_module_forward(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_FAST", "0")
    _, f = _bound(tmp_path)
    assert f.fast is None
