"""EAGLE-3 checkpoints in the layouts serving engines load.

- SGLang (`LlamaForCausalLMEagle3`): a Llama-style config.json with `draft_vocab_size`, tensors
  `fc.weight`, `midlayer.*`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d`, no `embed_tokens`
  (SGLang reuses the target's). This is also draftsmith's own layout, so export only normalises it.
- vLLM speculators (`Eagle3Speculator`): config with `speculators_model_type: "eagle3"`, the layer's
  Llama config under `transformer_layer_config`, `eagle_aux_hidden_state_layer_ids`, and a
  `speculators_config` naming the proposal method and the verifier (target); tensors `layers.0.*`.
  Served with `vllm serve DST` or `--speculative-config '{"model": DST, "method": "eagle3", ...}'`.
  vLLM numbers feature layers by the decoder layer whose *input* they are (its default is
  (2, L//2, L-3); id j is HF `hidden_states[j]`), ours and SGLang's by the layer whose output they
  are (id i is `hidden_states[i + 1]`): this layout holds our ids + 1. vLLM 0.32 drafting with our
  SmolLM2 EAGLE-3 accepted exactly as our engine (tau 1.741 over the same 108 steps, float32) with
  the + 1, and differently without it (tests/ecosystem/test_vllm.py).

`read_eagle3_checkpoint` reads either layout (and SGLang files that use `layers.0.*`) into one
canonical form: a LlamaConfig with our extra fields plus a state dict with `midlayer.*` names.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from draftsmith.errors import UserError
from draftsmith.fileio import atomic_dir, require_empty_dir

# Hub ids of the embedded targets, for the verifier field of exported configs.
EMBEDDED_HUB_IDS = {
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "SmolLM2-135M-Instruct": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "gemma3-270m": "google/gemma-3-270m",
}
_OUR_EXTRAS = ("draft_vocab_size", "target_hidden_size", "eagle_config", "target_model_type")


def read_eagle3_checkpoint(path: str | Path) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    path = Path(path)
    cfg_file, weights = path / "config.json", path / "model.safetensors"
    if not cfg_file.exists() or not weights.exists():
        raise UserError(f"no EAGLE-3 checkpoint at {path}: expected config.json and model.safetensors")
    raw = json.loads(cfg_file.read_text())
    if raw.get("speculators_model_type") == "eagle3":
        layer = dict(raw["transformer_layer_config"])
        config = LlamaConfig(**layer)
        config.draft_vocab_size = raw.get("draft_vocab_size", config.vocab_size)
        config.target_hidden_size = raw.get("target_hidden_size") or config.hidden_size
        config.eagle_config = {
            "eagle_aux_hidden_state_layer_ids": _ids_from_vllm(
                raw.get("eagle_aux_hidden_state_layer_ids"), path
            )
        }
        if raw.get("norm_before_residual"):
            raise UserError(f"{path}: norm_before_residual EAGLE-3 drafters are not supported yet")
    elif ARCH_SGLANG in (raw.get("architectures") or []) or "draft_vocab_size" in raw:
        config = LlamaConfig(**raw)
        if getattr(config, "draft_vocab_size", None) is None:
            config.draft_vocab_size = config.vocab_size
        if not hasattr(config, "target_hidden_size"):
            config.target_hidden_size = config.hidden_size
        if not getattr(config, "eagle_config", None):
            config.eagle_config = {"eagle_aux_hidden_state_layer_ids": []}
    else:
        raise UserError(
            f"{path} is not an EAGLE-3 checkpoint (no LlamaForCausalLMEagle3 or speculators eagle3 config)"
        )
    state = load_file(str(weights))
    state = {k.removeprefix("model.").replace("layers.0.", "midlayer."): v for k, v in state.items()}
    state.pop("embed_tokens.weight", None)
    return config, state


ARCH_SGLANG = "LlamaForCausalLMEagle3"


def _sglang_config(config: LlamaConfig) -> dict:
    d = config.to_dict()
    d["architectures"] = [ARCH_SGLANG]
    d["num_hidden_layers"] = 1
    d["tie_word_embeddings"] = False
    return d


def _vllm_config(config: LlamaConfig, verifier: str | None, speculative_tokens: int) -> dict:
    layer = {k: v for k, v in config.to_dict().items() if k not in _OUR_EXTRAS}
    layer["architectures"] = ["LlamaForCausalLM"]
    layer["num_hidden_layers"] = 1
    layer["tie_word_embeddings"] = False
    return {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": layer,
        "draft_vocab_size": config.draft_vocab_size,
        "norm_before_residual": False,
        "target_hidden_size": config.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": _ids_to_vllm(
            config.eagle_config["eagle_aux_hidden_state_layer_ids"]
        ),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": [_verifier_arch(config)]},
        },
    }


def _ids_to_vllm(ids: list[int]) -> list[int]:
    """Our feature layer ids (output of layer i) -> vLLM's (input of layer j = i + 1).

    >>> _ids_to_vllm([1, 14, 26])
    [2, 15, 27]
    """
    if any(i < 0 for i in ids):
        raise UserError(
            f"this EAGLE-3 reads the target's final normed hidden state (feature layer ids {list(ids)}), "
            "which vLLM cannot hand a drafter: export it with --format sglang or retrain with decoder layers"
        )
    return [int(i) + 1 for i in ids]


def _ids_from_vllm(ids: list[int] | None, path: Path) -> list[int]:
    """vLLM's feature layer ids -> ours (inverse of `_ids_to_vllm`); empty stays empty."""
    ids = list(ids or [])
    if any(j < 1 for j in ids):
        raise UserError(
            f"{path}: feature layer id 0 (the embedding output) in eagle_aux_hidden_state_layer_ids "
            "is not supported: draftsmith reads decoder layer outputs only"
        )
    return [int(j) - 1 for j in ids]


def _verifier_arch(config: LlamaConfig) -> str:
    kind = getattr(config, "target_model_type", None) or "llama"
    return {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}.get(
        kind, f"{kind}ForCausalLM"
    )


def export_eagle3(
    src: str | Path, dst: str | Path, fmt: str, verifier: str | None = None, k: int = 3
) -> Path:
    """Write SRC (any supported layout) to DST in `fmt` ('sglang' or 'vllm'), atomically."""
    if fmt not in ("sglang", "vllm"):
        raise UserError(f"unknown --format '{fmt}': use sglang or vllm")
    src, dst = Path(src), Path(dst)
    require_empty_dir(dst)
    config, state = read_eagle3_checkpoint(src)
    meta_file = src / "draftsmith.json"
    meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
    verifier = verifier or EMBEDDED_HUB_IDS.get(str(meta.get("target")), meta.get("target"))
    if fmt == "sglang":
        cfg, tensors = _sglang_config(config), state
    else:
        cfg = _vllm_config(config, verifier, k)
        tensors = {k.replace("midlayer.", "layers.0."): v for k, v in state.items()}
    with atomic_dir(dst) as tmp:
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        save_file(
            {k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"), {"format": "pt"}
        )
        if meta:
            (tmp / "draftsmith.json").write_text(json.dumps({**meta, "exported_as": fmt}, indent=2) + "\n")
    return dst
