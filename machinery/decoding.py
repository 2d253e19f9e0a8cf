"""Decoding: the model calls of the sampler, one new token per live history at a time.

rollout.sample draws G responses per prompt token by token. Between draws it needs one
thing from the model: given the histories still growing (the *nodes*: a prompt plus the
tokens drawn after it, see rollout.sample), the logits of each one's next token. This
file answers that question in two ways, behind one interface:

    decoder = make_decoder(model, prompt_ids, prompt_mask, G, max_new_tokens)
    logits = decoder.prefill()               # [N, V]: one node per prompt
    logits = decoder.step(parent, tokens)    # [U, V]: node u = node parent[u] of the
                                             # previous step, extended by tokens[u]

- TransformersDecoder calls the model itself, as `model.generate` would: any Hugging
  Face causal LM, with transformers' DynamicCache of keys and values.
- LlamaDecoder does the same arithmetic for the Llama family (Llama, Qwen2: RMSNorm,
  rotary positions, attention, SwiGLU MLP) written out in `forward_slots`, on the
  model's own weights, with the architecture's own rotary and attention functions.

Why a second decoder, and what it saves. On a small model a decoding step is mostly
bookkeeping, not arithmetic: the embedded model's step multiplies ~250 rows by 64 x 256
matrices, and the model call around it builds a causal mask, wraps outputs in
dataclasses and goes through ~10 module calls per layer. LlamaDecoder skips that, and it
moves fewer rows. When nodes end (a row drew EOS) or split (rows of one node drew
different tokens), the transformers path re-indexes the whole cache (every key and value
of every live row, in every layer); here each node keeps a *slot* (its row in the cache)
and only the rows that must change place are copied: a new child takes a free slot and
copies its parent's keys and values, and a slot above the new count moves into a hole
(`assign_slots`); and it grows the cache a few columns at a time, not one (LlamaDecoder).
On the bench's batches the sampler takes about a fifth less CPU time on both tasks
(docs/results.md has the measurements).

Exactness. LlamaDecoder runs the same rows (one per live node) through the model's
arithmetic. Three things differ from the model's own forward, none of them in a bit:
the order of the rows in the batch, q, k and v (and gate and up) computed as one matrix
product of stacked weights, and the cache read as a view of a wider buffer. Each
kernel gives every output element the same value either way: a matrix product computes
a row from that row and the weight's columns, attention works per row and head whatever
the memory layout. (One caveat, measured with MKL: a product of fewer than four rows
takes another path with other rounding; both decoders run exactly one row per live
node, so their products always have the same number of rows, and below four rows
LlamaDecoder uses the model's own weights, not the stacked copy.) So the two decoders
return identical bits (tested on the embedded Llama and on a Qwen2 with biases and
grouped-query attention: the same tokens, log-probs and entropies, with negative
controls). A model outside what LlamaDecoder checks for (`lean_unsupported`: another
architecture, eager attention, sliding windows, query/key norms, a cache layer with
state beyond keys and values) gets TransformersDecoder.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


def make_decoder(model, prompt_ids: Tensor, prompt_mask: Tensor, G: int, max_new_tokens: int):
    """LlamaDecoder when the model is one it can drive exactly, TransformersDecoder otherwise.

    prompt_ids, prompt_mask: [N, P] left-padded; at most N * G nodes and P + max_new_tokens
    cache columns will ever be needed (the sizes LlamaDecoder allocates once).
    """
    if lean_unsupported(model) is None:
        return LlamaDecoder(model, prompt_ids, prompt_mask, rows=len(prompt_ids) * G,
                            width=prompt_ids.shape[1] + max_new_tokens)
    return TransformersDecoder(model, prompt_ids, prompt_mask)


def prefill_cache(model, prompt_ids: Tensor, prompt_mask: Tensor, allowed: tuple) -> tuple[Tensor, DynamicCache]:
    """One forward over the N left-padded prompts: (last-position logits [N, V], cache).

    Position ids count each prompt's real tokens from 0 (left padding invisible), as
    logprobs.token_logprobs numbers them. The cache's layers must be of the `allowed`
    types: re-indexing rows is all a plain or sliding-window key/value layer needs, and a
    layer with other state (linear attention, a compressed or quantized cache) would be
    re-indexed wrongly, so it raises ValueError.
    """
    cache = DynamicCache(config=model.config)
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask,
                position_ids=(prompt_mask.cumsum(1) - 1).clamp(min=0),
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    for layer in cache.layers:
        if type(layer) not in allowed:
            raise ValueError(f"sample: {type(layer).__name__} cache layers (state beyond keys and values) are not "
                             f"supported by this sampler; use the vLLM backend for this model")
    return out.logits[:, -1], cache


# ---------------------------------------------------------------------------------------
# Any transformers causal LM: the model call and its DynamicCache
# ---------------------------------------------------------------------------------------

class TransformersDecoder:
    """Decoding through the model's own forward, one row of the cache per node.

    State: the DynamicCache (row u = node u), the 2-D attention mask [U, P + t] (the
    prompt's mask, then ones) and each node's next position [U].
    """

    def __init__(self, model, prompt_ids: Tensor, prompt_mask: Tensor):
        self.model, self.prompt_ids, self.attn = model, prompt_ids, prompt_mask
        self.next_pos = prompt_mask.sum(1)

    def prefill(self) -> Tensor:
        logits, self.cache = prefill_cache(self.model, self.prompt_ids, self.attn,
                                           (DynamicLayer, DynamicSlidingWindowLayer))
        return logits

    def step(self, parent: Tensor, tokens: Tensor) -> Tensor:
        """Logits [U, V] of the U new nodes: node u continues node parent[u] with tokens[u].

        The cache is re-indexed by parent (DynamicCache.batch_select_indices with repeated
        indices: a node whose rows drew k different tokens is copied k times, a node whose
        rows all stopped is dropped); a step where no node split or ended keeps it as is.
        """
        if len(parent) != len(self.attn) or not torch.equal(parent, torch.arange(len(parent), device=parent.device)):
            self.cache.batch_select_indices(parent)
        self.attn = torch.cat([self.attn[parent], self.attn.new_ones(len(parent), 1)], dim=1)
        self.next_pos = self.next_pos[parent]
        out = self.model(input_ids=tokens.unsqueeze(1), attention_mask=self.attn,
                         position_ids=self.next_pos.unsqueeze(1), past_key_values=self.cache, use_cache=True)
        self.next_pos = self.next_pos + 1
        return out.logits[:, -1]


# ---------------------------------------------------------------------------------------
# The Llama family: the same arithmetic, called directly, rows kept in slots
# ---------------------------------------------------------------------------------------

LEAN_MODELS = ("LlamaForCausalLM", "Qwen2ForCausalLM")
"""Architectures LlamaDecoder drives (Qwen2 is Llama with biases on q, k and v)."""


def lean_unsupported(model) -> str | None:
    """Why LlamaDecoder cannot drive `model` exactly, or None when it can.

    It needs a Llama-family model in evaluation mode whose attention runs through
    PyTorch's scaled_dot_product_attention (transformers' "sdpa", the default), every
    layer full causal attention (no sliding window), and no extra norms or biases beyond
    Llama's and Qwen2's. The check reads the model's classes and config, so a model that
    looks different in any of these ways gets TransformersDecoder instead.
    """
    if type(model).__name__ not in LEAN_MODELS:
        return f"{type(model).__name__} is not one of {LEAN_MODELS}"
    config = model.config
    if model.training:
        return "the model is in training mode (dropout)"
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return f"attention implementation {getattr(config, '_attn_implementation', None)!r} (needs 'sdpa')"
    if getattr(config, "use_sliding_window", False) or any(t != "full_attention"
                                                          for t in (getattr(config, "layer_types", None) or [])):
        return "sliding-window attention"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    for layer in model.model.layers:
        attn = layer.self_attn
        if hasattr(attn, "q_norm") or hasattr(attn, "k_norm") or getattr(attn, "sliding_window", None):
            return "attention with query/key norms or a sliding window"
        if not all(hasattr(norm, "variance_epsilon") for norm in (layer.input_layernorm, layer.post_attention_layernorm)):
            return f"{type(layer.input_layernorm).__name__} is not Llama's RMSNorm"
    return None


COLUMN_SLACK = 4
"""Columns the keys' and values' buffers grow by at a time (LlamaDecoder._widen)."""


class LlamaDecoder:
    """Decoding with the Llama family's arithmetic written out, each node in a slot.

    State, for U = the number of live nodes (slots 0..U-1 all in use), R = N * G (the
    most nodes there can be: every row its own) and L = P + the tokens drawn so far:
      keys[l], values[l]  [R, H_kv, C, D]  layer l's cache in columns 0..L-1 (C >= L)
      seen                [R, P + max]     bool attention mask: the prompt's, then ones
      padded              [R]              the slot's prompt has left padding
      next_pos            [R]              the position of each slot's next token
      slot                [U]              node u lives in row slot[u]
    Each step writes its new key and value into column L in place; the attention reads
    columns 0..L of the first U rows, a view. A full buffer is widened by COLUMN_SLACK
    columns (`_widen`): not one column a step (a copy of the whole cache each step) nor
    all at once (the kernel reads widely spaced rows slowly). The measurements:
    docs/sampler.md, "The decoding step".
    """

    def __init__(self, model, prompt_ids: Tensor, prompt_mask: Tensor, rows: int, width: int):
        self.model, self.prompt_ids, self.prompt_mask = model, prompt_ids, prompt_mask
        self.rows, self.width = rows, width
        # the architecture's own functions, so that the arithmetic is the model's
        module = sys.modules[type(model.model.layers[0].self_attn).__module__]
        self.rotate, self.attention = module.apply_rotary_pos_emb, _sdpa_function()

    def prefill(self) -> Tensor:
        logits, cache = prefill_cache(self.model, self.prompt_ids, self.prompt_mask, (DynamicLayer,))
        N, P = self.prompt_mask.shape
        R = self.rows
        self.keys = [layer.keys for layer in cache.layers]          # [N, H_kv, P, D] until _widen
        self.values = [layer.values for layer in cache.layers]
        self.L = P                                              # columns in use: P + tokens so far
        self._widen(N)
        self.seen = _with_rows(self.prompt_mask.bool(), R, width=self.width)
        self.padded = _with_rows(~self.prompt_mask.bool().all(1), R)
        self.next_pos = _with_rows(self.prompt_mask.sum(1), R)
        self.slot = torch.arange(N, device=self.prompt_mask.device)
        # cos and sin of every position a token can take, from the model's own rotary
        # module (elementwise, so a row of the table is what the module gives that position)
        embed = self.model.model.embed_tokens.weight
        positions = torch.arange(int(self.prompt_mask.sum(1).max()) + self.width - P, device=embed.device)
        self.cos, self.sin = self.model.model.rotary_emb(embed.new_zeros(1, 1), positions.unsqueeze(0))
        # q, k, v in one matrix product and gate, up in another: each output column is the
        # same dot product as in its own product (tested: identical bits), in fewer calls
        self.qkv = [_stacked(l.self_attn.q_proj, l.self_attn.k_proj, l.self_attn.v_proj) for l in self.model.model.layers]
        self.gate_up = [_stacked(l.mlp.gate_proj, l.mlp.up_proj) for l in self.model.model.layers]
        return logits

    def step(self, parent: Tensor, tokens: Tensor) -> Tensor:
        """Logits [U, V] of the U new nodes (node u continues node parent[u] with tokens[u]).

        1. Slots: assign_slots gives each new node a slot in 0..U-1 and lists the rows to
           copy (a child into a free slot, a slot above U into a hole); only those rows'
           keys and values (columns 0..L-1), mask and position move.
        2. One forward over the U slots (`forward_slots`), then the logits are put back in
           node order.
        """
        U, L = len(parent), self.L
        slot, src, dst = assign_slots(self.slot[parent], parent)
        if len(dst):
            for cache in self.keys + self.values:
                cache[dst, :, :L] = cache[src, :, :L]
            for t in (self.seen, self.padded, self.next_pos):
                t[dst] = t[src]
        self.slot = slot
        if L == self.keys[0].shape[2]:                          # no free column left
            self._widen(U)
        ids = torch.empty(U, dtype=tokens.dtype, device=tokens.device)
        ids[slot] = tokens
        self.seen[:U, L] = True
        mask = self.seen[:U, None, None, :L + 1] if bool(self.padded[:U].any()) else None
        logits = self.forward_slots(ids, self.next_pos[:U], mask)
        self.L += 1
        self.next_pos[:U] += 1
        return logits[slot]

    def forward_slots(self, ids: Tensor, positions: Tensor, mask: Tensor | None) -> Tensor:
        """Next-token logits [U, V] of slots 0..U-1, each fed its token ids[s] at positions[s].

        A Llama decoder layer, for x [U, 1, d] (one new token per slot), as transformers
        computes it:
            h = x + o_proj(attn(rope(q_proj(n1(x))), [cache, rope(k_proj(n1(x)))], [cache, v_proj(n1(x))]))
            x' = h + down_proj(act(gate_proj(n2(h))) * up_proj(n2(h)))
        with n1, n2 the layer's RMSNorms, rope the rotary embedding of `positions`, and attn
        scaled dot-product attention over the slot's cache plus the new key (column L),
        masked by `mask` [U, 1, 1, L + 1] (left padding; None when no slot has any, which
        is what transformers passes then); then logits = lm_head(norm(x)).
        """
        m = self.model.model
        U, L = len(ids), self.L
        x = m.embed_tokens(ids.unsqueeze(1))                                # [U, 1, d]
        cos, sin = self.cos[0, positions].unsqueeze(1), self.sin[0, positions].unsqueeze(1)     # [U, 1, D]
        for i, layer in enumerate(m.layers):
            a, mlp = layer.self_attn, layer.mlp
            n1 = _rms_norm(layer.input_layernorm, x)
            q, k, v = (t.view(U, 1, -1, a.head_dim).transpose(1, 2)                  # [U, H or H_kv, 1, D]
                       for t in _projections(self.qkv[i], (a.q_proj, a.k_proj, a.v_proj), n1))
            q, k = self.rotate(q, k, cos, sin)
            self.keys[i][:U, :, L] = k[:, :, 0]
            self.values[i][:U, :, L] = v[:, :, 0]
            out, _ = self.attention(a, q, self.keys[i][:U, :, :L + 1], self.values[i][:U, :, :L + 1], mask,
                                    dropout=0.0, scaling=a.scaling)
            h = x + _linear(a.o_proj, out.reshape(U, 1, -1).contiguous())
            n2 = _rms_norm(layer.post_attention_layernorm, h)
            gate, up = _projections(self.gate_up[i], (mlp.gate_proj, mlp.up_proj), n2)
            x = h + _linear(mlp.down_proj, mlp.act_fn(gate) * up)
        return _linear(self.model.lm_head, _rms_norm(m.norm, x))[:, -1]

    def _widen(self, U: int) -> None:
        """Move rows 0..U-1 of every layer's keys and values (columns 0..L-1) into new
        [R, H_kv, L + COLUMN_SLACK, D] buffers (the rest uninitialised: never read)."""
        for cache in (self.keys, self.values):
            for i, old in enumerate(cache):
                new = old.new_empty((self.rows, old.shape[1], self.L + COLUMN_SLACK, old.shape[3]))
                new[:U, :, :self.L] = old[:U, :, :self.L]
                cache[i] = new


def assign_slots(parent_slot: Tensor, parent: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(slot [U], src [k], dst [k]): a slot in 0..U-1 for each of the U new nodes, and the
    k row copies src -> dst that put each node's history there.

    parent: [U] the previous node of each new node, sorted (rollout.sample's torch.unique
    gives them in order); parent_slot: [U] that node's slot. Rules:
      - a parent's first child keeps the parent's slot if it is below U (no copy);
      - every other new node (a further child of a split node, or a first child whose
        parent sat at slot >= U) takes one of the free slots below U, in order, and
        copies its parent's row there.
    Sources are rows of nodes that continue, destinations are rows no continuing node
    keeps, so no copy overwrites a row another copy reads. Example: slots of the previous
    nodes 0..3 = (0, 1, 2, 3); node 1 ended, node 3 split in two: parent = (0, 2, 3, 3),
    slot = (0, 2, 3, 1), src = (3,), dst = (1,): one row copied instead of four re-indexed.
    """
    U = len(parent)
    first = torch.ones(U, dtype=torch.bool, device=parent.device)
    first[1:] = parent[1:] != parent[:-1]
    stays = first & (parent_slot < U)
    slot = torch.where(stays, parent_slot, -1)
    taken = torch.zeros(U, dtype=torch.bool, device=parent.device)
    taken[parent_slot[stays]] = True
    free = (~taken).nonzero().squeeze(1)                    # as many as there are movers
    movers = (~stays).nonzero().squeeze(1)
    slot[movers] = free
    return slot, parent_slot[movers], free


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------

def _linear(layer: torch.nn.Linear, x: Tensor) -> Tensor:
    """layer(x) without the module call (the same F.linear on the same weight and bias)."""
    return torch.nn.functional.linear(x, layer.weight, layer.bias)


def _stacked(*layers: torch.nn.Linear) -> tuple[Tensor, Tensor | None, list[int]]:
    """(weight, bias, sizes): the layers' weights stacked into one [sum of outputs, in]
    matrix (and biases, None if they have none), with each layer's output size, so that
    F.linear(x, weight, bias).split(sizes, -1) gives each layer(x)."""
    bias = None if layers[0].bias is None else torch.cat([l.bias for l in layers])
    return torch.cat([l.weight for l in layers]), bias, [l.weight.shape[0] for l in layers]


def _projections(stacked: tuple, layers: tuple, x: Tensor) -> tuple[Tensor, ...]:
    """(layer(x) for each layer), as one product with the stacked weights (`_stacked`).

    Below four rows the layers' own weights are used, one product each: a product of one
    row (a matrix-vector product) rounds differently depending on where in memory the
    weight lies (measured with MKL: the loaded weights and their stacked copy gave
    other bits for one row, the same for two and more), and only the model's own weight
    gives the model's own bits there."""
    if x.shape[0] < 4:
        return tuple(_linear(layer, x) for layer in layers)
    weight, bias, sizes = stacked
    return torch.nn.functional.linear(x, weight, bias).split(sizes, dim=-1)


def _rms_norm(norm, x: Tensor) -> Tensor:
    """norm(x) without the module call: Llama's and Qwen2's RMSNorm, step for step,
    w * (x / sqrt(mean(x^2) + eps)) computed in float32 and cast back to x's dtype."""
    x32 = x.to(torch.float32)
    return norm.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)).to(x.dtype)


def _with_rows(t: Tensor, rows: int, width: int | None = None) -> Tensor:
    """t [n, ...] copied into the first n rows of a new zero tensor [rows, ...] (rows >= n),
    optionally widened to `width` columns in dimension 1."""
    shape = list(t.shape)
    shape[0] = rows
    if width is not None:
        shape[1] = width
    out = t.new_zeros(shape)
    out[tuple(slice(0, n) for n in t.shape)] = t
    return out


def _sdpa_function():
    """transformers' own attention function for "sdpa" (its grouped-query handling and
    arguments to torch's scaled_dot_product_attention are then exactly the model's)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward
