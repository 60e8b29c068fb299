"""Drafter cost from type and size: host drafters pay a look-up per request, autoregressive ones
pay k passes, block drafters one pass over the block, and a speculator folder gives its real size."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from draftsmith.errors import UserError
from draftsmith.simulate.catalog import load_model
from draftsmith.simulate.drafter_cost import AUTOREGRESSIVE, BLOCK, HOST, drafter_cost, safetensors_params
from draftsmith.simulate.hardware import load_hardware
from draftsmith.simulate.roofline import forward_cost

H200 = load_hardware("h200")
QWEN = load_model("qwen3-8b")
KW = dict(batch=1, context=1024, dtype="bf16", tp=1)


def test_host_drafters_cost_their_lookup_per_request() -> None:
    for name in ("ngram", "suffix"):
        d = drafter_cost(name, QWEN)
        assert d.kind == HOST and d.net is None
        one = d.time(H200, k=8, **KW)
        assert one == pytest.approx(H200.host_draft_per_row_s) and one > 0
        # one look-up per request, whatever k: the engine loops over requests on the host
        assert d.time(H200, k=3, **{**KW, "batch": 32}) == pytest.approx(32 * one)
        assert d.time(H200, k=0, **KW) == 0.0  # no drafting, no look-up
        # a profile without the figure (an old `local` one, a GPU-side proposer) costs nothing
        assert d.time(replace(H200, host_draft_per_row_s=0.0), k=8, **KW) == 0.0


def test_no_drafter_costs_nothing() -> None:
    assert drafter_cost("none", QWEN).time(H200, k=8, **KW) == 0.0


def test_autoregressive_pays_k_passes() -> None:
    d = drafter_cost("eagle3", QWEN)
    assert d.kind == AUTOREGRESSIVE and d.net.num_layers == 1 and d.net.vocab == 32000
    one = forward_cost(d.net, H200, q=1, extra_params=d.extra_params, **KW).total
    assert d.time(H200, k=5, **KW) == pytest.approx(5 * one)
    # The draft network is far smaller than the target: each pass costs well under a target step.
    assert one < 0.25 * forward_cost(QWEN, H200, q=1, **KW).total


def test_block_drafter_pays_one_pass_over_the_block() -> None:
    d = drafter_cost("dflash", QWEN)
    assert d.kind == BLOCK and d.net.num_layers == 5 and d.net.vocab == QWEN.vocab
    block = forward_cost(d.net, H200, q=16, extra_params=d.extra_params, **KW).total
    assert d.time(H200, k=15, **KW) == pytest.approx(block)
    assert d.time(H200, k=15, **KW) < 2 * d.time(H200, k=3, **KW)  # memory-bound: block size is ~free


def test_mtp_on_moe_target_reads_experts() -> None:
    d = drafter_cost("mtp", load_model("qwen3.5-35b-a3b"))
    assert d.net.num_layers == 1 and d.net.num_linear_layers == 0 and d.net.num_experts == 256


def _write_safetensors(path: Path, tensors: dict[str, list[int]]) -> None:
    header, offset = {}, 0
    for name, shape in tensors.items():
        n = 1
        for s in shape:
            n *= s
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_speculator_folder_gives_its_real_size(tmp_path: Path) -> None:
    folder = tmp_path / "my-dflash"
    folder.mkdir()
    h = 64
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "hidden_size": h,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    _write_safetensors(
        folder / "model.safetensors", {"fc.weight": [h, 3 * h], "layers.0.mlp.up_proj.weight": [128, h]}
    )
    assert safetensors_params(folder) == {"fc.weight": 3 * h * h, "layers.0.mlp.up_proj.weight": 128 * h}
    target = load_model("smollm2-135m")
    d = drafter_cost(str(folder), target)
    # No lm_head tensor: it drafts through the target's head, which counts towards what it reads.
    assert d.kind == BLOCK and d.real_params == 3 * h * h + 128 * h + target.vocab * target.hidden
    assert d.net.always_on_params + d.extra_params == d.real_params


def test_bad_drafters(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown --drafter"):
        drafter_cost("medusa", QWEN)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(UserError, match="speculator"):
        drafter_cost(str(tmp_path), QWEN)
