"""A lean forward pass for Llama-family causal LMs: the decoders' fast path.

transformers' eager forward spends a third of a decoding step outside the matrix products (dispatch, Python, a
growing cache) and multiplies bf16 weights at about half the bandwidth llama.cpp reaches on the same CPU.
:class:`LeanLlama` runs the same model with q/k/v and gate/up fused into one product each, a preallocated KV cache
(rollback moves one integer), attention over the filled part only, and a choice of weights (:data:`WEIGHTS`):

* ``model``: the model's own weights, in its dtype;
* ``int8``: weight-only int8, one scale per output row;
* ``int4``: weight-only int4 in groups of 32 with a scale and an offset each, which reproduce a Q4_1 GGUF file's
  weights (the default target is shipped as one) up to float rounding; the output head (the tied embedding, Q8_0 in
  that file) is int8;
* ``int8-aten``, ``int4-aten``: the same weights, always on torch's kernels (to compare).

bf16 models multiply low-bit weights with :mod:`adaptive.lowbit_kernels` (AVX512-BF16) where they run, else with
torch's kernels (``torch._weight_int8pack_mm``, ``torch._weight_int4pack_mm_for_cpu``).

With ``compiled=True`` the one-token step is compiled by inductor as one graph (plain decoding's and a head's target's:
it returns every layer's residual stream), dynamic in the context and the cache's size from its first call, each
layer's three parts nested compile regions compiled once for all layers (:func:`attention_inputs`,
:func:`layer_attention`, :func:`layer_output`; the attention region halved a cold compile of both graphs, 118 to 59 s,
2026-12-07), attention written as products and sums it fuses (:func:`fused_attention`), guards on its inputs
only (:func:`inputs_only`). Verifications (2 to :data:`VERIFY_MAX` tokens after a context, under a mask) run through
a second graph of the same parts, dynamic in the token count too (:attr:`LeanLlama.verify`); a prompt's prefill stays
uncompiled. With inductor's own int4 lowering such a graph was slower than the uncompiled forward (2026-12-06);
calling the products as opaque kernels it is faster (5 tokens 15.4 against 23.6 ms, compiled-int4, 2026-12-07).

Forwards of more than :data:`VERIFY_MAX` rows (a prompt's prefill, a wide tree's verification) multiply low-bit
weights as one dense product of the weights as the kernels read them, rounded to the model's dtype
(:attr:`Product.wide`): the kernels read each weight once per 8 rows, which suits decoding, not a prompt (192 tokens
on the int4 target: 675 ms on the kernels, 102 ms dense in bf16, a 2-core Xeon with AMX, 2026-12-07).

EAGLE-3 heads follow the engine (:mod:`adaptive.lean_head`), and :mod:`adaptive.engines` names the engines the
command line offers.

:func:`make_lean` attaches an engine to a loaded model; :func:`open_cache` gives a decoder the session for a model,
lean where one is attached (:class:`LeanCache`), else transformers' own (:class:`~adaptive.cached_model.CachedModel`).
Both have the same surface, so every single-sequence decoder runs on either.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import FunctionType, MethodType

import torch
import torch.nn.functional as F
from torch import nn
from torch._inductor.runtime.cache_dir_utils import default_cache_dir
from tqdm import tqdm
from transformers import PreTrainedModel

from adaptive import lowbit_kernels
from adaptive.cached_model import CachedModel, output_vocabulary
from adaptive.models import cache_root

WEIGHTS = ("model", "int8", "int4", "int8-aten", "int4-aten")
"""How :class:`LeanLlama` holds its matrices (see the module's docstring)."""
GROUP = 32
"""Weights per int4 group (Q4_1's block size)."""
CACHE_BLOCK = 256
"""Positions the KV cache grows by when it fills."""


class Product:
    """``x @ weight.T`` for ``x [n, K]``, with the weight held as :data:`WEIGHTS` says; :attr:`kernel` names what
    multiplies it (``model``; ``int8-dot``, ``int4-dot`` for :mod:`adaptive.lowbit_kernels`; ``int8``, ``int4`` for torch's).
    With ``wide``, :attr:`wide` multiplies the same low-bit weights as one dense product, for inputs of many rows."""

    def __init__(self, weight: torch.Tensor, kind: str, dtype: torch.dtype, wide: bool = False) -> None:
        if kind not in WEIGHTS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {kind!r}")
        self.kind = kind
        rows, columns = weight.shape
        self.out_features = rows
        weight = weight.detach().float()
        own = not kind.endswith("-aten") and dtype == torch.bfloat16 and lowbit_kernels.fits(rows, columns) and lowbit_kernels.available()
        read = weight  # the weight as the kernels read it
        if kind == "model":
            self.kernel, self.tensors = "model", (weight.to(dtype).contiguous(),)
        elif kind.startswith("int8"):
            scale = (weight.abs().amax(dim=1).clamp(min=1e-12) / 127).to(dtype)  # both kernels multiply by it in dtype
            levels = (weight / scale[:, None].float()).round().clamp(-127, 127).to(torch.int8).contiguous()
            read = levels.float() * scale.float()[:, None]
            if own:
                self.kernel, self.tensors = "int8-dot", (lowbit_kernels.pack_int8(levels), scale.float())
            else:
                self.kernel, self.tensors = "int8", (levels, scale)
        else:
            if columns % GROUP:
                raise ValueError(f"int4 weights need input sizes that are multiples of {GROUP}, got {columns}")
            groups = weight.reshape(rows, columns // GROUP, GROUP)
            low, high = groups.amin(dim=-1, keepdim=True), groups.amax(dim=-1, keepdim=True)
            step = torch.where(high > low, (high - low) / 15, torch.ones_like(low))
            levels = ((groups - low) / step).round().clamp(0, 15).to(torch.int32).reshape(rows, columns)
            offset = low + 8 * step  # both kernels read level q as (q - 8) * step + offset, step and offset rounded to dtype
            step, offset = step[..., 0].to(dtype), offset[..., 0].to(dtype)
            read = ((levels.reshape(rows, -1, GROUP) - 8).float() * step.float()[..., None] + offset.float()[..., None]).reshape(rows, columns)
            if own:
                self.kernel, self.tensors = "int4-dot", (lowbit_kernels.pack_int4(levels, step, offset),)
            else:
                packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(levels, 1)
                self.kernel, self.tensors = "int4", (packed, torch.tensor(GROUP), torch.stack((step, offset), dim=-1).transpose(0, 1).contiguous())
        self.wide = (self if kind == "model" else Product(read, "model", dtype)) if wide else None
        """The weight as the kernel reads it, rounded to ``dtype``, multiplied densely (``F.linear``: one oneDNN product,
        fast for many rows; each weight within half a ``dtype`` step of what the kernel multiplies by), or None."""

    @property
    def parts(self) -> tuple[str, tuple[torch.Tensor, ...]]:
        """What :func:`multiply` takes after ``x``: the kernel and its operands."""
        return self.kernel, self.tensors

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return multiply(x, *self.parts)


def multiply(x: torch.Tensor, kernel: str, tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``x @ W.T`` for a matrix held for ``kernel`` (:class:`Product`). torch's int4 kernel is called through its own
    op with the group size as a tensor: inductor lowers the aten op to it with the size as a graph constant, which a
    nested compile region leaves unset (torch 2.13)."""
    if kernel == "model":
        return F.linear(x, *tensors)
    if kernel == "int8":
        return torch.ops.aten._weight_int8pack_mm(x, *tensors)
    if kernel == "int4-dot":
        return torch.ops.adaptive.int4_matmul(x, *tensors)
    if kernel == "int8-dot":
        return torch.ops.adaptive.int8_matmul(x, *tensors)
    packed, group, scales = tensors
    return torch.ops.quantized.int4mm_packed_weight_cpu(x, packed, group, scales)


def inputs_only(guards: list) -> list[bool]:
    """The guards a compiled step keeps (``guard_filter_fn``): those on what is passed in (the cache, the context),
    none on its object's own attributes (weights and sizes, fixed once built): checking their ~1,000 guards before
    every step cost 0.5-1.5 ms of a 9 ms step (2026-12-07). Safe only with :func:`own_code`."""
    return [not guard.name.startswith("self.") for guard in guards]


def own_code(method: MethodType) -> MethodType:
    """``method`` bound to a copy of its function with a code object of its own. Dynamo keeps compiled graphs per code
    object and tells them apart by their guards: with :func:`inputs_only` two engines sharing one code object would
    run each other's graphs."""
    function = method.__func__
    copy = FunctionType(function.__code__.replace(), function.__globals__, function.__name__, function.__defaults__, function.__closure__)
    return MethodType(copy, method.__self__)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: normalised in float32, back to the activations' dtype, then scaled."""
    return weight * F.rms_norm(x.float(), x.shape[-1:], None, eps).to(x.dtype)


def attention_inputs(
    x: torch.Tensor, norm: torch.Tensor, eps: float, qkv: tuple, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int
) -> torch.Tensor:
    """A layer's rotated queries and keys, then its values, of the residual streams ``x [N, hidden]``:
    ``[N, (heads + 2·kv_heads)·dim]``, one tensor (a region's outputs may not alias each other)."""
    dim = cos.shape[-1]
    qkv = multiply(rms_norm(x, norm, eps), *qkv).view(len(x), heads + 2 * kv_heads, dim)  # viewed whole, then sliced: a
    # slice's view would guard on the token count being 1 in the batched graph (:func:`size_oblivious`)
    qk = qkv[:, : heads + kv_heads]
    qk = qk * cos + torch.cat((-qk[..., dim // 2 :], qk[..., : dim // 2]), dim=-1) * sin  # rotary, queries and keys at once
    return torch.cat((qk, qkv[:, heads + kv_heads :]), dim=1).view(len(x), -1)


def layer_output(x: torch.Tensor, attended: torch.Tensor, out: tuple, norm: torch.Tensor, eps: float, gate_up: tuple, down: tuple) -> torch.Tensor:
    """A layer's output streams: ``x [N, hidden]`` plus the projected attention (``attended [N, heads·dim]``), plus
    the MLP of that."""
    x = x + multiply(attended, *out)
    gate, up = multiply(rms_norm(x, norm, eps), *gate_up).chunk(2, dim=-1)
    return x + multiply(F.silu(gate) * up, *down)


attention_region = torch.compiler.nested_compile_region(attention_inputs)
""":func:`attention_inputs` as a nested compile region: compiled once for every layer of a one-sequence graph, which
shortens compilation by a third. The batched graph inlines the function instead: a region's inputs may not have sizes
that are products of the graph's (rows × tokens), which its wrapper cannot bind in torch 2.13."""
output_region = torch.compiler.nested_compile_region(layer_output)
""":func:`layer_output` as a nested compile region, as :data:`attention_region`."""


@torch.compiler.nested_compile_region
def layer_attention(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """A layer's attention ``[n, heads·dim]`` of its rotated ``queries [n, heads, dim]`` over the cache's ``keys`` and
    ``values`` ``[kv_heads, capacity, dim]``, slots ``[0, L)`` where ``mask [group·n, L]`` allows (a nested compile
    region, as :data:`attention_region`)."""
    n, heads, dim = queries.shape
    grouped = queries.transpose(0, 1).reshape(kv_heads, heads // kv_heads * n, dim)
    end = mask.shape[-1]
    attended = fused_attention(grouped, keys[:, :end], values[:, :end], mask)
    return attended.reshape(heads, n, dim).transpose(0, 1).reshape(n, heads * dim)


def batched_attention(projected: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor, heads: int) -> tuple[torch.Tensor, ...]:
    """Several rows' attention ``[B·n, heads·dim]`` of their rotated queries over the cache's ``keys`` and ``values``
    ``[B, kv_heads, C, dim]`` followed by their own new keys and values, where ``allowed [B, n, C + n]`` says
    (``projected [B, n, (heads + 2·kv_heads)·dim]``: :func:`attention_inputs`); and the cache's keys and values with
    the new ones appended. Written with views and fresh tensors only, never a reshape of a strided view: under sizes
    compiled as any (:func:`size_oblivious`) such a reshape guards on a size being 1."""
    rows, n = projected.shape[:2]
    kv_heads, dim = keys.shape[1], keys.shape[3]
    group = heads // kv_heads
    queries, new_keys, new_values = projected.view(rows, n, heads + 2 * kv_heads, dim).split((heads, kv_heads, kv_heads), dim=2)
    keys, values = torch.cat((keys, new_keys.transpose(1, 2)), dim=2), torch.cat((values, new_values.transpose(1, 2)), dim=2)
    queries = queries.clone(memory_format=torch.contiguous_format)  # a fresh tensor views freely
    grouped = queries.view(rows, n, kv_heads, group, dim).permute(0, 2, 3, 1, 4)  # [B, kv_heads, group, n, dim]
    attended = fused_attention(grouped, keys[:, :, None], values[:, :, None], allowed[:, None, None])
    attended = attended.permute(0, 3, 1, 2, 4).clone(memory_format=torch.contiguous_format)  # [B, n, kv_heads, group, dim]
    return attended.view(rows * n, heads * dim), keys, values


def fused_attention(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention of the queries ``[..., kv_heads, rows, dim]`` over ``keys``/``values`` ``[..., kv_heads, L, dim]``
    where ``mask`` (``[rows, L]``, or broadcasting to the scores ``[..., kv_heads, rows, L]``) allows (everywhere when
    None), written as products and sums that inductor fuses into one loop (in float32 for 16-bit activations)."""
    compute = torch.float32 if queries.dtype in (torch.bfloat16, torch.float16) else queries.dtype
    scores = (queries.to(compute)[..., :, None, :] * keys.to(compute)[..., None, :, :]).sum(-1) * queries.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1)[..., None] * values.to(compute)[..., None, :, :]).sum(-2).to(queries.dtype)


class LeanLinear(nn.Module):
    """A bias-free ``nn.Linear`` whose matrix is held as a :class:`Product` (inputs of any leading shape; more than
    :data:`VERIFY_MAX` rows, e.g. a head reading a prompt, multiplied by its dense twin, :attr:`Product.wide`)."""

    def __init__(self, linear: nn.Linear, kind: str) -> None:
        super().__init__()
        self.product = Product(linear.weight, kind, linear.weight.dtype, wide=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        product = self.product.wide if len(rows) > VERIFY_MAX else self.product
        return product(rows).reshape(*x.shape[:-1], self.product.out_features)


class KVCache:
    """Keys and values of every layer for one sequence, preallocated ``[kv_heads, capacity, head_dim]`` per layer
    (one tensor each, so a compiled step writes its slots in place) and grown in blocks of :data:`CACHE_BLOCK`
    positions; slots ``[0, length)`` hold the sequence."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.keys = [torch.empty((kv_heads, 0, head_dim), dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.empty((kv_heads, 0, head_dim), dtype=dtype, device=device) for _ in range(layers)]

    def reserve(self, positions: int) -> None:
        """Make room for ``positions`` slots."""
        capacity = self.keys[0].shape[1]
        if positions <= capacity:
            return
        grown = -(-positions // CACHE_BLOCK) * CACHE_BLOCK
        for tensors in (self.keys, self.values):
            for index, old in enumerate(tensors):
                new = old.new_empty((old.shape[0], grown, old.shape[2]))
                new[:, :capacity] = old
                tensors[index] = new

    def keep(self, columns: torch.Tensor) -> None:
        """Move the slots at ``columns`` to the front, in that order."""
        count = len(columns)
        for tensors in (self.keys, self.values):
            for tensor in tensors:
                tensor[:, :count] = tensor.index_select(1, columns)


class LeanLlama:
    """The forward pass of a transformers Llama-family model (``LlamaForCausalLM`` and models with its layout:
    RMSNorm, rotary embeddings of the default kind, grouped-query attention, a SiLU-gated MLP, no biases) over
    a :class:`KVCache`, with its matrices held as ``weights`` says (:data:`WEIGHTS`)."""

    def __init__(self, model: PreTrainedModel, weights: str = "int4", compiled: bool = False) -> None:
        check_layout(model)
        config, body = model.config, model.model
        self.weights = weights
        self.dtype = next(model.parameters()).dtype
        self.device = model.device
        if weights != "model" and self.device.type != "cpu":
            raise ValueError(f"{weights} weights run on the CPU only, the model is on {self.device}; use weights='model'")
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.layers = config.num_hidden_layers
        self.eps = float(config.rms_norm_eps)
        self.embedding = body.embed_tokens.weight.detach()
        self.norms = [(layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach()) for layer in body.layers]
        self.final_norm = body.norm.weight.detach()
        self.qkv, self.out, self.gate_up, self.down = [], [], [], []
        for layer in body.layers:
            attention, mlp = layer.self_attn, layer.mlp
            self.qkv.append(Product(torch.cat((attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight)), weights, self.dtype, wide=True))
            self.out.append(Product(attention.o_proj.weight, weights, self.dtype, wide=True))
            self.gate_up.append(Product(torch.cat((mlp.gate_proj.weight, mlp.up_proj.weight)), weights, self.dtype, wide=True))
            self.down.append(Product(mlp.down_proj.weight, weights, self.dtype, wide=True))
        self.head = Product(model.lm_head.weight, weights.replace("int4", "int8"), self.dtype, wide=True)
        theta = float((getattr(config, "rope_parameters", None) or {}).get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        self.inverse_frequencies = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=self.device) / self.head_dim))
        self.compiled = compiled
        if compiled:  # its sizes fixed: never generalised by dynamo because another engine's differ
            own = [self.embedding, self.final_norm, self.inverse_frequencies, *(w for pair in self.norms for w in pair)]
            own += [t for p in (*self.qkv, *self.out, *self.gate_up, *self.down, self.head) for t in p.tensors if t.dim()]
            for tensor in own:
                torch._dynamo.mark_static(tensor)
        self.step = torch.compile(own_code(self._step), dynamic=None, fullgraph=True, options={"guard_filter_fn": inputs_only}) if compiled else None
        """One token that sees every slot (plain decoding's step; a head's target's, with taps), compiled by inductor:
        the small ops of each layer fused into a few loops, attention included (:func:`fused_attention`, under an
        all-True mask, so that the attention region takes the same inputs in both graphs)."""
        self.verify = torch.compile(own_code(self._verify), dynamic=None, fullgraph=True, options={"guard_filter_fn": inputs_only}) if compiled else None
        """2 to :data:`VERIFY_MAX` tokens under a mask (a chain's or a tree's verification), compiled as :attr:`step`,
        dynamic in the token count too."""
        self.batch = torch.compile(own_code(self._batch), dynamic=None, fullgraph=True, options={"guard_filter_fn": inputs_only}) if compiled else None
        """Several rows' next tokens (the batched decoder's rounds, :meth:`batched`), compiled as :attr:`step` (on
        first use: :func:`compile_batched`), dynamic in rows, tokens per row and cache columns from its first call."""
        self.batch_compiled = False
        """Whether :func:`compile_batched` has compiled :attr:`batch`."""

    def new_cache(self) -> KVCache:
        """An empty cache for one sequence."""
        return KVCache(self.layers, self.kv_heads, self.head_dim, self.dtype, self.device)

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[n, 1, head_dim]`` at ``positions``."""
        angles = positions.float()[:, None] * self.inverse_frequencies
        angles = torch.cat((angles, angles), dim=-1)[:, None, :]
        return angles.cos().to(self.dtype), angles.sin().to(self.dtype)

    @torch.inference_mode()
    def __call__(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        start: int,
        mask: torch.Tensor | None = None,
        taps: Sequence[int] = (),
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits ``[n, V]`` of ``token_ids [n]`` at rotary ``positions [n]``, written to cache slots
        ``start .. start + n`` and attending over slots ``[0, start + n)`` under ``mask`` (boolean ``[n, start + n]``,
        True where attention is allowed; None: causal, token i at position start + i seeing slots up to its own); and
        the residual streams entering the ``taps`` layers ``[n, hidden]`` each (transformers' ``hidden_states[i]``). A
        compiled engine runs one token without a mask (plain decoding's step, with or without taps) through :attr:`step`."""
        cache.reserve(start + len(token_ids) + 1)  # one spare slot: attention never reads the whole tensor, whose
        # contiguity would be another case for the compiled step (a recompile of half a minute in mid-decoding)
        n = len(token_ids)
        if self.step is None or (n > 1 or mask is not None) and (n > VERIFY_MAX or start == 0):  # a prompt's prefill
            return self._forward(token_ids, positions, cache.keys, cache.values, start, mask, tuple(taps), fused=False)
        if n == 1 and (mask is None or bool(mask.all())):  # a token that sees every slot: the step's case
            logits, states = self.step(token_ids, positions, cache.keys, cache.values, start)
        else:
            # a tree's mask arrives made outside inference mode: copied, so that one graph serves both kinds
            mask = causal_mask(n, start, token_ids.device) if mask is None else mask if mask.is_inference() else mask.clone()
            with torch.compiler.config.patch(dynamic_sources=VERIFY_DYNAMIC):
                logits, states = self.verify(token_ids, positions, cache.keys, cache.values, start, mask)
        return logits, [states[index] for index in taps]

    def _step(
        self, token_ids: torch.Tensor, positions: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], start: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The compiled step's body: the logits and every layer's incoming residual stream, stacked ``[layers + 1,
        1, hidden]`` (one graph for plain decoding and a head's target alike: compiled once)."""
        logits, states = self._forward(token_ids, positions, keys, values, start, None, tuple(range(self.layers + 1)), fused=True)
        return logits, torch.stack(states)

    def _verify(
        self, token_ids: torch.Tensor, positions: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], start: int, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The compiled verification's body: as :meth:`_step`, for ``n`` tokens under ``mask [n, start + n]``."""
        logits, states = self._forward(token_ids, positions, keys, values, start, mask, tuple(range(self.layers + 1)), fused=True)
        return logits, torch.stack(states)

    def _forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        start: int,
        mask: torch.Tensor | None,
        taps: tuple[int, ...],
        fused: bool,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        n, end = len(token_ids), start + len(token_ids)
        wide = not fused and n > VERIFY_MAX  # the compiled graphs always multiply on the kernels
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        group = heads // kv_heads
        x = self.embedding[token_ids]  # [n, hidden]
        cos, sin = self.rotary(positions)
        if mask is None and (n > 1 or fused):  # the fused attention region always takes a mask (the step's: all True)
            mask = causal_mask(n, start, token_ids.device)
        if mask is not None:  # query rows are ordered (head within its key/value group, token): [group·n, end]
            mask = mask.repeat(group, 1)
        tapped = []
        for index in range(self.layers):
            if index in taps:
                tapped.append(x)
            queries, new_keys, new_values = self._project(index, x, cos, sin, wide)
            keys[index][:, start:end] = new_keys.transpose(0, 1)
            values[index][:, start:end] = new_values.transpose(0, 1)
            if fused:
                attended = layer_attention(queries, keys[index], values[index], mask, kv_heads)
            else:
                queries = queries.transpose(0, 1).reshape(kv_heads, group * n, dim)  # each key/value head's queries together
                attended = F.scaled_dot_product_attention(queries[None], keys[index][None, :, :end], values[index][None, :, :end], attn_mask=mask)
                attended = attended.reshape(heads, n, dim).transpose(0, 1).reshape(n, heads * dim)
            x = self._finish(index, x, attended, wide)
        x = rms_norm(x, self.final_norm, self.eps)
        if self.layers in taps:
            tapped.append(x)
        return (self.head.wide if wide else self.head)(x), tapped

    def _project(self, index: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, wide: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer ``index``'s rotated queries ``[N, heads, dim]``, rotated keys and values ``[N, kv_heads, dim]`` of
        the residual streams ``x [N, hidden]`` (cos and sin ``[N, 1, dim]``); ``wide``: dense products (:attr:`Product.wide`)."""
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        qkv = self.qkv[index].wide if wide else self.qkv[index]
        projected = attention_region(x, self.norms[index][0], self.eps, qkv.parts, cos, sin, heads, kv_heads)
        queries, keys, values = projected.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
        return queries.view(len(x), heads, dim), keys.view(len(x), kv_heads, dim), values.view(len(x), kv_heads, dim)

    def _finish(self, index: int, x: torch.Tensor, attended: torch.Tensor, wide: bool) -> torch.Tensor:
        """Layer ``index``'s output streams of ``x [N, hidden]`` and its attention ``attended [N, heads·dim]``; ``wide``:
        dense products (:attr:`Product.wide`)."""
        out, gate_up, down = ((p.wide if wide else p) for p in (self.out[index], self.gate_up[index], self.down[index]))
        return output_region(x, attended, out.parts, self.norms[index][1], self.eps, gate_up.parts, down.parts)

    @torch.inference_mode()
    def batched(
        self, token_ids: torch.Tensor, positions: torch.Tensor, cache: list[BatchedLayer], allowed: torch.Tensor, taps: Sequence[int] = ()
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Several sequences at once (the batched decoder's forward): logits ``[B, n, V]`` of ``token_ids [B, n]`` at
        rotary ``positions [B, n]``, their keys and values appended to each layer of ``cache`` (``[B, kv_heads, C, dim]``
        each, C growing by n), attending where ``allowed [B, n, C + n]`` says; and the residual streams entering the
        ``taps`` layers ``[B, n, hidden]`` each. A compiled engine runs up to :data:`VERIFY_MAX` tokens per row after
        the rows' first entries through :attr:`batch`; the rows' prefill runs uncompiled."""
        keys, values = [layer.keys for layer in cache], [layer.values for layer in cache]
        prefill = keys[0] is None or keys[0].shape[2] == 0 or token_ids.shape[1] > VERIFY_MAX
        if self.batch is None or prefill:
            logits, states, keys, values = self._batched(token_ids, positions, keys, values, allowed, fused=False)
        else:
            with torch.compiler.config.patch(dynamic_sources=BATCH_DYNAMIC), size_oblivious():
                logits, states, keys, values = self.batch(token_ids, positions, keys, values, allowed)  # states stacked: indexed alike
        for layer, layer_keys, layer_values in zip(cache, keys, values):
            layer.keys, layer.values = layer_keys, layer_values
        return logits, [states[index] for index in taps]

    def _batch(
        self, token_ids: torch.Tensor, positions: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], allowed: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """The compiled batched forward's body: as :meth:`_batched`, every layer's residual stream stacked ``[layers + 1,
        B, n, hidden]``."""
        logits, states, keys, values = self._batched(token_ids, positions, keys, values, allowed, fused=True)
        return logits, torch.stack(states), keys, values

    def _batched(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        keys: list[torch.Tensor | None],
        values: list[torch.Tensor | None],
        allowed: torch.Tensor,
        fused: bool,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """:meth:`batched`'s work on the cache's tensors (None: no entries yet): the logits, every layer's incoming
        residual stream and the final normed one ``[B, n, hidden]``, and each layer's keys and values with the new
        columns appended."""
        rows, n = token_ids.shape
        wide = not fused and rows * n > VERIFY_MAX  # a few rows' prefill: dense products (the compiled graph: the kernels)
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        group = heads // kv_heads
        x = self.embedding[token_ids].reshape(rows * n, -1)
        cos, sin = self.rotary(positions.reshape(-1))
        states, all_keys, all_values = [], [], []
        for index in range(self.layers):
            states.append(x.view(rows, n, -1))
            if fused:
                projected = attention_inputs(x, self.norms[index][0], self.eps, self.qkv[index].parts, cos, sin, heads, kv_heads)
                attended, layer_keys, layer_values = batched_attention(projected.view(rows, n, -1), keys[index], values[index], allowed, heads)
                x = layer_output(x, attended, self.out[index].parts, self.norms[index][1], self.eps, self.gate_up[index].parts, self.down[index].parts)
            else:
                queries, new_keys, new_values = (t.view(rows, n, -1, dim).transpose(1, 2) for t in self._project(index, x, cos, sin, wide))
                layer_keys, layer_values = (  # contiguous, as the compiled graph's inputs always are
                    new.contiguous() if old is None else torch.cat((old, new), dim=2) for old, new in ((keys[index], new_keys), (values[index], new_values))
                )
                grouped = queries.reshape(rows, kv_heads, group * n, dim)  # query rows: head within its group, token
                attended = F.scaled_dot_product_attention(grouped, layer_keys, layer_values, attn_mask=allowed.repeat(1, group, 1)[:, None])
                x = self._finish(index, x, attended.reshape(rows, heads, n, dim).transpose(1, 2).reshape(rows * n, heads * dim), wide)
            all_keys.append(layer_keys)
            all_values.append(layer_values)
        x = rms_norm(x, self.final_norm, self.eps)
        states.append(x.view(rows, n, -1))
        return (self.head.wide if wide else self.head)(x).view(rows, n, -1), states, all_keys, all_values


class BatchedLayer:
    """One layer's keys and values for several rows, ``[B, kv_heads, C, dim]`` each (None until the first forward):
    the batched decoder's cache layer on a lean engine, with the attributes of transformers' cache layers it reads."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None


class BatchedLeanCache:
    """The batched decoder's cache on a lean engine: one :class:`BatchedLayer` per layer (``layers``, as transformers'
    caches name them)."""

    def __init__(self, layers: int) -> None:
        self.layers = [BatchedLayer() for _ in range(layers)]


def check_layout(model: PreTrainedModel) -> None:
    """Raise ValueError unless ``model`` has the Llama layout :class:`LeanLlama` runs."""
    config = model.config
    body = getattr(model, "model", None)
    layers = getattr(body, "layers", None)
    problems = []
    if layers is None or not hasattr(model, "lm_head"):
        problems.append("no model.layers / lm_head")
    else:
        layer = layers[0]
        attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if not all(hasattr(attention, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj")):
            problems.append("attention without q/k/v/o projections")
        if not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj")):
            problems.append("an MLP without gate/up/down projections")
        if any(getattr(module, "bias", None) is not None for module in (attention.q_proj, mlp.gate_proj, model.lm_head) if module is not None):
            problems.append("biases")
    if getattr(config, "hidden_act", "silu") != "silu":
        problems.append(f"activation {config.hidden_act}")
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", "default") != "default":
        problems.append(f"rotary embeddings of type {rope['rope_type']}")
    if problems:
        raise ValueError(f"the lean forward runs Llama-layout models; {type(model).__name__} has {', '.join(problems)}: use --engine eager")


class LeanCache:
    """A model and its :class:`KVCache` for one sequence through :class:`LeanLlama`: the surface of
    :class:`~adaptive.cached_model.CachedModel` (feed tokens, read logits, roll back, keep a tree's path, keep
    the ``taps`` layers' hidden states in :attr:`tapped`)."""

    deterministic = False

    def __init__(self, model: PreTrainedModel, engine: LeanLlama, taps: tuple[int, ...] | None = None) -> None:
        self.model = model
        self.engine = engine
        self.device = engine.device
        self.dtype = engine.dtype
        self.taps = taps
        self.vocabulary = output_vocabulary(model)
        self.cache = engine.new_cache()
        self.hidden = torch.empty(0, len(taps or ()) * model.config.hidden_size, dtype=self.dtype, device=self.device)
        self.length = 0

    @property
    def tapped(self) -> torch.Tensor:
        """The tapped hidden states of every cached position, concatenated: ``[length, len(taps)·hidden]``."""
        return self.hidden[: self.length]

    def reset(self) -> None:
        """Start a new sequence (the cache's memory is kept)."""
        self.length = 0

    def can_draft(self, confirmed: int) -> bool:
        return True

    def begin_round(self) -> None:
        """A round starts (nothing to do)."""

    @torch.inference_mode()
    def _run(self, token_ids: Sequence[int], positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        ids = torch.tensor(list(token_ids), dtype=torch.long, device=self.device)
        logits, tapped = self.engine(ids, positions, self.cache, self.length, mask, self.taps or ())
        end = self.length + len(ids)
        if self.taps:
            if self.hidden.shape[0] < end:
                grown = torch.empty(-(-end // CACHE_BLOCK) * CACHE_BLOCK, self.hidden.shape[1], dtype=self.dtype, device=self.device)
                grown[: self.length] = self.hidden[: self.length]
                self.hidden = grown
            self.hidden[self.length : end] = torch.cat(tapped, dim=-1)
        self.length = end
        return logits

    def forward(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Append ``token_ids`` after the cached prefix; return their logits ``[len(token_ids), V]``."""
        n = len(token_ids)
        return self._run(token_ids, torch.arange(self.length, self.length + n, device=self.device), None)

    def forward_masked(self, token_ids: Sequence[int], positions: Sequence[int], mask: torch.Tensor) -> torch.Tensor:
        """Append ``token_ids`` at rotary ``positions`` under an additive attention ``mask`` ``[1, 1, n, length + n]``
        (0 where allowed, -inf elsewhere: draft trees); return their logits ``[n, V]``."""
        allowed = mask[0, 0] == 0
        return self._run(token_ids, torch.tensor(list(positions), dtype=torch.long, device=self.device), allowed)

    @torch.inference_mode()
    def keep(self, columns: Sequence[int]) -> None:
        """Keep only the cache entries at ``columns`` (in that order): a tree's accepted path after its context."""
        if any(not 0 <= c < self.length for c in columns):
            raise ValueError(f"cache columns must lie in [0, {self.length}), got {list(columns)}")
        index = torch.tensor(list(columns), dtype=torch.long, device=self.device)
        self.cache.keep(index)
        if self.taps:
            self.hidden[: len(index)] = self.hidden.index_select(0, index)
        self.length = len(index)

    def rollback(self, length: int) -> None:
        """Discard cached entries past ``length`` (keep the first ``length`` tokens)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to length {length}: the cache holds {self.length} tokens")
        self.length = length


def make_lean(model: PreTrainedModel, weights: str = "int4", compiled: bool = False) -> PreTrainedModel:
    """Attach a :class:`LeanLlama` with ``weights`` to ``model`` (which is returned): every decoder that opens its
    cache with :func:`open_cache` then runs it through the lean forward. ``compiled``: its one-token step is
    compiled now (:func:`compile_step`)."""
    model.lean_engine = LeanLlama(model, weights, compiled)
    if compiled:
        compile_step(model, model.lean_engine)
    return model


STEP_DYNAMIC = r"L\['start'\],L\['(keys|values)'\]\[\d+\]:1"
"""What varies between one-token steps (the context and the cache's capacity), compiled as sizes from the first
call on: otherwise inductor compiles a graph for the first context, then another for any (half the time)."""
VERIFY_DYNAMIC = STEP_DYNAMIC + r",L\['(token_ids|positions|mask)'\]"
"""What varies between verifications: as :data:`STEP_DYNAMIC`, and the token count."""
VERIFY_MAX = 16
"""The most tokens a compiled verification takes; longer forwards (a prompt's prefill) run uncompiled."""
BATCH_DYNAMIC = r"L\['(token_ids|positions|allowed)'\],L\['(keys|values)'\]\[\d+\]:0,L\['(keys|values)'\]\[\d+\]:2"
"""What varies between batched forwards: rows, tokens per row and cache columns."""


def size_oblivious():
    """Compile sizes of 1 as any other size (one row, one token per row): dynamo would otherwise specialise them,
    a recompile in mid-serving."""
    return torch.fx.experimental._config.patch(backed_size_oblivious=True)


def causal_mask(n: int, start: int, device: torch.device) -> torch.Tensor:
    """``[n, start + n]``: token i (at slot start + i) sees slots up to its own."""
    return torch.arange(start + n, device=device)[None, :] <= start + torch.arange(n, device=device)[:, None]


def compile_step(model: PreTrainedModel, engine: LeanLlama) -> None:
    """Compile ``engine``'s one-token step and its verification before any timed work, with a progress bar, and check
    that a second context, cache size and token count run on the same graphs. About a minute on 2 cores the first time; inductor keeps what it builds in
    ``$TORCHINDUCTOR_CACHE_DIR`` (default ``~/.cache/adaptive-draft/inductor``), and later processes load it in about
    twenty seconds."""
    use_inductor_cache()
    session = LeanCache(model, engine)  # the decoders' own path
    description = f"compiling the lean step and verification (cache: {os.environ['TORCHINDUCTOR_CACHE_DIR']})"
    with tqdm(total=2, desc=description, unit="context") as progress, torch.compiler.config.patch(dynamic_sources=STEP_DYNAMIC):
        for context in (2, CACHE_BLOCK + 2):  # the second grows the cache: another context and another capacity (no recompile)
            session.forward([0] * context)
            session.forward([0])
            for tokens in (2, 5):  # verifications: another token count (no recompile)
                session.forward([0] * tokens)
                session.rollback(context + 1)
            session.rollback(0)
            progress.update()


@torch.inference_mode()  # the decoders' inputs are inference tensors: a compiled graph's guards tell the kinds apart
def compile_batched(engine: LeanLlama) -> None:
    """Compile ``engine``'s batched forward (:attr:`LeanLlama.batch`) before any timed work, once per engine, with a
    progress bar: a few rows' prefill, then forwards of other row and token counts, one of them a single row of one
    token, which run on the same graph. Nothing to do for an uncompiled engine."""
    if engine.batch is None or engine.batch_compiled:
        return
    use_inductor_cache()
    description = f"compiling the lean batched forward (cache: {os.environ['TORCHINDUCTOR_CACHE_DIR']})"
    with tqdm(total=2, desc=description, unit="shape") as progress:
        for rows, n in ((3, 2), (1, 1)):
            cache, context = BatchedLeanCache(engine.layers).layers, 4
            for start, count in ((0, context), (context, n)):
                ids = torch.zeros(rows, count, dtype=torch.long, device=engine.device)
                positions = torch.arange(start, start + count, device=engine.device).repeat(rows, 1)
                allowed = causal_mask(count, start, engine.device).repeat(rows, 1, 1)
                engine.batched(ids, positions, cache, allowed)
            progress.update()
    engine.batch_compiled = True


def use_inductor_cache() -> None:
    """Keep inductor's artefacts in ``$TORCHINDUCTOR_CACHE_DIR``, by default ``~/.cache/adaptive-draft/inductor``."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, default_cache_dir()):  # unset, or torch's /tmp default
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root() / "inductor")


def open_cache(model: PreTrainedModel, taps: tuple[int, ...] | None = None) -> CachedModel | LeanCache:
    """A one-sequence cached session of ``model``: lean where :func:`make_lean` attached an engine, else transformers'."""
    engine = getattr(model, "lean_engine", None)
    return LeanCache(model, engine, taps) if engine is not None else CachedModel(model, taps=taps)
