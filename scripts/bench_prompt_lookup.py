"""Issue 2 benchmark: prompt lookup vs plain decoding vs transformers generate(), side by side, bf16, T=0."""
import statistics
import time

import torch

from specdec import SpecDec
from specdec.prompts import task_prompts

sd = SpecDec("smollm2-135m", "prompt-lookup")
model, tok = sd.target.model, sd.tokenizer
prompts = [p for t in ("code","summarise","translate") for p in task_prompts(t, 3, seed=0)]
rows = []
def hf(ids, **kw):
    x = torch.tensor([ids])
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=128, do_sample=False, **kw)
    dt = time.perf_counter() - t
    n = out.shape[1] - len(ids)
    return n / dt, out[0, len(ids):].tolist()
sd.generate(prompts[0].text, max_new_tokens=8, gamma=0)
for p in prompts:
    ids = sd.encode(p.text)
    a = sd.generate(ids, max_new_tokens=128, gamma=0)
    b = sd.generate(ids, max_new_tokens=128, gamma="auto")
    c = sd.generate(ids, max_new_tokens=128, gamma=10)
    hp, hp_ids = hf(ids)
    hl, hl_ids = hf(ids, prompt_lookup_num_tokens=10)
    r = dict(task=p.task, plain=a.stats.tokens_per_second, auto=b.stats.tokens_per_second,
             g10=c.stats.tokens_per_second, hf_plain=hp, hf_pl=hl, same=(a.token_ids == b.token_ids),
             n=len(a.token_ids), alpha=b.stats.alpha, tau=b.stats.tau)
    rows.append(r)
    print({k: (round(v,2) if isinstance(v,float) else v) for k,v in r.items()}, flush=True)
for k in ("auto","g10","hf_plain","hf_pl"):
    ratios = [r[k]/r["plain"] for r in rows]
    print(k, "/ plain: median", round(statistics.median(ratios),2), "min", round(min(ratios),2), "max", round(max(ratios),2))
print("auto / hf_pl median", round(statistics.median([r["auto"]/r["hf_pl"] for r in rows]),2))
