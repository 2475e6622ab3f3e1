"""Re-record the hidden states (final-norm features, eagle3's aux layers) of distillation cache files whose
answers' records were overwritten (the engine sampler's bf16 buffer bug): one teacher-forced pass per
sequence on the same backend the answers were sampled on (lean+tiles: a row's numbers do not depend on
the rows beside it), tokens and top-k kept as they are. Usage: rerecord.py OLD_STEM NEW_STEM [NEW_STEM ...]"""
import sys
import time
from pathlib import Path

import torch

from specdec.backends.base import Step
from specdec.backends.lean import target_backend
from specdec.models import load_model
from specdec.training.data import DistillData

folder = Path.home() / ".cache/specdec/distill"
target = load_model("smollm2-135m")  # bf16 here, as the data was sampled
backend = target_backend(target)
assert backend.path == "lean+tiles", backend.path
layers = (2, 15, 27, 30)
width = 8
sequences = [backend] + [backend.fork() for _ in range(width - 1)]
for s in sequences:
    s.record_features(True, layers)
for old, new in zip(sys.argv[1::2], sys.argv[2::2]):
    data = DistillData.load(folder / f"{old}.safetensors")
    start, n = time.perf_counter(), data.sequences
    hidden = torch.empty(data.tokens.numel(), 4 * 576, dtype=torch.bfloat16)
    for lo in range(0, n, width):
        group = list(range(lo, min(n, lo + width)))
        work = []
        for seq, s in zip(sequences, group):
            seq.reset()
            work.append((seq, Step(data.tokens[int(data.offsets[s]) : int(data.offsets[s + 1])], wants_logits=False)))
        backend.forward_many(work)
        for seq, s in zip(sequences, group):
            hidden[int(data.offsets[s]) : int(data.offsets[s + 1])] = seq.hidden().to(torch.bfloat16)
        if lo % 512 == 0:
            print(old, lo, n, f"{time.perf_counter() - start:.0f} s", flush=True)
    data.features, data.aux = hidden[:, -576:].contiguous(), hidden[:, :-576].contiguous()
    del hidden
    data.save(folder / f"{new}.safetensors")
    print("wrote", new, f"{time.perf_counter() - start:.0f} s", flush=True)
    del data
