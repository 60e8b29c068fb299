"""Tests for benchmark workloads. `chat` reads ShareGPT only up to its N-th held-out record: with
N = 8 that is about 3% of the 125 MB file (tens of milliseconds)."""

import ast
import json
import re

import pytest

from draftsmith.data.sources import is_heldout
from draftsmith.data.workloads import (
    CHAT_MAX_CHARS,
    LONG_MAX_CHARS,
    LONG_MIN_CHARS,
    Prompt,
    load_workload,
)
from draftsmith.errors import UserError


def _check_shape(prompts, n):
    assert len(prompts) == n
    assert all(isinstance(p, Prompt) for p in prompts)
    assert len({p.id for p in prompts}) == n
    for p in prompts:
        assert p.messages and all(set(m) == {"role", "content"} for m in p.messages)
        assert p.messages[-1]["role"] == "user"
        assert all(isinstance(m["content"], str) and m["content"].strip() for m in p.messages)


# ---------------------------------------------------------------- built-in workloads


def test_chat():
    prompts = load_workload("chat", 8)
    _check_shape(prompts, 8)
    for p in prompts:
        assert p.id.startswith("sharegpt/") and is_heldout(p.id.removeprefix("sharegpt/"))
        assert len(p.messages) == 1 and len(p.messages[0]["content"]) <= CHAT_MAX_CHARS
    assert load_workload("chat", 8) == prompts
    assert load_workload("chat", 3) == prompts[:3]


def test_code():
    prompts = load_workload("code", 5)
    _check_shape(prompts, 5)
    assert [p.id for p in prompts] == [f"HumanEval/{i}" for i in range(5)]
    content = prompts[0].messages[0]["content"]
    assert content.startswith("Complete the following Python function.")
    assert "```python\nfrom typing import List\n" in content and content.endswith("```")
    assert "def has_close_elements(" in content
    assert load_workload("code", 5) == prompts


def test_fewer_available_than_asked():
    assert len(load_workload("code", 1000)) == 164


def test_long():
    prompts = load_workload("long", 6, seed=0)
    _check_shape(prompts, 6)
    requests = set()
    for p in prompts:
        assert p.id.startswith("stdlib/") and len(p.messages) == 1
        content = p.messages[0]["content"]
        assert len(content) >= LONG_MIN_CHARS
        code = content.split("```python\n", 1)[1].rsplit("\n```", 1)[0]
        assert LONG_MIN_CHARS <= len(code) + 1 <= LONG_MAX_CHARS
        request = content.rsplit("```", 1)[1]
        requests.add(request.split("`")[0])
        # The request names a real top-level def or class of the file shown (the first name; a
        # rename's second name is the new one).
        top_level = {n.name for n in ast.parse(code).body if hasattr(n, "name")}
        assert re.findall(r"`([^`]+)`", request)[0] in top_level
    assert len(requests) >= 4  # the templates rotate
    assert load_workload("long", 6, seed=0) == prompts
    assert load_workload("long", 6, seed=1) != prompts


# ---------------------------------------------------------------- JSONL files


def _write(tmp_path, lines, name="data.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_jsonl(tmp_path):
    path = _write(
        tmp_path,
        [
            json.dumps({"prompt": "Hello?"}),
            "",
            "   ",
            json.dumps(
                {
                    "id": "multi",
                    "messages": [
                        {"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "Hi", "name": "ann"},
                        {"role": "assistant", "content": "Hello."},
                        {"role": "user", "content": "Why?"},
                    ],
                }
            ),
            json.dumps({"id": 7, "prompt": "int id"}),
        ],
    )
    prompts = load_workload(path, 10)
    assert prompts == [
        Prompt(id="line-1", messages=[{"role": "user", "content": "Hello?"}]),
        Prompt(
            id="multi",
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Why?"},
            ],
        ),
        Prompt(id="7", messages=[{"role": "user", "content": "int id"}]),
    ]
    assert load_workload(path, 2) == prompts[:2]


GOOD = json.dumps({"prompt": "fine"})


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ('{"prompt": "unterminated', "invalid JSON"),
        ('["a", "list"]', "expected a JSON object"),
        ('{"id": "x"}', 'expected "messages" or "prompt"'),
        ('{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}', "both"),
        ('{"prompt": ""}', '"prompt" must be a non-empty string'),
        ('{"prompt": 3}', '"prompt" must be a non-empty string'),
        ('{"messages": []}', '"messages" must be a non-empty list'),
        ('{"messages": "hi"}', '"messages" must be a non-empty list'),
        ('{"messages": ["hi"]}', r"messages\[0\] must be an object"),
        ('{"messages": [{"role": "tool", "content": "x"}]}', r"messages\[0\] has role 'tool'"),
        ('{"messages": [{"content": "x"}]}', r'messages\[0\] has no "role"'),
        (
            '{"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": " "}]}',
            "empty content",
        ),
        ('{"messages": [{"role": "user", "content": ["parts"]}]}', r'"content" must be a string'),
        ('{"messages": [{"role": "user"}]}', r'"content" must be a string'),
        ('{"id": ["x"], "prompt": "a"}', '"id" must be'),
        ('{"id": "", "prompt": "a"}', '"id" must be'),
        ('{"id": "line-1", "prompt": "a"}', "already used on line 1"),
    ],
)
def test_jsonl_bad_line(tmp_path, bad, problem):
    # The bad line is physical line 4 (after a blank line), past the prompts asked for: every line
    # is checked.
    path = _write(tmp_path, [GOOD, GOOD.replace("fine", "ok"), "", bad, GOOD])
    with pytest.raises(
        UserError, match=rf"^workload file .*data\.jsonl line 4: .*{problem}.*; fix or remove that line$"
    ):
        load_workload(path, 1)


def test_jsonl_bad_utf8(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(GOOD.encode() + b'\n{"prompt": "\xff"}\n')
    with pytest.raises(UserError, match="line 2: not valid UTF-8"):
        load_workload(str(path), 1)


def test_jsonl_missing_empty_and_directory(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_workload(str(tmp_path / "nope.jsonl"), 1)
    with pytest.raises(UserError, match="has no prompts"):
        load_workload(_write(tmp_path, ["", "  "]), 1)
    with pytest.raises(UserError, match="not a file"):
        load_workload(str(tmp_path), 1)


def test_unknown_name_and_bad_count():
    with pytest.raises(UserError, match="unknown workload 'chatt'; choose chat, code, long"):
        load_workload("chatt", 1)
    for n in (0, -3):
        with pytest.raises(UserError, match="positive integer"):
            load_workload("code", n)
