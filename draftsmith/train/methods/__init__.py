"""One module per training method: how it builds its draft, runs a step, and saves the folder its
drafter loads. The loop (`train/trainer.py`) knows none of them by name beyond `METHODS`; what it
asks of each is `TrainingMethod`."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    import torch

    from draftsmith.train.config import TrainConfig
    from draftsmith.train.evaluate import Savable


class TrainingMethod(Protocol):
    # Settings (names in `TrainConfig.record()`) a checkpoint resumes under.
    fingerprint: ClassVar[tuple[str, ...]]
    # The registry name that loads the saved folder (`eagle3`, `dflash`, `mtp`, `draft`).
    drafter: ClassVar[str]
    # Whether `--init` other than "random" is a folder (resolved and added to the fingerprint).
    init_is_folder: ClassVar[bool]

    model: torch.nn.Module  # the trained module: its parameters with requires_grad are optimised
    layers: list[int]  # target feature layers read per step (recorded in draftsmith.json)

    @staticmethod
    def check(cfg: TrainConfig) -> None:
        """Raise UserError for this method's bad settings, before any work."""

    @staticmethod
    def positions(cfg: TrainConfig) -> int:
        """S: how many per-position numbers (loss, accuracy, counts) each step reports."""

    def __init__(self, cfg: TrainConfig, target, examples, world) -> None:
        """Build the draft on `world.device` (and open the feature store, if any)."""

    def forward_backward(
        self, examples, ids: list[int], step: int, autocast, train: bool = True
    ) -> torch.Tensor:
        """Loss (and, when training, gradients) on this rank's shard of a global batch; returns
        the all-reduced parts of `methods.common.loss_parts`."""

    def export(self, dtype: torch.dtype) -> Savable:
        """The draft as a finished speculator in `dtype`: its `save(dir, extra)` writes the folder."""

    def info(self) -> dict:
        """Method facts for draftsmith.json (draft vocabulary, block size, init, ...)."""
