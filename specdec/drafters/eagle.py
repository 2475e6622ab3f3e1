"""EAGLE and EAGLE-3 drafters: a chain (EagleDrafter) or a token tree (EagleTreeDrafter).

They read the target's features (`reads_features`; eagle3 the hidden states entering three of its
layers, `feature_layers`): they `bind` to the target backend, and the engine has it record features
for the generations they serve. After a round the target holds positions 0..L-2 of a context of
length L (its newest token x_{L-1} is scored next round), so features f_0..f_{L-2} are known: eagle
feeds the pairs (f_j, x_{j+1}) it has not seen, predicts f_{L-1}, reads d1 = x_L through the head,
feeds (f̂_{L-1}, d1), and so on; its cache then drops the speculative pairs. eagle3 drafts the same
way with fc(features) for f and its pre-norm outputs for f̂."""

from __future__ import annotations

import torch

from ..config import SamplingParams
from ..decoding.sampling import coupled_draw, probs, samples
from ..modeling.tree import TreeLayout
from .base import Proposal
from .feature_heads import FeatureHeadsDrafter
from .nets import DraftNet


class EagleDrafter(FeatureHeadsDrafter):
    """EAGLE and EAGLE-3 drafting a chain (the net's kind decides what it reads and feeds back)."""

    cost_prior = 0.05

    def __init__(self, net: DraftNet, label: str):
        super().__init__(net, f"{net.config.kind}:{label}")
        self.cache = net.new_cache()

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.net.feature_layers

    def fork(self) -> EagleDrafter:
        twin = super().fork()
        twin.cache = self.net.new_cache()
        return twin

    def begin(self, prompt: torch.Tensor) -> None:
        self.cache = self.net.new_cache()

    def _catch_up(self, context: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor] | None:
        """Feed the draft net the (feature, next token) pairs it has not seen: returns the target's
        length `known`, its last feature f_{known-1} (d,) and the predicted f̂_{known} (1, 1, d);
        None when the target does not hold features for this context."""
        known = self.target.length  # features f_0..f_{known-1}; the context is one token longer
        if known == 0 or known + 1 != context.numel():
            return None
        start = min(self.cache.length, known - 1)
        features = self.net.features_in(self.target.hidden(start, known)[None])  # (1, m, d)
        next_tokens = context[start + 1 : known + 1].to(features.device)[None]  # (1, m)
        return known, features[0, -1], self.net.predict(features, next_tokens, self.cache, start)[:, -1:]

    @torch.inference_mode()
    def propose(self, context: torch.Tensor, gamma: int, sampling: SamplingParams,
                generator: torch.Generator) -> Proposal:
        caught_up = self._catch_up(context)
        if caught_up is None:
            return Proposal.empty()
        return self._draft(context, gamma, sampling, generator, *caught_up)

    def _draft(self, context: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator,
               known: int, last_feature: torch.Tensor, predicted: torch.Tensor) -> Proposal:
        """Draft from the caught-up state (see _catch_up): a chain of up to gamma tokens."""
        tokens, dists = [], []
        for i in range(gamma):
            token, _, q = self.vocab.draw(self.net.draft_logits(predicted[0]).float(), sampling, generator,
                                          position=context.numel() + i)
            tokens.append(token)
            if q is not None:
                dists.append(q)
            if i + 1 < gamma:
                predicted = self.net.predict(predicted, torch.tensor([[token]], device=last_feature.device),
                                             self.cache, known + i)
        self.cache.length = known  # keep only pairs built from the target's true features
        return Proposal(torch.tensor(tokens, dtype=torch.long), torch.stack(dists) if dists else None)

    def feedback(self, kept: int) -> None:
        self.cache.length = min(self.cache.length, max(kept - 1, 0))


class EagleTreeDrafter(EagleDrafter):
    """EAGLE drafting a token tree (EAGLE-2's dynamic tree, simplified): each level expands the
    `beam` nodes of highest cumulative draft probability into `branch` children each, for up to
    `gamma` levels and `max_nodes` nodes; the draft net runs each level as one tree pass over its
    own cache (every node sees the context and its ancestors).

    Which children a node gets keeps verification exact (specdec.decoding.rejection, token trees):
    - T = 0: the `branch` likeliest tokens of q (point masses; the target's argmax decides);
    - drafter-invariant sampling: the position's coupled draw from q, then the likeliest others
      (point masses; the target's own draw decides);
    - rejection sampling: `branch` independent draws from q, all kept, so a node's children never
      depend on their own values (the multi-round rule's premise); which nodes are expanded may
      depend on anything the drafter knows.

    Worked example, gamma=2, branch=2, beam=1: the root's two likeliest tokens a, b become nodes 0
    and 1; the likelier, a, is expanded into its two likeliest, c and d: tokens [a, b, c, d],
    parents [-1, -1, 0, 0]."""

    def __init__(self, net: DraftNet, label: str, branch: int = 2, beam: int = 2, max_nodes: int = 6):
        super().__init__(net, label)
        self.name = f"{net.config.kind}-tree:{label}"
        if min(branch, beam, max_nodes) < 1:
            raise ValueError(f"branch, beam and max_nodes must be >= 1, got {branch}, {beam}, {max_nodes}")
        self.branch, self.beam, self.max_nodes = branch, beam, max_nodes

    def _children(self, feature: torch.Tensor, sampling: SamplingParams, generator: torch.Generator,
                  position: int) -> tuple[list[tuple[int, float]], torch.Tensor | None]:
        """A node's children as (target token id, draft probability), and the q they were drawn
        from (rejection sampling only; None for point masses)."""
        logits = self.net.draft_logits(feature[None]).float()  # (1, |S|)
        vocab = self.net.vocab
        if sampling.greedy:
            top = torch.softmax(logits[0], -1).topk(min(self.branch, logits.shape[-1]))
            return [(int(vocab[i]), float(v)) for v, i in zip(top.values, top.indices)], None
        compact = probs(logits, sampling)  # (1, |S|)
        q = self.vocab.full(compact, 0.0)[0]  # (V,)
        if sampling.drafter_invariant:
            first = coupled_draw(q, sampling.seed, position)
            others = [int(t) for t in q.topk(self.branch + 1).indices if int(t) != first and q[t] > 0]
            return [(t, float(q[t])) for t in [first] + others[: self.branch - 1]], None
        drawn = [int(vocab[i]) for i in samples(compact[0], generator, self.branch)]  # over |S|: see VocabMap
        return [(t, float(q[t])) for t in drawn], q

    def _draft(self, context: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator,
               known: int, last_feature: torch.Tensor, root_prediction: torch.Tensor) -> Proposal:
        """Draft a tree of up to gamma levels from the caught-up state (see _catch_up)."""
        predicted = {-1: root_prediction[0, 0]}  # node -> its f̂
        self.cache.length = known  # pairs built from the target's true features only
        root_pair = (last_feature, int(context[known]))  # (f_{known-1}, x_known), at slot known - 1
        tokens: list[int] = []
        parents: list[int] = []
        qs: list[torch.Tensor] = []
        score = {-1: 1.0}
        frontier = [-1]
        for level in range(gamma):
            offers = []  # (cumulative score, parent, token, q), grouped by parent in frontier order
            for node in frontier:
                children, q = self._children(predicted[node], sampling, generator, context.numel() + level)
                offers.append([(score[node] * prob, node, token, q) for token, prob in children])
            room = self.max_nodes - len(tokens)
            if sampling.greedy or sampling.drafter_invariant:  # point masses: keep the best offers anywhere
                chosen = sorted((o for group in offers for o in group), key=lambda o: -o[0])[:room]
                chosen.sort(key=lambda o: (frontier.index(o[1]), -o[0]))  # by parent, likeliest first
            else:  # a node's draws all, or none of them
                chosen = []
                for group in offers:
                    if len(chosen) + len(group) > room:
                        break
                    chosen += group
            if not chosen:
                break
            new = []
            for value, parent, token, q in chosen:
                tokens.append(token)
                parents.append(parent)
                if q is not None:
                    qs.append(q)
                score[len(tokens) - 1] = value
                new.append(len(tokens) - 1)
            if level + 1 == gamma or len(tokens) >= self.max_nodes:
                break
            # f̂ of every node so far, in one tree pass: the root pair again (row 0), then each node
            # with its parent's f̂ (the root's for the first level)
            inputs = torch.stack([root_pair[0]] + [predicted[parent] for parent in parents])[None]
            ids = torch.tensor([root_pair[1]] + tokens, device=last_feature.device)[None]
            out = self.net.predict(inputs, ids, self.cache, known - 1, TreeLayout.of(torch.tensor(parents)))[0]
            self.cache.length = known
            for node in range(len(tokens)):
                predicted[node] = out[1 + node]
            frontier = sorted(new, key=lambda node: -score[node])[: self.beam]
        if not tokens:
            return Proposal.empty()
        return Proposal(torch.tensor(tokens, dtype=torch.long), torch.stack(qs) if qs else None,
                        torch.tensor(parents, dtype=torch.long), torch.tensor([score[i] for i in range(len(tokens))]))
