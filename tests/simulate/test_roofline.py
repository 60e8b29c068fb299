"""The cost model on hand-computed cases: a dense layer memory-bound at batch 1 and compute-bound
at a large batch, the distinct-experts count of MoE verification, and a tensor-parallel all-reduce."""

from __future__ import annotations

import pytest

from draftsmith.simulate.catalog import ModelShape
from draftsmith.simulate.hardware import Hardware
from draftsmith.simulate.roofline import allreduce_time, alltoall_time, distinct_experts, forward_cost

# Round numbers: 1 TB/s, 100 TFLOP/s, everything achieved, no overheads.
HW = Hardware(
    "test",
    80,
    1e12,
    {"bf16": 100e12},
    bw_eff=1.0,
    flops_eff=1.0,
    overhead_s=0.0,
    overhead_per_layer_s=0.0,
    spec_step_overhead_s=0.0,
    link_bandwidth=100e9,
    allreduce_latency_s=1e-5,
)

# One layer, hidden 1024, 8 heads of 128 (MHA), MLP 4096, vocab 1000, tied.
DENSE = ModelShape(
    name="dense",
    source="test",
    num_layers=1,
    hidden=1024,
    vocab=1000,
    num_heads=8,
    num_kv_heads=8,
    head_dim=128,
    intermediate=4096,
    tie_embeddings=True,
)
# attention 4 * 1024^2 + MLP 3 * 1024 * 4096 + LM head 1000 * 1024
DENSE_PARAMS = 4 * 1024 * 1024 + 3 * 1024 * 4096 + 1000 * 1024


def test_param_count_by_hand() -> None:
    assert DENSE.always_on_params == DENSE_PARAMS == 17_801_216


def test_dense_layer_batch_1_is_memory_bound() -> None:
    c = forward_cost(DENSE, HW, batch=1, q=1, context=0)
    assert c.bound["weights"] == "memory"
    assert c.parts["weights"] == pytest.approx(DENSE_PARAMS * 2 / 1e12)  # 35.7 us
    assert c.parts["kv_cache"] == 0 and c.parts["experts"] == 0 and c.parts["allreduce"] == 0


def test_verifying_a_few_tokens_costs_the_same_until_the_compute_roof() -> None:
    one = forward_cost(DENSE, HW, batch=1, q=1, context=0).total
    nine = forward_cost(DENSE, HW, batch=1, q=9, context=0).total
    assert nine == pytest.approx(one)
    # Ridge: 2 * P * T / 100e12 = 2 * P / 1e12  ->  T = 100 tokens. At 4 * 64 = 256 tokens: compute.
    big = forward_cost(DENSE, HW, batch=64, q=4, context=0)
    assert big.bound["weights"] == "compute"
    assert big.parts["weights"] == pytest.approx(2 * DENSE_PARAMS * 256 / 100e12)
    assert big.parts["weights"] / one == pytest.approx(2.56)


def test_kv_cache_and_attention_compute_by_hand() -> None:
    c = forward_cost(DENSE, HW, batch=2, q=1, context=1000)
    kv = 2 * 1000 * (2 * 8 * 128 * 2)  # rows * tokens * (K,V * heads * dim * bf16)
    assert c.bytes["kv_cache"] == kv
    assert c.parts["kv_cache"] == pytest.approx(kv / 1e12)
    assert c.parts["attention_compute"] == 0.0  # 4*2*1000*8*128 flops take 0.08 us < 8 us of reads
    # 512 query tokens per row at 1000 context: compute exceeds the read and the excess is reported.
    c = forward_cost(DENSE, HW, batch=2, q=512, context=1000)
    flops = 4 * 2 * 512 * 1000 * 8 * 128
    assert c.parts["kv_cache"] + c.parts["attention_compute"] == pytest.approx(flops / 100e12)


def test_moe_distinct_experts() -> None:
    assert distinct_experts(128, 8, 1) == pytest.approx(8)
    # 16 tokens: 128 * (1 - (120/128)^16) = 128 * (1 - 0.3561) = 82.4
    assert distinct_experts(128, 8, 16) == pytest.approx(128 * (1 - (120 / 128) ** 16))
    assert distinct_experts(128, 8, 16) == pytest.approx(82.42, abs=0.01)
    assert distinct_experts(128, 8, 10_000) == pytest.approx(128)


def test_moe_verification_reads_the_experts_its_tokens_touch() -> None:
    moe = MOE  # defined with the multi-GPU tests below
    expert_bytes = 3 * 512 * 256 * 2
    for tokens in (1, 8):
        c = forward_cost(moe, HW, batch=1, q=tokens, context=0)
        want = 2 * distinct_experts(64, 4, tokens) * expert_bytes
        assert c.bytes["experts"] == pytest.approx(want)
        assert c.parts["experts"] == pytest.approx(want / 1e12)
    # 8 tokens touch 64 * (1 - (60/64)^8) = 25.8 experts instead of 4: 6.45x the expert reads.
    ratio = (
        forward_cost(moe, HW, batch=1, q=8, context=0).parts["experts"]
        / forward_cost(moe, HW, batch=1, q=1, context=0).parts["experts"]
    )
    assert ratio == pytest.approx(25.81 / 4, rel=0.001)


def test_tensor_parallel_all_reduce_by_hand() -> None:
    # 8 GPUs, 4 MB message, 100 GB/s links: 10 us + 2 * 7/8 * 4e6 / 100e9 = 10 + 70 = 80 us.
    assert allreduce_time(4e6, 8, 100e9, 1e-5) == pytest.approx(80e-6)
    assert allreduce_time(4e6, 1, 100e9, 1e-5) == 0.0
    # In a forward: two all-reduces per layer of B*q*hidden bf16 activations; weights split 8 ways.
    c = forward_cost(DENSE, HW, batch=4, q=1, context=0, tp=8)
    per = 1e-5 + 2 * 7 / 8 * (4 * 1024 * 2) / 100e9
    assert c.parts["allreduce"] == pytest.approx(2 * 1 * per)
    assert c.parts["weights"] == pytest.approx(DENSE_PARAMS * 2 / 8e12)


def test_fixed_overheads_add_per_forward_layer_token_and_row() -> None:
    hw = Hardware(
        "o",
        1,
        1e12,
        {"bf16": 1e14},
        overhead_s=1e-3,
        overhead_per_layer_s=1e-4,
        overhead_per_token_s=1e-5,
        overhead_per_row_s=1e-6,
    )
    c = forward_cost(DENSE, hw, batch=2, q=3, context=0)
    assert c.parts["overhead"] == pytest.approx(1e-3 + 1e-4 * 1 + 1e-5 * 6 + 1e-6 * 2)


def test_dtype_halves_the_weight_bytes() -> None:
    hw = Hardware("f", 1, 1e12, {"bf16": 1e14, "fp8": 2e14}, bw_eff=1.0, flops_eff=1.0)
    b = forward_cost(DENSE, hw, batch=1, q=1, context=0, dtype="bf16").bytes["weights"]
    f = forward_cost(DENSE, hw, batch=1, q=1, context=0, dtype="fp8").bytes["weights"]
    assert f == b / 2


# --- multi-GPU and MoE terms ----------------------------------------------------------------------

MOE = ModelShape(
    name="moe",
    source="t",
    num_layers=2,
    hidden=512,
    vocab=100,
    num_heads=4,
    num_kv_heads=4,
    head_dim=128,
    intermediate=0,
    num_experts=64,
    experts_per_token=4,
    moe_intermediate=256,
)


def test_one_gpu_has_no_all_reduce_and_latency_grows_with_peers() -> None:
    assert allreduce_time(1e3, 1, 100e9, 1e-5, 1e-6) == 0.0
    assert forward_cost(DENSE, HW, batch=4, q=1, context=0, tp=1).parts["allreduce"] == 0.0
    # 2 GPUs: 10 us + 1 peer * 1 us + 2 * 1/2 * 1 kB / 100 GB/s = 11.01 us; 8 GPUs: 17 us + 0.0175 us
    assert allreduce_time(1e3, 2, 100e9, 1e-5, 1e-6) == pytest.approx(11.01e-6)
    assert allreduce_time(1e3, 8, 100e9, 1e-5, 1e-6) == pytest.approx(17e-6 + 2 * 7 / 8 * 1e3 / 100e9)


def test_dense_has_no_dispatch_and_one_gpu_no_all_to_all() -> None:
    assert alltoall_time(1e6, 1, 100e9, 2e-5) == 0.0
    c = forward_cost(DENSE, HW, batch=8, q=4, context=0, tp=8, ep=True)
    assert c.parts["dispatch"] == 0.0 and c.parts["allreduce"] == 0.0  # dense under ep: data parallel
    c = forward_cost(MOE, HW, batch=8, q=1, context=0, tp=8)  # MoE under tensor parallelism
    assert c.parts["dispatch"] == 0.0 and c.parts["allreduce"] > 0.0


def test_expert_parallel_dispatch_by_hand() -> None:
    hw = Hardware(
        "ep",
        80,
        1e12,
        {"bf16": 100e12},
        bw_eff=1.0,
        flops_eff=1.0,
        link_bandwidth=100e9,
        alltoall_latency_s=2e-5,
    )
    # 16 rows over 4 GPUs: 4 rows per GPU, q=2 -> 8 tokens per GPU, each sent to 4 experts of 512 wide.
    c = forward_cost(MOE, hw, batch=16, q=2, context=0, tp=4, ep=True)
    sent = 8 * 4 * 512
    one = 2e-5 + 3 / 4 * sent * 1.0 / 100e9  # dispatch in fp8
    two = 2e-5 + 3 / 4 * sent * 2.0 / 100e9  # combine in bf16
    assert c.parts["dispatch"] == pytest.approx(2 * (one + two))  # two MoE layers
    # Attention and the always-on weights are replicated: each GPU reads all of them for its rows.
    assert c.bytes["weights"] == pytest.approx(MOE.always_on_params * 2)
    assert c.parts["weights"] == pytest.approx(MOE.always_on_params * 2 / 1e12)
    # Experts touched by all 32 tokens are spread over the 4 GPUs.
    assert c.parts["experts"] == pytest.approx(2 * distinct_experts(64, 4, 32) * MOE.expert_params * 2 / 4e12)


def test_moe_layer_latency_and_expert_dtype() -> None:
    hw = Hardware(
        "m",
        80,
        1e12,
        {"bf16": 1e14, "fp4": 4e14},
        overhead_s=0.0,
        overhead_per_layer_s=1e-5,
        moe_overhead_per_layer_s=2e-5,
    )
    assert forward_cost(MOE, hw, batch=1, q=1, context=0).parts["overhead"] == pytest.approx(
        2 * 1e-5 + 2 * 2e-5
    )
    assert forward_cost(DENSE, hw, batch=1, q=1, context=0).parts["overhead"] == pytest.approx(1e-5)
    bf16 = forward_cost(MOE, hw, batch=1, q=1, context=0).bytes["experts"]
    fp4 = forward_cost(MOE, hw, batch=1, q=1, context=0, expert_dtype="fp4")
    assert fp4.bytes["experts"] == pytest.approx(bf16 * (0.5 + 1 / 16) / 2)
    assert fp4.bytes["weights"] == forward_cost(MOE, hw, batch=1, q=1, context=0).bytes["weights"]


def test_draft_forwards_can_pay_their_own_per_forward_cost() -> None:
    hw = Hardware("d", 80, 1e12, {"bf16": 1e14}, overhead_s=3e-4, overhead_per_layer_s=0.0)
    assert forward_cost(DENSE, hw, batch=1, q=1, context=0, overhead_s=2e-5).parts[
        "overhead"
    ] == pytest.approx(2e-5)
    assert forward_cost(DENSE, hw, batch=1, q=1, context=0).parts["overhead"] == pytest.approx(3e-4)
