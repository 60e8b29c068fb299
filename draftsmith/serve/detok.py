"""Token ids -> text for one answer, as deltas while it streams and as the final text at its end.

The final text is exactly what `draftsmith generate` prints: the whole output decoded without special
tokens, cut before the first stop string. While streaming, a delta never runs past what the final
text will hold: it waits while the decoded text ends in an incomplete UTF-8 piece, and holds back the
last `len(longest stop) - 1` characters, which could still turn out to begin a stop string.
Deltas therefore concatenate to the final text.
"""

from __future__ import annotations

from draftsmith.target.chat import cut_at_stop


class TextStream:
    def __init__(self, tokenizer, stops: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0  # characters already handed out

    def push(self, ids: list[int]) -> str:
        """Add committed ids; return the text that is now safe to send (may be empty)."""
        self.ids.extend(ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            return ""
        cut = cut_at_stop(text, self.stops)
        safe = len(cut) if len(cut) < len(text) else max(len(text) - self.hold, 0)
        return self._emit(cut[:safe])

    def finish(self) -> str:
        """The rest of the final text (call once, when the answer ended)."""
        return self._emit(self.text())

    def text(self) -> str:
        return cut_at_stop(self.tokenizer.decode(self.ids, skip_special_tokens=True), self.stops)

    def _emit(self, upto: str) -> str:
        if len(upto) <= self.sent:
            return ""
        delta = upto[self.sent :]
        self.sent = len(upto)
        return delta
