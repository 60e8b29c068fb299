"""What a training run is: its settings. Which of them define a run (a checkpoint resumes only
under the same ones) each method lists in its `fingerprint` (`train/methods/*.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field

MTP_INITS = ("random", "last_layer", "native")  # or a folder holding a head (`mtp.*` tensors)


@dataclass
class TrainConfig:
    target: str
    data: str
    out: str
    epochs: int = 1
    lr: float = 1e-4
    batch_tokens: int = 4096
    max_len: int = 2048
    warmup_ratio: float = 0.04
    grad_clip: float = 0.5
    eval_every: int = 200  # 0: only at the end of a run
    eval_workload: str = "chat"
    eval_prompts: int = 8  # 0: no held-out tau
    eval_max_new_tokens: int = 64
    eval_k: int | None = None  # drafted tokens per step when measuring tau; None = ttt_steps
    eval_data: str | None = None  # held-out conversations: teacher-forced accuracy per position
    eval_every_minutes: float | None = None  # also evaluate each time training wall time passes a multiple
    eval_at_start: bool = False  # held-out tau of the starting weights too, before the first step
    save_every: int | None = None  # None = eval_every; 0: only at the end of a run
    resume: bool = False
    seed: int = 0
    dtype: str = "auto"  # resolved by `train` to what the device computes natively
    device: str = "cpu"
    max_steps: int | None = None
    time_budget: float | None = None  # seconds; None = the schedule is steps alone
    progress: bool = True
    command: str = ""
    extra: dict = field(default_factory=dict)  # anything else to record in draftsmith.json
    method: str = "eagle3"  # a key of `trainer.METHODS`: eagle3, dflash, mtp, draft-lm
    features: str | None = None  # an offline feature store (`draftsmith data features`); None = online
    # random, or the folder of a trained draft to continue; MTP also: last_layer, native (the target's own head)
    init: str = "random"
    # Method-specific settings: each method reads its own and checks them (`check`), and lists the
    # ones a checkpoint resumes under in its `fingerprint`.
    # EAGLE-3 (ttt_steps also MTP: the unrolled steps trained)
    ttt_steps: int = 7
    draft_vocab: int = 32000
    head_init: str = "random"  # "random" or "target" (the target's LM head rows)
    attn_init: str = "token"  # "token" (`eagle3_init.token_attention`) or "random"
    # DFlash only
    block_size: int = 16
    layers: int = 5
    anchors: int = 512
    gamma: float = 7.0
    target_layers: list[int] | None = None  # None: K=5 spread from 1 to L-3
    mask_token_id: int | None = None  # None: `dflash.default_mask_token_id`
    norm_init: str = "scaled"  # "scaled" (`dflash.scale_output_norm`) or "ones"
    # draft LM only (`layers` above is its depth when `init_layers` is None)
    hidden: int | None = None  # None: the target's width, sharing its (frozen) embedding and head
    init_layers: list[int] | None = None  # copy these target layers (and the final norm) to start
