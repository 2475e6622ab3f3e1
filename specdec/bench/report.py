"""Bench output: a Markdown table shaped like the paper's Table 2, PNG plots, and the report across runs
(`specdec bench --report DIR`: one table per CPU kind, each row naming the commit it measured)."""

from __future__ import annotations

import json
from pathlib import Path

from ..decoding import theory
from ..errors import SpecdecError


def _f(x, spec=".2f") -> str:
    return "–" if x is None else format(x, spec)


def markdown_table(rows: list[dict]) -> str:
    """Task, method (drafter), T, γ, α, τ, c, verify cost, measured speedup (median, min–max),
    Theorem 3.8's prediction, tok/s (decoding; end to end with the prompt's prefill), identical greedy
    outputs, peak memory."""
    head = ("| task | method | T | γ | α | τ | c | verify cost | speedup (median, min–max) | predicted (Thm 3.8) "
            "| predicted w/ verify cost | tok/s | tok/s end to end | identical@T=0 | peak RSS MB |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        s = r["speedup"]
        ident = f"{r['identical_to_plain']}/{r['prompts']}" if "identical_to_plain" in r else "–"
        lines.append(
            f"| {r['task']} | {r['method']} | {r['temperature']:g} | {r['gamma'] if r['gamma'] != 'None' else '–'} "
            f"| {_f(r.get('alpha'))} | {_f(r.get('tau'))} | {_f(r.get('c'), '.3f')} | {_f(r.get('verify_cost'))} "
            f"| {_f(s['median'])}× ({_f(s['min'])}–{_f(s['max'])}) | {_f(r.get('predicted_speedup'))}× "
            f"| {_f(r.get('predicted_speedup_measured_cost'))}× | {_f(r['tokens_per_s'], '.1f')} "
            f"| {_f(r.get('e2e_tokens_per_s'), '.1f')} | {ident} "
            f"| {r['peak_rss_mb']:.0f} |")
    paths = sorted({r["path"] for r in rows if r.get("path")})
    if paths:  # which arithmetic specdec's rows ran (e.g. lean+gguf-int8: the GGUF blocks, int8 activations)
        lines += ["", f"specdec ran on: {', '.join(paths)}"]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], out_dir: Path) -> list[Path]:
    """speedup_vs_gamma.png (per drafter, task and T, with the Theorem 3.8 curve through the
    measured α and c) and alpha.png (α per task and temperature, per drafter)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    spec_rows = [r for r in rows if r.get("alpha") is not None]
    tasks = sorted({r["task"] for r in spec_rows})
    temps = sorted({r["temperature"] for r in spec_rows})
    methods = sorted({r["method"] for r in spec_rows})
    colors = {m: plt.cm.tab10(i % 10) for i, m in enumerate(methods)}
    fig, axes = plt.subplots(len(temps) or 1, len(tasks) or 1, figsize=(3.6 * max(len(tasks), 1), 3.2 * max(len(temps), 1)),
                             squeeze=False, sharey=True)
    for ti, temperature in enumerate(temps):
        for ki, task in enumerate(tasks):
            ax = axes[ti][ki]
            for method in methods:
                items = [r for r in spec_rows if (r["task"], r["temperature"], r["method"]) == (task, temperature, method)]
                fixed = sorted((int(r["gamma"]), r) for r in items if r["gamma"].isdigit())
                color = colors[method]
                if fixed:
                    ax.plot([g for g, _ in fixed], [r["speedup"]["median"] for _, r in fixed], "o-", color=color,
                            label=method)
                    alpha = sum(r["alpha"] for _, r in fixed) / len(fixed)
                    c = sum(r["c"] or 0.0 for _, r in fixed) / len(fixed)
                    grid = list(range(1, max(g for g, _ in fixed) + 1))
                    ax.plot(grid, [theory.walltime_improvement(alpha, g, c) for g in grid], "--", color=color, alpha=0.6)
                for r in items:
                    if r["gamma"] == "auto" and r.get("mean_gamma"):
                        ax.plot([r["mean_gamma"]], [r["speedup"]["median"]], "*", markersize=11, color=color)
            ax.axhline(1.0, color="gray", linewidth=0.8)
            ax.set_title(f"{task}, T={temperature:g}", fontsize=9)
            if ti == len(temps) - 1:
                ax.set_xlabel("γ (★ = auto at its mean γ)", fontsize=8)
            if ki == 0:
                ax.set_ylabel("speedup over plain", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Measured speedup (solid, median over prompts) vs Theorem 3.8 at the measured α, c (dashed)", fontsize=10)
    fig.tight_layout()
    paths.append(out_dir / "speedup_vs_gamma.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    bars = sorted({(r["method"], r["task"], r["temperature"]): r["alpha"] for r in spec_rows if r["gamma"] == "auto"
                   or not any(x["gamma"] == "auto" for x in spec_rows)}.items())
    labels = [f"{m}\n{t} T={temp:g}" for (m, t, temp), _ in bars]
    ax.bar(range(len(bars)), [a for _, a in bars], color=[plt.cm.tab10(0 if k[2] == 0 else 1) for k, _ in bars])
    ax.set_xticks(range(len(bars)), labels, fontsize=7, rotation=45, ha="right")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=plt.cm.tab10(0), label="T = 0"), Patch(color=plt.cm.tab10(1), label="T > 0")],
              fontsize=8)
    ax.set_ylabel("α (accepted / (accepted + rejections))")
    ax.set_ylim(0, 1)
    ax.set_title("Acceptance rate per task, drafter and temperature")
    fig.tight_layout()
    paths.append(out_dir / "alpha.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def read_runs(directories: list[Path]) -> list[dict]:
    """Every row of every rows.jsonl file in (or below) `directories`, or a SpecdecError naming what is
    missing or unreadable."""
    rows = []
    for directory in directories:
        if not directory.exists():
            raise SpecdecError(f"{directory} does not exist: give the --out directory of a bench run")
        files = [directory] if directory.is_file() else sorted(directory.rglob("rows.jsonl"))
        if not files:
            raise SpecdecError(f"{directory}: no rows.jsonl in it or below it (specdec bench --out DIR writes one)")
        for path in files:
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    row["task"], row["method"], row["speedup"]["median"]
                except (ValueError, KeyError, TypeError):
                    raise SpecdecError(f"{path}:{number}: not a bench row (expected JSON with task, method, "
                                       "speedup)") from None
                rows.append(row)
    return rows


def cross_run_report(rows: list[dict]) -> str:
    """One Markdown table per CPU kind: each drafter's rows against plain decoding on the same run, with
    the target, the compute path, the commit and the date they were measured on. Rows from before the bench
    stamped them say "unknown"."""
    by_cpu: dict[str, list[dict]] = {}
    for r in rows:
        if r["method"] != "plain":
            by_cpu.setdefault(r.get("cpu", "unknown CPU"), []).append(r)
    if not by_cpu:
        raise SpecdecError("the rows hold no speculative run (only plain decoding): nothing to report")
    out = []
    for cpu in sorted(by_cpu):
        out += [f"### {cpu}", "",
                "| target | task | method | T | γ | α | τ | speedup (median, min–max) | tok/s | path | commit | date |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(by_cpu[cpu], key=lambda r: (r.get("target", ""), r["task"], r["temperature"], r["method"],
                                                     str(r["gamma"]))):
            s = r["speedup"]
            out.append(f"| {r.get('target', 'unknown')} | {r['task']} | {r['method']} | {r['temperature']:g} "
                       f"| {r['gamma']} | {_f(r.get('alpha'))} | {_f(r.get('tau'))} "
                       f"| {_f(s['median'])}× ({_f(s['min'])}–{_f(s['max'])}) | {_f(r.get('tokens_per_s'), '.1f')} "
                       f"| {r.get('path', '–')} | {r.get('commit', 'unknown')} | {r.get('date', 'unknown')} |")
        out.append("")
    return "\n".join(out)
