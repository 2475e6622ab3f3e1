"""`specdec verify` on pure-tensor models: the real engine passes with every drafter, and each bug
that real implementations shipped (the mutants below) makes it FAIL at the default settings."""

import json

import pytest
import torch

import specdec.decoding.engine
import specdec.decoding.rejection
from helpers import TableLM
from specdec.config import SamplingParams
from specdec.conformance.check import Settings, run_conformance
from specdec.decoding.engine import SpeculativeEngine
from specdec.decoding.rejection import Verdict, acceptance_probability, point_mass, residual
from specdec.decoding.sampling import probs, sample
from specdec.drafters import ModelDrafter, NGramDrafter, NGramTable, NGramTreeDrafter, PromptLookupDrafter, Proposal

VOCAB, EOS = 8, 7
PROMPTS = [[0, 1, 2, 3, 4, 5, 6, 1, 2, 3]]
T1 = SamplingParams(temperature=1.0)
WARPED = SamplingParams(temperature=0.7, top_p=0.9)


def target(eos_bias: float = -2.5) -> TableLM:
    """The target: end of sequence rare (long runs stay long) unless `eos_bias` says otherwise."""
    return TableLM(VOCAB, order=2, seed=20, eos=EOS, eos_bias=eos_bias)


def drafter(kind: str, eos_bias: float = -2.5):
    if kind == "model":
        return ModelDrafter(TableLM(VOCAB, order=1, seed=21, scale=1.2, eos=EOS, eos_bias=eos_bias), VOCAB)
    if kind == "prompt-lookup":
        return PromptLookupDrafter()
    table = NGramTable.fit([[0, 1, 2, 3, 4, 5, 6, 0, 2, 4, 6, 1, 3, 5, 0]], n=2)
    return NGramTreeDrafter(table) if kind == "ngram-tree" else NGramDrafter(table)


def conformance(kind="model", sampling=T1, settings=Settings(), gamma=3, draft=None, engine_class=SpeculativeEngine,
                eos_bias=-2.5, backend=None):
    backend = backend or target(eos_bias)
    draft = draft or drafter(kind, eos_bias)
    plain = SpeculativeEngine(backend, None, eos_token_ids={EOS})
    spec = engine_class(backend, draft, eos_token_ids={EOS})
    return run_conformance("table", torch.float32, plain, spec, backend, PROMPTS, sampling, gamma, settings, seed=1,
                           drafter_name=draft.name)


def by_name(report):
    return {c.name: c for c in report.checks}


@pytest.mark.parametrize("kind,sampling", [(kind, sampling) for kind in ("model", "prompt-lookup", "ngram")
                                           for sampling in (T1, WARPED)] + [("ngram-tree", T1)],
                         ids=lambda v: v if isinstance(v, str) else "T1" if v is T1 else "T0.7-top-p0.9")
def test_real_engine_passes_every_check(kind, sampling):
    """Each kind of drafter (ngram-tree: point-mass token trees; warped sampling of trees is checked
    in test_tree.py)."""
    report = conformance(kind, sampling)
    assert report.passed, report.to_text()
    assert report.detectable_tv is not None and report.detectable_tv <= 0.05, report.to_text()
    json.dumps(report.to_dict())  # serialisable
    names = [t.name for c in report.checks for t in c.tests]
    assert any("PIT" in n for n in names) and any("draft position 2" in n for n in names)


# -- mutants: each is a bug that shipped somewhere; each must fail -----------------------------------


def _beta(p, q, k, n):
    tested = min(n + 1, k)
    return torch.minimum(p[:tested], q[:tested]).sum(-1)


def accept_always(p, q, draft, generator):
    k = draft.shape[0]
    q = point_mass(draft, p.shape[-1]) if q is None else q
    return Verdict(accepted=k, token=sample(p[k], generator), beta=_beta(p, q, k, k))


def _verify_with(accept_rule=None, emit=None):
    """A verifier that differs from the real one in the acceptance rule or the emitted token."""

    def mutant(p, q, draft, generator):
        k = draft.shape[0]
        q = point_mass(draft, p.shape[-1]) if q is None else q
        u = torch.rand(k, generator=generator)
        a = acceptance_probability(p[:k], q, draft)
        accept = accept_rule(u, a) if accept_rule else u < a
        rejected = (~accept).nonzero()
        n = int(rejected[0]) if rejected.numel() else k
        n, token = emit(p, q, draft, n, generator) if emit else (n, sample(p[k] if n == k else residual(p[n], q[n]), generator))
        return Verdict(accepted=n, token=token, beta=_beta(p, q, k, n))

    return mutant


def _residual_inverse_cdf_unnormalised(p, q, draft, n, generator):
    k = draft.shape[0]
    if n == k:
        return n, sample(p[k], generator)
    cdf = (p[n] - q[n]).clamp_min(0).cumsum(0)  # not divided by its mass: the rest lands on the last token
    return n, min(int(torch.searchsorted(cdf, torch.rand(1, generator=generator))), p.shape[-1] - 1)


def _bonus_never_drawn(p, q, draft, n, generator):
    k = draft.shape[0]
    if n == k and k > 0:  # the last draft stands in for the target's token: no bonus is drawn
        return k - 1, int(draft[k - 1])
    return n, sample(p[k] if n == k else residual(p[n], q[n]), generator)


def _bonus_from_wrong_position(p, q, draft, n, generator):
    k = draft.shape[0]
    return n, sample(p[max(k - 1, 0)] if n == k else residual(p[n], q[n]), generator)


def _residual_is_p(p, q, draft, n, generator):
    k = draft.shape[0]
    return n, sample(p[k] if n == k else p[n], generator)


class ReportsOtherQ(ModelDrafter):
    """Draws its tokens from one distribution (the request's warped q unless `draw_with` says) and
    reports another."""

    def __init__(self, report_with, draw_with=None):
        super().__init__(TableLM(VOCAB, order=1, seed=21, scale=1.2), VOCAB)
        self.report_with, self.draw_with = report_with, draw_with or (lambda logits, s: probs(logits, s))

    def propose(self, context, gamma, sampling, generator):
        if sampling.greedy:
            return super().propose(context, gamma, sampling, generator)
        unseen = context[self.backend.length:]
        tokens, reported = [], []
        for _ in range(gamma):
            logits = self._fit_vocab(self.backend.forward(unseen)[-1:])
            tokens.append(sample(self.draw_with(logits, sampling)[0], generator))
            reported.append(self.report_with(logits, sampling)[0])
            unseen = torch.tensor([tokens[-1]])
        return Proposal(tokens=torch.tensor(tokens), q=torch.stack(reported))


_live_generators: list = []  # (generator, seed) of each generation, made by _remembering_generator


def _remembering_generator(seed, device="cpu"):
    """new_generator for the reseeding mutant: remembers each request's generator and seed."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else 0)
    _live_generators.append((generator, seed if seed is not None else 0))
    return generator


class ReseededEngine(SpeculativeEngine):
    """Reseeds the request's generator at every round (the random stream repeats). Runs with
    specdec.decoding.engine.new_generator patched to _remembering_generator."""

    def emitted(self, accepted, token, spec):
        generator, seed = _live_generators[-1]
        generator.manual_seed(seed)
        return super().emitted(accepted, token, spec)


class EosInDraftIgnored(SpeculativeEngine):
    """Stops only when the target's own token is the end of sequence, not an accepted draft."""

    def emitted(self, accepted, token, spec):
        new = accepted.tolist() + [token]
        return new, token in self.eos_token_ids


def _reject_always(p, q, draft, generator):
    """Never keeps a draft (its token from the residual, as after a true rejection)."""
    k = draft.shape[0]
    q = point_mass(draft, p.shape[-1]) if q is None else q
    token = sample(p[0] if k == 0 else residual(p[0], q[0]), generator)
    return Verdict(accepted=0, token=token, beta=_beta(p, q, k, 0))


def _untempered(logits, sampling):
    return torch.softmax(logits.float(), -1)


MUTANTS = {
    "accept always": dict(verify=accept_always),
    "reject always": dict(verify=_reject_always),
    "residual = p": dict(verify=_verify_with(emit=_residual_is_p)),
    "residual = p, prompt lookup": dict(verify=_verify_with(emit=_residual_is_p), kind="prompt-lookup"),
    "residual not renormalised": dict(verify=_verify_with(emit=_residual_inverse_cdf_unnormalised)),
    "bonus never drawn": dict(verify=_verify_with(emit=_bonus_never_drawn)),
    "bonus from the wrong position": dict(verify=_verify_with(emit=_bonus_from_wrong_position)),
    "q unwarped": dict(draft=lambda: ReportsOtherQ(_untempered), sampling=WARPED),
    "drafted untempered, target tempered": dict(draft=lambda: ReportsOtherQ(probs, draw_with=_untempered),
                                                sampling=WARPED),
    "q from another temperature": dict(draft=lambda: ReportsOtherQ(
        lambda logits, s: probs(logits, SamplingParams(temperature=2 * s.temperature, top_p=s.top_p)))),
    "generator reseeded each round": dict(engine_class=ReseededEngine),
    "EOS inside a draft ignored": dict(engine_class=EosInDraftIgnored, eos_bias=0.5),
}


@pytest.mark.parametrize("quick", [False, True], ids=["default", "quick"])
@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutant_fails(name, quick, monkeypatch):
    """Every mutant fails `specdec verify` at its default settings and at --quick's; the output names the
    smallest p-value (pytest -rP shows it)."""
    mutant = dict(MUTANTS[name], settings=Settings.quick() if quick else Settings())
    if "verify" in mutant:
        monkeypatch.setattr(specdec.decoding.engine, "verify", mutant.pop("verify"))
    if "draft" in mutant:
        mutant["draft"] = mutant["draft"]()
    if name == "generator reseeded each round":
        monkeypatch.setattr(specdec.decoding.engine, "new_generator", _remembering_generator, raising=True)
    report = conformance(**mutant)
    p_value, test = min(((t.p_value, t.name) for c in report.checks for t in c.tests), default=(1.0, "none"))
    print(f"{name} ({'quick' if quick else 'default'}): smallest p = {p_value:.3g} ({test})")
    assert not report.passed, report.to_text()


@pytest.mark.parametrize("kind,sampling", [("model", T1), ("prompt-lookup", T1), ("model", WARPED)],
                         ids=["model-T1", "prompt-lookup-T1", "model-T0.7-top-p0.9"])
def test_real_engine_passes_quick(kind, sampling):
    """--quick's false alarms stay at the stated level: the real engine passes where the mutants fail."""
    report = conformance(kind, sampling, settings=Settings.quick())
    assert report.passed, report.to_text()


def test_acceptance_of_a_few_drafts_is_not_judged_by_the_normal_tail():
    """One draft at β = 0.9447 rejected happens one time in 18; the normal tail made it z = −4.1, p = 4e-5, and
    `specdec verify` FAILED a correct engine (prompt lookup on a quantised SmolLM2, its 4th draft position).
    Few draws take Freedman's bound, valid at any count; many keep the normal tail's power."""
    from specdec.conformance.exactness import acceptance_z

    beta = 0.9447
    one = acceptance_z("one draft", 0, beta, beta**2, 1)
    assert one.p_value > 0.5 and one.statistic < -4  # the same z, no longer a rejection
    few = acceptance_z("20 drafts at 0.95, none accepted", 0, 20 * 0.95, 20 * 0.95**2, 20)
    assert few.p_value < 1e-9  # gross deviations of a few draws still fail
    many = acceptance_z("900 drafts at 0.5", 400, 450.0, 225.0, 900)  # variance 225: the normal tail
    assert many.p_value == pytest.approx(8.8e-4, rel=0.05)


def test_settings_quick_is_smaller():
    quick = Settings.quick()
    assert quick.samples < Settings().samples and quick.long_runs < Settings().long_runs


# -- greedy parity names the cause --------------------------------------------------------------------


def parity(backend, gamma=4):
    plain = SpeculativeEngine(backend, None)
    spec = SpeculativeEngine(backend, PromptLookupDrafter())
    prompts = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5, 6, 5, 6, 5, 6, 5]]
    return run_conformance("table", torch.bfloat16, plain, spec, backend, prompts, SamplingParams(), gamma,
                           Settings.quick())


def test_parity_explains_a_near_tie_flipped_by_the_row_count():
    """One numeric path whose rounding depends on the row count (ATen in bf16): a divergence is
    explained when the measured rounding difference there covers the gap."""
    report = parity(TableLM(VOCAB, seed=5, scale=0.3, row_noise=0.05))
    check = by_name(report)["greedy parity"]
    divergences = check.data["divergences"]
    assert divergences and all(d["explained"] for d in divergences), report.to_text()
    assert check.passed and "explained" in check.lines[0] + check.lines[-1]


class TwoPaths(TableLM):
    def numeric_path(self, rows):
        return "kernels" if rows == 1 else "ATen"


def test_parity_fails_naming_the_paths_when_they_differ():
    report = parity(TwoPaths(VOCAB, seed=5, scale=0.3, row_noise=0.05))
    check = by_name(report)["greedy parity"]
    assert not check.passed
    assert "on ATen, plain pass of 1 on kernels" in "\n".join(check.lines)


def test_parity_fails_on_a_row_invariant_path(monkeypatch):
    """Where passes of any row count round alike, a divergence is a bug, however small the gap."""
    from specdec.decoding.rejection import Verdict

    def accept_always_greedy(target_argmax, draft):
        return Verdict(accepted=draft.shape[0], token=int(target_argmax[draft.shape[0]]))

    monkeypatch.setattr(specdec.decoding.engine, "verify_greedy", accept_always_greedy)
    report = parity(TableLM(VOCAB, seed=5, scale=0.3, row_noise=0.05, fast_rows=16))
    check = by_name(report)["greedy parity"]
    assert not check.passed and check.data["divergences"][0]["rounding_difference"] == 0.0, report.to_text()


# -- the command ---------------------------------------------------------------------------------------


def test_verify_cli_json(tiny_dirs, tmp_path, capsys):
    from specdec.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "abc abc ab"}\n')
    code = main(["verify", "--target", str(tiny_dirs["target"]), "--drafter", f"model:{tiny_dirs['draft']}",
                 "--dtype", "float32", "--quick", "--samples", "300", "--plain-samples", "200", "--long-runs", "2",
                 "--prompts", str(prompts), "--max-new-tokens", "12", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] and code == 0, out  # the real engine passes (a false alarm has probability <= 1e-3)
    assert [c["name"] for c in out["checks"]] == ["distribution", "greedy parity", "acceptance"]
    assert out["detectable_tv"] is not None and out["sampling"]["samples"] == 300
    assert out["path"].startswith("lean")  # exactness is relative to the arithmetic that ran: it is named


@pytest.mark.parametrize("args,needle", [(["--samples", "5"], "--samples"), (["--gamma", "0"], "plain decoding"),
                                         (["--k", "7"], "--k"), (["--drafter", "none"], "nothing speculative"),
                                         (["--long-runs", "-1"], "--long-runs"),
                                         (["--drafter-invariant", "--temperature", "0"], "--drafter-invariant")])
def test_verify_bad_input(tiny_dirs, capsys, args, needle):
    from specdec.cli import main

    assert main(["verify", "--target", str(tiny_dirs["target"]), "--dtype", "float32", *args]) == 1
    assert needle in capsys.readouterr().err
