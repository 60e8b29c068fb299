"""z-lab's `dflash` 0.1.0 (in .peers/dflash) loads our DFlash exports with its own loader
(`benchmark.load_transformers_models`) and decodes with its own `dflash_generate`.

Checked per drafter: the config fields it reads equal ours, every tensor it loaded equals the file we
wrote, its speculative output and its plain output (block size 1) equal our plain greedy decoding in
float32, and its acceptance length equals our engine's with the same drafter. Both run the same
algorithm (a block [bonus, MASK x (B-1)], greedy chain verification, features of the committed
tokens appended), so in float32 they should accept the same drafts; a near-tie can flip one draft
argmax between two kernels, so the assertion allows 5% (a rule wrong by one token a step moves tau
by far more).
"""

from __future__ import annotations

import json

import pytest
import torch
from ecosystem import SHIPPED, chat_prompts, close, our_decoding, record, run_program, venv_python
from safetensors.torch import load_file

from draftsmith.drafters.dflash import DFlashModel, make_config
from draftsmith.formats.export import export
from draftsmith.target.model import load_target
from draftsmith.target.resolve import resolve_target

MAX_NEW = 40


def _check(tmp_path, target, target_dir: str, src, prompts: list[list[int]], name: str) -> dict:
    dst = tmp_path / "export"
    export(src, dst, "vllm")  # the z-lab layout (the same folder for SGLang)
    cfg = json.loads((dst / "config.json").read_text())
    block = int(cfg["dflash_config"]["block_size"])
    job = tmp_path / "job.json"
    stop = sorted(target.eos_ids)
    job.write_text(
        json.dumps(
            {
                "target": target_dir,
                "draft": str(dst),
                "prompts": prompts,
                "max_new_tokens": MAX_NEW,
                "stop": stop,
            }
        )
    )
    out = tmp_path / "out"
    out.mkdir()
    run_program("dflash", "dflash_check.py", job, out)
    lib = json.loads((out / "result.json").read_text())

    want = cfg["dflash_config"]
    config_ok = (
        lib["config"]["class"] == "DFlashDraftModel"
        and lib["config"]["block_size"] == want["block_size"]
        and lib["config"]["mask_token_id"] == want["mask_token_id"]
        and lib["config"]["target_layer_ids"] == want["target_layer_ids"]
    )
    ours_file = load_file(str(dst / "model.safetensors"))
    loaded = load_file(str(out / "draft.safetensors"))
    loaded = {k: v for k, v in loaded.items() if not k.startswith("rotary_emb.")}  # buffers, not weights
    # The library loads in bf16 and the check casts to float32: compare the file the same way.
    weights_equal = loaded.keys() == ours_file.keys() and all(
        torch.equal(loaded[k], ours_file[k].to(torch.bfloat16).float()) for k in loaded
    )
    ours = our_decoding(target, f"dflash:{dst}", prompts, k=block - 1, max_new_tokens=MAX_NEW)
    output_equal = lib["spec"] == ours.plain and lib["plain"] == ours.plain and ours.spec == ours.plain
    steps = [a for row in lib["acceptance_lengths"] for a in row]
    tau_lib = sum(steps) / len(steps)
    row = {
        "library": "dflash 0.1.0",
        "speculator": name,
        "config_ok": config_ok,
        "weights_equal": weights_equal,
        "tensors": len(loaded),
        "output_equal": output_equal,
        "tau_library": round(tau_lib, 4),
        "tau_ours": round(ours.tau, 4),
        "prompts": len(prompts),
        "max_new_tokens": MAX_NEW,
        "dtype": "float32",
    }
    record(row)
    assert config_ok, (lib["config"], want)
    assert weights_equal, sorted(set(loaded) ^ set(ours_file))
    assert lib["plain"] == ours.plain, "the library's plain decoding differs from ours"
    assert lib["spec"] == ours.plain, "the library's DFlash output differs from plain decoding"
    assert close(tau_lib, ours.tau, 0.05), row
    return row


@pytest.mark.slow
def test_shipped_smollm2_dflash(tmp_path):
    venv_python("dflash")
    target = load_target("smollm2-135m", "float32")
    prompts = chat_prompts(target.tokenizer, 2)
    folder = resolve_target("smollm2-135m").model_path
    _check(
        tmp_path, target, folder, SHIPPED / "smollm2-135m-dflash", prompts, "smollm2-135m-dflash (shipped)"
    )


def test_fabricated_tiny_dflash(tmp_path, tiny_checkpoint):
    """A random two-layer DFlash drafter for the tiny Llama checkpoint (char tokenizer)."""
    venv_python("dflash")
    target = load_target(tiny_checkpoint, "float32")
    torch.manual_seed(0)
    cfg = make_config(target.model.config, layers=2, block_size=4, mask_token_id=0, target_layer_ids=[0, 1])
    m = DFlashModel(cfg, target.model.get_input_embeddings(), target.model.get_output_embeddings())
    m.save(tmp_path / "src", extra={"kind": "dflash", "target": tiny_checkpoint})
    ids = target.tokenizer
    prompts = [ids(t)["input_ids"] for t in ("def add(a, b):", "hello hello hello", "x = [1, 2, 3]")]
    _check(tmp_path, target, tiny_checkpoint, tmp_path / "src", prompts, "tiny DFlash (fabricated)")
