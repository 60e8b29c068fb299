"""DFlash checkpoints in the layout z-lab publishes and SGLang and vLLM load (draftsmith's own).

`config.json`: a Qwen3 config with `architectures: ["DFlashDraftModel"]`, `model_type: "qwen3"`,
`num_hidden_layers` (draft layers), `num_target_layers`, `hidden_size` (= the target's), the
target's RoPE settings, `layer_types` (all `full_attention`), and

    "block_size": B,                                    # older loaders (z-lab -b16 drafters)
    "dflash_config": {"block_size": B, "mask_token_id": M, "target_layer_ids": [...]}

`model.safetensors`: `fc.weight [H, K*H]`, `hidden_norm.weight`, `norm.weight` and per layer i
`layers.{i}.self_attn.{q,k,v,o}_proj.weight`, `layers.{i}.self_attn.{q,k}_norm.weight`,
`layers.{i}.mlp.{gate,up,down}_proj.weight`, `layers.{i}.{input,post_attention}_layernorm.weight`.
No embedding and no LM head: serving reuses the target's.

Reading accepts both places for the block size (top level: z-lab/Qwen3-8B-DFlash-b16; under
`dflash_config`: newer drafters such as modal-labs/Qwen3.5-*-DFlash), a `model.` prefix on tensor
names, and a missing `target_layer_ids` (then the published default spread with K = number of draft
layers, as SGLang does). It refuses what this model does not compute: DFlash2 selectors and
convolutions, causal or sliding-window draft layers, attention biases, reduced draft vocabularies.

`export_dflash` writes any folder the reader accepts back in the layout above, which is what vLLM
(`"method": "dflash"`) and SGLang (`--speculative-algorithm DFLASH`) load for both `--format`s:
the config needs no verifier name, since both engines take the target from the served model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3Config

from draftsmith.errors import UserError
from draftsmith.fileio import atomic_dir, atomic_write_json, require_empty_dir
from draftsmith.formats import vocab_order

ARCHITECTURE = "DFlashDraftModel"
DEFAULT_BLOCK_SIZE = 16
DEFAULT_NUM_FEATURES = 5  # K target layers; the released drafters use K = number of draft layers = 5


def default_target_layer_ids(num_target_layers: int, k: int = DEFAULT_NUM_FEATURES) -> list[int]:
    """K layers spread evenly from 1 to L-3, the published rule (36 layers, K=5: [1, 9, 17, 25, 33]).

    >>> default_target_layer_ids(36)
    [1, 9, 17, 25, 33]
    >>> default_target_layer_ids(30)
    [1, 8, 14, 20, 27]
    """
    if k == 1:
        return [num_target_layers // 2]
    start, end = 1, max(1, num_target_layers - 3)
    ids = [int(round(start + i * (end - start) / (k - 1))) for i in range(k)]
    return [min(max(i, 0), num_target_layers - 1) for i in ids]


_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def config_dict(config: Qwen3Config, dtype: torch.dtype | None = None) -> dict:
    """The config.json we write: the published layout, plus `target_model_type` for our own checks."""
    d = config.to_dict()
    d["architectures"] = [ARCHITECTURE]
    d["model_type"] = "qwen3"
    d["tie_word_embeddings"] = False
    d["block_size"] = int(config.dflash_config["block_size"])
    d["layer_types"] = ["full_attention"] * config.num_hidden_layers
    theta = (config.rope_parameters or {}).get("rope_theta")
    if theta is not None:
        d["rope_theta"] = theta  # loaders that predate rope_parameters read it at the top level
    if dtype is not None:
        d["dtype"] = _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))
    for key in ("_name_or_path", "id2label", "label2id", "problem_type", "output_hidden_states"):
        d.pop(key, None)
    return d


def read_dflash_checkpoint(path: str | Path) -> tuple[Qwen3Config, dict[str, torch.Tensor]]:
    """(config with a complete `dflash_config`, state dict with our tensor names)."""
    path = Path(path)
    cfg_file, weights = path / "config.json", path / "model.safetensors"
    if not cfg_file.exists() or not weights.exists():
        raise UserError(f"no DFlash checkpoint at {path}: expected config.json and model.safetensors")
    raw = json.loads(cfg_file.read_text())
    arch = raw.get("architectures") or []
    if ARCHITECTURE not in arch:
        raise UserError(f"{path} is not a DFlash drafter (architectures {arch}, expected ['{ARCHITECTURE}'])")
    dflash = dict(raw.get("dflash_config") or {})
    for key in ("selector_rank", "conv_kernel_size", "use_swa", "attention_sink_bias"):
        if dflash.get(key):
            raise UserError(f"{path}: DFlash drafters with '{key}' are not supported yet")
    if raw.get("is_causal") or dflash.get("causal") or "sliding_attention" in (raw.get("layer_types") or []):
        raise UserError(f"{path}: causal or sliding-window DFlash draft layers are not supported yet")
    if raw.get("attention_bias"):
        raise UserError(f"{path}: DFlash drafters with attention biases are not supported yet")
    draft_vocab = raw.get("draft_vocab_size")
    if draft_vocab is not None and draft_vocab != raw.get("vocab_size"):
        raise UserError(f"{path}: DFlash drafters with a reduced draft vocabulary are not supported yet")

    mask = dflash.get("mask_token_id", raw.get("mask_token_id"))
    if mask is None:
        raise UserError(
            f"{path}: config.json has no dflash_config.mask_token_id; add the id of the mask token"
        )
    layers = raw.get("num_hidden_layers", 1)
    ids = dflash.get("target_layer_ids") or raw.get("target_layer_ids")
    if not ids:
        if not raw.get("num_target_layers"):
            raise UserError(
                f"{path}: config.json names neither dflash_config.target_layer_ids nor num_target_layers"
            )
        ids = default_target_layer_ids(int(raw["num_target_layers"]), int(layers))
    block = dflash.get("block_size", raw.get("block_size", DEFAULT_BLOCK_SIZE))
    fields = {
        k: v
        for k, v in raw.items()
        if k not in ("dflash_config", "block_size", "architectures", "model_type")
    }
    fields["layer_types"] = ["full_attention"] * layers
    fields.setdefault(
        "rope_parameters", {"rope_type": "default", "rope_theta": raw.get("rope_theta", 10000.0)}
    )
    config = Qwen3Config(**fields)
    config.architectures = [ARCHITECTURE]
    config.dflash_config = dflash | {
        "block_size": int(block),
        "mask_token_id": int(mask),
        "target_layer_ids": [int(i) for i in ids],
    }
    config.block_size = int(block)
    if int(mask) >= config.vocab_size:
        raise UserError(f"{path}: mask_token_id {mask} is outside the vocabulary of {config.vocab_size}")

    state = load_file(str(weights))
    state = {k.removeprefix("model."): v for k, v in state.items()}
    for key in ("embed_tokens.weight", "lm_head.weight"):
        state.pop(key, None)  # some exports carry the target's; we use the target's own
    return config, state


def export_dflash(src: str | Path, dst: str | Path, fmt: str = "vllm") -> Path:
    """Write the DFlash drafter at SRC (any layout `read_dflash_checkpoint` takes) to DST in the
    published layout, atomically: canonical tensor names, the complete `dflash_config`, tensors in
    their stored dtype (bit-exact). `fmt` is only recorded (`exported_as`): both engines read this
    one layout. An `auto_map` (z-lab's remote code for transformers) is kept with its module files
    when SRC has them, else dropped."""
    src, dst = Path(src), Path(dst)
    require_empty_dir(dst)
    config, state = read_dflash_checkpoint(src)
    cfg = config_dict(config, state["fc.weight"].dtype)
    code = {str(v).split(".")[0] + ".py" for v in (cfg.get("auto_map") or {}).values()}
    if not code or not all((src / f).is_file() for f in code):
        cfg.pop("auto_map", None)
        code = set()
    meta_file = src / "draftsmith.json"
    with atomic_dir(dst) as tmp:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        atomic_write_json(tmp / "config.json", cfg)
        for f in sorted(code):
            shutil.copyfile(src / f, tmp / f)
        if (src / vocab_order.JSON).is_file():  # draftsmith's `vocab=N`; other engines ignore it
            shutil.copyfile(src / vocab_order.JSON, tmp / vocab_order.JSON)
        if meta_file.is_file():
            atomic_write_json(
                tmp / "draftsmith.json", json.loads(meta_file.read_text()) | {"exported_as": fmt}
            )
    return dst
