import pytest
import torch

from specdec.config import SamplingParams, SpecConfig
from specdec.errors import SpecdecError
from specdec.sampling import probs


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


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1),
                                    dict(temperature=float("nan"))])
def test_bad_sampling_params(kwargs):
    with pytest.raises(SpecdecError):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("gamma", [-1, "fast", 1.5])
def test_bad_gamma(gamma):
    with pytest.raises(SpecdecError):
        SpecConfig(gamma=gamma)
