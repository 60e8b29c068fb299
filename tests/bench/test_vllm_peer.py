"""The vLLM peer's plumbing without vLLM: a fake worker speaks the worker's line protocol, so the
subprocess handling, the bench JSON and the skip reasons are checked on any machine. The real
worker runs against vLLM in tests/ecosystem/test_vllm.py (scripts/check_exports.sh)."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from draftsmith.bench import vllm_peer
from draftsmith.bench.peers import expand_peers, peer_available
from draftsmith.bench.runner import run_bench
from draftsmith.decoding.sampling import SamplingParams
from draftsmith.errors import UserError
from draftsmith.target.model import load_target

FAKE = textwrap.dedent(
    """
    import json, sys
    cfg = json.load(open(sys.argv[1]))
    print("INFO some vLLM log line on stdout")
    print("READY " + json.dumps({"vllm": "fake", "load_s": 0.5}), flush=True)
    spec = cfg["speculative_config"]
    for line in sys.stdin:
        req = json.loads(line)
        if req["prompt_ids"][0] == 0:
            print("ERROR " + json.dumps("boom"), flush=True)
            continue
        n = req["max_new_tokens"]
        toks = [(req["prompt_ids"][-1] + i) % 50 for i in range(n)]
        steps = (n - 1 + 1) // 2  # two tokens a step after the first
        counters = None
        if spec:
            counters = {"drafts": steps, "draft_tokens": 3 * steps, "accepted": steps, "accepted_per_pos": [steps, 0, 0]}
        out = {"token_ids": toks, "prefill_s": 0.01, "decode_s": 0.1, "decode_tokens": n - 1,
               "steps": steps, "spec": counters, "echo": cfg}
        print("RESULT " + json.dumps(out), flush=True)
    """
)


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    worker = tmp_path / "fake_worker.py"
    worker.write_text(FAKE)
    monkeypatch.setattr(vllm_peer, "WORKER", worker)
    monkeypatch.setenv(vllm_peer.PYTHON_ENV, sys.executable)
    return worker


def test_vllm_group_and_names():
    assert expand_peers("hf,vllm") == ["hf", "vllm-plain", "vllm-ngram", "vllm-eagle3", "vllm-dflash"]
    assert expand_peers("vllm-ngram") == ["vllm-ngram"]


def test_absent_venv_is_a_one_line_skip_reason(tiny_checkpoint, monkeypatch, tmp_path):
    monkeypatch.setenv(vllm_peer.PYTHON_ENV, str(tmp_path / "no-such-python"))
    target = load_target(tiny_checkpoint, "float32")
    assert peer_available("vllm-plain", target) is None  # the generic check leaves vLLM to vllm_peer
    reason = vllm_peer.vllm_available(target)
    assert reason is not None and "scripts/setup.sh --vllm" in reason and "\n" not in reason


def test_worker_protocol(fake_vllm, tiny_checkpoint):
    target = load_target(tiny_checkpoint, "float32")
    peer = vllm_peer.VllmPeer("vllm-ngram", target, 256, {"method": "ngram", "num_speculative_tokens": 4})
    try:
        assert peer.version == "fake" and peer.load_s == 0.5
        res = peer.run([5, 6, 7], 5, SamplingParams())
        assert res.token_ids == [7, 8, 9, 10, 11] and res.new_tokens == 5 and res.decode_tokens == 4
        assert res.steps == 2 and res.spec["drafts"] == 2 and res.prefill_s == 0.01
        with pytest.raises(RuntimeError, match="boom"):
            peer.run([0, 1], 5, SamplingParams())
        assert peer.run([1], 3, SamplingParams()).token_ids == [1, 2, 3]  # still serving after an error
        with pytest.raises(UserError, match="exceeds the peer's context"):
            peer.run([1] * 250, 10, SamplingParams())
    finally:
        peer.close()
    assert peer._proc.returncode == 0


def test_bench_json_has_vllm_runs_and_reasons(fake_vllm, tiny_checkpoint):
    target = load_target(tiny_checkpoint, "float32")
    prompts = [[3, 4, 5], [6, 7, 8, 9]]
    out = run_bench(
        target,
        prompts,
        methods=["ar"],
        peers=expand_peers("vllm"),
        sampling=SamplingParams(),
        k=4,
        max_new_tokens=5,
        workload="tiny",
        progress=False,
        log=lambda m: None,
    )
    runs = {r["method"]: r for r in out["runs"]}
    plain, ngram = runs["vllm-plain"], runs["vllm-ngram"]
    assert plain["kind"] == "peer" and plain["engine"] == "vllm fake" and plain["speculative_config"] is None
    assert plain["num_prompts"] == 2 and plain["new_tokens"] == 10 and plain["decode_s"] == pytest.approx(0.2)
    assert ngram["speculative_config"] == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    }
    # our tau (decode tokens / steps) and vLLM's own (1 + accepted / drafts), from the counters
    assert ngram["tau"] == 2.0 and ngram["vllm_mean_acceptance_length"] == 2.0
    assert ngram["accept_per_pos"] == [1.0, 0.0, 0.0]
    assert "no eagle3:PATH method" in runs["vllm-eagle3"]["skipped"]
    assert "no dflash:PATH method" in runs["vllm-dflash"]["skipped"]
    json.dumps(out)  # the whole result stays JSON


def test_bench_exports_the_eagle3_method_for_vllm(fake_vllm, tiny_checkpoint, tmp_path):
    """vllm-eagle3 gets the bench's eagle3:PATH method exported to vLLM's layout, with its k."""
    from draftsmith.drafters.eagle3 import Eagle3Model, make_config

    target = load_target(tiny_checkpoint, "float32")
    cfg = make_config(target.model.config, 20, feature_layers=[0, 0, 1])
    m = Eagle3Model(cfg, target.model.get_input_embeddings())
    m.save(tmp_path / "e3", extra={"target": tiny_checkpoint})
    spec = vllm_peer.speculative_config(
        "vllm-eagle3",
        {"eagle3:x@2": (f"eagle3:{tmp_path / 'e3'}", 2)},
        5,
        tmp_path / "w",
        verifier=tiny_checkpoint,
    )
    assert spec["method"] == "eagle3" and spec["num_speculative_tokens"] == 2
    exported = json.loads((tmp_path / "w" / "eagle3" / "config.json").read_text())
    assert exported["speculators_model_type"] == "eagle3"
    assert exported["speculators_config"]["verifier"]["name_or_path"] == tiny_checkpoint
