"""Turn one GGUF file into a bf16 safetensors Hugging Face checkpoint folder.

transformers reads GGUF (with `gguf` and `accelerate` installed) and dequantizes every tensor on
load, which takes 15-30 s on these CPUs; the folder this writes loads in about a second. The
GGUF-loaded model refuses `save_pretrained` ("quantized with gguf and is not serializable") although
its parameters are plain tensors, so the same architecture is rebuilt from its config without
`quantization_config` and the state dict is copied into it.

The written folder is checked before it is handed back: its weights reload bit for bit, and its
tokenizer encodes like the GGUF's and keeps the GGUF's chat template.

This module knows nothing about caches, locks, target names or where the GGUF came from; the caller
(`draftsmith.target.resolve`) writes into a temporary folder and renames it into place.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from draftsmith.errors import UserError

SOURCE_FILE = "draftsmith_source.json"  # provenance: which GGUF produced this folder

# Covers byte-level BPE, sentencepiece spaces, digits, code indentation and non-Latin scripts, so a
# tokenizer that lost merges, normalisation or added tokens encodes it differently.
_PROBE_TEXT = "Hello world!  def f(x):\n    return x ** 2  # naïve café, 日本語, emoji 🙂 12345"


def convert_gguf(gguf_path: Path, out_dir: Path, *, require_chat_template: bool = False) -> None:
    """Write `out_dir` (created; must not exist) as a bf16 checkpoint converted from `gguf_path`.

    `require_chat_template`: fail when the GGUF yields no chat template (for instruct models whose
    template we rely on), instead of producing a checkpoint that silently lacks one.
    """
    # Imported here so resolving an already converted target does not pay for importing transformers.
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        # float32, not bf16: the dequantized values are the same after the cast below, the load is
        # faster, and transformers warns about bf16 GGUF loads.
        gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (ValueError, KeyError, NotImplementedError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"cannot read {gguf_path} with transformers' GGUF loader ({reason}): "
            "use a GGUF of an architecture transformers supports, or a local HF checkpoint folder"
        ) from e
    if require_chat_template and not tokenizer.chat_template:
        raise RuntimeError(
            f"the tokenizer read from {gguf_path} has no chat template although this model needs one: "
            f"transformers {transformers.__version__} may have stopped reading tokenizer.chat_template"
        )

    config = copy.deepcopy(gguf_model.config)
    del config.quantization_config  # its presence is what makes save_pretrained refuse
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(gguf_model.state_dict(), strict=True)  # copies and casts to bf16
    model.generation_config = copy.deepcopy(gguf_model.generation_config)
    del gguf_model
    # GGUF carries no tokenizer length limit, so transformers sets "unlimited" (1e30); the context
    # length is the real limit, and checks for over-long prompts read it from the tokenizer.
    max_positions = getattr(config, "max_position_embeddings", None)
    if max_positions and tokenizer.model_max_length > 1e12:
        tokenizer.model_max_length = max_positions

    out_dir.mkdir(parents=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / SOURCE_FILE).write_text(
        json.dumps(
            {
                "gguf_path": str(gguf_path.resolve()),
                "gguf_size": gguf_path.stat().st_size,
                "dtype": "bfloat16",
                "transformers": transformers.__version__,
            },
            indent=2,
        )
        + "\n"
    )
    _check_roundtrip(out_dir, model, tokenizer)


def _check_roundtrip(out_dir: Path, model, tokenizer) -> None:
    """Reload `out_dir` and compare with what was saved; raise RuntimeError on any difference.

    A weight that save_pretrained skipped (a tied head saved under another name, say) would come back
    randomly initialised and still load without error, so comparing tensors is the only real check.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reloaded = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.bfloat16)
    saved, back = model.state_dict(), reloaded.state_dict()
    differing = [k for k, v in saved.items() if k not in back or not torch.equal(v, back[k])]
    if differing or set(back) != set(saved):
        raise RuntimeError(f"converted checkpoint {out_dir} does not reload its own weights: {differing[:5]}")

    tokenizer_back = AutoTokenizer.from_pretrained(out_dir)
    if tokenizer_back.encode(_PROBE_TEXT) != tokenizer.encode(_PROBE_TEXT):
        raise RuntimeError(f"tokenizer saved in {out_dir} encodes differently from the GGUF's tokenizer")
    if tokenizer_back.chat_template != tokenizer.chat_template:
        raise RuntimeError(f"tokenizer saved in {out_dir} lost or changed the GGUF's chat template")
