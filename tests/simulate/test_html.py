"""The token timing page: self-contained, and in headless Chromium both streams run and the plots show."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from draftsmith.cli import main


def _page(tmp_path: Path) -> Path:
    out = tmp_path / "page.html"
    assert (
        main(
            [
                "simulate",
                "--model",
                "qwen3-8b",
                "--hardware",
                "b200",
                "--drafter",
                "dflash",
                "--tau",
                "6.5",
                "--html",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    return out


def test_page_is_self_contained(tmp_path: Path, capsys) -> None:
    text = _page(tmp_path).read_text()
    capsys.readouterr()
    assert 'id="stream-baseline"' in text and 'id="stream-spec"' in text
    assert len(re.findall(r'<svg class="plot"', text)) == 3
    assert not re.search(r'(src|href)=["\']?https?:', text)  # nothing fetched from the network


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(
    _chromium() is None, reason="Debian's chromium is not installed (scripts/setup.sh installs it)"
)
def test_chromium_renders_both_streams_and_plots(tmp_path: Path, capsys) -> None:
    page = _page(tmp_path)
    capsys.readouterr()
    cmd = [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=2000",
        "--dump-dom",
        page.as_uri(),
    ]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    stats = dict(re.findall(r'id="stats-(baseline|spec)">(\d+) tokens', dom))
    assert set(stats) == {"baseline", "spec"}, dom[:500]
    # Two simulated seconds: both streams produced text, the speculative one several times more.
    assert int(stats["baseline"]) > 50 and int(stats["spec"]) > 2 * int(stats["baseline"])
    for pane in ("baseline", "spec"):
        body = re.search(rf'id="stream-{pane}">(.*?)</div>', dom, re.S).group(1)
        assert re.sub(r"<[^>]+>", "", body).strip()
    assert len(re.findall(r'<svg class="plot"', dom)) == 3 and dom.count("<polyline") >= 4
