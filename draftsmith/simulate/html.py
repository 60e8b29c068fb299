"""The token timing page: one self-contained HTML file (inline CSS, JS and SVG; no network access).

Two panes stream tokens as a user would see them: plain decoding commits one token per plain step;
the speculative pane commits a burst per speculative step, its length drawn from the acceptance
rates (token i+1 of a draft is kept with probability a_{i+1} once tokens 1..i were). Below them,
three SVG plots: speedup against batch, against k, and against tau (with the naive speedup = tau
line). The plots are drawn here in Python, so they exist without JavaScript; the streams need it.
"""

from __future__ import annotations

import html
import json
import math

_TEXT = (
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        yield a\n        a, b = b, a + b\n\n"
    "Speculative decoding lets a small drafter propose several tokens, and the target model checks "
    "all of them in one forward pass. Every accepted token is exactly the token the target would have "
    "produced on its own, so the text is unchanged; only the time it takes to appear is different. "
    "When decoding is limited by memory bandwidth, verifying a handful of tokens costs about as much "
    "as generating one, which is where the speedup comes from. "
) * 3


def _svg_plot(
    pid: str,
    title: str,
    xlabel: str,
    series: list[tuple[str, str, list[tuple[float, float]]]],
    mark_x: float | None = None,
    log2_x: bool = False,
) -> str:
    """A small line plot; series = [(label, colour, [(x, y), ...])]; `log2_x` spaces x by powers of 2."""
    w, h, left, right, top, bottom = 420, 260, 48, 12, 28, 40
    pts = [p for _, _, s in series for p in s]
    if not pts:
        return f'<svg class="plot" id="{pid}" width="{w}" height="{h}"></svg>'
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y1 = max(max(p[1] for p in pts) * 1.1, 1.2)
    x1 = x1 if x1 > x0 else x0 + 1

    def tx(x: float) -> float:
        return math.log2(x) if log2_x else x

    x0, x1 = tx(x0), tx(x1)
    x1 = x1 if x1 > x0 else x0 + 1

    def sx(x: float) -> float:
        return left + (tx(x) - x0) / (x1 - x0) * (w - left - right)

    def sy(y: float) -> float:
        return top + (1 - y / y1) * (h - top - bottom)

    out = [
        f'<svg class="plot" id="{pid}" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img">',
        f'<text x="{w / 2}" y="16" text-anchor="middle" class="title">{html.escape(title)}</text>',
        f'<line x1="{left}" y1="{sy(0)}" x2="{w - right}" y2="{sy(0)}" class="axis"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{sy(0)}" class="axis"/>',
        f'<line x1="{left}" y1="{sy(1)}" x2="{w - right}" y2="{sy(1)}" class="one"/>',
        f'<text x="{w / 2}" y="{h - 6}" text-anchor="middle">{html.escape(xlabel)}</text>',
        f'<text x="12" y="{top + (h - top - bottom) / 2}" transform="rotate(-90 12 {top + (h - top - bottom) / 2})" '
        'text-anchor="middle">speedup</text>',
    ]
    for i in range(5):
        y = y1 * i / 4
        out.append(f'<text x="{left - 4}" y="{sy(y) + 4}" text-anchor="end" class="tick">{y:.1f}x</text>')
    xs = sorted({p[0] for p in pts})
    step = max(1, len(xs) // 8)
    for x in xs[::step]:
        out.append(f'<text x="{sx(x)}" y="{sy(0) + 14}" text-anchor="middle" class="tick">{x:g}</text>')
    if mark_x is not None:
        out.append(f'<line x1="{sx(mark_x)}" y1="{top}" x2="{sx(mark_x)}" y2="{sy(0)}" class="mark"/>')
    for j, (label, colour, s) in enumerate(series):
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2" class="series"/>'
        )
        out.append(
            f'<text x="{w - right - 4}" y="{top + 14 * (j + 1)}" text-anchor="end" fill="{colour}">'
            f"{html.escape(label)}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def render_page(summary: dict, sweeps: dict) -> str:
    """summary: model, hardware, drafter, batch, k, tau, baseline_tok_s, spec_tok_s, speedup,
    baseline_step_s, spec_step_s, accept_probs. sweeps: batch/k/tau -> [(x, speedup)], tau also
    'naive'."""
    plots = [
        _svg_plot(
            "plot-batch",
            "speedup vs batch",
            "batch (concurrent requests)",
            [("simulated", "#1f77b4", sweeps["batch"])],
            mark_x=summary["batch"],
            log2_x=True,
        ),
        _svg_plot(
            "plot-k",
            f"speedup vs k (batch {summary['batch']})",
            "k (drafted tokens per step)",
            [("simulated", "#1f77b4", sweeps["k"])],
            mark_x=summary["k"] or None,
        ),
        _svg_plot(
            "plot-tau",
            f"speedup vs tau (k {summary['k']}, batch {summary['batch']})",
            "tau (acceptance length)",
            [("simulated", "#1f77b4", sweeps["tau"]), ("naive = tau", "#d62728", sweeps["naive"])],
            mark_x=summary["tau"],
        ),
    ]
    data = json.dumps({**summary, "text": _TEXT})
    title = f"{summary['model']} on {summary['hardware']}: token timing"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 20px; color: #222; }}
.streams {{ display: flex; gap: 16px; }}
.pane {{ flex: 1; border: 1px solid #ccc; border-radius: 6px; padding: 8px; }}
.pane h2 {{ font-size: 15px; margin: 0 0 6px 0; }}
.stream {{ font-family: ui-monospace, monospace; font-size: 13px; white-space: pre-wrap; height: 260px;
  overflow: hidden; background: #fafafa; padding: 6px; }}
.stats {{ font-size: 13px; color: #555; margin-top: 4px; }}
.plots {{ display: flex; flex-wrap: wrap; gap: 12px; margin-top: 18px; }}
svg text {{ font-size: 11px; }} svg .title {{ font-size: 13px; font-weight: 600; }}
.axis {{ stroke: #444; }} .one {{ stroke: #bbb; stroke-dasharray: 3 3; }} .mark {{ stroke: #999; stroke-dasharray: 2 4; }}
.burst {{ background: #d9ecff; }}
</style></head><body>
<h1 style="font-size:18px">{html.escape(title)}</h1>
<p id="summary">{html.escape(summary["drafter"])}, batch {summary["batch"]}, k {summary["k"]}, tau {summary["tau"]:.2f}:
plain {summary["baseline_tok_s"]:.1f} tok/s per request, speculative {summary["spec_tok_s"]:.1f} tok/s per request,
speedup {summary["speedup"]:.2f}x (naive estimate {summary["tau"]:.2f}x). Shown in real time.</p>
<div class="streams">
 <div class="pane"><h2>Plain decoding</h2><div class="stream" id="stream-baseline"></div>
  <div class="stats" id="stats-baseline"></div></div>
 <div class="pane"><h2>Speculative decoding</h2><div class="stream" id="stream-spec"></div>
  <div class="stats" id="stats-spec"></div></div>
</div>
<div class="plots">{"".join(plots)}</div>
<script>
const D = {data};
const words = D.text.match(/\\s*\\S+|\\s+/g);
let seed = 12345;
function rand() {{ seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648; }}
function burst() {{
  let n = 1;  // the target's own token
  for (const a of D.accept_probs) {{ if (rand() < a) n += 1; else break; }}
  return n;
}}
function makeStream(id, stepSeconds, tokensPerStep) {{
  // Steps happen at their simulated times; a 30 ms timer catches up with the wall clock, so even
  // sub-millisecond steps stream at their true rate.
  const el = document.getElementById(id), stats = document.getElementById('stats-' + id.split('-')[1]);
  const start = performance.now();
  let pos = 0, steps = 0;
  function emit() {{
    const n = tokensPerStep(), span = document.createElement('span');
    if (n > 1) span.className = 'burst';
    const at = pos % words.length;
    span.textContent = words.slice(at, at + n).join('');
    el.appendChild(span); pos += n; steps += 1;
    if (el.childNodes.length > 400) el.removeChild(el.firstChild);
  }}
  function tick() {{
    const t = (performance.now() - start) / 1000;
    let budget = 2000;  // at most this many steps per tick (a background tab wakes up late)
    while ((steps + 1) * stepSeconds <= t && budget-- > 0) emit();
    el.scrollTop = el.scrollHeight;
    const shown = Math.max(steps * stepSeconds, 1e-9);
    stats.textContent = pos + ' tokens in ' + shown.toFixed(2) + ' s (' + (pos / shown).toFixed(1) + ' tok/s, '
      + steps + ' steps)';
  }}
  emit();
  tick();
  setInterval(tick, 30);
}}
makeStream('stream-baseline', D.baseline_step_s, () => 1);
makeStream('stream-spec', D.spec_step_s, D.accept_probs.length ? burst : () => 1);
</script>
</body></html>
"""
