"""Greedy speculative decoding with draft trees (batch 1).

Each round grows a :class:`~adaptive.tree.DraftTree` below the last confirmed token, one batched draft
forward per depth, for as long as the depth policy says continue; the best ``shape.size`` nodes go to the
target in ONE forward under a tree attention mask; the longest path matching the target's arg-max is
accepted, plus the target's next token. Both KV caches then keep only the context and the accepted path.

Greedy only: exact multi-candidate verification for sampling (T > 0) is not implemented; use the chain
:class:`~adaptive.decoder.SpeculativeDecoder` there. Cache invariant as in the chain decoder: after every
round the caches hold every confirmed token except the last (the draft possibly fewer).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from adaptive.cached_model import CachedModel
from adaptive.decoder import Clock, GenerationResult, TokenBudget, eos_token_ids, prompt_token_ids
from adaptive.pair import check_compatible
from adaptive.policy import RECENT_ROUNDS, DraftPolicy, DraftState, DraftStep, RoundStats
from adaptive.sampling import check_logits
from adaptive.tree import DraftTree, TreeShape, accept_greedy, attention_mask, grow_level


class TreeDecoder:
    """Greedy speculative decoding with EAGLE-2-style draft trees; output identical to plain greedy.

    Args:
        target, draft: causal LMs sharing a tokenizer (the draft may have a reduced output vocabulary).
        policy: its ``should_continue`` decides when to stop growing the tree (it sees the best node of
            each depth as that depth's step); a policy whose ``sizes_trees`` is true (trained on tree
            traces) also picks V; ``reset``/``observe`` are called as in the chain decoder.
        shape: branching k, width W and verified nodes V (the default V).
        max_depth: hard cap on tree depth per round.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel,
        policy: DraftPolicy,
        shape: TreeShape = TreeShape(),
        *,
        tokenizer=None,
        max_depth: int = 8,
        eos_token_id: int | Sequence[int] | None = None,
    ) -> None:
        check_compatible(target, draft, tokenizer, None)
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.target, self.draft = CachedModel(target), CachedModel(draft)
        self.policy, self.shape, self.tokenizer, self.max_depth = policy, shape, tokenizer, max_depth
        self.eos = eos_token_ids(target, eos_token_id)
        self.clock = Clock(target.device)

    def generate(self, prompt: str | Sequence[int] | torch.Tensor, max_new_tokens: int = 128) -> GenerationResult:
        """Generate up to ``max_new_tokens`` greedy tokens after ``prompt``."""
        tokens = prompt_token_ids(prompt, self.tokenizer)
        prompt_ids, budget = list(tokens), TokenBudget(max_new_tokens, self.eos)
        start = self.clock()
        self.policy.reset()
        for model in (self.target, self.draft):
            model.reset()
            if len(tokens) > 1:
                model.forward(tokens[:-1])
        rounds: list[RoundStats] = []
        first_token_time = 0.0
        while not budget.stop_reason:
            stats = self._round(tokens, budget, [r.accepted for r in rounds[-RECENT_ROUNDS:]])
            self.policy.observe(stats)
            if not rounds:
                first_token_time = self.clock() - start
            rounds.append(stats)
        total = self.clock() - start
        text = self.tokenizer.decode(budget.tokens, skip_special_tokens=True) if self.tokenizer else None
        return GenerationResult(prompt_ids, budget.tokens, rounds, total - sum(r.total_time for r in rounds), total, budget.stop_reason, text, first_token_time)

    def _round(self, tokens: list[int], budget: TokenBudget, recent: list[int]) -> RoundStats:
        clock, shape = self.clock, self.shape
        context = len(tokens)
        cap = min(self.max_depth, budget.remaining - 1)
        t0 = clock()
        tree, steps, policy_time, forward_time = DraftTree(), [], 0.0, 0.0
        if cap > 0:
            logits = self.draft.forward(tokens[self.draft.length :])[-1]
            forward_time = clock() - t0
            tree.add_children(-1, logits, shape.branching)
            steps.append(_step(tree.best_at(1)))
            while tree.depth < cap:
                t1 = clock()
                go_on = self.policy.should_continue(DraftState(context, tuple(steps), cap, tuple(recent)))
                policy_time += clock() - t1
                if not go_on:
                    break
                forward_time += grow_level(self.draft, [tree], [context], shape, clock)
                steps.append(_step(tree.best_at(tree.depth)))
        draft_time = clock() - t0 - policy_time
        size = shape.size
        if getattr(self.policy, "sizes_trees", False) and tree.nodes:
            t1 = clock()
            size = max(1, self.policy.verify_size(DraftState(context, tuple(steps), cap, tuple(recent))))
            policy_time += clock() - t1
        t0 = clock()
        selected = tree.select(size) if tree.nodes else []
        row = {index: j for j, index in enumerate(selected)}  # node -> its place among the verified nodes
        pending = tokens[self.target.length :]
        cached = self.target.length
        prefixes = [cached + i for i in range(len(pending))] + [context] * len(selected)
        ancestors = [[] for _ in pending] + [[context + row[a] for a in tree.ancestors(i)] for i in selected]
        positions = [cached + i for i in range(len(pending))] + [context - 1 + tree.nodes[i].depth for i in selected]
        mask = attention_mask(cached, prefixes, ancestors, self.target.dtype, self.target.device)
        t1 = clock()
        logits = self.target.forward_masked(pending + [tree.nodes[i].token for i in selected], positions, mask)[len(pending) - 1 :]
        forward_time += clock() - t1
        check_logits(logits)
        choices = logits.argmax(dim=-1).tolist()
        path = accept_greedy(tree, selected, choices[0], choices[1:])
        bonus = choices[1 + row[path[-1]]] if path else choices[0]
        emitted = budget.emit([tree.nodes[i].token for i in path] + [bonus])
        self.target.keep(list(range(context)) + [context + row[i] for i in path])
        fed = [tree.slots[i] for i in _fed_prefix(tree, path)]
        self.draft.keep(list(range(min(self.draft.length, context))) + (fed if self.draft.length >= context else []))
        tokens.extend(emitted)
        return RoundStats(
            context_length=context, drafted=tree.depth, verified=len(selected), accepted=len(path), emitted=len(emitted),
            tokens=tuple(emitted), draft_time=draft_time, verify_time=clock() - t0, policy_time=policy_time,
            forward_time=forward_time, steps=tuple(steps),
        )


def _step(node) -> DraftStep:
    return DraftStep(node.token, node.top1_prob, node.entropy, node.log_prob, node.score)


def _fed_prefix(tree: DraftTree, path: list[int]) -> list[int]:
    """The accepted path's leading nodes that the draft has cached (leaves were never fed)."""
    prefix = []
    for index in path:
        if index not in tree.slots:
            break
        prefix.append(index)
    return prefix
