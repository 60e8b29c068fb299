"""Each method's settings live in their own dataclass; fingerprints and draftsmith.json read them
under the flat names runs were saved with, so old checkpoints still resume."""

from __future__ import annotations

import pytest

from draftsmith.train.config import SETTINGS, DFlashSettings, DraftLMSettings, MTPSettings, TrainConfig
from draftsmith.train.trainer import METHODS


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_fingerprint_name_is_a_recorded_setting(method: str) -> None:
    cfg = TrainConfig("t", "d", "o", settings=SETTINGS[method]())
    assert cfg.method == method
    missing = [k for k in METHODS[method].fingerprint if k not in cfg.record()]
    assert missing == []


def test_record_is_flat_and_holds_only_this_methods_settings() -> None:
    rec = TrainConfig("t", "d", "o", settings=DFlashSettings(anchors=64, block_size=8), lr=1e-3).record()
    assert (rec["method"], rec["anchors"], rec["block_size"], rec["lr"]) == ("dflash", 64, 8, 1e-3)
    assert "settings" not in rec and "ttt_steps" not in rec and "hidden" not in rec


def test_methods_keep_their_own_defaults() -> None:
    # The same name means different things per method: a draft LM's depth is not a DFlash block's.
    assert (DFlashSettings().layers, DraftLMSettings().layers) == (5, 4)
    assert MTPSettings().ttt_steps == 3
    assert TrainConfig("t", "d", "o").method == "eagle3"
