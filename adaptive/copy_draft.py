"""The copy drafter: a model-free draft that proposes what followed the current context's longest earlier match.

Real requests copy: edits, code, answers over a passage, translations that keep names. The copy drafter
keeps a :class:`SuffixIndex` of everything read so far (prompt and generated tokens): a suffix trie of
depth ``max_match + 1`` with occurrence counts, appended and undone token by token (O(max_match) each),
so it follows the decoder's cache through drafting and rollback. After each token it finds the longest
suffix of the context, of ``min_match`` to ``max_match`` tokens, that occurred earlier with a continuation,
and proposes that suffix's most frequent continuation (ties: the most recent one). Its logits are the
log-frequencies of the continuations (−inf for tokens never seen there), which give the policy its
confidence features; a row of −inf everywhere means no proposal. Like SuffixDecoding (arXiv 2411.04975)
and prompt lookup, the proposal is deterministic: under sampling its q is one-hot at the proposed token,
and the accept rule min(1, p/q) with the residual norm(max(p − q, 0)) keeps the target's distribution.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

RECENCY_BONUS = 1e-6
"""Added to the log-count of a node's most recent continuation: it breaks ties between equal counts only
(log-counts below 10^5 differ by more than 1e-5)."""


@dataclass(frozen=True)
class CopyDraft:
    """Settings of a copy drafter; :func:`adaptive.drafts.draft_session` gives it a :class:`CopySession`.

    Args:
        max_match: the longest context suffix looked up (tokens); the index is a trie one deeper.
        min_match: the shortest suffix match that makes a proposal (1 copies after any repeated token).
    """

    max_match: int = 16
    min_match: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.min_match <= self.max_match:
            raise ValueError(f"the copy drafter needs 1 <= min_match <= max_match, got min_match={self.min_match}, max_match={self.max_match}")

    @property
    def name(self) -> str:
        return "copy"


class SuffixIndex:
    """A suffix trie of one token stream, ``depth`` tokens deep, with occurrence counts.

    Node n is a token string s; ``count[n]`` is how often s occurs in the stream; its children are the
    tokens that followed s (so a suffix of the whole stream has no child for its own, last occurrence).
    Appending a token extends each of the ``depth`` suffixes that end at the stream's end; :meth:`pop`
    undoes the last append exactly."""

    def __init__(self, depth: int) -> None:
        if depth < 1:
            raise ValueError(f"the suffix index needs depth >= 1, got {depth}")
        self.depth = depth
        self.children: list[dict[int, int]] = [{}]
        self.count = [0]
        self.node_depth = [0]
        self.recent: list[int | None] = [None]
        """The continuation token most recently appended under each node."""
        self.length = 0
        self.ending: list[int] = [0]
        """Nodes of the suffixes ending at the stream's end, shortest (the root, the empty suffix) first."""
        self._undo: list[tuple[list[int], list[tuple[int, int, int, bool, int | None]]]] = []

    def append(self, token: int) -> None:
        """Extend the stream by ``token``."""
        ending, changes = [0], []
        for node in self.ending:
            if self.node_depth[node] >= self.depth:
                continue
            child = self.children[node].get(token)
            created = child is None
            if created:
                child = len(self.count)
                self.children[node][token] = child
                self.children.append({})
                self.count.append(0)
                self.node_depth.append(self.node_depth[node] + 1)
                self.recent.append(None)
            self.count[child] += 1
            changes.append((node, token, child, created, self.recent[node]))
            self.recent[node] = token
            ending.append(child)
        self._undo.append((self.ending, changes))
        self.ending = ending
        self.length += 1

    def pop(self) -> None:
        """Undo the last :meth:`append`."""
        if not self._undo:
            raise ValueError("the suffix index is empty")
        self.ending, changes = self._undo.pop()
        for node, token, child, created, recent in reversed(changes):
            self.count[child] -= 1
            self.recent[node] = recent
            if created:  # the newest node: drop it from the end of every list
                del self.children[node][token]
                self.children.pop(), self.count.pop(), self.node_depth.pop(), self.recent.pop()
        self.length -= 1

    def longest_match(self, min_length: int) -> int:
        """The node of the longest suffix of the stream (at least ``min_length`` tokens) that occurred earlier
        with a continuation; 0 (the root) when there is none."""
        for node in reversed(self.ending):
            if self.node_depth[node] < min_length:
                return 0
            if self.children[node]:
                return node
        return 0


class CopySession:
    """The copy drafter reading one sequence, with the surface of the decoder's cached sessions (``length``,
    ``forward``, ``rollback``, ``reset``, ``can_draft``).

    ``deterministic`` tells the decoder that the proposal is the arg-max of the logits (q one-hot), not a
    draw from them; :attr:`match_lengths` holds, per token read, the length of the match its row came from."""

    deterministic = True

    def __init__(self, draft: CopyDraft, vocab_size: int, device: torch.device) -> None:
        self.model, self.vocab_size, self.device = draft, vocab_size, device
        self.reset()

    def reset(self) -> None:
        self.index = SuffixIndex(self.model.max_match + 1)
        self.tokens: list[int] = []
        self.match_lengths: list[int] = []

    @property
    def length(self) -> int:
        return len(self.tokens)

    def can_draft(self, confirmed: int) -> bool:
        """A match needs one token of context at least."""
        return confirmed >= 1

    def forward(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Read tokens; per token, float32 logits ``[n, V]``: the log-counts of the continuations of its
        longest earlier match (−inf elsewhere; −inf everywhere when there is no match)."""
        rows = torch.full((len(token_ids), self.vocab_size), -math.inf, dtype=torch.float32)
        index = self.index
        for i, token in enumerate(token_ids):
            index.append(int(token))
            self.tokens.append(int(token))
            node = index.longest_match(self.model.min_match)
            self.match_lengths.append(index.node_depth[node])
            if node:
                followers = index.children[node]
                ids = torch.tensor(list(followers), dtype=torch.long)
                counts = torch.tensor([index.count[c] for c in followers.values()], dtype=torch.float32)
                rows[i, ids] = counts.log()
                rows[i, index.recent[node]] += RECENCY_BONUS
        return rows.to(self.device)

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` tokens read."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to length {length}: the copy drafter holds {self.length} tokens")
        while self.length > length:
            self.index.pop()
            self.tokens.pop()
            self.match_lengths.pop()


def proposes(row: torch.Tensor) -> bool:
    """Whether a draft logits row proposes anything (a copy drafter's row is all −inf without a match)."""
    return bool(torch.isfinite(row).any())
