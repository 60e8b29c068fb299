"""One conversation under regeneration, and the seed of each of its turns: what the local and the
endpoint regenerators share (`data/regenerate.py`, `data/regen_endpoint.py`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass
class Conversation:
    index: int  # position in the source order (shards select on it)
    id: str
    segments: list[list[dict]]  # the input messages before each assistant turn
    messages: list[dict] = field(default_factory=list)  # regenerated conversation so far
    finish_reasons: list[str] = field(default_factory=list)
    turn_tokens: list[int] = field(default_factory=list)  # generated tokens per assistant turn
    ended_by: str | None = None  # "context" or "rejected" when it ended before its last segment

    def history(self, turn: int) -> list[dict]:
        """The messages the target answers at `turn`: the regenerated history plus the new inputs."""
        return self.messages + self.segments[turn]

    def add_reply(self, turn: int, text: str, finish_reason: str, n_tokens: int) -> None:
        self.messages = self.history(turn) + [{"role": "assistant", "content": text}]
        self.finish_reasons.append(finish_reason)
        self.turn_tokens.append(n_tokens)

    def record(self, source: str, target: str) -> dict:
        return {
            "id": self.id,
            "source": source,
            "messages": self.messages,
            "finish_reasons": self.finish_reasons,
            "target": target,
            "num_new_tokens": sum(self.turn_tokens),
            "new_tokens_per_turn": self.turn_tokens,
        }


def turn_seed(seed: int, *parts: int) -> int:
    """A 31-bit seed per (run seed, batch or conversation, turn): unrelated streams, reproducible."""
    digest = hashlib.sha256("/".join(str(p) for p in (seed, *parts)).encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1
