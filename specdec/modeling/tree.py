"""The shape of a token tree, as the target's forward pass needs it.

A tree of n drafted nodes hangs below the root, the context's last token. parents[i] is the index
of node i's parent, -1 for the root; parents come before their children (parents[i] < i). A chain
of k drafts is the tree parents = [-1, 0, 1, ..., k - 2].

The target scores root and nodes in one pass: row 0 is the root, row 1 + i is node i. Each row
sees the context, the root and its own ancestors (an ancestor mask), and sits at position
context length + depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def check_parents(parents: torch.Tensor) -> None:
    """parents must be (n,) integers with -1 <= parents[i] < i."""
    index = torch.arange(parents.numel())
    if parents.dim() != 1 or bool(((parents < -1) | (parents >= index)).any()):
        raise ValueError(f"parents must list each node's parent before it (-1 = the root), got {parents.tolist()}")


def depths(parents: torch.Tensor) -> torch.Tensor:
    """(n,) parents -> (n,) depth of each node (a child of the root has depth 1)."""
    out = torch.zeros(parents.numel(), dtype=torch.long)
    for i, parent in enumerate(parents.tolist()):
        out[i] = 1 if parent < 0 else out[parent] + 1
    return out


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """(n,) parents -> (n + 1, n + 1) boolean: row r may attend to column c, over [root, nodes]
    (each row sees the root, its ancestors and itself)."""
    n = parents.numel()
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[:, 0] = True
    for i, parent in enumerate(parents.tolist()):
        row = 1 + i
        if parent >= 0:
            mask[row] = mask[1 + parent]
        mask[row, row] = True
    return mask


def chain(k: int) -> torch.Tensor:
    """The parents of a chain of k drafts."""
    return torch.arange(-1, k - 1)


@dataclass(frozen=True)
class TreeLayout:
    """What a forward pass over [root, nodes] needs: each row's depth (0 for the root; its
    position is the root's + depth) and which rows each row sees."""

    depth: torch.Tensor  # (n + 1,)
    mask: torch.Tensor  # (n + 1, n + 1) bool

    def visible(self, context: int) -> torch.Tensor:
        """(n + 1, context + n + 1) boolean: what each row sees of `context` earlier positions
        (all of them) followed by the tree's own rows."""
        return torch.cat([torch.ones(self.mask.shape[0], context, dtype=torch.bool), self.mask], dim=1)

    @staticmethod
    def of(parents: torch.Tensor) -> TreeLayout:
        check_parents(parents)
        return TreeLayout(torch.cat([torch.zeros(1, dtype=torch.long), depths(parents)]), ancestor_mask(parents))
