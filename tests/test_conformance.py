"""`specdec verify`: each check passes on the real engine and fails on a deliberately broken one."""

import json

import pytest
import torch

import specdec.engine
from specdec.backends import TransformersBackend
from specdec.cli import main
from specdec.config import SamplingParams
from specdec.conformance import near_tie_tolerance, run_conformance
from specdec.drafters import ModelDrafter, Proposal
from specdec.engine import SpeculativeEngine
from specdec.sampling import probs, sample
from specdec.verify import Verdict, acceptance_probability, point_mass

from conftest import tiny_llama

VOCAB = 6
PROMPTS = [[0, 1, 2, 3, 4, 5, 1]]
SAMPLING = SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def models():
    return tiny_llama(VOCAB, layers=2, seed=20, init=0.15), tiny_llama(VOCAB, layers=1, seed=21, init=0.15)


def conformance(models, drafter=None, samples=800):
    target, draft = models
    backend = TransformersBackend(target)
    drafter = drafter or ModelDrafter(TransformersBackend(draft), VOCAB)
    plain = SpeculativeEngine(backend, None)
    spec = SpeculativeEngine(backend, drafter)
    return run_conformance("tiny", target, plain, spec, backend, PROMPTS, SAMPLING, gamma=3, k=2, samples=samples,
                           parity_tokens=24)


def by_name(report):
    return {c.name: c for c in report.checks}


def test_real_engine_passes_every_check(models):
    report = conformance(models)
    assert report.passed, report.to_text()
    text = report.to_text()
    assert "[PASS] distribution" in text and "[PASS] greedy parity" in text and "[PASS] acceptance" in text
    json.dumps(report.to_dict())  # serialisable


def accept_always(p, q, draft, generator):
    k = draft.shape[0]
    q = point_mass(draft, p.shape[-1]) if q is None else q
    beta = torch.minimum(p[:k], q).sum(-1)
    return Verdict(accepted=k, token=sample(p[k], generator), beta=beta)


def accept_always_greedy(target_argmax, draft):
    return Verdict(accepted=draft.shape[0], token=int(target_argmax[draft.shape[0]]))


def test_accept_always_fails_distribution_acceptance_and_parity(models, monkeypatch):
    monkeypatch.setattr(specdec.engine, "verify", accept_always)
    monkeypatch.setattr(specdec.engine, "verify_greedy", accept_always_greedy)
    checks = by_name(conformance(models))
    assert not checks["distribution"].passed
    assert not checks["acceptance"].passed
    assert not checks["greedy parity"].passed


def residual_not_renormalised(p, q, draft, generator):
    """Samples the rejection token by inverse CDF of max(0, p - q) without dividing by its mass:
    the missing mass lands on the last token."""
    k = draft.shape[0]
    q = point_mass(draft, p.shape[-1]) if q is None else q
    accept = torch.rand(k, generator=generator) < acceptance_probability(p[:k], q, draft)
    rejected = (~accept).nonzero()
    n = int(rejected[0]) if rejected.numel() else k
    if n == k:
        token = sample(p[k], generator)
    else:
        cdf = (p[n] - q[n]).clamp_min(0).cumsum(0)
        token = min(int(torch.searchsorted(cdf, torch.rand(1, generator=generator))), p.shape[-1] - 1)
    tested = min(n + 1, k)
    return Verdict(accepted=n, token=token, beta=torch.minimum(p[:tested], q[:tested]).sum(-1))


def test_unnormalised_residual_fails_distribution(models, monkeypatch):
    monkeypatch.setattr(specdec.engine, "verify", residual_not_renormalised)
    checks = by_name(conformance(models))
    assert not checks["distribution"].passed


class WrongTemperatureDrafter(ModelDrafter):
    """Draws at the request's temperature but reports q at twice it (the transformers #32867 bug)."""

    def propose(self, context, gamma, sampling, generator):
        if sampling.greedy:
            return super().propose(context, gamma, sampling, generator)
        unseen = context[self.backend.length:]
        tokens, reported = [], []
        hotter = SamplingParams(temperature=sampling.temperature * 2)
        for _ in range(gamma):
            logits = self._fit_vocab(self.backend.forward(unseen)[-1:])
            token = sample(probs(logits, sampling)[0], generator)
            reported.append(probs(logits, hotter)[0])
            tokens.append(token)
            unseen = torch.tensor([token])
        return Proposal(tokens=torch.tensor(tokens), q=torch.stack(reported))


def test_q_from_wrong_temperature_fails_acceptance(models):
    _, draft = models
    checks = by_name(conformance(models, WrongTemperatureDrafter(TransformersBackend(draft), VOCAB), samples=1500))
    assert not checks["acceptance"].passed


def test_near_tie_tolerance_scales_with_dtype_and_logits():
    logits = torch.tensor([10.0, -3.0])
    assert near_tie_tolerance(torch.bfloat16, logits, 30) > near_tie_tolerance(torch.float32, logits, 30) * 1000
    assert near_tie_tolerance(torch.bfloat16, logits * 2, 30) == pytest.approx(2 * near_tie_tolerance(torch.bfloat16, logits, 30))


def test_verify_cli_json(tiny_dirs, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "abc abc ab"}\n')
    code = main(["verify", "--target", str(tiny_dirs["target"]), "--drafter", "model", "--draft", str(tiny_dirs["draft"]),
                 "--dtype", "float32", "--samples", "100", "--prompts", str(prompts), "--max-new-tokens", "12", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == (0 if out["passed"] else 1)
    assert [c["name"] for c in out["checks"]] == ["distribution", "greedy parity", "acceptance"]


@pytest.mark.parametrize("args,needle", [(["--samples", "5"], "--samples"), (["--gamma", "0"], "plain decoding"),
                                         (["--k", "7"], "--k"), (["--drafter", "none"], "nothing speculative")])
def test_verify_bad_input(tiny_dirs, capsys, args, needle):
    assert main(["verify", "--target", str(tiny_dirs["target"]), "--dtype", "float32", *args]) == 1
    assert needle in capsys.readouterr().err
