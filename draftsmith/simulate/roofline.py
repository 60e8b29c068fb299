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
- all-reduce (tensor parallelism over N GPUs): two per layer, each latency (a base plus a step per
  peer GPU) + 2(N-1)/N * message bytes / link bandwidth, the message being B*q*hidden bf16
  activations. One GPU has none.
- expert parallelism (`ep=True`, SGLang's DP attention + DeepEP layout): the B rows are spread over
  the N GPUs, each GPU runs attention and the always-on weights for its own rows (weights
  replicated, no all-reduce), and every MoE layer sends each token to its k_e experts' GPUs and back:
  two all-to-alls of latency + tokens_per_gpu * k_e * hidden * (N-1)/N bytes / link bandwidth
  (dispatch in fp8, combine in bf16). A dense model has no dispatch.
- overhead: per forward, per layer, per MoE layer, per token and per batch row; see hardware.py.

Weights may be stored in two dtypes: `expert_dtype` for the routed experts (NVFP4 / MXFP4
checkpoints quantise only them) and `dtype` for everything else.

What it does not model: prefill, pipeline parallelism, overlap of communication with compute,
non-uniform expert routing (real routers are skewed, which touches fewer experts) or load imbalance
between expert-parallel ranks, and kernel efficiency that varies with matrix size (folded into the
achieved fractions and the per-layer latency). One consequence of uniform routing: once the plain
step's B tokens already touch nearly every expert (B * k_e a few times E), verifying k+1 tokens per
row reads no more expert bytes, so at fixed tau a large MoE's predicted speedup stops falling with
concurrency and rises again. Llama-4-Scout (16 experts, top-1) reaches it by batch 32; there its
published n-gram speedup still falls because each request's host look-up grows the step
(`Hardware.host_draft_per_row_s`, paid by the drafter, not by this roofline).
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

PARTS = ("weights", "kv_cache", "attention_compute", "experts", "allreduce", "dispatch", "overhead")


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


def _need_link(link_bandwidth: float) -> None:
    if link_bandwidth <= 0:
        raise UserError("this hardware has no interconnect figure for tensor parallelism: use --gpus 1")


def allreduce_time(
    message_bytes: float, gpus: int, link_bandwidth: float, latency_s: float, per_peer_s: float = 0.0
) -> float:
    """All-reduce of one message over `gpus` GPUs: latency + per_peer * (N-1) + 2(N-1)/N * bytes / bw.

    The bandwidth term is a ring's; the latency grows with the peers a one-shot kernel reads from.

    >>> round(allreduce_time(8e6, 8, 400e9, 1e-5) * 1e6, 1)   # 8 MB over 8 GPUs at 400 GB/s
    45.0
    >>> round(allreduce_time(8e3, 8, 400e9, 1e-5, 1e-6) * 1e6, 2)   # 8 kB: latency-bound
    17.04
    """
    if gpus <= 1:
        return 0.0
    _need_link(link_bandwidth)
    return latency_s + per_peer_s * (gpus - 1) + 2 * (gpus - 1) / gpus * message_bytes / link_bandwidth


def alltoall_time(message_bytes: float, gpus: int, link_bandwidth: float, latency_s: float) -> float:
    """One expert-parallel all-to-all: each GPU keeps 1/N of its `message_bytes` and sends the rest.

    >>> round(alltoall_time(8 * 8 * 7168, 16, 450e9, 2e-5) * 1e6, 2)   # 8 tokens x top-8 x 7168 B
    20.96
    >>> alltoall_time(1e6, 1, 450e9, 2e-5)   # one GPU: nothing to send
    0.0
    """
    if gpus <= 1:
        return 0.0
    _need_link(link_bandwidth)
    return latency_s + (gpus - 1) / gpus * message_bytes / link_bandwidth


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
    ep: bool = False,
    expert_dtype: str | None = None,
    overhead_s: float | None = None,
) -> ForwardCost:
    """Time of one forward of `m` over `batch` rows of `q` new tokens at `context` cached tokens.

    `tp` is the GPU count: tensor parallelism over all of them, or with `ep` data-parallel attention
    and expert parallelism. `extra_params` adds always-on weights that are not part of the shape (a
    drafter's fusion layer); `overhead_s` replaces the hardware's per-forward cost (draft forwards).
    """
    if batch <= 0 or q <= 0 or context < 0 or tp <= 0:
        raise UserError(f"batch {batch}, q {q}, context {context} and gpus {tp} must be positive")
    bpp = BYTES_PER_PARAM[dtype]
    expert_dtype = expert_dtype or dtype
    ebpp = BYTES_PER_PARAM[expert_dtype]
    # Expert parallelism replicates attention and the always-on weights (data-parallel attention): each
    # GPU reads them whole for its own rows, and the step lasts as long as the busiest GPU (ceil of
    # rows per GPU). A dense model under `ep` is plain data parallelism.
    ep = ep and tp > 1
    rows = -(-batch // tp) if ep else batch
    split = 1 if ep else tp
    peak = hw.peak_flops(dtype) * hw.flops_eff * split
    attn_eff = hw.flops_eff if hw.attn_flops_eff is None else hw.attn_flops_eff
    attn_peak = hw.peak_flops("fp32" if dtype == "fp32" else "bf16") * attn_eff * split  # attention in bf16
    bw = hw.bandwidth * hw.bw_eff * split
    tokens = rows * q
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
    kv_split = 1 if m.is_mla else min(split, max(m.num_kv_heads, 1))
    state_split = min(split, max(m.linear_value_heads, 1))
    kv = rows * context * m.kv_bytes_per_token(KV_BYTES)
    state = 2 * rows * m.linear_state_elems * STATE_BYTES
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
    # All B*q tokens of the step (every GPU's) pick experts; the touched experts are spread evenly over
    # the GPUs whether they are split by tensor (each holds 1/N of every expert) or by expert.
    all_tokens = batch * q
    if m.is_moe:
        touched = distinct_experts(m.num_experts, m.experts_per_token, all_tokens)
        nbytes["experts"] = m.num_moe_layers * touched * m.expert_params * ebpp
        flops["experts"] = 2.0 * all_tokens * m.experts_per_token * m.expert_params * m.num_moe_layers
        e_peak = hw.peak_flops(expert_dtype) * hw.flops_eff * tp
        e_bw = hw.bandwidth * hw.bw_eff * tp
        parts["experts"], bound["experts"] = _roof(flops["experts"], nbytes["experts"], e_peak, e_bw)
    else:
        parts["experts"] = 0.0

    # ---- tensor-parallel all-reduce, expert-parallel dispatch and combine ------------------------
    per = allreduce_time(
        tokens * m.hidden * ACT_BYTES,
        split,
        hw.link_bandwidth,
        hw.allreduce_latency_s,
        hw.allreduce_latency_per_peer_s,
    )
    parts["allreduce"] = 2 * m.num_layers * per
    parts["dispatch"] = 0.0
    if ep and m.is_moe:
        # dispatch sends fp8 activations (1 byte), combine returns bf16 (2 bytes)
        sent = tokens * m.experts_per_token * m.hidden
        one = alltoall_time(sent * 1.0, tp, hw.link_bandwidth, hw.alltoall_latency_s)
        two = alltoall_time(sent * ACT_BYTES, tp, hw.link_bandwidth, hw.alltoall_latency_s)
        parts["dispatch"] = m.num_moe_layers * (one + two)

    parts["overhead"] = (
        (hw.overhead_s if overhead_s is None else overhead_s)
        + hw.overhead_per_layer_s * m.num_layers
        + hw.moe_overhead_per_layer_s * m.num_moe_layers
        + hw.overhead_per_token_s * tokens
        + hw.overhead_per_row_s * rows
    )
    return ForwardCost(parts=parts, bytes=nbytes, flops=flops, bound=bound)
