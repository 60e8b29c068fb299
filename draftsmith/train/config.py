"""What a training run is: the settings every method shares (`TrainConfig`) and each method's own
(`EAGLE3Settings`, `DFlashSettings`, `MTPSettings`, `DraftLMSettings`, held in `TrainConfig.settings`).
Which of them define a run (a checkpoint resumes only under the same ones) each method lists in its
`fingerprint` (`train/methods/*.py`), by the names `TrainConfig.record` gives them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import ClassVar

MTP_INITS = ("random", "last_layer", "native")  # or a folder holding a head (`mtp.*` tensors)


@dataclass
class EAGLE3Settings:
    method: ClassVar[str] = "eagle3"
    ttt_steps: int = 7  # training-time-test unroll depth
    draft_vocab: int = 32000
    head_init: str = "random"  # "random" or "target" (the target's LM head rows)
    attn_init: str = "token"  # "token" (`eagle3_init.token_attention`) or "random"


@dataclass
class DFlashSettings:
    method: ClassVar[str] = "dflash"
    block_size: int = 16
    layers: int = 5
    anchors: int = 512
    gamma: float = 7.0
    target_layers: list[int] | None = None  # None: K=5 spread from 1 to L-3
    mask_token_id: int | None = None  # None: `dflash.default_mask_token_id`
    norm_init: str = "scaled"  # "scaled" (`dflash.scale_output_norm`) or "ones"


@dataclass
class MTPSettings:
    method: ClassVar[str] = "mtp"
    ttt_steps: int = 3  # steps the head is unrolled on its own outputs


@dataclass
class DraftLMSettings:
    method: ClassVar[str] = "draft-lm"
    layers: int = 4  # depth of a fresh draft when `init_layers` is None
    hidden: int | None = None  # None: the target's width, sharing its (frozen) embedding and head
    init_layers: list[int] | None = None  # copy these target layers (and the final norm) to start


MethodSettings = EAGLE3Settings | DFlashSettings | MTPSettings | DraftLMSettings
SETTINGS: dict[str, type] = {
    s.method: s for s in (EAGLE3Settings, DFlashSettings, MTPSettings, DraftLMSettings)
}


@dataclass
class TrainConfig:
    target: str
    data: str
    out: str
    settings: MethodSettings = field(default_factory=EAGLE3Settings)  # the method and its own settings
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
    eval_k: int | None = None  # drafted tokens per step when measuring tau; None = the method's positions
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
    features: str | None = None  # an offline feature store (`draftsmith data features`); None = online
    # random, or the folder of a trained draft to continue; MTP also: last_layer, native (the target's own head)
    init: str = "random"

    @property
    def method(self) -> str:
        """A key of `trainer.METHODS` (eagle3, dflash, mtp, draft-lm), set by the settings' type."""
        return self.settings.method

    def record(self) -> dict:
        """Every setting under one flat name (the method's beside the shared ones): what fingerprints
        and draftsmith.json's `train` read, as they did before settings were split by method."""
        shared = {k: v for k, v in asdict(self).items() if k != "settings"}
        return shared | {"method": self.method} | asdict(self.settings)
