"""Chat conversations -> token ids with a loss mask on the assistant's tokens, for training drafters.

Knows the target tokenizer's chat template and where, in its rendering, each assistant turn lies.
Does not know where conversations come from (see `regenerate`), batching, padding or features.

**What the mask covers.** 1 exactly on the tokens of each assistant turn: its content and the
end-of-turn token the template emits after it (`<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`); 0 on
the role header (`<|im_start|>assistant\\n`), on every other message, and on template glue after
the end token (ChatML's trailing newline), which the target never generates because decoding stops
at the end token. The end token is the last special token inside the turn's span; a template that
emits none gets the whole span masked. Turns whose generation was cut by the token budget
(`finish_reasons[i] == "length"`) keep their content masked but not the end token: the template
closes them, the target did not.

**How the spans are found** (works for templates without `{% generation %}`, such as SmolLM2's):
the template is rendered to text for each prefix of the conversation, with and without the
generation prompt; an assistant turn is the text between `render(messages[:i], gen=True)` and
`render(messages[:i + 1])`. Each rendering must be a prefix of the whole conversation's rendering
(checked; templates that rewrite history, e.g. dropping earlier reasoning, are refused). The whole
text is then tokenized once and character spans map to tokens through the fast tokenizer's
offsets, so `input_ids` equal `apply_chat_template(messages, tokenize=True)` even where BPE merges
across a boundary (SmolLM2 merges the header's `\\n` with a reply starting with `\\n`); such a
straddling token belongs to the side where it starts, i.e. the header.

**Long conversations.** With `split=True` a conversation is cut at turn boundaries into windows of
at most `max_len` tokens. Each window is a conversation of its own: the leading system message (if
any) followed by consecutive exchanges (a user turn and the assistant reply after it), rendered by
the template as if it were the whole chat, so the template's own additions (SmolLM2's default
system prompt) appear in every window just as at inference. A single exchange longer than
`max_len` becomes a window truncated at `max_len`. With `split=False` the whole conversation is one
example truncated at `max_len`. Messages after the last assistant turn carry no loss and are
dropped; a window (or truncated example) with no assistant token is not returned, so a
conversation without any assistant turn yields `[]`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from draftsmith.errors import UserError


@dataclass
class Example:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the token is trained on (assistant content + end token)


def tokenize_conversation(
    tokenizer,
    messages: list[dict],
    max_len: int,
    split: bool = True,
    *,
    finish_reasons: list[str] | None = None,
) -> list[Example]:
    """Tokenize one chat (`[{"role", "content"}, ...]`) into training examples; see the module doc.

    `finish_reasons` (one per assistant turn, as `draftsmith data regenerate` records them) only
    decides whether each turn's end token is trained on.
    """
    if max_len <= 0:
        raise UserError(f"--max-len {max_len} must be a positive number of tokens")
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(
            "the target's tokenizer has no chat template, so assistant turns cannot be located; "
            "use an instruction-tuned target"
        )
    messages, closed = _trim(messages, finish_reasons)
    if not messages:
        return []
    whole = _encode(tokenizer, messages, closed)
    if not split or len(whole.input_ids) <= max_len:
        return _keep([whole], max_len)

    system = messages[:1] if messages[0]["role"] == "system" else []
    exchanges = _exchanges(messages[len(system) :])
    if len(exchanges) == 1:
        return _keep([whole], max_len)
    # Token counts per exchange, from the whole chat's encoding: bounds[j] is where exchange j + 1
    # starts. The header every window repeats (the system message, or the template's own
    # default one, as SmolLM2 adds) is what a window of exchange 1 holds beyond that exchange.
    bounds, done = [], len(system) + len(exchanges[0])
    for ex in exchanges[1:]:
        bounds.append(_token_at(whole.starts, len(_render(tokenizer, messages[:done], gen=False))))
        done += len(ex)
    bounds.append(len(whole.input_ids))
    sizes = [bounds[i + 1] - bounds[i] for i in range(len(exchanges) - 1)]
    alone = _render(tokenizer, system + exchanges[1], gen=False)
    header = len(tokenizer(alone, add_special_tokens=False)["input_ids"]) - sizes[0]
    sizes.insert(0, bounds[0] - header)
    windows: list[list[int]] = []  # exchange indices per window
    used = 0
    for e, size in enumerate(sizes):
        if windows and used + size <= max_len:
            windows[-1].append(e)
            used += size
        else:
            windows.append([e])
            used = header + size
    examples = [
        _encode(tokenizer, system + [m for e in w for m in exchanges[e]], [closed[e] for e in w])
        for w in windows
    ]
    return _keep(examples, max_len)


# ---------------------------------------------------------------- spans


@dataclass
class _Encoded(Example):
    starts: list[int]  # character offset where each token starts in the rendered text


def _encode(tokenizer, messages: list[dict], closed: list[bool]) -> _Encoded:
    """One conversation -> ids of its full rendering and the assistant mask."""
    full = _render(tokenizer, messages, gen=False)
    spans: list[tuple[int, int, bool]] = []  # (char start, char end, train the end token)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = _render(tokenizer, messages[:i], gen=True)
        end = _render(tokenizer, messages[: i + 1], gen=False)
        if not (full.startswith(end) and end.startswith(start)):
            raise UserError(
                "the target's chat template renders a conversation's prefix differently from the whole "
                "conversation (it rewrites earlier turns), so assistant tokens cannot be located"
            )
        spans.append((len(start), len(end), closed[len(spans)]))

    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    starts = [a for a, _ in enc["offset_mapping"]]
    special = set(tokenizer.all_special_ids)
    mask = [0] * len(ids)
    for lo, hi, train_end in spans:
        first, stop = _token_at(starts, lo), _token_at(starts, hi)
        ends = [t for t in range(first, stop) if ids[t] in special]
        last = ends[-1] if ends else stop - 1  # the end-of-turn token, or the whole span without one
        mask[first : last + 1] = [1] * (last + 1 - first)
        if ends and not train_end:
            mask[last] = 0
    return _Encoded(input_ids=ids, loss_mask=mask, starts=starts)


def _render(tokenizer, messages: list[dict], gen: bool) -> str:
    if not messages:
        # Nothing before the first turn; asking jinja would make some templates fail on messages[0].
        return ""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)


def _token_at(starts: list[int], char: int) -> int:
    """Index of the first token starting at or after `char` (a token straddling it stays before)."""
    return bisect.bisect_left(starts, char)


# ---------------------------------------------------------------- turns and windows


def _trim(messages: list[dict], finish_reasons: list[str] | None) -> tuple[list[dict], list[bool]]:
    """Keep the span from the first input to the last assistant turn; one 'train the end token'
    flag per kept assistant turn. An assistant turn opening the chat answers nothing: dropped."""
    msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
    n_asst = sum(m["role"] == "assistant" for m in msgs)
    if finish_reasons is not None and len(finish_reasons) != n_asst:
        raise ValueError(f"{len(finish_reasons)} finish reasons for {n_asst} assistant turns")
    closed = [r != "length" for r in finish_reasons] if finish_reasons is not None else [True] * n_asst
    while msgs and msgs[0]["role"] == "assistant":
        msgs, closed = msgs[1:], closed[1:]
    last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=-1)
    return msgs[: last + 1], closed


def _exchanges(turns: list[dict]) -> list[list[dict]]:
    """Cut after each assistant turn, so each exchange holds its inputs and exactly one reply."""
    out: list[list[dict]] = []
    current: list[dict] = []
    for m in turns:
        current.append(m)
        if m["role"] == "assistant":
            out.append(current)
            current = []
    return out


def _keep(examples: list[Example], max_len: int) -> list[Example]:
    out = []
    for ex in examples:
        ex = Example(ex.input_ids[:max_len], ex.loss_mask[:max_len])
        if any(ex.loss_mask):
            out.append(ex)
    return out
