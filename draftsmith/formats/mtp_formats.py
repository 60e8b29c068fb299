"""MTP heads on disk: Qwen3.5/3.6's layout, every tensor under `mtp.` in the checkpoint's
safetensors (beside the target's own weights, or alone in a folder draftsmith saved), with MoE
experts stored one matrix per expert, while transformers' modules fuse them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

PREFIX = "mtp."
_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def read_mtp_tensors(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every `mtp.*` tensor in a folder's safetensors, keyed without the prefix; {} when none."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({folder / f for k, f in weight_map.items() if k.startswith(PREFIX)})
    else:
        files = sorted(folder.glob("*.safetensors"))
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for key in sf.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                if key.startswith(PREFIX):
                    out[key[len(PREFIX) :]] = sf.get_tensor(key)
    return out


def to_module_layout(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint names -> module names: per-expert matrices stacked into transformers' fused
    `experts.gate_up_proj` [E, 2I, H] (gate rows first) and `experts.down_proj` [E, H, I]."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for key, t in tensors.items():
        m = _EXPERT.match(key)
        if m is None:
            out[key] = t
        else:
            experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = t
    for base, by_index in experts.items():
        order = [by_index[e] for e in sorted(by_index)]
        out[f"{base}.gate_up_proj"] = torch.stack([torch.cat([e["gate_proj"], e["up_proj"]]) for e in order])
        out[f"{base}.down_proj"] = torch.stack([e["down_proj"] for e in order])
    return out


def to_checkpoint_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of `to_module_layout`, with the `mtp.` prefix: the names Qwen's checkpoints use."""
    out: dict[str, torch.Tensor] = {}
    for key, t in state.items():
        if key.endswith(".experts.gate_up_proj"):
            base = key[: -len(".gate_up_proj")]
            gate, up = t.chunk(2, dim=1)
            for e in range(t.shape[0]):
                out[f"{PREFIX}{base}.{e}.gate_proj.weight"] = gate[e]
                out[f"{PREFIX}{base}.{e}.up_proj.weight"] = up[e]
        elif key.endswith(".experts.down_proj"):
            base = key[: -len(".down_proj")]
            for e in range(t.shape[0]):
                out[f"{PREFIX}{base}.{e}.down_proj.weight"] = t[e]
        else:
            out[PREFIX + key] = t
    return {k: v.detach().contiguous() for k, v in out.items()}
