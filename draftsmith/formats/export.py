"""`draftsmith export`: a trained speculator folder -> the folder vLLM or SGLang loads, by its kind.

- EAGLE-3: SGLang's `LlamaForCausalLMEagle3` or vLLM speculators' `Eagle3Speculator` layout
  (`eagle3_formats.py`); the two differ, so `--format` picks one.
- DFlash: z-lab's published layout (`dflash_formats.py`), which both engines load; `--format` only
  gets recorded.
- draft LM (`train draft-lm`): a standalone transformers folder (the target's embedding and head
  filled in, the target's tokenizer) that vLLM's `draft_model`, SGLang's STANDALONE and
  transformers' `assistant_model` load; the same folder for both `--format`s.
- MTP heads are refused: both engines run MTP only from inside a target checkpoint of a family that
  ships one, so there is no standalone layout to write.

Every exporter writes into a temporary folder renamed into place (`fileio.atomic_dir`), with plain
file and folder modes. This module knows the kinds and the serving flags; the layouts live in the
per-kind modules.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftsmith.errors import UserError
from draftsmith.fileio import atomic_dir, atomic_write_json, require_empty_dir
from draftsmith.formats.kind import read_config, read_json_object, speculator_kind

SUPPORTED = "EAGLE-3, DFlash and draft-LM folders (train eagle3, dflash, draft-lm)"
_DEFAULT_K = 3


def export(
    src: str | Path,
    dst: str | Path,
    fmt: str,
    *,
    verifier: str | None = None,
    k: int | None = None,
    target: str | None = None,
) -> tuple[str, list[str]]:
    """Write SRC to DST for `fmt` ('sglang' or 'vllm'); (what was written, serving command lines)."""
    from draftsmith.formats.dflash_formats import export_dflash
    from draftsmith.formats.eagle3_formats import EMBEDDED_HUB_IDS, export_eagle3

    if fmt not in ("sglang", "vllm"):
        raise UserError(f"unknown --format '{fmt}': use sglang or vllm")
    if k is not None and k < 1:
        raise UserError(f"--k {k} must be a positive number of drafted tokens")
    src, dst = Path(src).expanduser(), Path(dst).expanduser()
    kind = speculator_kind(src)
    if kind in ("draftsmith", None) and _has_mtp_tensors(src):
        raise UserError(
            f"{src} holds an MTP head (mtp.* tensors): vLLM (method 'mtp') and SGLang run MTP only from "
            "inside a target checkpoint whose family ships one, so there is no standalone layout to "
            f"export it to; serve it with draftsmith serve --drafter mtp:{src}"
        )
    if kind not in ("eagle3", "dflash", "draft-lm"):
        raise UserError(f"{src} is none of the speculators export writes: {SUPPORTED}")
    require_empty_dir(dst)
    meta = _meta(src)
    hub_id = EMBEDDED_HUB_IDS.get(str(meta.get("target")), meta.get("target_spec"))
    served = verifier or target or hub_id or "TARGET"  # for the printed serving flags

    if kind == "eagle3":
        k = k or _DEFAULT_K
        export_eagle3(src, dst, fmt, verifier=verifier, k=k)
        return "EAGLE-3", [_serve_line(fmt, served, dst, "eagle3", "EAGLE3", k)]
    if kind == "dflash":
        export_dflash(src, dst, fmt)
        k = k or int(read_config(dst)["block_size"]) - 1  # the whole block by default
        return "DFlash", [_serve_line(f, served, dst, "dflash", "DFLASH", k) for f in ("vllm", "sglang")]
    export_draft_lm(src, dst, fmt, target=target)
    k = k or _DEFAULT_K
    return "draft-LM", [
        _serve_line("vllm", served, dst, "draft_model", "STANDALONE", k),
        _serve_line("sglang", served, dst, "draft_model", "STANDALONE", k),
        f"transformers: model.generate(..., assistant_model=AutoModelForCausalLM.from_pretrained('{dst}'))",
    ]


def export_draft_lm(src: str | Path, dst: str | Path, fmt: str = "vllm", target: str | None = None) -> Path:
    """A draft-LM folder (shared-embedding or full) -> a standalone transformers folder with the
    target's embedding and head and the target's tokenizer, weights in the folder's stored dtype.
    The target is `target` or draftsmith.json's `target_spec`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftsmith.formats.draft_lm_format import load_shared, save_full, shares_target_embedding
    from draftsmith.target.model import load_target
    from draftsmith.target.resolve import resolve_target

    src, dst = Path(src).expanduser(), Path(dst)
    require_empty_dir(dst)
    meta = _meta(src)
    spec = target or meta.get("target_spec")
    if not spec:
        raise UserError(
            f"{src}/draftsmith.json names no target_spec: pass --target, the target it was trained for"
        )
    cfg = read_config(src)
    name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise UserError(f"{src}/config.json: unknown dtype '{name}'")
    if shares_target_embedding(src):
        # bf16 and fp32 targets load exactly in the draft's dtype; others in fp32 (a widening copy)
        tgt = load_target(spec, name if name in ("bfloat16", "float32") else "float32")
        model, tokenizer = load_shared(src, tgt.model, dtype), tgt.tokenizer
    else:
        model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(resolve_target(spec).model_path)
    with atomic_dir(dst) as tmp:
        save_full(model, tmp, dtype, tokenizer)
        atomic_write_json(
            tmp / "draftsmith.json", meta | {"shares_target_embedding": False, "exported_as": fmt}
        )
    return dst


def _serve_line(engine: str, target: str, dst: Path, method: str, algorithm: str, k: int) -> str:
    if engine == "vllm":
        spec = json.dumps({"model": str(dst), "method": method, "num_speculative_tokens": k})
        return f"vllm: vllm serve {target} --speculative-config '{spec}'"
    line = (
        f"sglang: python -m sglang.launch_server --model-path {target} --speculative-algorithm {algorithm} "
        f"--speculative-draft-model-path {dst}"
    )
    if algorithm != "DFLASH":  # a chain of k drafted tokens
        line += (
            f" --speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}"
        )
    return line


def _meta(src: Path) -> dict:
    meta = src / "draftsmith.json"
    return read_json_object(meta) if meta.is_file() else {}


def _has_mtp_tensors(folder: Path) -> bool:
    """Whether any safetensors file in `folder` names an `mtp.*` tensor (names only, no weights read)."""
    from safetensors import safe_open

    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            if any(key.startswith("mtp.") for key in sf.keys()):  # noqa: SIM118 (a safetensors handle)
                return True
    return False
