from collections import Counter

import pytest
import torch

from specdec.config import SamplingParams, SpecConfig
from specdec.conformance.exactness import goodness_of_fit
from specdec.decoding.sampling import argmax_rows, probs, sample, samples
from specdec.errors import SpecdecError


def test_samples_follow_the_distribution_and_never_draw_probability_zero():
    """Inverse-CDF draws: a chi-square fit to the law (a mass left unnormalised is fine), no token of
    probability 0 ever drawn (also at either end), and the fit fails for a law the draws do not follow."""
    law = torch.tensor([0.0, 0.3, 0.0, 0.1, 0.45, 0.15, 0.0])
    generator = torch.Generator().manual_seed(7)
    drawn = torch.tensor(samples(law * 3.0, generator, 20000) + [sample(law, generator) for _ in range(200)])
    counts = Counter(drawn.tolist())
    assert not any(counts[i] for i in (0, 2, 6))
    assert goodness_of_fit("draws", counts, dict(enumerate(law.tolist()))).p_value > 1e-4
    wrong = [0.0, 0.25, 0.0, 0.15, 0.45, 0.15, 0.0]
    assert goodness_of_fit("negative control", counts, dict(enumerate(wrong))).p_value < 1e-6


def test_argmax_rows_is_torch_argmax():
    """First index of the largest value, a NaN counting as the largest, strided rows, inference tensors."""
    x = torch.randn(6, 4099)
    x[1, 7] = x[1, 9] = float("nan")
    x[2] = 3.0  # all equal: the first
    x[3, 100] = x[3, 200] = float("inf")
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1))
    assert torch.equal(argmax_rows(x[:, ::3]), x[:, ::3].argmax(dim=-1))
    with torch.inference_mode():
        y = torch.randn(3, 50)
    assert torch.equal(argmax_rows(y), y.argmax(dim=-1)) and argmax_rows(y).dtype == torch.long
    z = torch.randn(2, 50, dtype=torch.bfloat16)  # not a float NumPy takes: torch's own
    assert torch.equal(argmax_rows(z), z.argmax(dim=-1))


def test_temperature_scales_logits():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    assert torch.allclose(probs(logits, SamplingParams(temperature=0.5)), torch.softmax(logits / 0.5, -1))


def test_top_k_keeps_k():
    out = probs(torch.tensor([[1.0, 4.0, 3.0, 2.0]]), SamplingParams(temperature=1.0, top_k=2))
    assert (out[0] > 0).tolist() == [False, True, True, False]
    assert torch.isclose(out.sum(), torch.tensor(1.0))


def test_top_p_keeps_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda top_p: (probs(logits, SamplingParams(temperature=1.0, top_p=top_p))[0] > 0).sum().item()
    assert kept(0.5) == 1
    assert kept(0.6) == 2
    assert kept(0.8) == 2
    assert kept(0.81) == 3
    assert kept(1.0) == 4
    assert kept(0.01) == 1  # the top token always stays


def test_top_p_from_the_likeliest_candidates_is_the_whole_sort_rule():
    """probs sorts only the likeliest tokens of a row (64, 512, 4096, then all): the kept set is the rule's on a
    whole float64 sort (keep a token while the mass before it is below top_p), wherever the mass
    before it is not within rounding of top_p; every row on its own, as in a batch. The rows range
    from flat (hundreds kept: the whole sort) to peaked (a few kept), side by side."""
    scales = torch.tensor([0.2, 1.0, 12.0, 0.2, 1.0, 12.0])[:, None]
    logits = torch.randn(6, 5000, generator=torch.Generator().manual_seed(3)) * scales
    for top_p in (0.3, 0.9, 0.99):
        got = probs(logits, SamplingParams(temperature=1.0, top_p=top_p)) > 0
        p = logits.double().softmax(dim=-1)
        ordered, order = p.sort(dim=-1, descending=True)
        before = ordered.cumsum(dim=-1) - ordered
        want = torch.zeros_like(got).scatter(-1, order, before < top_p)
        decided = torch.zeros_like(got).scatter(-1, order, (before - top_p).abs() > 1e-5)
        assert torch.equal(got[decided], want[decided]), top_p
        for row in range(logits.shape[0]):  # a row's kept set does not depend on the rows beside it
            alone = probs(logits[row : row + 1], SamplingParams(temperature=1.0, top_p=top_p)) > 0
            assert torch.equal(alone[0], got[row])
    kept = want.sum(dim=-1)
    assert int(kept[0]) > 512 and int(kept[2]) < 64  # flat rows took the whole sort, peaked ones 64


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1),
                                    dict(temperature=float("nan"))])
def test_bad_sampling_params(kwargs):
    with pytest.raises(SpecdecError):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("gamma", [-1, "fast", 1.5])
def test_bad_gamma(gamma):
    with pytest.raises(SpecdecError):
        SpecConfig(gamma=gamma)
