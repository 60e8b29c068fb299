"""What drafting costs on the device, from the drafter's type and size.

- n-gram / suffix: look-ups on the host, no device time, but host time per request that the GPU
  waits for (the next draft needs the tokens this step accepted): `Hardware.host_draft_per_row_s`.
- autoregressive (EAGLE-3, MTP): k forwards of a small network, one token per row each.
- block (DFlash): one forward of a small network over the whole block of k+1 positions per row.
- a speculator folder: its `config.json` says which kind, and its safetensors headers give its real
  size (only the headers are read, never the tensors).

Default shapes follow the published drafters: EAGLE-3 is one decoder layer of the target's width
whose q/k/v take [embedding ; feature] (2H), a 3H -> H fusion and an LM head over a 32k draft
vocabulary (the whole vocabulary when it is smaller than 64k); MTP is one full decoder layer of the
target (MoE when the target is) with a 2H -> H fusion and the target's LM head; DFlash is five
Qwen3-style layers of the target's width over the target's LM head, conditioned through a
5H -> H fusion. What it does not model: tree drafts (a tree of m nodes verifies m tokens; pass
`--k m-1` as an approximation), a host look-up whose time grows with the context or the match
length (one constant per request stands for it).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, replace
from pathlib import Path

from draftsmith.errors import UserError
from draftsmith.simulate.catalog import ModelShape, shape_from_config
from draftsmith.simulate.hardware import Hardware
from draftsmith.simulate.roofline import forward_cost

HOST, AUTOREGRESSIVE, BLOCK, NONE = "host", "autoregressive", "block", "none"

DRAFTERS = ("none", "ngram", "suffix", "eagle3", "dflash", "mtp")
# Defaults when the user gives no k and no acceptance: k from the published configurations,
# alpha from reference.md (MTP 75-92% per token; DFlash tau 6.5 at block 16; prompt lookup ~0.5).
DEFAULT_K = {"ngram": 8, "suffix": 8, "eagle3": 7, "mtp": 3, "dflash": 15}
MAX_K = {"ngram": 16, "suffix": 16, "eagle3": 10, "mtp": 8, "dflash": 15}
DEFAULT_ALPHA = {"ngram": 0.5, "suffix": 0.55, "eagle3": 0.8, "mtp": 0.8, "dflash": 0.88}


@dataclass(frozen=True)
class DrafterCost:
    name: str
    kind: str
    net: ModelShape | None = None
    extra_params: int = 0
    real_params: int | None = None  # counted from a speculator folder's safetensors

    def time(
        self,
        hw: Hardware,
        *,
        batch: int,
        k: int,
        context: int,
        dtype: str,
        tp: int,
        ep: bool = False,
        expert_dtype: str | None = None,
    ) -> float:
        """Seconds the target waits for k draft tokens for each of `batch` rows.

        Each draft forward pays the draft network's own roofline, its layers' fixed latencies and
        all-reduces at this batch, and the hardware's per-draft-forward cost (the engine replays the
        k draft steps back to back, without the scheduling and sampling of a target step). A host
        drafter pays its look-up once per row, serially (the engine loops over requests)."""
        if self.kind == NONE or k <= 0:
            return 0.0
        if self.kind == HOST:
            return hw.host_draft_per_row_s * batch
        if self.net is None:
            return 0.0
        common = dict(
            batch=batch,
            context=context,
            dtype=dtype,
            tp=tp,
            extra_params=self.extra_params,
            ep=ep,
            expert_dtype=expert_dtype,
            overhead_s=hw.draft_overhead_s,
        )
        if self.kind == AUTOREGRESSIVE:
            return k * forward_cost(self.net, hw, q=1, **common).total
        return forward_cost(self.net, hw, q=k + 1, **common).total


def _dense_layers(target: ModelShape, layers: int, vocab: int, name: str) -> ModelShape:
    """Plain full-attention decoder layers of the target's width (no experts, no linear attention)."""
    return replace(
        target,
        name=name,
        num_layers=layers,
        vocab=vocab,
        intermediate=target.intermediate or 3 * target.hidden,
        attn_output_gate=False,
        num_linear_layers=0,
        num_experts=0,
        experts_per_token=0,
        moe_intermediate=0,
        shared_intermediate=0,
        num_dense_layers=0,
        mtp_layers=0,
    )


def _attn_io(net: ModelShape) -> int:
    """Extra q/k/v input weights when attention reads 2H instead of H (EAGLE-3)."""
    return net.hidden * (net.num_heads + 2 * net.num_kv_heads) * net.head_dim


def drafter_cost(spec: str, target: ModelShape) -> DrafterCost:
    """`none`, `ngram`, `suffix`, `eagle3`, `dflash`, `mtp`, or a speculator folder."""
    name = spec.strip()
    key = name.lower()
    h = target.hidden
    if key in ("none", "ar"):
        return DrafterCost("none", NONE)
    if key in ("ngram", "suffix"):
        return DrafterCost(key, HOST)
    if key == "eagle3":
        vocab = 32000 if target.vocab > 64000 else target.vocab
        net = _dense_layers(target, 1, vocab, "eagle3")
        return DrafterCost("eagle3", AUTOREGRESSIVE, net, extra_params=3 * h * h + _attn_io(net))
    if key == "dflash":
        net = _dense_layers(target, 5, target.vocab, "dflash")
        return DrafterCost("dflash", BLOCK, net, extra_params=5 * h * h)
    if key == "mtp":
        net = replace(
            target,
            name="mtp",
            num_layers=1,
            num_linear_layers=0,
            num_dense_layers=0 if target.is_moe else target.num_dense_layers,
            mtp_layers=0,
        )
        return DrafterCost("mtp", AUTOREGRESSIVE, net, extra_params=2 * h * h)
    path = Path(name).expanduser()
    if path.is_dir():
        return _from_folder(path, target)
    raise UserError(f"unknown --drafter '{spec}': use {', '.join(DRAFTERS)} or a speculator folder")


# --- speculator folders ---------------------------------------------------------------------------

_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "BF16": 2,
    "F16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


def safetensors_params(folder: Path) -> dict[str, int]:
    """name -> element count of every tensor in the folder's .safetensors files (headers only)."""
    out: dict[str, int] = {}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UserError(f"speculator folder {folder} holds no .safetensors file")
    for f in files:
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
        except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"cannot read safetensors header of {f}: {e}") from None
        for tname, info in header.items():
            if tname == "__metadata__":
                continue
            count = 1
            for d in info.get("shape", []):
                count *= int(d)
            out[tname] = count
    return out


def _from_folder(folder: Path, target: ModelShape) -> DrafterCost:
    from draftsmith.formats.kind import read_config, speculator_kind

    cfg = read_config(folder)
    cfg_path = folder / "config.json"
    found = speculator_kind(folder, cfg)
    if found is None:
        raise UserError(f"{cfg_path} names no speculator architecture (EAGLE-3 or DFlash) in `architectures`")
    kind = BLOCK if found == "dflash" else AUTOREGRESSIVE
    layer_cfg = cfg.get("transformer_layer_config") or cfg
    merged = {"vocab_size": target.vocab, **layer_cfg}
    net = shape_from_config(merged, folder.name, str(cfg_path))
    tensors = safetensors_params(folder)
    params = sum(n for t, n in tensors.items() if "embed_tokens" not in t and t not in ("d2t", "t2d"))
    head = [t for t in tensors if t.endswith("lm_head.weight")]
    if head:
        net = replace(net, vocab=tensors[head[0]] // net.hidden)
    else:
        params += target.vocab * target.hidden  # drafts through the target's LM head
        net = replace(net, vocab=target.vocab)
    net = replace(net, num_linear_layers=0, num_experts=0, moe_intermediate=0, shared_intermediate=0)
    return DrafterCost(folder.name, kind, net, extra_params=params - net.always_on_params, real_params=params)
