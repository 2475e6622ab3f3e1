"""Could the shipped drafter's own confidence size chat rounds better than a fixed gamma? Records, at
T = 0 and a fixed gamma = 4, each round's four draft tokens' top-1 draft probabilities and how many the
target accepted (10 chat prompts, 128 tokens), then replays the rounds under other policies with a cost
model: a draft token costs C target steps, scoring n positions v(n) steps (measured on this host by
docs/results/gamma-shrink/round_costs.py and the engine's rounds), a round 0.02 outside both. At T = 0 a
round with k drafts verified yields min(accepted, k) + 1 tokens whatever the draft beyond k.

    .venv/bin/python docs/results/chat-ceiling/confidence_policies.py record chat 3 /tmp/rounds.json
    .venv/bin/python docs/results/chat-ceiling/confidence_policies.py replay /tmp/rounds.json 0.15
    .venv/bin/python docs/results/chat-ceiling/confidence_policies.py replay /tmp/rounds.json 0.15 flat  # v(n) = 1
"""

import json
import sys

V = {1: 1.0, 2: 1.08, 3: 1.26, 4: 1.35, 5: 1.65}  # v(n): n positions in steps (engine rounds, chat, this host)
OUTSIDE = 0.02


def record(task: str, seed: int, path: str) -> None:
    import torch

    import specdec.drafters.trained as trained
    from specdec import SpecDec
    from specdec.prompts import task_prompts

    confidences: list[float] = []
    plain_draw = trained._draw

    def draw(logits, *rest, **named):
        confidences.append(float(torch.softmax(logits.float(), -1).max()))
        return plain_draw(logits, *rest, **named)

    trained._draw = draw
    spec = SpecDec(target="smollm2-135m", drafter="trained")
    prompts = [p.text for p in task_prompts(task, 10, seed=seed)]
    spec.generate(prompts[0], max_new_tokens=8)
    drafter, out = spec.drafter, []
    for prompt in prompts:
        rounds, feedback = [], drafter.feedback

        def heard(kept, feedback=feedback, rounds=rounds):
            rounds.append((list(confidences), kept))
            confidences.clear()
            feedback(kept)

        drafter.feedback = heard
        result = spec.generate(prompt, max_new_tokens=128, temperature=0, gamma=4)
        drafter.feedback = feedback
        out.append({"prompt_len": len(result.prompt_ids), "rounds": rounds})
    json.dump(out, open(path, "w"))
    print(f"{sum(len(o['rounds']) for o in out)} rounds of {len(out)} prompts -> {path}")


def replay(path: str, c: float, flat: bool = False) -> None:
    if flat:  # positions cost what one does (AMX tiles up to 16 rows, as the paper assumes)
        V.update({n: 1.0 for n in V})
    rounds = []
    for o in json.load(open(path)):
        length = o["prompt_len"]
        for probs, kept in o["rounds"]:  # feedback(kept): the context length + the accepted drafts
            accepted, length = kept - length, kept + 1
            if len(probs) == 4 and 0 <= accepted <= 4:
                rounds.append((probs, accepted))
    print(f"{len(rounds)} rounds; acceptance by depth (given the depth before accepted) and top-1 draft probability:")
    edges = [0, 0.2, 0.4, 0.6, 0.8, 1.01]
    for d in range(4):
        cells = []
        for lo, hi in zip(edges, edges[1:]):
            seen = [n for p, n in rounds if n >= d and lo <= p[d] < hi]
            if seen:
                cells.append(f"[{lo:.1f}, {min(hi, 1):.1f}) {sum(n > d for n in seen) / len(seen):.2f} (n={len(seen)})")
        print(f"  depth {d + 1}: " + " | ".join(cells))

    def speed(policy) -> tuple[float, float]:
        tokens = cost = 0.0
        for probs, accepted in rounds:
            verified, drafted = policy(probs)
            tokens += min(accepted, verified) + 1
            cost += drafted * c + V[verified + 1] + OUTSIDE
        return tokens / cost * (1 + OUTSIDE), tokens / len(rounds)  # over plain decoding (1 + OUTSIDE a token)

    def shown(policy) -> str:
        rate, tokens = speed(policy)
        return f"{rate:.3f}, {tokens:.2f}"

    print(f"C = {c}{', v(n) = 1' if flat else ''}: speed over plain, tokens a round")
    for g in range(5):
        print(f"  fixed gamma {g}: {shown(lambda p, g=g: (g, g))}")
    for threshold in (0.3, 0.4, 0.5, 0.6, 0.7):
        def extend(p, threshold=threshold):  # verify the first; draft on while the last draft is confident
            k = 1
            while k < 4 and p[k] >= threshold:
                k += 1
            return k, min(4, k + 1)

        def best_prefix(p, threshold=threshold):  # draft while the chain's product of confidences holds,
            drafted, product = 1, p[0]  # then verify the prefix of best expected tokens per cost
            while drafted < 4 and product >= threshold:
                product *= p[drafted]
                drafted += 1
            best, best_rate, expected, chance = 0, 1.0 / (drafted * c + V[1]), 1.0, 1.0
            for k in range(1, drafted + 1):
                chance *= p[k - 1]
                expected += chance
                if expected / (drafted * c + V[k + 1]) > best_rate:
                    best, best_rate = k, expected / (drafted * c + V[k + 1])
            return best, drafted

        print(f"  threshold {threshold}: extend while confident {shown(extend)}; "
              f"best prefix of a confident chain {shown(best_prefix)}")


if __name__ == "__main__":
    if sys.argv[1] == "record":
        record(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        replay(sys.argv[2], float(sys.argv[3]), len(sys.argv) > 4 and sys.argv[4] == "flat")
