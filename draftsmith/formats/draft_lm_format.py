"""A draft-LM folder: a small causal LM that drafts for a target sharing its tokenizer.

Two layouts load the same way:
- a full folder: any transformers causal LM (config.json + weights), as the hub ships them;
- a folder draftsmith trained from a target (`draftsmith train draft-lm`), which keeps only what
  training changed: the decoder layers and the final norm, under transformers' own names
  (`model.layers.*`, `model.norm.weight`), with `draftsmith.json` saying
  `"shares_target_embedding": true`. Its token embedding (and LM head, tied in SmolLM2) are the
  target's, frozen during training: 28M of SmolLM2's 135M parameters that the draft would otherwise
  duplicate, and what keeps a shipped draft under 40 MB. `save_full` writes the standalone folder
  that vLLM's `draft_model`, SGLang's STANDALONE and transformers' `assistant_model` load.

This module knows the files. It does not know how drafts are proposed (`drafters/draft_lm.py`) or
trained (`train/draft_lm_objective.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from draftsmith.errors import UserError
from draftsmith.fileio import atomic_write_json, save_checkpoint_dir
from draftsmith.formats import vocab_order

KIND = "draft-lm"
SHARED = ("model.embed_tokens.weight", "lm_head.weight")  # the target's, in a shared-embedding folder
# Every token id, the most frequent in the training data's assistant tokens first: `draft:PATH:vocab=N`
# keeps the head's first N rows in this order (a smaller head, read at every draft step).
VOCAB_ORDER = vocab_order.SAFETENSORS


def shares_target_embedding(folder: str | Path) -> bool:
    """True for a folder whose embedding and head are the target's (draftsmith.json says so)."""
    meta = Path(folder).expanduser() / "draftsmith.json"
    if not meta.is_file():
        return False
    try:
        return bool(json.loads(meta.read_text()).get("shares_target_embedding"))
    except (OSError, json.JSONDecodeError):
        return False


def save_shared(model: PreTrainedModel, path: str | Path, extra: dict, dtype: torch.dtype) -> Path:
    """Write the layers and final norm in `dtype` (not the shared embedding/head) and the config."""
    state = {k: v.to(dtype) for k, v in model.state_dict().items() if k not in SHARED}
    config = model.config.to_dict()
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    return save_checkpoint_dir(path, state, config, {"kind": KIND, "shares_target_embedding": True, **extra})


def save_vocab_order(path: str | Path, order: torch.Tensor) -> None:
    """Write the ranking of token ids (a permutation of the vocabulary) beside the weights."""
    vocab_order.save(path, order)


def load_vocab_order(path: str | Path) -> torch.Tensor | None:
    """The folder's token ranking (int64 [V]), or None where it has none."""
    return vocab_order.load(path)


def save_full(model: PreTrainedModel, path: str | Path, dtype: torch.dtype, tokenizer=None) -> Path:
    """A standalone transformers folder (weights, config, tokenizer) any engine loads as a draft model."""
    path = Path(path)
    model.to(dtype).save_pretrained(path, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    atomic_write_json(path / "draftsmith.json", {"kind": KIND, "shares_target_embedding": False})
    return path


def build_shared(config, target_model: PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
    """A fresh draft LM of `config` whose embedding (and head) hold the target's weights."""
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(target_model.device)
    model.get_input_embeddings().weight.data.copy_(target_model.get_input_embeddings().weight)
    if not config.tie_word_embeddings:
        model.get_output_embeddings().weight.data.copy_(target_model.get_output_embeddings().weight)
    model.tie_weights()
    return model


def load_shared(path: str | Path, target_model: PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
    """Load a shared-embedding folder onto `target_model`'s embedding and head."""
    from safetensors.torch import load_file

    path = Path(path).expanduser()
    config = AutoConfig.from_pretrained(path)
    target_vocab = target_model.get_input_embeddings().weight.shape
    if (config.vocab_size, config.hidden_size) != tuple(target_vocab):
        raise UserError(
            f"draft LM at {path} shares a {config.vocab_size} x {config.hidden_size} embedding but the "
            f"target's is {target_vocab[0]} x {target_vocab[1]}: use the target it was trained for"
        )
    state = load_file(str(path / "model.safetensors"))
    model = build_shared(config, target_model, dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if m not in SHARED and "rotary" not in m]
    if missing or unexpected:
        raise UserError(
            f"draft LM at {path} does not match its config: missing {missing[:3]}, extra {unexpected[:3]}"
        )
    return model.eval()
