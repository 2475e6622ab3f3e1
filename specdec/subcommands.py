"""Subcommands beyond `generate`, each registered by the module that implements it."""

from __future__ import annotations


def register(sub) -> None:
    from . import ngram_cli, verify_cli
    from .bench import cli as bench_cli
    from .server import cli as server_cli
    from .training import cli as training_cli

    ngram_cli.register(sub)
    bench_cli.register(sub)
    verify_cli.register(sub)
    server_cli.register(sub)
    training_cli.register(sub)
