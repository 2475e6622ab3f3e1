"""Streaming detokenisation gives exactly the full decode, whatever the chunking, on fast
tokenizers (DecodeStream) and on the windowed fallback."""

import pytest

from helpers import char_tokenizer
from specdec.text import TextStream

TEXTS = ["Hällo wörld — 日本語のテキスト 🎉🎉 and code:\n\tdef f(x):\n        return x**2  # ok",
         "  leading spaces\n\n\nend "]


def _streamed(tokenizer, ids, chunk, fallback):
    stream = TextStream(tokenizer)
    if fallback:
        stream._stream = None
    return "".join(stream.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk))


@pytest.mark.parametrize("fallback", [False, True])
def test_stream_equals_full_decode_on_the_builtin_tokenizer(fallback):
    from transformers import AutoTokenizer

    from specdec.models import model_path

    tokenizer = AutoTokenizer.from_pretrained(model_path("smollm2-135m"))
    for text in TEXTS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        for chunk in (1, 2, 5):
            assert _streamed(tokenizer, ids, chunk, fallback) == tokenizer.decode(ids, skip_special_tokens=True)


def test_stream_on_a_character_tokenizer_skips_the_end_token():
    tokenizer = char_tokenizer()
    ids = tokenizer("hello world.", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    for fallback in (False, True):
        assert _streamed(tokenizer, ids, 3, fallback) == "hello world."
