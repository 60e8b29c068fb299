"""Roofline time of one forward: B rows, each running q new tokens over a context of S tokens.

Pure functions of (model shape, hardware, B, q, S, dtype, tensor-parallel degree). Each part takes
max(FLOPs / (peak * flops_eff), bytes / (bandwidth * bw_eff)), and the parts add up, plus a fixed
overhead per forward:

- weights: every always-on matrix (attention, dense MLP, shared experts, routers, LM head) is read
  once per forward and multiplied by B*q tokens: bytes = params * bytes_per_param,
  FLOPs = 2 * params * B * q. Verifying k+1 tokens costs the same bytes as one token until the
  FLOPs reach the compute roof, which is where speculation stops being free.
- experts: B*q tokens routed top-k_e among E experts touch A = E * (1 - (1 - k_e/E)^(B*q))
  distinct experts per layer in expectation (uniform routing), and each is read once.
- KV cache: B * S * (bytes per cached token) read per forward (latent cache for MLA), plus the
  recurrent state of linear-attention layers, read and written once (fp32).
- attention compute: 4 * B * q * S * heads * head_dim per full-attention layer (QK^T and PV); it is
  reported as the time it adds beyond the KV read of the same kernels.
- all-reduce (tensor parallelism over N GPUs): two per layer, each latency + 2(N-1)/N * message
  bytes / link bandwidth, the message being B*q*hidden bf16 activations.
- overhead: per forward, per layer, per token and per batch row; see hardware.py.

What it does not model: prefill, pipeline or expert parallelism, overlap of communication with
compute, non-uniform expert routing (real routers are skewed, which touches fewer experts), and
kernel efficiency that varies with matrix size (folded into the achieved fractions).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftsmith.errors import UserError
from draftsmith.simulate.catalog import ModelShape
from draftsmith.simulate.hardware import Hardware

BYTES_PER_PARAM = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp32": 4.0,
    "fp8": 1.0,
    "fp4": 0.5 + 1 / 16,
}  # fp4: + block scales
KV_BYTES = 2.0  # KV cache kept in bf16 whatever the weights' dtype
STATE_BYTES = 4.0  # linear-attention recurrent state in fp32
ACT_BYTES = 2.0  # activations exchanged by all-reduce

PARTS = ("weights", "kv_cache", "attention_compute", "experts", "allreduce", "overhead")


@dataclass
class ForwardCost:
    """Seconds per part of one forward (see PARTS), with the bytes and FLOPs behind them."""

    parts: dict[str, float]
    bytes: dict[str, float] = field(default_factory=dict)
    flops: dict[str, float] = field(default_factory=dict)
    bound: dict[str, str] = field(default_factory=dict)  # part -> "memory" | "compute"

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def distinct_experts(num_experts: int, per_token: int, tokens: int) -> float:
    """Expected experts touched when `tokens` tokens each pick `per_token` of `num_experts`.

    Each expert is missed by one token with probability 1 - k_e/E, by all with (1 - k_e/E)^T:

    >>> round(distinct_experts(128, 8, 1), 3)
    8.0
    >>> round(distinct_experts(128, 8, 16), 1)   # 16 tokens: 128 * (1 - (15/16)^16)
    82.4
    """
    if num_experts <= 0 or per_token <= 0 or tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - per_token / num_experts) ** tokens)


def allreduce_time(message_bytes: float, gpus: int, link_bandwidth: float, latency_s: float) -> float:
    """Ring all-reduce of one message over `gpus` GPUs: latency + 2(N-1)/N * bytes / link bandwidth.

    >>> round(allreduce_time(8e6, 8, 400e9, 1e-5) * 1e6, 1)   # 8 MB over 8 GPUs at 400 GB/s
    45.0
    """
    if gpus <= 1:
        return 0.0
    if link_bandwidth <= 0:
        raise UserError("this hardware has no interconnect figure for tensor parallelism: use --gpus 1")
    return latency_s + 2 * (gpus - 1) / gpus * message_bytes / link_bandwidth


def _roof(flops: float, nbytes: float, peak: float, bw: float) -> tuple[float, str]:
    t_c, t_m = flops / peak, nbytes / bw
    return (t_c, "compute") if t_c > t_m else (t_m, "memory")


def forward_cost(
    m: ModelShape,
    hw: Hardware,
    *,
    batch: int,
    q: int,
    context: int,
    dtype: str = "bf16",
    tp: int = 1,
    extra_params: int = 0,
) -> ForwardCost:
    """Time of one forward of `m` over `batch` rows of `q` new tokens at `context` cached tokens.

    `extra_params` adds always-on weights that are not part of the shape (a drafter's fusion layer).
    """
    if batch <= 0 or q <= 0 or context < 0 or tp <= 0:
        raise UserError(f"batch {batch}, q {q}, context {context} and gpus {tp} must be positive")
    bpp = BYTES_PER_PARAM[dtype]
    peak = hw.peak_flops(dtype) * hw.flops_eff * tp
    attn_peak = hw.peak_flops("fp32" if dtype == "fp32" else "bf16") * hw.flops_eff * tp  # attention in bf16
    bw = hw.bandwidth * hw.bw_eff * tp
    tokens = batch * q
    parts: dict[str, float] = {}
    nbytes: dict[str, float] = {}
    flops: dict[str, float] = {}
    bound: dict[str, str] = {}

    # ---- always-on weights ----------------------------------------------------------------------
    dense = m.always_on_params + extra_params
    nbytes["weights"], flops["weights"] = dense * bpp, 2.0 * dense * tokens
    parts["weights"], bound["weights"] = _roof(flops["weights"], nbytes["weights"], peak, bw)

    # ---- KV cache and attention ------------------------------------------------------------------
    # KV heads split across GPUs (replicated when fewer heads than GPUs; MLA's latent is replicated).
    kv_split = 1 if m.is_mla else min(tp, max(m.num_kv_heads, 1))
    state_split = min(tp, max(m.linear_value_heads, 1))
    kv = batch * context * m.kv_bytes_per_token(KV_BYTES)
    state = 2 * batch * m.linear_state_elems * STATE_BYTES
    nbytes["kv_cache"] = kv + state
    if m.is_mla:
        per_key = 2 * m.num_heads * (m.kv_lora_rank + m.qk_rope_dim) + 2 * m.num_heads * m.kv_lora_rank
    else:
        per_key = 4 * m.num_heads * m.head_dim
    attn_flops = tokens * context * per_key * m.num_attention_layers
    # Gated DeltaNet per token: state decay/update and readout, ~6 flops per state element.
    attn_flops += (
        tokens * 6 * m.num_linear_layers * m.linear_value_heads * m.linear_key_dim * m.linear_value_dim
    )
    flops["attention_compute"] = attn_flops
    t_kv = (kv / kv_split + state / state_split) / (hw.bandwidth * hw.bw_eff)
    t_attn = attn_flops / attn_peak
    parts["kv_cache"] = t_kv
    parts["attention_compute"] = max(0.0, t_attn - t_kv)
    bound["kv_cache"] = "compute" if t_attn > t_kv else "memory"

    # ---- routed experts --------------------------------------------------------------------------
    if m.is_moe:
        touched = distinct_experts(m.num_experts, m.experts_per_token, tokens)
        nbytes["experts"] = m.num_moe_layers * touched * m.expert_params * bpp
        flops["experts"] = 2.0 * tokens * m.experts_per_token * m.expert_params * m.num_moe_layers
        parts["experts"], bound["experts"] = _roof(flops["experts"], nbytes["experts"], peak, bw)
    else:
        parts["experts"] = 0.0

    # ---- tensor-parallel all-reduce --------------------------------------------------------------
    per = allreduce_time(tokens * m.hidden * ACT_BYTES, tp, hw.link_bandwidth, hw.allreduce_latency_s)
    parts["allreduce"] = 2 * m.num_layers * per

    parts["overhead"] = (
        hw.overhead_s
        + hw.overhead_per_layer_s * m.num_layers
        + hw.overhead_per_token_s * tokens
        + hw.overhead_per_row_s * batch
    )
    return ForwardCost(parts=parts, bytes=nbytes, flops=flops, bound=bound)
