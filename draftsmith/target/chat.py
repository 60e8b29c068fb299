"""Chat messages -> prompt token ids, with the target tokenizer's own chat template.

A base model without a template (Gemma 3 270M base) gets the messages' text joined plainly, which
is what completing a document means for such a model.
"""

from __future__ import annotations

from draftsmith.errors import UserError


def encode_messages(tokenizer, messages: list[dict]) -> list[int]:
    if not messages:
        raise UserError("empty prompt: give at least one message with text")
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # some tokenizers return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    text = "\n\n".join(m["content"] for m in messages)
    return tokenizer(text)["input_ids"]


def stop_checker(tokenizer, stops: list[str]):
    """Return a StopFn that fires once the decoded tail of a row contains any stop string."""
    if not stops:
        return None
    longest = max(len(s) for s in stops)

    def stop(row: int, ids: list[int]) -> bool:
        # Decoding only a tail keeps this cheap; a token is at least one character, so a window of
        # `longest + 8` tokens always covers the stop string.
        tail = tokenizer.decode(ids[-(longest + 8) :], skip_special_tokens=False)
        return any(s in tail for s in stops)

    return stop


def cut_at_stop(text: str, stops: list[str]) -> str:
    cuts = [text.find(s) for s in stops if s in text]
    return text[: min(cuts)] if cuts else text
