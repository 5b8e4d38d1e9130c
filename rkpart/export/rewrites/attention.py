"""Sparse, mixture-of-experts and grouped-query attention in dense forms neither exporter refuses.

Data-dependent routing (``bincount().tolist()``, flex attention's ``BlockMask``) either fails to
export or is baked in for the example input by TorchScript's trace; the dense form computes the
same sum over every expert (or key block) with weights that are 0 where the router did not pick
it.  ``scaled_dot_product_attention(enable_gqa=True)`` has no TorchScript conversion: the key/value
heads are repeated first, as SDPA does internally.
"""

from __future__ import annotations

from typing import Any


def dense_nabla_kandinsky6_sr(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Kandinsky 6 SR's NABLA attention in dense form, asserted equal to diffusers' own.

    diffusers runs the self-attention through flex attention with a ``BlockMask`` it builds from
    the queries' and keys' block means (``nabla_block_mask``: softmax of the block means, the
    blocks whose sorted cumulative share passes the threshold, or'ed with the sliding-tile prior):
    TorchScript fails in flex attention's vmap ("Unsupported value kind: Tensor") and the dynamo
    exporter cannot convert the ``BlockMask``'s ``argsort`` (``aten::sort.stable``).  Flex
    attention over a block mask of full blocks is ordinary attention with that block mask
    expanded to tokens: the same selection (sort, cumsum, threshold, put back in block order) is
    computed here and the dense boolean mask goes to ``scaled_dot_product_attention``.  The
    patched model's output on the example inputs must equal the unpatched model's (within 1e-5).
    """
    import math

    import torch
    import torch.nn.functional as F
    from diffusers.models.transformers.transformer_kandinsky6_sr import (
        Kandinsky6SRAttnProcessor,
        apply_rotary,
    )

    block = 64  # nabla_block_mask's default block_size, as the processor calls it

    class DenseNablaProcessor(Kandinsky6SRAttnProcessor):
        def __call__(self, attn: Any, hidden_states: torch.Tensor, rotary_emb: torch.Tensor,
                     sparse_params: dict[str, Any]) -> torch.Tensor:
            query = attn.to_query(hidden_states).unflatten(-1, (attn.num_heads, -1))
            key = attn.to_key(hidden_states).unflatten(-1, (attn.num_heads, -1))
            value = attn.to_value(hidden_states).unflatten(-1, (attn.num_heads, -1))
            query = attn.query_norm(query.float()).type_as(query)
            key = attn.key_norm(key.float()).type_as(key)
            q, k, v = (t.transpose(1, 2) for t in (apply_rotary(query, rotary_emb), apply_rotary(key, rotary_emb),
                                                   value))
            b, h, s, d = q.shape
            qa = q.reshape(b, h, s // block, block, d).mean(-2)
            ka = k.reshape(b, h, s // block, block, d).mean(-2).transpose(-2, -1)
            attn_map = torch.softmax((qa @ ka) / math.sqrt(d), dim=-1)
            vals, inds = attn_map.sort(-1)
            picked = (vals.cumsum(-1) >= 1 - sparse_params["threshold"]).int()
            mask = torch.zeros_like(picked).scatter(-1, inds, picked)  # back to block order
            mask = torch.logical_or(mask, sparse_params["sta_mask"])
            dense = mask.repeat_interleave(block, dim=-1).repeat_interleave(block, dim=-2)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
            return attn.out_layer(out.transpose(1, 2).flatten(2, 3))

    for module in model.modules():
        if type(getattr(module, "processor", None)) is Kandinsky6SRAttnProcessor:
            module.set_processor(DenseNablaProcessor())


def dense_moe_hidream(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """HiDream's MoE FFNs in the dense form.

    ``MOEFeedForwardSwiGLU.moe_infer`` groups tokens by expert with ``bincount().cpu().numpy()``
    (data-dependent: dynamo cannot export it, TorchScript would bake one input's grouping in).  The
    same sum is every expert on every token weighed by its gate, 0 where the router did not pick it
    (the top-k weights scattered into a dense ``[tokens, experts]`` matrix, as :mod:`tests.models.moe`).
    """
    import torch
    from diffusers.models.transformers.transformer_hidream_image import MOEFeedForwardSwiGLU

    def dense(self: Any, x: torch.Tensor) -> torch.Tensor:
        topk_idx, topk_weight, _ = self.gate(x)
        flat = x.view(-1, x.shape[-1])
        gates = torch.zeros(flat.shape[0], len(self.experts), dtype=x.dtype).scatter(1, topk_idx, topk_weight)
        y = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            y = y + gates[:, e:e + 1] * expert(flat)
        return y.view(*x.shape) + self.shared_experts(x)

    for module in model.modules():
        if isinstance(module, MOEFeedForwardSwiGLU):
            module.forward = dense.__get__(module)  # type: ignore[method-assign]


def repeat_kv_ace_step(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """ACE-Step's grouped-query attention with the key/value heads repeated before attention.

    ``AceStepAttnProcessor2_0`` calls ``scaled_dot_product_attention(enable_gqa=True)``, which the
    TorchScript exporter refuses ("conversion of scaled_dot_product_attention not implemented if
    enable_gqa is True").  GQA is the same attention with each key/value head repeated for its
    ``heads // kv_heads`` query heads (``repeat_interleave`` on the head axis, as SDPA does), so
    every attention gets a processor (a subclass: same projections, qk RMSNorm, RoPE on
    self-attention, masks and scale; the native, non-flash path) doing that; the output must equal
    the unpatched model's.
    """
    import torch
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.transformers.ace_step_transformer import AceStepAttnProcessor2_0

    class RepeatKVProcessor(AceStepAttnProcessor2_0):
        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: Any = None,
                     attention_mask: Any = None, image_rotary_emb: Any = None) -> torch.Tensor:
            is_cross = attn.is_cross_attention and encoder_hidden_states is not None
            kv_input = encoder_hidden_states if is_cross else hidden_states
            query = attn.norm_q(attn.to_q(hidden_states).unflatten(-1, (attn.heads, attn.head_dim)))
            key = attn.norm_k(attn.to_k(kv_input).unflatten(-1, (attn.kv_heads, attn.head_dim)))
            value = attn.to_v(kv_input).unflatten(-1, (attn.kv_heads, attn.head_dim))
            if not is_cross and image_rotary_emb is not None:
                query = apply_rotary_emb(query, image_rotary_emb, use_real=True, use_real_unbind_dim=-2,
                                         sequence_dim=1)
                key = apply_rotary_emb(key, image_rotary_emb, use_real=True, use_real_unbind_dim=-2, sequence_dim=1)
            n_rep = attn.heads // attn.kv_heads  # the one change: GQA's key/value heads repeated here
            key, value = key.repeat_interleave(n_rep, dim=2), value.repeat_interleave(n_rep, dim=2)
            hidden_states = dispatch_attention_fn(query, key, value, attn_mask=attention_mask, dropout_p=0.0,
                                                  scale=attn.scaling, backend=self._attention_backend)
            hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
            return attn.to_out[1](attn.to_out[0](hidden_states))

    for module in model.modules():
        if type(getattr(module, "processor", None)) is AceStepAttnProcessor2_0:
            module.set_processor(RepeatKVProcessor())


def repeat_kv_cosmos3(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Cosmos3's grouped-query attention with its key/value heads repeated.

    ``scaled_dot_product_attention(enable_gqa=True)`` has no TorchScript conversion: the processor's
    own computation otherwise.
    """
    import torch
    import torch.nn.functional as F
    from diffusers.models.transformers.transformer_cosmos3 import Cosmos3AttnProcessor, _rotate_half

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        rep = q.shape[1] // k.shape[1]  # [tokens, heads, head_dim] -> [1, heads, tokens, head_dim]
        q, k, v = (t.transpose(0, 1).unsqueeze(0)
                   for t in (q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)))
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)[0].transpose(0, 1).flatten(-2, -1)

    class RepeatedKVProcessor(Cosmos3AttnProcessor):
        def __call__(self, attn: Any, und_seq: torch.Tensor, gen_seq: torch.Tensor,
                     rotary_emb: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
            q_und = attn.to_q(und_seq).view(-1, attn.num_attention_heads, attn.head_dim)
            k_und = attn.to_k(und_seq).view(-1, attn.num_key_value_heads, attn.head_dim)
            v_und = attn.to_v(und_seq).view(-1, attn.num_key_value_heads, attn.head_dim)
            q_gen = attn.add_q_proj(gen_seq).view(-1, attn.num_attention_heads, attn.head_dim)
            k_gen = attn.add_k_proj(gen_seq).view(-1, attn.num_key_value_heads, attn.head_dim)
            v_gen = attn.add_v_proj(gen_seq).view(-1, attn.num_key_value_heads, attn.head_dim)
            q_und, k_und = attn.norm_q(q_und), attn.norm_k(k_und)
            k_und_for_gen = attn.k_norm_und_for_gen(k_und) if attn.k_norm_und_for_gen is not None else k_und
            q_gen, k_gen = attn.norm_added_q(q_gen), attn.norm_added_k(k_gen)
            cos_und, sin_und, cos_gen, sin_gen = (t.unsqueeze(1) for t in rotary_emb)
            q_und = q_und * cos_und + _rotate_half(q_und) * sin_und
            k_und = k_und * cos_und + _rotate_half(k_und) * sin_und
            k_und_for_gen = k_und_for_gen * cos_und + _rotate_half(k_und_for_gen) * sin_und
            q_gen = q_gen * cos_gen + _rotate_half(q_gen) * sin_gen
            k_gen = k_gen * cos_gen + _rotate_half(k_gen) * sin_gen
            causal_out = sdpa(q_und, k_und, v_und, True)
            full_out = sdpa(q_gen, torch.cat([k_und_for_gen, k_gen], dim=0), torch.cat([v_und, v_gen], dim=0), False)
            return attn.to_out(causal_out), attn.to_add_out(full_out)

    for module in model.modules():
        if type(getattr(module, "processor", None)) is Cosmos3AttnProcessor:
            module.set_processor(RepeatedKVProcessor())


def real_rope_sdpa_far(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """AnyFlow FAR's step with its complex RoPE in the real form and its flex attention as SDPA.

    The complex RoPE (``view_as_complex``, complex128: neither exporter converts it) becomes the
    real ``x * cos + rot(x) * sin`` with tables computed once from the model's own frequencies for
    this step's static layout (``fixed["chunk_partition"]``); the causal self-attention the
    processor runs through flex attention without a mask (the step reads the caches; queries,
    keys and values zero-padded to a multiple of 128 tokens, the padding keys taking part in the
    softmax, as diffusers computes it) runs through ``scaled_dot_product_attention`` on the same
    padded tensors.
    """
    import math

    import torch
    import torch.nn.functional as F
    from diffusers.models.transformers.transformer_anyflow_far import AnyFlowCausalAttnProcessor

    partition = list(fixed["chunk_partition"])
    # the step's RoPE tables: the layout _forward_inference gives the rope module
    _, _, _, height, width = inputs["hidden_states"].shape
    cfg = model.config
    limit = cfg.full_chunk_limit
    compressed = sum(partition[:len(partition) - limit]) if len(partition) >= limit else 0
    full, small = cfg.patch_size, cfg.compressed_patch_size
    far_cfg = {"total_frames": sum(partition), "num_compressed_frames": compressed,
               "full_frame_shape": (height // full[1], width // full[2]),
               "compressed_frame_shape": (height // small[1], width // small[2])}
    freqs = model.rope(far_cfg=far_cfg, device=torch.device("cpu"))["key"]  # [1, 1, S, D/2] complex
    table = torch.stack([freqs.real.repeat_interleave(2, dim=-1), freqs.imag.repeat_interleave(2, dim=-1)],
                        dim=-1).float().contiguous()  # [1, 1, S, D, 2]: cos, sin

    class StaticRealRope(torch.nn.Module):
        table: torch.Tensor

        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("table", table, persistent=False)

        def forward(self, far_cfg: Any, device: Any, clean_hidden_states: Any = None) -> dict[str, torch.Tensor]:
            return {"query": self.table, "key": self.table}

    def rotate(x: torch.Tensor, tab: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
        rot = torch.stack((-x2, x1), dim=-1).flatten(-2)
        return (x.float() * tab[..., 0] + rot.float() * tab[..., 1]).type_as(x)

    class DenseCausalProcessor(AnyFlowCausalAttnProcessor):
        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: Any = None,
                     attention_mask: Any = None, rotary_emb: Any = None, kv_cache: Any = None,
                     kv_cache_flag: Any = None) -> torch.Tensor:
            query = attn.to_q(hidden_states)
            key = attn.to_k(hidden_states)
            value = attn.to_v(hidden_states)
            if attn.norm_q is not None:
                query = attn.norm_q(query)
            if attn.norm_k is not None:
                key = attn.norm_k(key)
            query = query.unflatten(2, (attn.heads, -1)).transpose(1, 2)
            key = key.unflatten(2, (attn.heads, -1)).transpose(1, 2)
            value = value.unflatten(2, (attn.heads, -1)).transpose(1, 2)
            nc, nf = kv_cache_flag["num_cached_compressed_tokens"], kv_cache_flag["num_cached_full_tokens"]
            key = torch.cat([kv_cache["compressed_cache"][0, :, :, :nc], kv_cache["full_cache"][0, :, :, :nf], key],
                            dim=2)
            value = torch.cat([kv_cache["compressed_cache"][1, :, :, :nc], kv_cache["full_cache"][1, :, :, :nf],
                               value], dim=2)
            query = rotate(query, rotary_emb["query"])
            key = rotate(key, rotary_emb["key"])
            seq_len, head_dim = query.shape[2], query.shape[3]
            pad = int(math.ceil(seq_len / 128.0) * 128.0 - seq_len)
            if pad > 0:
                query, key, value = (torch.cat([t, t.new_zeros(t.shape[0], t.shape[1], pad, head_dim)], dim=2)
                                     for t in (query, key, value))
            assert head_dim >= 16, "the processor's head padding to 16 is not reproduced"
            out = F.scaled_dot_product_attention(query, key, value)[:, :, :seq_len]
            out = out.transpose(1, 2).flatten(2, 3).type_as(query)
            return attn.to_out[1](attn.to_out[0](out))

    model.rope = StaticRealRope()
    for module in model.modules():
        if type(getattr(module, "processor", None)) is AnyFlowCausalAttnProcessor:
            module.set_processor(DenseCausalProcessor())
