"""Peers measured in the same run: transformers' own generate() (plain, prompt lookup, assisted)."""

from __future__ import annotations

import time

import torch

from ..config import SamplingParams


def hf_sampling_kwargs(sampling: SamplingParams) -> dict:
    """generate() arguments for the same warping specdec applies (its defaults, e.g. top_k=50, off)."""
    if sampling.greedy:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": sampling.temperature, "top_k": sampling.top_k or None,
            "top_p": sampling.top_p}


@torch.inference_mode()
def hf_generate(model, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int,
                eos_token_ids: set[int], **extra) -> tuple[list[int], float]:
    """(new token ids, seconds) for one transformers generate() call."""
    if sampling.seed is not None:
        torch.manual_seed(sampling.seed)
    ids = torch.tensor([prompt_ids])
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         eos_token_id=sorted(eos_token_ids) or None, pad_token_id=next(iter(eos_token_ids), 0),
                         **hf_sampling_kwargs(sampling), **extra)
    seconds = time.perf_counter() - start
    return out[0, len(prompt_ids):].tolist(), seconds


def llama_cpp_available() -> bool:
    """Whether llama-cpp-python is installed (the optional extra `llama-cpp`; ~8 minutes to build)."""
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


class LlamaCpp:
    """llama.cpp through llama-cpp-python on the target's own GGUF file: plain decoding, or its prompt
    lookup drafting (LlamaPromptLookupDecoding, 10 tokens a draft, its default). Same prompt ids, same
    threads; each call starts from an empty cache, so the time includes the prompt's prefill."""

    def __init__(self, gguf_path, threads: int, prompt_lookup: bool = False, n_ctx: int = 8192):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        # logits_all with a draft model: llama-cpp-python 0.3.16 sizes its score buffer by the argument
        # (n_batch rows without it) and overflows past 512 positions when it drafts
        self.llm = Llama(model_path=str(gguf_path), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                         verbose=False, logits_all=prompt_lookup,
                         draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10) if prompt_lookup else None)

    def generate(self, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int,
                 eos_token_ids: set[int]) -> tuple[list[int], float]:
        """(new token ids, seconds end to end: prefill and decoding)."""
        if sampling.seed is not None:
            self.llm.set_seed(sampling.seed)
        warp = ({"temp": 0.0} if sampling.greedy else
                {"temp": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p})
        self.llm.reset()  # no prefix reuse from the previous call
        out: list[int] = []
        start = time.perf_counter()
        for token in self.llm.generate(prompt_ids, **{"top_k": 0, "top_p": 1.0, "min_p": 0.0, **warp}):
            if token in eos_token_ids:
                break
            out.append(int(token))
            if len(out) >= max_new_tokens:
                break
        return out, time.perf_counter() - start


LLAMA_SERVER_SPECS = {"llama-server": [], "llama-server-ngram-simple": ["--spec-type", "ngram-simple"],
                      "llama-server-ngram-mod": ["--spec-type", "ngram-mod"]}
"""The llama-server peers by method name: plain, and its n-gram speculation (`--spec-type`); a draft model
adds `llama-server-draft` (`--spec-draft-model FILE --spec-type draft-simple`: the file alone turns nothing on)."""


def llama_server_binary() -> str | None:
    """The llama-server to measure: SPECDEC_LLAMA_SERVER, else one on PATH (built from the llama.cpp sources the
    llama-cpp-python source package carries: docs/usage.md)."""
    import os
    import shutil

    return os.environ.get("SPECDEC_LLAMA_SERVER") or shutil.which("llama-server")


class LlamaServer:
    """llama.cpp's own llama-server on the target's GGUF file, started here on a free loopback port: its
    /completion endpoint with the same prompt ids, no prompt cache (every call prefills), timed end to end
    by the client."""

    def __init__(self, binary: str, gguf_path, threads: int, spec_args: list[str], n_ctx: int = 4096,
                 startup_seconds: float = 300.0):
        import socket
        import subprocess

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        command = [binary, "-m", str(gguf_path), "-t", str(threads), "-tb", str(threads), "-c", str(n_ctx),
                   "--host", "127.0.0.1", "--port", str(self.port), "-np", "1", "--no-webui", *spec_args]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + startup_seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.process.returncode}): {self.process.stderr.read()[-2000:]}")
            try:
                if self._get("/health").get("status") == "ok":
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.close()
        raise RuntimeError("llama-server did not answer /health in time")

    def _get(self, route: str) -> dict:
        import json
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{route}", timeout=5) as r:
            return json.loads(r.read())

    def generate(self, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int,
                 eos_token_ids: set[int]) -> tuple[list[int], float, float | None]:
        """(new tokens, seconds end to end, seconds of decoding by the server's own timings or None)."""
        import json
        import urllib.request

        body = {"prompt": list(prompt_ids), "n_predict": max_new_tokens, "cache_prompt": False, "return_tokens": True,
                "temperature": 0.0 if sampling.greedy else sampling.temperature, "top_k": sampling.top_k,
                "top_p": sampling.top_p, "min_p": 0.0, "seed": sampling.seed if sampling.seed is not None else -1}
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=600) as r:
            answer = json.loads(r.read())
        seconds = time.perf_counter() - start
        tokens = [int(t) for t in answer.get("tokens", [])]
        for i, token in enumerate(tokens):
            if token in eos_token_ids:
                tokens = tokens[:i]
                break
        decode_ms = (answer.get("timings") or {}).get("predicted_ms")
        return tokens, seconds, decode_ms / 1000 if decode_ms else None

    def peak_rss_mb(self) -> float | None:
        """The server process's peak resident memory (Linux), or None."""
        try:
            with open(f"/proc/{self.process.pid}/status") as status:
                return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM:"))
        except (OSError, StopIteration, ValueError):
            return None

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except Exception:
                self.process.kill()
