"""`draftsmith data regenerate --endpoint` against `draftsmith serve`: the same records as local
regeneration with the same target (greedy), multi-turn histories included."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.data.regenerate import add_regenerate_parser, cmd_regenerate

CONVS = [
    {"id": "c0", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "old"},
                              {"role": "user", "content": "and then?"}]},
    {"prompt": "abc def"},
    {"id": "c2", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "zzz"}]},
    {"prompt": "what is 2+2?"},
]  # fmt: skip


def regen(target_dir: str, src: Path, out: Path, *extra: str) -> dict[str, dict]:
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
    args = parser.parse_args([*argv, "--num", "4", "--no-progress", "--max-new-tokens", "24", *extra])
    assert cmd_regenerate(args) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return {r["id"]: r for r in records}


def test_regenerate_through_the_server_equals_local(server, serve_target_dir, tmp_path):
    src = tmp_path / "convs.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in CONVS))
    local = regen(serve_target_dir, src, tmp_path / "local.jsonl")
    remote = regen(
        serve_target_dir, src, tmp_path / "remote.jsonl", "--endpoint", server, "--concurrency", "4"
    )
    assert sorted(remote) == sorted(local)
    for cid, rec in local.items():
        assert remote[cid]["messages"] == rec["messages"], cid
        assert remote[cid]["finish_reasons"] == rec["finish_reasons"], cid
    assert len(local["c0"]["messages"]) == 4  # the second turn saw the regenerated first answer
