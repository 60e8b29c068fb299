"""Loss masks from the chat template: exactly the assistant content plus its end token, ids equal to
tokenizing the whole conversation at once, windows cut at turn boundaries, truncation. On the tiny
character tokenizer by default; on SmolLM2's real tokenizer (BPE, default system prompt) when slow."""

from __future__ import annotations

import copy

import pytest
from transformers import AutoTokenizer

from draftsmith.data.tokenize import tokenize_conversation
from draftsmith.errors import UserError

END = "<|im_end|>"


def u(text):
    return {"role": "user", "content": text}


def a(text):
    return {"role": "assistant", "content": text}


SYSTEM = {"role": "system", "content": "be kind"}
CHAT = [SYSTEM, u("hello"), a("hi there"), u("what is 2+2?"), a("four."), u("thanks"), a("you are welcome")]


@pytest.fixture(scope="module")
def tok(tiny_checkpoint):
    return AutoTokenizer.from_pretrained(tiny_checkpoint)


def whole(tok, messages) -> list[int]:
    ids = tok.apply_chat_template(messages, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def masked_runs(tok, ex) -> list[str]:
    """The text of each contiguous run of mask-1 tokens (tiny tokenizer: one token per character)."""
    return ["".join(tok.convert_ids_to_tokens(r)) for r in _runs(ex)]


# ---------------------------------------------------------------- tiny character tokenizer


def test_mask_is_exactly_assistant_content_and_end_token(tok):
    [ex] = tokenize_conversation(tok, CHAT, max_len=10_000)
    assert ex.input_ids == whole(tok, CHAT)  # one tokenization of the whole chat
    want = [m["content"] + END for m in CHAT if m["role"] == "assistant"]
    assert masked_runs(tok, ex) == want
    # The header before each answer and the newline after its end token are not trained on.
    rendered = tok.convert_ids_to_tokens(ex.input_ids)
    for i, (t, m) in enumerate(zip(rendered, ex.loss_mask, strict=True)):
        if t == END and m:
            assert rendered[i + 1] == "\n" and ex.loss_mask[i + 1] == 0
    assert len(ex.loss_mask) == len(ex.input_ids)


def test_split_windows_start_at_a_user_turn_and_repeat_the_system_message(tok):
    [full] = tokenize_conversation(tok, CHAT, max_len=10_000)
    header = whole(tok, [SYSTEM])
    max_len = len(full.input_ids) - 10  # too long as a whole, two exchanges fit
    examples = tokenize_conversation(tok, CHAT, max_len=max_len)
    assert len(examples) == 2 and all(len(ex.input_ids) <= max_len for ex in examples)
    for ex in examples:
        assert ex.input_ids[: len(header)] == header
        after = tok.convert_ids_to_tokens(ex.input_ids[len(header) : len(header) + 5])
        assert after[0] == "<|im_start|>" and "".join(after[1:]) == "user"
    # Each window is the template's rendering of [system, its exchanges]; together they are the chat.
    assert examples[0].input_ids == whole(tok, CHAT[:5]) and examples[1].input_ids == whole(
        tok, [SYSTEM, *CHAT[5:]]
    )
    rest = [ex.input_ids[len(header) :] for ex in examples[1:]]
    assert examples[0].input_ids + [i for r in rest for i in r] == full.input_ids
    assert [r for ex in examples for r in masked_runs(tok, ex)] == masked_runs(tok, full)


def test_without_system_message_windows_concatenate_to_the_whole_chat(tok):
    chat = CHAT[1:]
    [full] = tokenize_conversation(tok, chat, max_len=10_000)
    examples = tokenize_conversation(tok, chat, max_len=45)
    assert len(examples) == 3
    assert [i for ex in examples for i in ex.input_ids] == full.input_ids
    assert [m for ex in examples for m in ex.loss_mask] == full.loss_mask


def test_long_turn_is_truncated_and_split_false_truncates(tok):
    chat = [u("q"), a("x" * 100), u("r"), a("short")]
    examples = tokenize_conversation(tok, chat, max_len=50)
    assert [len(ex.input_ids) for ex in examples] == [50, len(whole(tok, chat[2:]))]
    assert examples[0].input_ids == whole(tok, chat[:2])[:50] and all(examples[0].loss_mask[-10:])
    [one] = tokenize_conversation(tok, chat, max_len=50, split=False)
    assert one.input_ids == whole(tok, chat)[:50]
    # A cut that leaves no assistant token leaves no example.
    assert tokenize_conversation(tok, [u("q" * 80), a("x")], max_len=50) == []


def test_turns_after_the_last_answer_and_chats_without_answers(tok):
    [ex] = tokenize_conversation(tok, [*CHAT, u("one more?")], max_len=10_000)
    assert ex.input_ids == whole(tok, CHAT)  # the unanswered user turn carries no loss: dropped
    assert tokenize_conversation(tok, [SYSTEM, u("hello")], max_len=10_000) == []
    assert tokenize_conversation(tok, [], max_len=10) == []
    # An answer that opens the chat answers nothing.
    [ex] = tokenize_conversation(tok, [a("stray"), u("hi"), a("yo")], max_len=10_000)
    assert ex.input_ids == whole(tok, [u("hi"), a("yo")])


def test_turn_cut_by_length_keeps_content_but_not_end_token(tok):
    chat = [u("a"), a("cut off"), u("b"), a("done")]
    [ex] = tokenize_conversation(tok, chat, max_len=10_000, finish_reasons=["length", "stop"])
    assert masked_runs(tok, ex) == ["cut off", "done" + END]
    with pytest.raises(ValueError, match="finish reasons"):
        tokenize_conversation(tok, chat, max_len=100, finish_reasons=["stop"])


def test_template_that_rewrites_history_is_refused(tok):
    odd = copy.deepcopy(tok)
    # Renders the last message differently from the same message followed by more turns.
    odd.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "{% if loop.last %}!{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(UserError, match="chat template"):
        tokenize_conversation(odd, CHAT, max_len=1000)
    odd.chat_template = None
    with pytest.raises(UserError, match="no chat template"):
        tokenize_conversation(odd, CHAT, max_len=1000)


def test_bad_max_len(tok):
    with pytest.raises(UserError, match="--max-len"):
        tokenize_conversation(tok, CHAT, max_len=0)


# ---------------------------------------------------------------- SmolLM2 (BPE, default system prompt)


@pytest.fixture(scope="module")
def smol():
    from draftsmith.target.resolve import resolve_target

    return AutoTokenizer.from_pretrained(resolve_target("smollm2-135m").model_path)


@pytest.mark.slow
def test_smollm2_mask_and_ids(smol):
    chat = [
        u("Write a haiku about rain."),
        a("Soft rain on the roof,\nquiet drums."),
        u("Now in French?"),
        a("Pluie douce."),
    ]
    [ex] = tokenize_conversation(smol, chat, max_len=10_000)
    assert ex.input_ids == whole(smol, chat)
    runs = [smol.decode(r) for r in _runs(ex)]
    assert runs == ["Soft rain on the roof,\nquiet drums." + END, "Pluie douce." + END]
    # The template's default system prompt is context, not loss.
    n_sys = len(whole(smol, [u("x")])) - len(
        smol("<|im_start|>user\nx<|im_end|>\n", add_special_tokens=False)["input_ids"]
    )
    assert n_sys > 10 and not any(ex.loss_mask[:n_sys])


@pytest.mark.slow
def test_smollm2_windows_each_start_with_the_default_system_prompt(smol):
    # Exchanges shorter than the default system prompt: a window size estimate that forgot the
    # prompt the template adds to every window would pack three of them and get truncated.
    chat = [m for i in range(6) for m in (u(f"q{i}"), a(f"a{i}"))]
    max_len = len(whole(smol, chat[:4]))  # exactly two exchanges and the default system prompt
    examples = tokenize_conversation(smol, chat, max_len=max_len)
    assert [ex.input_ids for ex in examples] == [whole(smol, chat[i : i + 4]) for i in (0, 4, 8)]
    header = whole(smol, [u("x")])[:20]  # <|im_start|>system ... of the default prompt
    assert all(ex.input_ids[:20] == header for ex in examples)
    assert [smol.decode(r) for ex in examples for r in _runs(ex)] == [f"a{i}{END}" for i in range(6)]


@pytest.mark.slow
def test_smollm2_token_straddling_the_header_belongs_to_the_header(smol):
    # BPE merges the header's "\n" with an answer that starts with "\n": that token stays unmasked.
    chat = [u("hi"), a("\n\nhello there")]
    [ex] = tokenize_conversation(smol, chat, max_len=1000)
    assert ex.input_ids == whole(smol, chat)
    assert [smol.decode(r) for r in _runs(ex)] == ["\nhello there" + END]


def _runs(ex) -> list[list[int]]:
    runs, current = [], []
    for i, m in zip(ex.input_ids, ex.loss_mask, strict=True):
        if m:
            current.append(i)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])
