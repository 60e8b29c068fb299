"""`draftsmith data regenerate` on a tiny local target and a fake OpenAI-compatible server: regenerated
history feeds later turns, batching does not change greedy outputs, killed runs resume, shards split
the work, and bad input ends in a UserError."""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tokenizers import decoders
from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

import draftsmith.decoding.engine as engine
from draftsmith.data.regenerate import (
    add_regenerate_parser,
    cmd_regenerate,
    iter_source,
    parse_shard,
    plan_turns,
)
from draftsmith.errors import UserError
from draftsmith.target.chat import encode_messages


def u(text):
    return {"role": "user", "content": text}


def a(text):
    return {"role": "assistant", "content": text}


CONVS = [
    {"id": "c0", "messages": [u("hi"), a("old answer"), u("and then?"), a("old 2")]},
    {"prompt": "abc def"},
    {"id": "c2", "messages": [{"role": "system", "content": "be brief"}, u("zzz"), a("x"), u("q")]},
    {"id": "c3", "messages": [u("hello world"), u("again"), a("y"), a("z"), u("more")]},
    {"prompt": "what is 2+2?"},
]


@pytest.fixture(scope="module")
def target_dir(tiny_checkpoint, tmp_path_factory):
    """The tiny tokenizer over an untied random model: the tied one echoes its last token forever.
    A larger EOS row makes some answers stop; a fused decoder makes decode(encode(text)) == text."""
    out = tmp_path_factory.mktemp("regen-target")
    cfg = AutoConfig.from_pretrained(tiny_checkpoint)
    cfg.tie_word_embeddings = False
    cfg.max_position_embeddings = 1024
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight[cfg.eos_token_id].mul_(2.0)
    model.save_pretrained(out)
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    tok.backend_tokenizer.decoder = decoders.Fuse()
    tok.save_pretrained(out)
    return str(out)


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in CONVS))
    return path


def regen(target_dir, src, out, *extra) -> list[dict]:
    parser = argparse.ArgumentParser()
    add_regenerate_parser(parser.add_subparsers())
    argv = [
        "regenerate",
        "--target",
        target_dir,
        "--dtype",
        "float32",
        "--source",
        str(src),
        "--out",
        str(out),
    ]
    args = parser.parse_args([*argv, "--no-progress", "--max-new-tokens", "24", *extra])
    assert cmd_regenerate(args) == 0
    return read(out)


def read(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def by_id(records):
    return {r["id"]: r for r in records}


# ---------------------------------------------------------------- planning


def test_plan_turns_keeps_inputs_and_drops_source_answers():
    sys_ = {"role": "system", "content": "s"}
    assert plan_turns([sys_, u("a"), a("x"), u("b"), a("y")]) == [[sys_, u("a")], [u("b")]]
    # consecutive users are answered together; repeated assistants collapse; a trailing user is answered
    assert plan_turns([u("a"), u("b"), a("x"), a("y"), u("c")]) == [[u("a"), u("b")], [u("c")]]
    assert plan_turns([a("x"), u("a")]) == [[u("a")]]
    assert plan_turns([sys_, a("x")]) == []


@pytest.mark.parametrize("spec", ["2/2", "-1/3", "a/b", "3", "0/0", "1/2/3"])
def test_bad_shard_is_a_user_error(spec):
    with pytest.raises(UserError, match="--shard"):
        parse_shard(spec)


def test_shard_spec():
    assert parse_shard(None) == (0, 1) and parse_shard("1/4") == (1, 4)


def test_sources_are_the_train_split_and_the_code_benchmark_prompts():
    from itertools import islice

    from draftsmith.data.sources import is_heldout
    from draftsmith.data.workloads import load_workload

    assert not any(is_heldout(cid) for cid, _ in islice(iter_source("sharegpt"), 50))
    first = next(iter_source("humaneval"))
    code = load_workload("code", 1)[0]
    assert first == (code.id, code.messages) and first[0] == "HumanEval/0"


def test_humaneval_train_never_holds_a_code_benchmark_prompt():
    from draftsmith.data.regenerate import HUMANEVAL_HELD_OUT
    from draftsmith.data.workloads import load_workload

    train = [cid for cid, _ in iter_source("humaneval-train")]
    bench = {p.id for p in load_workload("code", HUMANEVAL_HELD_OUT)}
    assert len(train) == 164 - HUMANEVAL_HELD_OUT and not bench & set(train)


# ---------------------------------------------------------------- local mode


def test_multi_turn_prompt_holds_regenerated_history(target_dir, source, tmp_path, monkeypatch):
    added: list[list[int]] = []  # every prompt that joined the running batch, in order
    in_flight: list[int] = []
    real = engine.Batch.add

    def spy(self, seqs):
        added.extend(list(s.prompt) for s in seqs)
        in_flight.append(len(self.rows) + len(seqs))
        return real(self, seqs)

    monkeypatch.setattr(engine.Batch, "add", spy)
    recs = by_id(regen(target_dir, source, tmp_path / "o.jsonl", "--num", "5", "--batch-size", "2"))
    tok = AutoTokenizer.from_pretrained(target_dir)
    c0 = recs["c0"]["messages"]
    assert [m["role"] for m in c0] == ["user", "assistant", "user", "assistant"]
    assert "old answer" not in json.dumps(recs)
    # Turn 2 of c0 was asked with its own regenerated turn 1 in the history, after turn 1 was asked.
    assert added.index(encode_messages(tok, c0[:3])) > added.index(encode_messages(tok, c0[:1]))
    # Continuous batching: one prompt per turn, never more than --batch-size rows at once.
    turns = sum(len(r["finish_reasons"]) for r in recs.values())
    assert len(added) == turns and max(in_flight) <= 2
    assert recs["c2"]["messages"][0] == {"role": "system", "content": "be brief"}
    assert [m["role"] for m in recs["c3"]["messages"]] == ["user", "user", "assistant", "user", "assistant"]
    for r in recs.values():
        assert r["target"] == Path(target_dir).name and r["source"] == "prompts.jsonl"
        n_asst = sum(m["role"] == "assistant" for m in r["messages"])
        assert len(r["finish_reasons"]) == n_asst == len(r["new_tokens_per_turn"])
        assert set(r["finish_reasons"]) <= {"stop", "length"}
        assert r["num_new_tokens"] == sum(r["new_tokens_per_turn"])


def test_batch_equals_one_at_a_time_and_manual_two_steps(target_dir, source, tmp_path):
    batched = by_id(regen(target_dir, source, tmp_path / "b.jsonl", "--num", "5", "--batch-size", "4"))
    single = by_id(regen(target_dir, source, tmp_path / "s.jsonl", "--num", "5", "--batch-size", "1"))
    assert batched == single
    reasons = [f for r in batched.values() for f in r["finish_reasons"]]
    assert "stop" in reasons and "length" in reasons  # the fixture exercises both
    # Turn 2 of c0 equals a plain engine run on [user1, regenerated answer 1, user2].
    from draftsmith.target.model import load_target

    target = load_target(target_dir, "float32")
    msgs = batched["c0"]["messages"]
    res = engine.generate(target, None, [encode_messages(target.tokenizer, msgs[:3])], max_new_tokens=24)[0]
    assert target.tokenizer.decode(res.token_ids, skip_special_tokens=True) == msgs[3]["content"]


def test_sampling_is_reproducible_for_a_seed(target_dir, source, tmp_path):
    runs = [
        regen(target_dir, source, tmp_path / f"{i}.jsonl", "--num", "3", "--temperature", "1", "--seed", "3")
        for i in range(2)
    ]
    greedy = regen(target_dir, source, tmp_path / "g.jsonl", "--num", "3")
    assert runs[0] == runs[1] != greedy


def test_ngram_drafter_gives_the_same_data(target_dir, source, tmp_path):
    plain = by_id(regen(target_dir, source, tmp_path / "p.jsonl", "--num", "3"))
    fast = by_id(regen(target_dir, source, tmp_path / "n.jsonl", "--num", "3", "--drafter", "ngram"))
    assert plain == fast


def test_max_turns_and_context_end_conversations_early(target_dir, tmp_path, monkeypatch):
    src = tmp_path / "long.jsonl"
    src.write_text(json.dumps({"id": "L", "messages": [u("a" * 300), a("-"), u("b"), a("-"), u("c")]}) + "\n")
    recs = regen(target_dir, src, tmp_path / "t.jsonl", "--num", "1", "--max-turns", "2")
    assert len(recs[0]["finish_reasons"]) == 2

    class FullLength:
        """A batch whose every answer is 'x' repeated up to the token budget."""

        def __init__(self, target, drafter, **kw) -> None:
            self.x = target.tokenizer.convert_tokens_to_ids("x")
            self.rows: list = []

        def add(self, seqs):
            self.rows += [SimpleNamespace(index=s.index, budget=s.max_new_tokens, finish=None) for s in seqs]
            return self.rows[-len(seqs) :]

        def step(self):
            for row in self.rows:
                row.output, row.finish = [self.x] * row.budget, "length"
            done, self.rows = self.rows, []
            return done

    monkeypatch.setattr(engine, "Batch", FullLength)
    # With 400 new tokens, turn 1 fits the 1024 context (about 320 + 400) but turn 2 does not.
    out = tmp_path / "c.jsonl"
    recs = regen(target_dir, src, out, "--num", "1", "--max-new-tokens", "400")
    assert [m["role"] for m in recs[0]["messages"]] == ["user", "assistant"]
    assert recs[0]["messages"][1]["content"] == "x" * 400 and recs[0]["finish_reasons"] == ["length"]
    report = json.loads(Path(f"{out}.report.json").read_text())
    assert report["run"]["ended_early"]["context"] == 1
    # A first prompt that never fits writes no record.
    src.write_text(json.dumps({"prompt": "x" * 900}) + "\n")
    assert regen(target_dir, src, tmp_path / "n.jsonl", "--num", "1", "--max-new-tokens", "200") == []


def test_report_matches_records(target_dir, source, tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    recs = regen(target_dir, source, out, "--num", "5")
    rep = json.loads(Path(f"{out}.report.json").read_text())
    lengths = sorted(n for r in recs for n in r["new_tokens_per_turn"])
    assert rep["conversations"] == 5 and rep["turns"] == len(lengths) == 8
    assert rep["generated_tokens"] == sum(lengths) == rep["run"]["generated_tokens"]
    assert rep["finish_reasons"]["stop"] + rep["finish_reasons"]["length"] == 8
    assert rep["assistant_tokens"]["mean"] == round(sum(lengths) / 8, 1)
    # nearest rank: the median is the ceil(0.5 * 8) = 4th, p90 the ceil(0.9 * 8) = 8th
    assert rep["assistant_tokens"]["median"] == lengths[3] and rep["assistant_tokens"]["p90"] == lengths[7]
    assert rep["run"]["tokens_per_s"] > 0 and rep["mode"] == "local" and rep["target"]
    printed = capsys.readouterr().out
    assert "tok/s" in printed and "p90" in printed


# ---------------------------------------------------------------- resume and shards


def test_rerun_skips_and_larger_num_folds_the_old_output_in(target_dir, source, tmp_path, monkeypatch):
    out = tmp_path / "o.jsonl"
    first = regen(target_dir, source, out, "--num", "2")
    assert sorted(r["id"] for r in first) == ["c0", "line-2"]
    calls = []
    monkeypatch.setattr(engine, "Batch", lambda *a, **k: calls.append(1))
    assert regen(target_dir, source, out, "--num", "2") == first and calls == []  # nothing to do
    monkeypatch.undo()
    both = by_id(regen(target_dir, source, out, "--num", "4"))
    assert set(both) == {"c0", "line-2", "c2", "c3"}
    assert both["c0"] == by_id(first)["c0"] and not Path(f"{out}.partial").exists()
    rep = json.loads(Path(f"{out}.report.json").read_text())
    assert rep["run"]["already_done"] == 2 and rep["run"]["conversations"] == 2 and rep["conversations"] == 4


def test_killed_run_resumes_from_partial_file(target_dir, source, tmp_path):
    reference = by_id(regen(target_dir, source, tmp_path / "ref.jsonl", "--num", "4"))
    out = tmp_path / "o.jsonl"
    kept = dict(reference["c2"], messages=[*reference["c2"]["messages"][:-1], a("MARKER")])
    torn = json.dumps(reference["c0"])[:37]  # the line a killed process was writing
    Path(f"{out}.partial").write_text(json.dumps(kept) + "\n" + torn)
    got = by_id(regen(target_dir, source, out, "--num", "4"))
    assert got["c2"]["messages"][-1]["content"] == "MARKER"  # finished: not regenerated
    assert {k: v for k, v in got.items() if k != "c2"} == {k: v for k, v in reference.items() if k != "c2"}
    assert not Path(f"{out}.partial").exists()


def test_output_of_another_target_is_refused(target_dir, source, tmp_path):
    out = tmp_path / "o.jsonl"
    out.write_text(json.dumps({"id": "c0", "target": "other", "source": "prompts.jsonl"}) + "\n")
    with pytest.raises(UserError, match="another --out"):
        regen(target_dir, source, out, "--num", "1")


def test_shards_split_the_work_and_concatenate_to_the_whole(target_dir, source, tmp_path):
    whole = by_id(regen(target_dir, source, tmp_path / "w.jsonl", "--num", "5", "--batch-size", "1"))
    parts = [
        regen(target_dir, source, tmp_path / f"s{i}.jsonl", "--num", "5", "--shard", f"{i}/2") for i in (0, 1)
    ]
    assert sorted(r["id"] for r in parts[0]) == ["c0", "c2", "line-5"]
    assert sorted(r["id"] for r in parts[1]) == ["c3", "line-2"]
    assert by_id(parts[0] + parts[1]) == whole


def test_bad_source_is_a_user_error(target_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"messages": [{"role": "robot", "content": "x"}]}\n')
    with pytest.raises(UserError, match="line 2"):
        regen(target_dir, bad, tmp_path / "o.jsonl", "--num", "2")
    with pytest.raises(UserError, match="--source"):
        regen(target_dir, tmp_path / "missing.jsonl", tmp_path / "o.jsonl", "--num", "2")


# ---------------------------------------------------------------- endpoint mode


class _FakeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass

    def _send(self, obj, status=200):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.endswith("/models"):
            self._send(
                {
                    "object": "list",
                    "data": [{"id": "fake-model", "object": "model", "created": 0, "owned_by": "t"}],
                }
            )
        else:
            self._send({"error": {"message": "not found"}}, 404)

    def do_POST(self):
        srv = self.server
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with srv.lock:
            srv.requests.append(req)
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
        time.sleep(0.05)  # long enough for concurrent requests to overlap
        with srv.lock:
            srv.in_flight -= 1
        # Deterministic answer: which turn this is (assistant messages seen) and the last user text.
        msgs = req["messages"]
        if msgs[-1]["content"] == "REJECT":  # what vLLM answers a prompt over its --max-model-len
            self._send({"error": {"message": "prompt too long", "type": "BadRequestError", "code": 400}}, 400)
            return
        turn = sum(m["role"] == "assistant" for m in msgs)
        text = f"t{turn}:{msgs[-1]['content'][::-1]}"
        finish = "length" if len(text) >= req["max_tokens"] else "stop"
        self._send(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": req["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": len(text), "total_tokens": len(text) + 1},
            }
        )


@pytest.fixture
def server():
    srv = _FakeServer()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    # Stop by itself even if a test hangs: the daemon thread dies with pytest, the timer frees the port.
    guard = threading.Timer(120, srv.shutdown)
    guard.daemon = True
    guard.start()
    yield srv
    guard.cancel()
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def test_endpoint_sends_history_with_requests_in_flight(target_dir, source, tmp_path, server):
    url = f"http://127.0.0.1:{server.server_address[1]}"  # without /v1: the client adds it
    out = tmp_path / "e.jsonl"
    recs = by_id(regen(target_dir, source, out, "--num", "5", "--endpoint", url, "--concurrency", "4"))
    assert 1 < server.max_in_flight <= 4
    assert {r["model"] for r in server.requests} == {"fake-model"}
    assert len(server.requests) == 8 and {r["max_tokens"] for r in server.requests} == {24}
    c0 = recs["c0"]["messages"]
    assert c0 == [u("hi"), a("t0:ih"), u("and then?"), a("t1:?neht dna")]
    # The second request of c0 carried the regenerated first answer, not the source's.
    assert [u("hi"), a("t0:ih"), u("and then?")] in [r["messages"] for r in server.requests]
    assert recs["c0"]["num_new_tokens"] == len("t0:ih") + len("t1:?neht dna")
    rep = json.loads(Path(f"{out}.report.json").read_text())
    assert rep["mode"] == "endpoint" and rep["turns"] == 8
    # Resuming against the server asks nothing more.
    before = len(server.requests)
    regen(target_dir, source, out, "--num", "5", "--endpoint", url)
    assert len(server.requests) == before


def test_unreachable_endpoint_is_one_user_error(target_dir, source, tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(UserError, match=f"127.0.0.1:{port}"):
        regen(target_dir, source, tmp_path / "e.jsonl", "--num", "2", "--endpoint", url, "--model", "m")


def test_endpoint_refusing_one_request_ends_only_that_conversation(target_dir, tmp_path, server):
    src = tmp_path / "r.jsonl"
    rows = [
        {"id": "r", "messages": [u("fine"), a("-"), u("REJECT"), a("-"), u("never asked")]},
        {"prompt": "ok"},
    ]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    out = tmp_path / "e.jsonl"
    recs = by_id(regen(target_dir, src, out, "--num", "2", "--endpoint", url))
    assert recs["r"]["messages"] == [u("fine"), a("t0:enif")] and recs["line-2"]["finish_reasons"] == ["stop"]
    assert json.loads(Path(f"{out}.report.json").read_text())["run"]["ended_early"]["rejected"] == 1
