"""Run inside .peers/speculators (vLLM's `speculators` 0.9.0, no draftsmith): validate a config and
load a checkpoint with the library's own classes.

    python speculators_check.py eagle3 EXPORT_DIR OUT_DIR
        `SpeculatorModelConfig.from_pretrained` then `SpeculatorModel.from_pretrained` (the class is
        resolved from the config) on a `draftsmith export --format vllm` folder.
    python speculators_check.py dflash DFLASH_DIR VERIFIER_DIR OUT_DIR
        `DFlashConverter().convert(DFLASH_DIR, OUT_DIR/converted, base_model=VERIFIER_DIR)` (with
        its own validation), then the converted folder loaded as above.

Writes OUT_DIR/result.json (what the library read from the config) and OUT_DIR/loaded.safetensors
(every tensor of the loaded model, the ones `load_verifier_weights` fills from the verifier named in
the config included, so the caller can compare them with its own).
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from speculators import SpeculatorModel, SpeculatorModelConfig


def load(folder: str, out: Path, extra: dict) -> None:
    config = SpeculatorModelConfig.from_pretrained(folder)
    model = SpeculatorModel.from_pretrained(folder)
    spec = config.speculators_config
    # from_pretrained leaves the verifier-owned tensors (embedding, verifier head and norm) unset, and
    # load_verifier_weights fills the embedding only where it is NaN; under transformers 5.19 the
    # absent embedding comes out as zeros, so ask for it explicitly (the flag its own callers use).
    embed_unset = bool((model.embed_tokens.weight == 0).all() or model.embed_tokens.weight.isnan().any())
    model._load_verifier_weights(overwrite_embed_tokens=True)
    result = {
        "config_class": type(config).__name__,
        "model_class": type(model).__name__,
        "speculators_model_type": config.speculators_model_type,
        "algorithm": spec.algorithm,
        "speculative_tokens": [m.speculative_tokens for m in spec.proposal_methods],
        "verifier": spec.verifier.name_or_path,
        "draft_vocab_size": getattr(config, "draft_vocab_size", None),
        "embed_unset_after_from_pretrained": embed_unset,
        **extra,
    }
    for name in ("eagle_aux_hidden_state_layer_ids", "aux_hidden_state_layer_ids", "block_size"):
        if getattr(config, name, None) is not None:
            result[name] = getattr(config, name)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    result["nan_tensors"] = sorted(
        k for k, v in state.items() if v.is_floating_point() and torch.isnan(v).any()
    )
    save_file(state, str(out / "loaded.safetensors"))
    (out / "result.json").write_text(json.dumps(result))


def main() -> None:
    kind = sys.argv[1]
    if kind == "eagle3":
        load(sys.argv[2], Path(sys.argv[3]), {})
    elif kind == "dflash":
        from speculators.convert.dflash.converter import DFlashConverter

        out = Path(sys.argv[4])
        converted = out / "converted"
        DFlashConverter().convert(sys.argv[2], converted, base_model=sys.argv[3], validate=True)
        load(str(converted), out, {"converted": True})
    else:
        raise SystemExit(f"unknown kind {kind}: use eagle3 or dflash")


if __name__ == "__main__":
    main()
