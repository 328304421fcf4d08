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

    name = "copy"

    def session(self, vocab_size: int, device: torch.device) -> CopySession:
        """A session reading one sequence (logits over ``vocab_size`` tokens, on ``device``)."""
        return CopySession(self, vocab_size, device)


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
    vocabulary = None

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

    def begin_round(self) -> None:
        """Nothing to do: each proposal depends on the tokens read alone."""

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


@dataclass(frozen=True)
class PromptLookupDraft:
    """transformers' prompt lookup (``prompt_lookup_num_tokens``), as a baseline drafter: at the start of a
    round, find the first (leftmost) earlier occurrence of the context's last ``max_ngram`` tokens, else of
    fewer, down to 1, that has a continuation, and copy up to ``num_tokens`` tokens that followed it (not
    past the context's end as it was then); nothing when no n-gram matches. Draft to the cap (``static``)
    to run it as transformers does. Unlike transformers, an EOS inside the copied span is proposed too (the
    output stops there all the same)."""

    max_ngram: int = 2
    num_tokens: int = 10
    name = "prompt-lookup"

    def __post_init__(self) -> None:
        if self.max_ngram < 1 or self.num_tokens < 1:
            raise ValueError(f"prompt lookup needs max_ngram >= 1 and num_tokens >= 1, got {self.max_ngram} and {self.num_tokens}")

    def session(self, vocab_size: int, device: torch.device) -> PromptLookupSession:
        """A session reading one sequence (logits over ``vocab_size`` tokens, on ``device``)."""
        return PromptLookupSession(self, vocab_size, device)


class PromptLookupSession:
    """:class:`PromptLookupDraft` reading one sequence, with the surface of :class:`CopySession`. The first
    row of a round looks the context up; the rows for the drafted tokens continue the copied span. A row
    proposes with logit 0 at its token and −inf elsewhere (−inf everywhere: nothing to propose)."""

    deterministic = True
    vocabulary = None

    def __init__(self, draft: PromptLookupDraft, vocab_size: int, device: torch.device) -> None:
        self.model, self.vocab_size, self.device = draft, vocab_size, device
        self.reset()

    def reset(self) -> None:
        self.tokens: list[int] = []
        self.match_lengths: list[int] = []
        self.begin_round()

    @property
    def length(self) -> int:
        return len(self.tokens)

    def can_draft(self, confirmed: int) -> bool:
        """A lookup needs two tokens: an n-gram and an earlier occurrence of it."""
        return confirmed >= 2

    def begin_round(self) -> None:
        """The round's first call looks the context up afresh, as transformers does at every round."""
        self._span: tuple[int, int] | None = None
        """(index of the token the last row proposed, end of the copied span) while a span is being copied."""
        self._drafting = False

    def forward(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Read tokens; one-hot logits ``[n, V]`` of the proposal after each (−inf rows: none). In the round's
        first call each row is a lookup; in later calls a token that is the last row's proposal moves along its
        span (which ends after ``num_tokens``), any other token is looked up."""
        rows = torch.full((len(token_ids), self.vocab_size), -math.inf, dtype=torch.float32)
        for i, token in enumerate(token_ids):
            self.tokens.append(int(token))
            span = self._span
            if self._drafting and span is not None and self.tokens[span[0]] == int(token):
                self._span = (span[0] + 1, span[1]) if span[0] + 1 < span[1] else None
                self.match_lengths.append(self.match_lengths[-1] if self._span else 0)
            else:
                self._span, ngram = self._lookup()
                self.match_lengths.append(ngram)
            if self._span is not None:
                rows[i, self.tokens[self._span[0]]] = 0.0
        self._drafting = True
        return rows.to(self.device)

    def _lookup(self) -> tuple[tuple[int, int] | None, int]:
        """The first earlier occurrence of the last n tokens (n = max_ngram, ..., 1) with a continuation: the
        span of up to ``num_tokens`` tokens after it, and n."""
        tokens = torch.tensor(self.tokens)
        length = len(self.tokens)
        for n in range(min(self.model.max_ngram, length - 1), 0, -1):
            windows = tokens.unfold(0, n, 1)
            starts = (windows == tokens[-n:]).all(dim=1).nonzero()[:, 0] + n
            starts = starts[starts < length]
            if len(starts):
                start = int(starts[0])
                return (start, min(start + self.model.num_tokens, length)), n
        return None, 0

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` tokens read."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to length {length}: the prompt lookup holds {self.length} tokens")
        del self.tokens[length:], self.match_lengths[length:]
        self.begin_round()


MODEL_FREE = (CopyDraft, PromptLookupDraft)
"""The drafters that need no model (``isinstance(draft, MODEL_FREE)``): no vocabulary of their own, chains only."""


def proposes(row: torch.Tensor) -> bool:
    """Whether a draft logits row proposes anything (a copy drafter's row is all −inf without a match)."""
    return bool(torch.isfinite(row).any())
