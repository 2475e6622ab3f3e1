"""Options several subcommands share, with their defaults read from the config dataclasses."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..config import BACKENDS, BUILTIN_TARGETS, DRAFTER_SYNTAX, WEIGHTS, SamplingParams, SpecConfig
from ..errors import SpecdecError

SAMPLING, SPEC = SamplingParams(), SpecConfig()


def gamma(text: str):
    """--gamma's type: 'auto' or an integer >= 0."""
    try:
        return SpecConfig.parse_gamma(text)
    except SpecdecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def comma_list(cast=str):
    """A type for comma-separated lists, each item converted by `cast`."""
    def parse(text: str) -> list:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("give a comma-separated list")
        try:
            return [cast(t) for t in items]
        except (ValueError, SpecdecError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def add_target(parser: argparse.ArgumentParser, what: str = "target model p") -> None:
    parser.add_argument("--target", default="smollm2-135m",
                        help=f"{what}: {', '.join(BUILTIN_TARGETS)}, a .gguf file (llama, mistral, qwen2, qwen3, gemma3; "
                             "run on its own blocks), a local directory or a hub id (default: %(default)s)")


def add_model_args(parser: argparse.ArgumentParser, drafter: bool = True, repeat_drafter: bool = False) -> None:
    """--target, --drafter, --dtype, --device, --backend."""
    add_target(parser)
    if repeat_drafter:
        parser.add_argument("--drafter", action="append", default=[], metavar="DRAFTER",
                            help=f"how drafts are made: {DRAFTER_SYNTAX}; repeatable (default: prompt-lookup)")
    elif drafter:
        parser.add_argument("--drafter", default="auto", metavar="DRAFTER",
                            help=f"how drafts are made: {DRAFTER_SYNTAX} (default: %(default)s)")
    add_dtype(parser)
    parser.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    parser.add_argument("--backend", default="auto", choices=BACKENDS,
                        help="forward pass: auto (lean where the architecture is known), lean, transformers")
    parser.add_argument("--weights", default="auto", choices=WEIGHTS,
                        help="the target's linear layers: gguf (a built-in target's own 4/8-bit GGUF blocks, float32 "
                             "activations: the float model's exact weights), gguf-int8 (activations quantised to "
                             "int8 per 32 as llama.cpp does: faster, perplexity +0-0.5 %%), float (dequantised, in --dtype), "
                             "auto (gguf-int8 where measured faster, with --dtype auto and the lean backend: the "
                             "blocks repacked at load for AVX2, AVX-512 VNNI or AMX-INT8, whichever the CPU has; "
                             "default); q8_0, q4_0: any model the lean backend runs, its float weights quantised at "
                             "load to llama.cpp's Q8_0 or Q4_0 blocks, times int8 activations (a quantised model, "
                             "~3-6x faster on a CPU than float32)")


def add_dtype(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", default="auto",
                        help="auto (bfloat16 where the CPU has fast bf16, else float32), bfloat16, float32, float16")


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    """The fields of SamplingParams and SpecConfig a request sets."""
    parser.add_argument("--temperature", type=float, default=SAMPLING.temperature, help="0 = greedy (default: %(default)s)")
    parser.add_argument("--top-k", type=int, default=SAMPLING.top_k, help="keep the k most likely tokens; 0 = off")
    parser.add_argument("--top-p", type=float, default=SAMPLING.top_p, help="nucleus sampling mass in (0, 1]")
    parser.add_argument("--seed", type=int, default=SAMPLING.seed,
                        help="seed of the request's random generator; a seeded sampled generation draws every token "
                             "by noise keyed by (seed, position), so its output does not depend on the drafter or gamma")
    parser.add_argument("--gamma", type=gamma, default=SPEC.gamma,
                        help="draft tokens per round: an integer (0 = plain decoding) or auto (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=SPEC.max_new_tokens, help="default: %(default)s")


def check_sampling_args(args: argparse.Namespace) -> None:
    """Fail on bad sampling flags before any model is loaded."""
    SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    SpecConfig(gamma=args.gamma, max_new_tokens=args.max_new_tokens)


def port(text: str) -> int:
    """--port's type: a TCP port, 1..65535."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a whole number from 1 to 65535, got {text!r}")
    return value


def _make_directory(directory: Path, what: str, flag: str) -> None:
    """Create `directory` (and its parents) and check it can be written into; `what` names it in the errors."""
    if directory.exists() and not directory.is_dir():
        raise SpecdecError(f"{what} {directory} is a file, not a directory: choose another {flag}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecdecError(f"cannot create {what} {directory}: {exc.strerror}; choose another {flag}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise SpecdecError(f"cannot write into {what} {directory}: permission denied; choose another {flag}")


def output_directory(path: str, flag: str = "--out") -> Path:
    """Create `path` (and its parents) now, before minutes of work whose results would have nowhere to go."""
    out = Path(path)
    _make_directory(out, flag, flag)
    return out


def output_file(path: str, flag: str = "--out") -> Path:
    """Check that the file `path` can be written (its directory created if missing) before the work that fills it."""
    out = Path(path)
    if out.is_dir():
        raise SpecdecError(f"{flag} {out} is a directory: give the path of a file to write")
    _make_directory(out.parent, f"{flag}'s directory", flag)
    if out.exists() and not os.access(out, os.W_OK):
        raise SpecdecError(f"cannot overwrite {flag} {out}: permission denied; choose another {flag}")
    return out
