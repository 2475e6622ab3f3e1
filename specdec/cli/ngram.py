"""`specdec ngram fit`: fit an n-gram drafter table on text on the machine or on the target's own outputs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import SpecdecError
from .options import add_dtype, add_target, output_file


def corpus_texts(name: str, limit: int, seed: int) -> list[str]:
    """Texts of a named corpus (gettext, man, stdlib) or the lines of a text file."""
    from ..tasks import corpus

    if name == "gettext":
        messages = corpus.gettext_messages()
        return [m.english + "\n" + m.german for m in messages[:limit]]
    if name == "man":
        return [text for _, text in corpus.man_pages(limit, seed=seed)]
    if name == "stdlib":
        return [source for _, source in corpus.stdlib_functions()[:limit]]
    path = Path(name)
    if not path.is_file():
        raise SpecdecError(f"corpus {name!r} is neither gettext, man, stdlib nor a readable text file")
    return [path.read_text(encoding="utf-8", errors="replace")]


def fit_table(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..drafters import NGramTable
    from ..models import load_model, tokenizer_fingerprint

    if args.n < 2:
        raise SpecdecError(f"--n must be >= 2 (2 = bigram), got {args.n}")
    if args.top_k < 1:
        raise SpecdecError(f"--top-k must be >= 1, got {args.top_k}")
    output_file(args.out)  # before the fit, whose table must have somewhere to go
    target = load_model(args.target, args.dtype)
    sequences, sources = [], []
    for name in args.corpus:
        texts = corpus_texts(name, args.limit, args.seed)
        sequences += [target.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        sources.append(f"{name}:{len(texts)}")
    if args.from_target:
        from ..api import SpecDec
        from ..tasks.prompts import task_prompts

        sd = SpecDec(target=args.target, drafter="none", dtype=args.dtype)
        prompts = [p for task in ("chat", "summarise", "code", "translate")
                   for p in task_prompts(task, args.from_target, args.seed + 1)]
        for prompt in tqdm(prompts, desc="sampling the target", file=sys.stderr):
            out = sd.generate(prompt.text, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              seed=args.seed, gamma=0)
            sequences.append(out.token_ids)
        sources.append(f"target-outputs:{len(prompts)}@T={args.temperature}")
    if not sequences:
        raise SpecdecError("nothing to fit on: give --corpus NAME and/or --from-target N")
    table = NGramTable.fit(sequences, n=args.n, tokenizer_id=tokenizer_fingerprint(target.tokenizer),
                           source=",".join(sources), top_k=args.top_k)
    table.save(args.out)
    size = sum(len(t) for t in table.successors.values())
    print(f"wrote {args.out}: {args.n}-gram table, {size} contexts, from {', '.join(sources)}", file=sys.stderr)
    return 0


def register(sub) -> None:
    ngram = sub.add_parser("ngram", help="n-gram drafter tables")
    ngram_sub = ngram.add_subparsers(dest="ngram_command", required=True)
    fit = ngram_sub.add_parser("fit", help="fit a table on text and/or on the target's own outputs")
    add_target(fit, "the target whose tokenizer the table uses")
    fit.add_argument("--corpus", action="append", default=[],
                     help="gettext, man, stdlib or a text file; repeatable")
    fit.add_argument("--from-target", type=int, default=0, metavar="N",
                     help="also fit on the target's own answers to N prompts per task")
    fit.add_argument("--temperature", type=float, default=0.0, help="for --from-target (default: %(default)s)")
    fit.add_argument("--max-new-tokens", type=int, default=128)
    fit.add_argument("--n", type=int, default=2, help="2 = bigram (default), 3 = trigram with bigram back-off, ...")
    fit.add_argument("--top-k", type=int, default=4,
                     help="successors kept per context, the branches ngram-tree may draft (default: %(default)s)")
    fit.add_argument("--limit", type=int, default=2000, help="texts per corpus (default: %(default)s)")
    fit.add_argument("--seed", type=int, default=0)
    add_dtype(fit)
    fit.add_argument("--out", required=True, help="the .npz file to write")
    fit.set_defaults(handler=fit_table)
