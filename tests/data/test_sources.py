"""Tests for the raw prompt sources. The real ShareGPT file is only read from its start (islice):
reading all 125 MB takes about 0.4 s, which the default run avoids."""

import io
import json
from itertools import islice

import pytest

from draftsmith.data.sources import (
    HELDOUT_PERCENT,
    conversation_key,
    is_heldout,
    iter_humaneval,
    iter_json_array,
    iter_sharegpt,
)
from draftsmith.errors import UserError


def _conv(record_id, *turns):
    return {"id": record_id, "conversations": [{"from": who, "value": text} for who, text in turns]}


def _write_cut(path, records, cut=25):
    """Write `records` as a pretty-printed JSON array and cut `cut` characters off its end, mid-record."""
    text = json.dumps(records, indent=2, ensure_ascii=False)
    path.write_text(text[:-cut], encoding="utf-8")


# ---------------------------------------------------------------- streaming decoder


@pytest.mark.parametrize("chunk_chars", [1, 7, 64, 1 << 20])
def test_json_array_stops_at_cut(chunk_chars):
    records = [{"id": i, "text": "é" * i + "ü,]}"} for i in range(20)]
    text = json.dumps(records, indent=2, ensure_ascii=False)
    cut = text[: text.index('"id": 19')]  # the last record is cut mid-way
    assert list(iter_json_array(io.StringIO(cut), chunk_chars=chunk_chars)) == records[:19]


@pytest.mark.parametrize("chunk_chars", [1, 5, 1 << 20])
def test_json_array_complete(chunk_chars):
    text = ' \n[ {"a": 1} ,\n{"b": [2, 3]}, 4 ]\n'
    assert list(iter_json_array(io.StringIO(text), chunk_chars=chunk_chars)) == [{"a": 1}, {"b": [2, 3]}, 4]
    assert list(iter_json_array(io.StringIO("[]"), chunk_chars=chunk_chars)) == []


def test_json_array_rejects_non_array():
    with pytest.raises(UserError, match="not a JSON array"):
        list(iter_json_array(io.StringIO('{"a": 1}'), name="x.json"))


# ---------------------------------------------------------------- ShareGPT conversion


def test_sharegpt_roles_and_filtering(tmp_path):
    path = tmp_path / "sharegpt.json"
    records = [
        _conv("a_0", ("human", "hi"), ("gpt", "hello"), ("chatgpt", "more"), ("bard", "b"), ("bing", "c")),
        _conv("b_0", ("gpt", "assistant first"), ("human", "then user")),  # not a user turn first
        _conv("c_0", ("system", "be brief"), ("human", "q"), ("unknown", "dropped"), ("gpt", "  ")),
        _conv("d_0", ("human", "   "), ("gpt", "answer to nothing")),  # blank user turn is dropped
        _conv("e_0"),  # empty conversation
        _conv("f_0", ("system", "only a banner")),
        _conv("g_0", ("user", "from the rare 'user' speaker")),
        _conv("h_0", ("human", "cut here")),
    ]
    _write_cut(path, records)
    got = list(iter_sharegpt(path=path))
    assert [r["id"] for r in got] == ["a_0", "c_0", "g_0"]  # h_0 is the cut record
    assert [m["role"] for m in got[0]["messages"]] == [
        "user",
        "assistant",
        "assistant",
        "assistant",
        "assistant",
    ]
    assert got[1]["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"}]
    assert got[2]["messages"] == [{"role": "user", "content": "from the rare 'user' speaker"}]


def test_sharegpt_splits_partition(tmp_path):
    path = tmp_path / "sharegpt.json"
    records = [_conv(f"id{i:04d}_{i % 3}", ("human", f"q{i}"), ("gpt", "a")) for i in range(600)]
    _write_cut(path, [*records, _conv("zz_0", ("human", "cut"))])
    ids = {split: [r["id"] for r in iter_sharegpt(split, path=path)] for split in ("all", "train", "heldout")}
    assert len(ids["all"]) == 600
    assert sorted(ids["train"] + ids["heldout"]) == sorted(ids["all"])
    assert ids["heldout"] and all(is_heldout(i) for i in ids["heldout"])
    assert not any(is_heldout(i) for i in ids["train"])
    with pytest.raises(ValueError):
        next(iter_sharegpt("test", path=path))


# ---------------------------------------------------------------- held-out split


def test_conversation_key():
    assert conversation_key("QWJhYvA_0") == "QWJhYvA"
    assert conversation_key("hRPPgZT_11") == "hRPPgZT"
    assert conversation_key("a_b_3") == "a_b"
    assert conversation_key("plain") == "plain"
    assert conversation_key("x_") == "x_"
    assert conversation_key("_5") == "_5"


def test_heldout_is_stable_and_about_two_percent():
    # Fixed values: changing the hash or the key would silently move prompts between training and
    # benchmark, so these are pinned.
    assert [is_heldout(i) for i in ("H1aZlSE_0", "QWJhYvA_0", "i6IyJda_0")] == [True, False, False]
    keys = [f"conv{i}" for i in range(20_000)]
    share = sum(map(is_heldout, keys)) / len(keys)
    assert abs(share - HELDOUT_PERCENT / 100) < 0.004
    # All parts of one shared conversation fall on the same side.
    for key in keys[:300]:
        assert len({is_heldout(f"{key}_{part}") for part in (0, 1, 7, 12)}) == 1


# ---------------------------------------------------------------- real packaged data


def test_real_sharegpt_start():
    first = list(islice(iter_sharegpt(), 50))  # reads well under 1% of the file
    assert len(first) == 50
    assert first[0]["id"] == "QWJhYvA_0"
    for record in first:
        roles = [m["role"] for m in record["messages"]]
        assert set(roles) <= {"system", "user", "assistant"}
        assert next(r for r in roles if r != "system") == "user"
        assert all(isinstance(m["content"], str) and m["content"].strip() for m in record["messages"])


def test_real_sharegpt_heldout_start():
    heldout = list(islice(iter_sharegpt("heldout"), 3))
    assert len(heldout) == 3 and all(is_heldout(r["id"]) for r in heldout)


def test_humaneval():
    problems = list(iter_humaneval())
    assert len(problems) == 164
    assert problems[0]["id"] == "HumanEval/0"
    assert len({p["id"] for p in problems}) == 164
    assert all("def " in p["prompt"] for p in problems)
