"""Multi-token-prediction (MTP) head: the one extra layer Qwen3.5/3.6 checkpoints ship as `mtp.*`
(DeepSeek-V3 calls it NextN), and the same head built for targets that have none.

What one MTP step computes, for position t, pairing a hidden state h_t with the token x_{t+1}:

    x      = fc([norm_e(embed(x_{t+1})) ; norm_h(h_t)])     # 2H -> H, no bias; embedding first
    y      = layer(x)                                         # a full-attention decoder layer, RoPE at t,
                                                              # with its own KV cache
    h'     = norm(y)
    logits = lm_head(h')                                      # -> a draft of x_{t+2}

h_t is the target's *final-normed* hidden state (the tensor its LM head reads; feature id
`FINAL_HIDDEN`). The next step feeds h' in its place. That is what vLLM (`qwen3_5_mtp.py` over
`Qwen3NextModel.forward`, which returns `norm(hidden, residual)`) and SGLang hand the head; engines
that fed the pre-norm state instead measured lower acceptance and switched (LightLLM reports
tau 1.80 -> 2.74 on Qwen3.5-0.8B). `norm_h` is the head's own norm on top of that state, not a
stand-in for the target's final norm.

The embedding and LM head are the target's (shared, never saved). The layer, the norms and the
rotary embedding are built from the target's own classes, so the target's conventions carry over
unchanged: Qwen3.5's zero-centred RMSNorm (`x * (1 + w)`, weights stored as offsets from 1), its
gated attention with q/k norms and partial RoPE, and the experts of `qwen3_5_moe`; a head built for
a Llama target (SmolLM2) gets Llama's plain RMSNorm and MLP.

Checkpoint layout, the one Qwen ships inside the target's safetensors: `mtp.fc.weight` [H, 2H],
`mtp.pre_fc_norm_embedding.weight`, `mtp.pre_fc_norm_hidden.weight`, `mtp.layers.0.*` (experts one
per index: `mlp.experts.{e}.{gate,up,down}_proj.weight`), `mtp.norm.weight`. A head saved here is a
folder holding exactly those tensors plus the target's config, so it drops into a target folder.

This module knows the head and its KV layout; its tensors on disk are `formats/mtp_formats.py`'s. It does not know how drafts are proposed
(`mtp_drafter.py`) or how the head is trained.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import torch
from torch import nn

from draftsmith.drafters.draft_kv import DraftKV
from draftsmith.errors import UserError
from draftsmith.formats.mtp_formats import read_mtp_tensors, to_checkpoint_layout, to_module_layout
from draftsmith.target import attention


class MTPHead(nn.Module):
    def __init__(
        self, layer: nn.Module, norm_cls: type[nn.Module], hidden_size: int, eps: float, target
    ) -> None:
        super().__init__()
        h = hidden_size
        self.pre_fc_norm_embedding = norm_cls(h, eps=eps)
        self.pre_fc_norm_hidden = norm_cls(h, eps=eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList([layer])
        self.norm = norm_cls(h, eps=eps)
        # The target's modules: shared, frozen, kept out of state_dict() and out of .to().
        object.__setattr__(self, "embed_tokens", target.model.get_input_embeddings())
        object.__setattr__(self, "lm_head", target.head)
        object.__setattr__(self, "rotary", target.base.rotary_emb)
        self.softcap = target.softcap

    def forward(
        self,
        input_ids: torch.Tensor,  # [b, q] token x_{t+1}
        hidden: torch.Tensor,  # [b, q, H] final-normed hidden h_t (the target's, or the head's own h')
        positions: torch.Tensor,  # [b, q] position t
        cache: DraftKV | None = None,
        mask: torch.Tensor | None = None,  # [b, 1, q, kv] bool, True = may attend; None = causal / all
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step. Returns (logits [b, q, V] float32, h' [b, q, H])."""
        h = self.hidden_step(input_ids, hidden, positions, cache, mask)
        return self.logits(h), h

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """[b, q, V] float32 logits of the head's normed output h' (soft-capped like the target's)."""
        logits = self.lm_head(h).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def hidden_step(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache: DraftKV | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One step without the LM head: h' [b, q, H] (training scores it with a fused head + loss)."""
        emb = self.embed_tokens(input_ids).to(hidden.dtype)
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hidden)], dim=-1))
        rope = self.rotary(x, positions)
        y = self.layers[0](
            x, attention_mask=mask, position_ids=positions, cache=cache, position_embeddings=rope
        )
        if isinstance(y, tuple):
            y = y[0]
        return self.norm(y)


# ---- building -------------------------------------------------------------------------------------


def build_head(target, init: str = "random", std: float = 0.02, seed: int = 0) -> MTPHead:
    """An MTP head shaped for `target`, on its device and dtype.

    init: "random" (normal(0, std) matrices, identity norms), or "last_layer" (the layer starts as a
    copy of the target's last full-attention layer and `fc` passes the hidden half through)."""
    if not target.attention_layers:
        raise UserError(f"target {target.name} has no full-attention layer to shape an MTP head on")
    ref = target.attention_layers[-1]
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = 1
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = ["full_attention"]
    cfg._attn_implementation_internal = attention.NAME
    hsize = cfg.hidden_size
    gen = torch.Generator().manual_seed(seed)
    layer = type(target.base.layers[ref])(cfg, 0)
    head = MTPHead(layer, type(target.base.norm), hsize, cfg.rms_norm_eps, target)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            elif name.endswith(".bias"):
                p.zero_()
        if init == "last_layer":
            layer.load_state_dict(target.base.layers[ref].state_dict())
            head.fc.weight[:, hsize:] = torch.eye(hsize)
        elif init != "random":
            raise ValueError(f"unknown MTP init '{init}'")
    return head.to(device=target.device, dtype=target.dtype).eval()


# ---- checkpoints ----------------------------------------------------------------------------------


def checkpoint_dir(target) -> Path | None:
    """The local folder the target was loaded from (hub ids resolve through the local HF cache)."""
    name = getattr(target.model.config, "_name_or_path", "") or ""
    if name and Path(name).is_dir():
        return Path(name)
    if name and "/" in name and not name.startswith(("/", ".")):
        try:
            from huggingface_hub import snapshot_download

            return Path(
                snapshot_download(name, local_files_only=True, allow_patterns=["*.json", "*.safetensors"])
            )
        except Exception:
            return None
    return None


def load_head(target, path: str | Path | None = None) -> MTPHead:
    """The MTP head in `path` (any folder whose safetensors hold `mtp.*`), or the target's own."""
    folder = Path(path) if path is not None else checkpoint_dir(target)
    if path is not None and not folder.is_dir():
        raise UserError(f"no MTP head at {path}: give a folder whose safetensors hold mtp.* tensors")
    tensors = read_mtp_tensors(folder) if folder is not None else {}
    if not tensors:
        where = f"the safetensors in {folder}" if folder is not None else "a checkpoint folder"
        if path is not None:
            raise UserError(f"no mtp.* tensors in {where}: give a saved MTP head or a Qwen3.5/3.6 checkpoint")
        raise UserError(
            f"target {target.name} has no MTP head (no mtp.* tensors in {where}): use a Qwen3.5/3.6 "
            "checkpoint folder as --target, or a trained head with --drafter mtp:PATH"
        )
    layers = {int(m.group(1)) for k in tensors if (m := re.match(r"layers\.(\d+)\.", k))}
    if layers != {0}:
        raise UserError(f"MTP head at {folder} has layers {sorted(layers)}; only one MTP layer is supported")
    head = build_head(target)
    state = to_module_layout(tensors)
    own = head.state_dict()
    missing = sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or extra or wrong:
        raise UserError(
            f"MTP head at {folder} does not fit target {target.name} (missing {missing[:3]}, extra "
            f"{extra[:3]}, wrong shape {wrong[:3]}): use a head made for this target"
        )
    head.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})
    return head


def save_head(head: MTPHead, path: str | Path, target_config, extra: dict | None = None) -> None:
    """`model.safetensors` with the `mtp.*` tensors, the target's config (so engines that read native
    heads see `mtp_num_hidden_layers`), and `draftsmith.json` when `extra` is given."""
    from draftsmith.fileio import save_checkpoint_dir

    cfg = target_config.to_dict()
    cfg["mtp_num_hidden_layers"] = 1
    save_checkpoint_dir(path, to_checkpoint_layout(head.state_dict()), cfg, extra)
