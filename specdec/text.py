"""Streaming detokenisation: token ids in, newly completed text out, in time linear in the output.

Fast tokenizers use `tokenizers.decoders.DecodeStream`, which keeps a small window of ids and holds
back a partial UTF-8 character; other tokenizers use the same window by hand (the prefix/read
offsets of Hugging Face's text-generation-inference): decode the ids since a little before the
last emitted point, and emit what grew past the text those ids already gave.
"""

from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._stream = None
        if backend is not None:
            from tokenizers.decoders import DecodeStream

            self._backend, self._stream = backend, DecodeStream(skip_special_tokens=skip_special_tokens)
        self.ids: list[int] = []
        self._prefix = self._read = 0  # the window: ids[prefix:read] gave text already emitted

    def push(self, ids: list[int]) -> str:
        """Append token ids; return the text they complete ("" while a character is still partial)."""
        if self._stream is not None:
            pieces = (self._stream.step(self._backend, int(i)) for i in ids)
            return "".join(piece for piece in pieces if piece)
        self.ids.extend(ids)
        return self._window_step()

    def _window_step(self) -> str:
        decode = lambda part: self.tokenizer.decode(part, skip_special_tokens=self.skip)  # noqa: E731
        before = decode(self.ids[self._prefix : self._read])
        after = decode(self.ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return after[len(before):]
