"""Subcommands beyond `generate`, each registered by the module that implements it."""

from __future__ import annotations


def register(sub) -> None:
    from . import ngram_cli

    ngram_cli.register(sub)
