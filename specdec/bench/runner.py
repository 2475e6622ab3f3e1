"""The benchmark run: task x drafter x temperature x gamma, against plain decoding on the same
prompts with the same seeds, in an order shuffled per prompt so machine drift hits every method
alike. One row per (task, drafter, temperature, gamma); per-prompt speedups give the median and the
spread."""

from __future__ import annotations

import json
import random
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..config import SamplingParams, SpecConfig
from ..decoding import theory
from ..decoding.engine import SpeculativeEngine
from ..drafters import parse_drafter
from ..errors import SpecdecError
from ..plan import make_plan
from ..tasks.prompts import TASKS, Prompt, load_prompts_file, task_prompts
from .peers import LLAMA_SERVER_SPECS, LlamaCpp, LlamaServer, hf_generate, llama_cpp_available, llama_server_binary
from .provenance import stamp

PEERS = ("hf", "llama.cpp", "llama-server")
DEFAULT_PEERS = ("hf", "llama.cpp")
"""llama-server is measured only when asked for: it needs a binary built apart (docs/usage.md)."""


@dataclass
class BenchConfig:
    target: str = "smollm2-135m"
    drafters: list[str] = field(default_factory=lambda: ["prompt-lookup"])
    """Drafter specs: prompt-lookup, ngram:FILE, model:NAME_OR_DIR."""
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0])
    gammas: list = field(default_factory=lambda: [1, 2, 4, 8, "auto"])
    prompts_per_task: int = 3
    prompts_file: str | None = None
    max_new_tokens: int = 128
    seed: int = 0
    dtype: str = "auto"
    backend: str = "auto"
    """auto (lean where known), lean or transformers: the forward pass specdec's rows run on."""
    weights: str = "auto"
    """auto, gguf, gguf-int8 or float (config.WEIGHTS): a built-in target's linear layers on its GGUF
    blocks or float weights (auto is float when a self-q4 drafter is benchmarked)."""
    peers: tuple[str, ...] = DEFAULT_PEERS
    """Peers to run beside specdec: "hf" (transformers' generate(): plain, prompt lookup, assisted),
    "llama.cpp" (llama-cpp-python on the target's GGUF file: plain, prompt lookup; needs the `llama-cpp`
    extra) and "llama-server" (llama.cpp's server on that file: plain, its n-gram speculation, a draft
    model; needs its binary)."""
    threads: int | None = None
    """Threads for llama.cpp (default: torch's)."""
    coupled: bool = False
    """Also run each drafter at T > 0 with drafter-invariant sampling (method "NAME+coupled"), the
    server's rule for seeded requests: what its coupling costs in acceptance against rejection
    sampling's."""


class BenchInterrupted(Exception):
    """A bench stopped part-way, by an error or Ctrl-C: `rows`, the rows of the runs it finished (those
    whose plain run it has, for the speedups), and `cause`."""

    def __init__(self, rows: list[dict], cause: BaseException):
        super().__init__(str(cause))
        self.rows, self.cause = rows, cause


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _summary(values: list[float]) -> dict:
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def collect_prompts(config: BenchConfig) -> list[Prompt]:
    if config.prompts_file:
        return load_prompts_file(config.prompts_file)
    return [p for task in config.tasks for p in task_prompts(task, config.prompts_per_task, config.seed)]


def run_bench(config: BenchConfig, progress=None, log=None) -> list[dict]:
    """Run everything; returns rows (also the input of the table and plots). `log` takes notes for
    the user (default: stderr)."""
    log = log or (lambda message: print(f"specdec: {message}", file=sys.stderr))
    plan = make_plan(config.target, config.drafters, config.dtype, config.weights, config.backend)
    target = plan.load()
    prompts = collect_prompts(config)
    if not target.has_chat_template and any(p.follow_up for p in prompts):  # checked before minutes of runs
        prompts = [p for p in prompts if not p.follow_up]
        why = f"the multi-turn task needs a chat template and {config.target!r} has none (a base model)"
        if not prompts:
            raise SpecdecError(f"{why}: choose other --tasks")
        log(f"{why}: skipped")
    backend = plan.target_pass(target)
    eos = target.eos_token_ids
    plain_engine = SpeculativeEngine(backend, None, eos)
    engines = {}
    for spec in config.drafters:
        kind, arg = parse_drafter(spec)
        drafter = plan.drafter(spec, target, backend)
        engines[spec] = (SpeculativeEngine(backend, drafter, eos), drafter, kind, arg)
    encode = target.encode

    # Warm-up: thread pools and allocator, so the first measured run is not penalised.
    plain_engine.generate(encode("Hello"), SamplingParams(), SpecConfig(gamma=0, max_new_tokens=4)).run()

    methods = [("plain", None, 0)] + [(spec, spec, g) for spec in config.drafters for g in config.gammas]
    if config.coupled:
        methods += [(f"{spec}+coupled", spec, g) for spec in config.drafters for g in config.gammas]
    if "hf" in config.peers:
        methods += [("hf-generate", "hf", None), ("hf-prompt-lookup", "hf-pl", None)]
        methods += [(f"hf-assisted:{spec}", f"hf-assist:{spec}", None) for spec in config.drafters
                    if parse_drafter(spec)[0] == "model"]
    if "llama.cpp" in config.peers and llama_cpp_available() and target.gguf is not None:
        import torch

        threads = config.threads or torch.get_num_threads()
        for name, lookup in (("llama.cpp", False), ("llama.cpp-prompt-lookup", True)):
            engines[name] = (LlamaCpp(target.gguf, threads, prompt_lookup=lookup), None, name, None)
            methods.append((name, name, None))
    if "llama-server" in config.peers and target.gguf is not None:
        import torch

        binary = llama_server_binary()
        if binary is None:
            raise SpecdecError("the llama-server peer needs llama.cpp's llama-server: put it on PATH or set "
                               "SPECDEC_LLAMA_SERVER (how to build it: docs/usage.md), or drop it from --peers")
        threads = config.threads or torch.get_num_threads()
        specs = dict(LLAMA_SERVER_SPECS)
        drafts = [arg for spec in config.drafters for kind, arg in [parse_drafter(spec)] if kind == "model"
                  and arg and arg.lower().endswith(".gguf")]
        if drafts:
            specs["llama-server-draft"] = ["--spec-draft-model", drafts[0], "--spec-type", "draft-simple"]
        for name, spec_args in specs.items():
            if log:
                log(f"starting {name} on {target.gguf.name}")
            engines[name] = (LlamaServer(binary, target.gguf, threads, spec_args), None, name, None)
            methods.append((name, name, None))
    runs: list[dict] = []
    coupled = sum(name.endswith("+coupled") for name, _, _ in methods)
    total = len(prompts) * sum(len(methods) - (coupled if t == 0 else 0) for t in config.temperatures)
    try:
        for p_index, prompt in enumerate(prompts):
            if prompt.follow_up:  # the first turn's answer is the target's own (greedy, not timed)
                first = plain_engine.generate(encode(prompt.text), SamplingParams(),
                                              SpecConfig(gamma=0, max_new_tokens=config.max_new_tokens)).run()
                ids = encode(prompt.messages(target.tokenizer.decode(first.tokens, skip_special_tokens=True)))
            else:
                ids = encode(prompt.text)
            for temperature in config.temperatures:
                sampling = SamplingParams(temperature=temperature, seed=config.seed * 100003 + p_index)
                order = list(methods)
                random.Random(f"{config.seed}:{p_index}:{temperature}").shuffle(order)
                for name, key, gamma in order:
                    if name.endswith("+coupled"):
                        if temperature == 0:  # greedy is greedy: nothing to couple
                            continue
                        run_sampling = replace(sampling, drafter_invariant=True)
                    else:
                        run_sampling = sampling
                    runs.append(_run_one(name, key, gamma, prompt, p_index, ids, run_sampling, config, plain_engine,
                                         engines, target, eos))
                    if progress:
                        progress(len(runs), total, f"{prompt.task} T={temperature} {name} γ={gamma}")
    except (SpecdecError, KeyboardInterrupt) as error:  # what finished is kept: minutes of runs are not lost
        with_plain = {_prompt_run(r) for r in runs if r["method"] == "plain"}
        raise BenchInterrupted(aggregate([r for r in runs if _prompt_run(r) in with_plain], config), error) from error
    finally:
        for engine, *_ in engines.values():
            if isinstance(engine, LlamaServer):
                engine.close()
    return aggregate(runs, config)


def _run_one(name, key, gamma, prompt, p_index, ids, sampling, config, plain_engine, engines, target, eos) -> dict:
    base = {"method": name, "task": prompt.task, "prompt_index": p_index, "temperature": sampling.temperature,
            "gamma": gamma, "seed": sampling.seed, "started": time.time()}
    if key is not None and isinstance(engines.get(key, (None,))[0], LlamaServer):
        # the server times its decoding apart from its prefill: both rates compare with specdec's own
        tokens, seconds, decode_seconds = engines[key][0].generate(ids, sampling, config.max_new_tokens, eos)
        e2e = len(tokens) / seconds if seconds else None
        tps = len(tokens) / decode_seconds if decode_seconds else e2e
        return {**base, "tokens": tokens, "seconds": decode_seconds or seconds, "tps": tps, "e2e_tps": e2e,
                "includes_prefill": decode_seconds is None,
                "peak_rss_mb": engines[key][0].peak_rss_mb() or _peak_rss_mb()}
    if key is not None and isinstance(engines.get(key, (None,))[0], LlamaCpp):
        tokens, seconds = engines[key][0].generate(ids, sampling, config.max_new_tokens, eos)
        tps = len(tokens) / seconds if seconds else None
        return {**base, "tokens": tokens, "seconds": seconds, "tps": tps, "e2e_tps": tps, "includes_prefill": True,
                "peak_rss_mb": _peak_rss_mb()}
    if key is None or key in engines:
        engine = plain_engine if key is None else engines[key][0]
        engine.target.reset()  # every run prefills its prompt: end-to-end times stay comparable
        run = engine.generate(ids, sampling, SpecConfig(gamma=gamma, max_new_tokens=config.max_new_tokens)).run()
        s = run.stats
        e2e = s.prefill_seconds + s.decode_seconds
        return {**base, "tokens": run.tokens, "seconds": s.decode_seconds, "tps": s.tokens_per_second,
                "e2e_tps": s.new_tokens / e2e if e2e else None,
                "target_calls": s.target_calls, "drafted": s.drafted, "accepted": s.accepted, "rejections": s.rejections,
                "beta_sum": s.beta_sum, "beta_count": s.beta_count, "draft_seconds": s.draft_seconds,
                "target_seconds": s.target_seconds, "rounds_with_draft": s.rounds_with_draft, "path": s.path,
                "peak_rss_mb": _peak_rss_mb()}
    extra = {}
    if key == "hf-pl":
        extra = {"prompt_lookup_num_tokens": 10}
    elif key.startswith("hf-assist:"):
        extra = {"assistant_model": engines[key.removeprefix("hf-assist:")][1].backend.model}
    tokens, seconds = hf_generate(target.model, ids, sampling, config.max_new_tokens, eos, **extra)
    tps = len(tokens) / seconds if seconds else None  # generate() prefills too: decoding and end to end alike
    return {**base, "tokens": tokens, "seconds": seconds, "tps": tps, "e2e_tps": tps, "includes_prefill": True,
            "peak_rss_mb": _peak_rss_mb()}


def _prompt_run(run: dict) -> tuple:
    """Which prompt at which temperature a run answered: the runs compared with one plain run."""
    return run["task"], run["prompt_index"], run["temperature"]


def aggregate(runs: list[dict], config: BenchConfig) -> list[dict]:
    """Rows per (task, method, temperature, gamma), speedups taken per prompt against plain."""
    plain = {_prompt_run(r): r for r in runs if r["method"] == "plain"}
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["task"], r["method"], r["temperature"], str(r["gamma"])), []).append(r)
    rows = []
    measured_on = stamp()
    for (task, method, temperature, gamma), items in groups.items():
        base = [plain[_prompt_run(r)] for r in items]
        # a peer's time includes its prefill: it is compared with plain decoding's end-to-end rate
        rate = "e2e_tps" if items[0].get("includes_prefill") else "tps"
        speedups = [r["tps"] / b[rate] for r, b in zip(items, base) if r["tps"] and b.get(rate)]
        e2e = [r["e2e_tps"] for r in items if r.get("e2e_tps")] or [0.0]
        row = {"task": task, "method": method, "temperature": temperature, "gamma": gamma, "prompts": len(items),
               "tokens_per_s": statistics.median([r["tps"] for r in items if r["tps"]] or [0.0]),
               "e2e_tokens_per_s": statistics.median(e2e), "e2e_tokens_per_s_range": [min(e2e), max(e2e)],
               "speedup": _summary(speedups), "peak_rss_mb": max(r["peak_rss_mb"] for r in items),
               "new_tokens": sum(len(r["tokens"]) for r in items)}
        if items[0].get("path"):
            row["path"] = items[0]["path"]
        row.update(target=config.target, **measured_on)
        if temperature == 0:
            row["identical_to_plain"] = sum(r["tokens"] == b["tokens"] for r, b in zip(items, base))
        if "drafted" in items[0] and method != "plain":
            drafted = sum(r["drafted"] for r in items)
            accepted = sum(r["accepted"] for r in items)
            tested = accepted + sum(r["rejections"] for r in items)
            calls = sum(r["target_calls"] for r in items)
            rounds = sum(r["rounds_with_draft"] for r in items)
            beta_count = sum(r["beta_count"] for r in items)
            target_step = sum(r["target_seconds"] for r in items) / calls
            plain_step = sum(b["target_seconds"] for b in base) / sum(b["target_calls"] for b in base)
            alpha = accepted / tested if tested else None
            c = (sum(r["draft_seconds"] for r in items) / drafted) / target_step if drafted else None
            mean_gamma = drafted / rounds if rounds else None
            row.update({
                "alpha": alpha, "beta": sum(r["beta_sum"] for r in items) / beta_count if beta_count else None,
                "tau": sum(len(r["tokens"]) for r in items) / calls, "c": c, "mean_gamma": mean_gamma,
                "verify_cost": target_step / plain_step,
                "predicted_speedup": theory.walltime_improvement(alpha, round(mean_gamma), c)
                if alpha is not None and mean_gamma else None,
                "predicted_speedup_measured_cost": theory.walltime_improvement(
                    alpha, round(mean_gamma), c, target_step / plain_step) if alpha is not None and mean_gamma else None,
            })
        rows.append(row)
    rows.sort(key=lambda r: (r["task"], r["temperature"], r["method"] != "plain", r["method"], str(r["gamma"])))
    return rows


def write_rows(rows: list[dict], path: Path) -> None:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
