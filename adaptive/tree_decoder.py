"""Speculative decoding with draft trees (batch 1), greedy or sampled.

Each round grows a :class:`~adaptive.tree.DraftTree` below the last confirmed token, one batched draft
forward per depth, for as long as the depth policy says continue; the best ``shape.size`` nodes go to the
target in ONE forward under a tree attention mask. Greedy: the longest path matching the target's arg-max is
accepted, plus the target's next token. At T > 0: recursive rejection sampling over each node's verified
children (:func:`~adaptive.tree.accept_sampled`), exact for any tree. Both KV caches then keep only the context
and the accepted path. Cache invariant as in the chain decoder: after every round the caches hold every
confirmed token except the last (the draft possibly fewer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from transformers import PreTrainedModel

from adaptive.generation import Decoder, Generation, TokenBudget
from adaptive.observation import tree_summary
from adaptive.policy import DraftPolicy, DraftState, DraftStep, RoundStats
from adaptive.sampling import GREEDY, SamplingConfig, arg_max, check_logits, sampling_distribution
from adaptive.tree import DraftTree, TreeShape, accept_greedy, accept_sampled, attention_mask, grow_level
from adaptive.verification import CorrectionRule, residual_correction

DEFAULT_SHAPE = TreeShape()
"""k = 4, W = 4, V = 32."""


class TreeDecoder(Decoder):
    """Speculative decoding with EAGLE-2-style draft trees; greedy output identical to plain greedy, sampled output
    distributed exactly as the target's under ``sampling``.

    Args:
        target, draft: causal LMs sharing a tokenizer (the draft may have a reduced output vocabulary).
        policy: its ``should_continue`` decides when to stop growing the tree (it sees the best node of
            each depth as that depth's step); a policy whose ``sizes_trees`` is true (trained on tree
            traces) also picks V; ``reset``/``observe`` are called as in the chain decoder.
        shape: branching k, width W and verified nodes V (the default V).
        sampling: temperature / top-k / top-p of the target's distribution (the tree's nodes are the draft's
            top-k, proposals that need no sampling); default greedy.
        max_depth: hard cap on tree depth per round.
        correction: the rule after a rejected child; keep the default (exact residual) except to audit.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel,
        policy: DraftPolicy,
        shape: TreeShape = DEFAULT_SHAPE,
        sampling: SamplingConfig = GREEDY,
        *,
        tokenizer=None,
        max_depth: int = 8,
        eos_token_id: int | Sequence[int] | None = None,
        correction: CorrectionRule = residual_correction,
    ) -> None:
        super().__init__(target, draft, policy, tokenizer=tokenizer, max_depth=max_depth, eos_token_id=eos_token_id)
        if not hasattr(self.draft, "forward_masked"):
            raise ValueError(f"tree drafting needs a draft that attends under a tree mask; {type(draft).__name__} drafts chains only")
        self.shape = shape
        self.sampling = sampling
        self.correction = correction
        self.generator = torch.Generator(device=target.device)

    def _begin(self, prompt_ids: list[int], output: TokenBudget, seed: int | None) -> TreeGeneration:
        if seed is not None:
            self.generator.manual_seed(seed)
        return TreeGeneration(self, prompt_ids, output)


class TreeGeneration(Generation):
    """A tree generation in progress: each draft step grows the round's tree by one level (the first from
    the last confirmed token, the next ones with one batched draft forward over the W best frontier nodes)."""

    decoder: TreeDecoder

    def _begin_round(self) -> None:
        super()._begin_round()
        self.tree = DraftTree()
        self._steps: list[DraftStep] = []
        self._draft_time = self._forward_time = 0.0

    @property
    def depth(self) -> int:
        return self.tree.depth

    def steps(self) -> tuple[DraftStep, ...]:
        return tuple(self._steps)

    def state(self) -> DraftState:
        """What a policy knows now, with what the grown tree shows (:func:`~adaptive.observation.tree_summary`)."""
        nodes = self.tree.nodes
        ranked, level_mass = tree_summary([n.depth for n in nodes], [n.score for n in nodes])
        return replace(super().state(), tree_ranked=ranked, tree_level_mass=level_mass)

    def draft_step(self, features: bool = True) -> DraftStep:
        """Grow the tree by one level; the step is the level's best node (features always computed)."""
        if self.depth >= self.max_depth:
            raise ValueError(f"this round's tree is already {self.depth} levels deep, its cap (max_depth or token budget)")
        decoder, tree = self.decoder, self.tree
        clock, draft = decoder.clock, decoder.draft
        t0 = clock()
        if not tree.nodes:
            logits = draft.forward(self.tokens[draft.length :])[-1]
            self._forward_time += clock() - t0
            tree.add_children(-1, logits, decoder.shape.branching, draft.vocabulary)
        else:
            self._forward_time += grow_level(draft, [tree], [len(self.tokens)], decoder.shape, clock)
        self._steps.append(_step(tree.best_at(tree.depth)))
        self._draft_time += clock() - t0
        return self._steps[-1]

    def choose_size(self, policy: DraftPolicy, state: DraftState) -> int:
        """Nodes to verify: the policy's V if it sizes trees, else the shape's V."""
        if getattr(policy, "sizes_trees", False) and self.tree.nodes:
            return max(1, policy.verify_size(state))
        return self.decoder.shape.size

    def verify(self, size: int, policy_time: float = 0.0) -> RoundStats:
        """Send the ``size`` best nodes (an ancestor-closed set) to the target in ONE forward under a tree
        mask, accept a path (greedy: the longest arg-max path; sampled: :func:`~adaptive.tree.accept_sampled`)
        plus the token after it, and keep only the context and that path in both caches."""
        decoder, tree, tokens = self.decoder, self.tree, self.tokens
        clock, target, draft = decoder.clock, decoder.target, decoder.draft
        context = len(tokens)
        t0 = clock()
        selected = tree.select(size) if tree.nodes else []
        row = {index: j for j, index in enumerate(selected)}  # node -> its place among the verified nodes
        pending = tokens[target.length :]
        cached = target.length
        prefixes = [cached + i for i in range(len(pending))] + [context] * len(selected)
        ancestors = [[] for _ in pending] + [[context + row[a] for a in tree.ancestors(i)] for i in selected]
        positions = [cached + i for i in range(len(pending))] + [context - 1 + tree.nodes[i].depth for i in selected]
        mask = attention_mask(cached, prefixes, ancestors, target.dtype, target.device)
        t1 = clock()
        logits = target.forward_masked(pending + [tree.nodes[i].token for i in selected], positions, mask)[len(pending) - 1 :]
        target_forward = clock() - t1
        forward_time = self._forward_time + target_forward
        if decoder.sampling.is_greedy:
            check_logits(logits)
            choices = arg_max(logits).tolist()
            path = accept_greedy(tree, selected, choices[0], choices[1:])
            bonus = choices[1 + row[path[-1]]] if path else choices[0]
        else:
            path, bonus = accept_sampled(tree, selected, sampling_distribution(logits, decoder.sampling), decoder.generator, decoder.correction)
        emitted = self.output.emit([tree.nodes[i].token for i in path] + [bonus])
        target.keep(list(range(context)) + [context + row[i] for i in path])
        fed = [tree.slots[i] for i in _fed_prefix(tree, path)]
        draft.keep(list(range(min(draft.length, context))) + (fed if draft.length >= context else []))
        tokens.extend(emitted)
        self.recent.append(len(path))
        stats = RoundStats(
            context_length=context,
            drafted=tree.depth,
            verified=len(selected),
            accepted=len(path),
            emitted=len(emitted),
            tokens=tuple(emitted),
            draft_time=self._draft_time,
            verify_time=clock() - t0,
            policy_time=policy_time,
            forward_time=forward_time,
            steps=tuple(self._steps),
            target_forward_time=target_forward,
        )
        self._begin_round()
        return stats


def _step(node) -> DraftStep:
    return DraftStep(node.token, node.top1_prob, node.entropy, node.log_prob, node.score, margin=node.margin)


def _fed_prefix(tree: DraftTree, path: list[int]) -> list[int]:
    """The accepted path's leading nodes that the draft has cached (leaves were never fed)."""
    prefix = []
    for index in path:
        if index not in tree.slots:
            break
        prefix.append(index)
    return prefix
