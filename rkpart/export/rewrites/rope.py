"""Complex RoPE rewritten to the real (cos/sin) form, and RoPE tables computed once for static shapes.

diffusers rotates q/k viewed as complex pairs (``view_as_complex``) by complex tables
(``torch.polar``): TorchScript cannot export complex tensors and the dynamo exporter fails to
convert the complex products.  The rotation of interleaved pairs ``(a, b)`` by ``(c, s)`` is
``(a c - b s, a s + b c)``, i.e. ``x * cos + rot(x) * sin`` with each frequency's cos/sin repeated
per pair: the same function in real arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def real_rope_lumina2(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Lumina2's forward with its RoPE in the real (cos/sin) form and the caption mask a graph input.

    diffusers derives the caption lengths from the mask in Python (``mask.sum(dim=1).tolist()``),
    packs each row's valid caption tokens and its image tokens into a joint sequence of
    ``max(cap_len) + image`` tokens, and rotates q/k as complex pairs (``view_as_complex``):
    TorchScript bakes the example mask's lengths in (and cannot export complex tensors),
    ``torch.export`` fails on the ``tolist``.  The same function with static shapes: the joint
    sequence is ``[all L caption tokens, image tokens]`` with the caption tokens past each row's
    length masked out as keys (so every valid token attends to exactly the keys it attends to in
    diffusers), the positions are tensors computed from the mask (caption token ``i`` at
    ``(i, 0, 0)``, image token ``(h, w)`` at ``(cap_len, h, w)``, as diffusers numbers them) and
    gather the real cos/sin tables made once from the embedder's own frequencies; the image tokens
    are read from their fixed place.  Valid captions are a prefix of the mask's length (diffusers
    takes the first ``cap_len`` tokens).
    """
    import torch
    import torch.nn.functional as F
    from diffusers.models.transformers.transformer_lumina2 import Lumina2AttnProcessor2_0

    rope = model.rope_embedder
    p = rope.patch_size
    # per axis [len, d] float32 cos / sin, each frequency repeated per pair (diffusers' complex128 tables,
    # evaluated once; a repeat_interleave in the graph trips TorchScript's shape inference: "ONNX Tile input
    # shapes do not match")
    tables = [(f.real.float().repeat_interleave(2, dim=-1).contiguous(),
               f.imag.float().repeat_interleave(2, dim=-1).contiguous()) for f in rope.freqs_cis]

    def rotate(x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:  # x: [B, S, H, D]
        cos, sin = (t[:, :, None, :] for t in cos_sin)
        x_real, x_imag = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
        rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
        return (x.float() * cos + rotated * sin).type_as(x)

    class RealRopeLumina2Processor(Lumina2AttnProcessor2_0):
        """diffusers' processor (projections, norms, GQA, masking) with the batched real rotation."""

        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                     attention_mask: torch.Tensor | None = None, image_rotary_emb: Any = None,
                     base_sequence_length: int | None = None) -> torch.Tensor:
            batch_size, sequence_length, _ = hidden_states.shape
            query = attn.to_q(hidden_states)
            key = attn.to_k(encoder_hidden_states)
            value = attn.to_v(encoder_hidden_states)
            head_dim = query.shape[-1] // attn.heads
            dtype = query.dtype
            kv_heads = key.shape[-1] // head_dim
            query = query.view(batch_size, -1, attn.heads, head_dim)
            key = key.view(batch_size, -1, kv_heads, head_dim)
            value = value.view(batch_size, -1, kv_heads, head_dim)
            if attn.norm_q is not None:
                query = attn.norm_q(query)
            if attn.norm_k is not None:
                key = attn.norm_k(key)
            if image_rotary_emb is not None:
                query, key = rotate(query, image_rotary_emb), rotate(key, image_rotary_emb)
            query, key = query.to(dtype), key.to(dtype)
            if base_sequence_length is not None:
                softmax_scale = math.sqrt(math.log(sequence_length, base_sequence_length)) * attn.scale
            else:
                softmax_scale = attn.scale
            n_rep = attn.heads // kv_heads
            if n_rep >= 1:
                key = key.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)
                value = value.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)
            if attention_mask is not None:
                attention_mask = attention_mask.bool().view(batch_size, 1, 1, -1)
            query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
            hidden_states = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           scale=softmax_scale)
            hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
            hidden_states = hidden_states.type_as(query)
            hidden_states = attn.to_out[0](hidden_states)
            return attn.to_out[1](hidden_states)

    def forward(hidden_states: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor,
                encoder_attention_mask: torch.Tensor, attention_kwargs: Any = None,
                return_dict: bool = True) -> tuple[torch.Tensor]:
        self = model
        batch_size, channels, height, width = hidden_states.shape
        hp, wp = height // p, width // p
        temb, encoder_hidden_states = self.time_caption_embed(hidden_states, timestep, encoder_hidden_states)
        text = encoder_hidden_states.shape[1]
        cap_len = encoder_attention_mask.sum(dim=1).to(torch.int64)  # [B]
        # caption token i at (i, 0, 0); image token (h, w) at (cap_len, h, w): only axis 0 of the image
        # positions depends on the mask (a gather by cap_len), the rest are constants of the static shapes
        arange = torch.arange(text, device=hidden_states.device)
        rows = [r for r in range(hp) for _ in range(wp)]
        cols = [c for _ in range(hp) for c in range(wp)]
        cap_rope: list[torch.Tensor] = []
        img_rope: list[torch.Tensor] = []
        for k in (0, 1):  # cos, sin
            cap = torch.cat([tables[0][k][:text], tables[1][k][:1].expand(text, -1),
                             tables[2][k][:1].expand(text, -1)], dim=-1)
            cap_rope.append(cap.unsqueeze(0).expand(batch_size, -1, -1))
            grid = torch.cat([tables[1][k][rows], tables[2][k][cols]], dim=-1)  # [hp * wp, d1 + d2]
            img_rope.append(torch.cat([tables[0][k][cap_len].unsqueeze(1).expand(-1, hp * wp, -1),
                                       grid.unsqueeze(0).expand(batch_size, -1, -1)], dim=-1))
        joint_rope = (torch.cat([cap_rope[0], img_rope[0]], dim=1), torch.cat([cap_rope[1], img_rope[1]], dim=1))

        hidden_states = (hidden_states.view(batch_size, channels, hp, p, wp, p).permute(0, 2, 4, 3, 5, 1)
                         .flatten(3).flatten(1, 2))
        hidden_states = self.x_embedder(hidden_states)
        for layer in self.context_refiner:
            encoder_hidden_states = layer(encoder_hidden_states, encoder_attention_mask, tuple(cap_rope))
        for layer in self.noise_refiner:
            hidden_states = layer(hidden_states, None, tuple(img_rope), temb)

        # the joint sequence: every caption slot, then the image; caption slots past cap_len are masked keys
        valid = arange[None, :] < cap_len[:, None]
        attention_mask = torch.cat([valid, valid.new_ones(batch_size, hp * wp)], dim=1)
        hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask, joint_rope, temb)
        hidden_states = self.norm_out(hidden_states, temb)[:, text:]
        output = (hidden_states.view(batch_size, hp, wp, p, p, self.out_channels).permute(0, 5, 1, 3, 2, 4)
                  .flatten(4, 5).flatten(2, 3))
        return (output,)

    for module in model.modules():
        if type(getattr(module, "processor", None)) is Lumina2AttnProcessor2_0:
            module.set_processor(RealRopeLumina2Processor())
    model.forward = forward


def real_rope_lumina_next(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """LuminaNext's complex RoPE rewritten to the real (cos/sin) form.

    The pipeline passes a complex64 table (``get_2d_rotary_pos_embed_lumina``) that
    ``LuminaAttnProcessor2_0`` multiplies with q/k viewed as complex pairs: TorchScript cannot
    export complex tensors ("ScalarType ComplexFloat") and dynamo fails to convert the complex
    product (``aten.unsqueeze`` of the complex view).  The same rotation of interleaved pairs is
    ``x * cos + rot(x) * sin`` with each frequency's cos/sin repeated per pair (diffusers'
    ``apply_rotary_emb(use_real=True)``).  The table is a fixed argument: it is replaced by the
    real ``[H, W, head_dim, 2]`` (cos, sin) table, which the patch embedder crops and flattens as
    it did the complex one, and every attention gets a processor (a subclass: same projections,
    qk norms, GQA, masks and scales) that applies it.  The patched model's output on the example
    inputs must equal the unpatched model's.
    """
    import torch
    import torch.nn.functional as F
    from diffusers.models.attention_processor import LuminaAttnProcessor2_0
    from diffusers.models.embeddings import apply_rotary_emb

    table = fixed["image_rotary_emb"]
    fixed["image_rotary_emb"] = torch.stack((table.real.repeat_interleave(2, dim=-1),
                                             table.imag.repeat_interleave(2, dim=-1)), dim=-1).float()

    class RealRopeLuminaProcessor(LuminaAttnProcessor2_0):
        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                     attention_mask: torch.Tensor | None = None, query_rotary_emb: Any = None,
                     key_rotary_emb: Any = None, base_sequence_length: int | None = None) -> torch.Tensor:
            batch_size, sequence_length, _ = hidden_states.shape
            query = attn.to_q(hidden_states)
            key = attn.to_k(encoder_hidden_states)
            value = attn.to_v(encoder_hidden_states)
            head_dim = query.shape[-1] // attn.heads
            dtype = query.dtype
            kv_heads = key.shape[-1] // head_dim
            if attn.norm_q is not None:
                query = attn.norm_q(query)
            if attn.norm_k is not None:
                key = attn.norm_k(key)
            query = query.view(batch_size, -1, attn.heads, head_dim)
            key = key.view(batch_size, -1, kv_heads, head_dim)
            value = value.view(batch_size, -1, kv_heads, head_dim)
            if query_rotary_emb is not None:  # the one change: [1, S, D, 2] real (cos, sin) instead of complex
                # diffusers annotates the complex form; use_real takes a (cos, sin) pair
                query = apply_rotary_emb(query, (query_rotary_emb[0, ..., 0], query_rotary_emb[0, ..., 1]),  # type: ignore[arg-type]
                                         use_real=True, sequence_dim=1)
            if key_rotary_emb is not None:
                key = apply_rotary_emb(key, (key_rotary_emb[0, ..., 0], key_rotary_emb[0, ..., 1]),  # type: ignore[arg-type]
                                       use_real=True, sequence_dim=1)
            query, key = query.to(dtype), key.to(dtype)
            if key_rotary_emb is None:
                softmax_scale = None
            elif base_sequence_length is not None:
                softmax_scale = math.sqrt(math.log(sequence_length, base_sequence_length)) * attn.scale
            else:
                softmax_scale = attn.scale
            n_rep = attn.heads // kv_heads
            if n_rep >= 1:
                key = key.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)
                value = value.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)
            assert attention_mask is not None  # LuminaNext always passes its mask
            attention_mask = attention_mask.bool().view(batch_size, 1, 1, -1)
            attention_mask = attention_mask.expand(-1, attn.heads, sequence_length, -1)
            query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
            hidden_states = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           scale=softmax_scale)
            return hidden_states.transpose(1, 2).to(dtype)

    for module in model.modules():
        if type(getattr(module, "processor", None)) is LuminaAttnProcessor2_0:
            module.set_processor(RealRopeLuminaProcessor())


def real_rope_fibo2(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Fibo 2's complex RoPE in the real form.

    diffusers multiplies q/k viewed as complex pairs (``view_as_complex``) by complex tables
    (``torch.polar``) that the (non-module) ``RopeEmbedder`` gathers by position: TorchScript has no
    ``aten::view_as_complex`` and dynamo cannot convert the complex product (as QwenImage).  The same
    product of interleaved pairs is ``(a c - b s, a s + b c)``: the embedder here gathers the same
    tables viewed as real ``[..., 2]`` (cos, sin) pairs, and the processor (diffusers' with only its
    ``apply_rotary_emb`` changed) rotates with them.
    """
    import torch
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers.transformer_bria_fibo2 import BriaFibo2Attention, BriaFibo2AttnProcessor

    rope = model.rope_embedder
    tables = [torch.view_as_real(t) for t in rope.precompute_freqs_cis(rope.axes_dims, rope.axes_lens, rope.theta)]

    class RealRopeEmbedder:
        def __call__(self, ids: torch.Tensor) -> torch.Tensor:  # [S, axes] -> [S, D/2, 2] (cos, sin)
            return torch.cat([tables[i][ids[:, i]] for i in range(len(tables))], dim=-2)

    class RealRopeFibo2Processor(BriaFibo2AttnProcessor):
        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                     attention_mask: torch.Tensor | None = None, freqs_cis: torch.Tensor | None = None) -> torch.Tensor:
            query = attn.to_q(hidden_states)
            if encoder_hidden_states is None:
                encoder_hidden_states = hidden_states
            key = attn.to_k(encoder_hidden_states)
            value = attn.to_v(encoder_hidden_states)
            query = attn.norm_q(query.unflatten(-1, (attn.heads, -1)))
            key = attn.norm_k(key.unflatten(-1, (attn.heads, -1)))
            value = value.unflatten(-1, (attn.heads, -1))

            def apply_rotary_emb(x_in: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:  # the one change
                x = x_in.float().reshape(*x_in.shape[:-1], -1, 2)
                a, b = x[..., 0], x[..., 1]
                c, s = freqs[..., 0].unsqueeze(2), freqs[..., 1].unsqueeze(2)
                return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(3).type_as(x_in)

            if freqs_cis is not None:
                query = apply_rotary_emb(query, freqs_cis)
                key = apply_rotary_emb(key, freqs_cis)
            if attention_mask is not None and attention_mask.ndim == 2:
                attention_mask = attention_mask[:, None, None, :]
            hidden_states = dispatch_attention_fn(query, key, value, attn_mask=attention_mask, dropout_p=0.0,
                                                  is_causal=False, backend=self._attention_backend,
                                                  parallel_config=self._parallel_config)
            return attn.to_out[0](hidden_states.flatten(2, 3))

    model.rope_embedder = RealRopeEmbedder()
    for module in model.modules():
        if isinstance(module, BriaFibo2Attention):
            module.set_processor(RealRopeFibo2Processor())  # type: ignore[arg-type]


def mrope_where_ideogram4(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Ideogram4's MRoPE interleave as two ``torch.where`` with constant masks.

    diffusers writes the h and w frequencies into every third slot in place
    (``freqs_t[..., idx] = freqs[axis][..., idx]``); TorchScript exports that index_put as a
    ScatterND whose constant-folded data leaves an ``Expand`` with an empty input name (ONNX
    checker and ONNX Runtime: "input 0 is marked single but has an empty string").  Selecting
    each slot from its axis with ``torch.where`` is the same function (no arithmetic).
    """
    import torch

    rope = model.rotary_emb
    masks = []
    for axis, offset in ((1, 1), (2, 2)):
        mask = torch.zeros(rope.inv_freq.numel(), dtype=torch.bool)
        mask[offset:rope.mrope_section[axis] * 3:3] = True
        masks.append(mask)

    def forward(position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch_size = position_ids.shape[0]
        pos = position_ids.permute(2, 0, 1).to(dtype=torch.float32)
        inv_freq = rope.inv_freq.to(dtype=torch.float32)[None, None, :, None].expand(3, batch_size, -1, 1)
        freqs = (inv_freq @ pos.unsqueeze(2)).transpose(2, 3)  # (3, B, L, F)
        freqs_t = torch.where(masks[0], freqs[1], freqs[0])
        freqs_t = torch.where(masks[1], freqs[2], freqs_t)
        emb = torch.cat((freqs_t, freqs_t), dim=-1)
        return emb.cos().float(), emb.sin().float()

    rope.forward = forward


def static_rope_factors_omnigen(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """OmniGen's SuScaled RoPE with its short/long factor choice made once.

    diffusers picks the factors by ``torch.max(position_ids) + 1 > original_max_position_embeddings``,
    a branch on input values: the dynamo exporter fails ("Could not guard on data-dependent
    expression"), TorchScript bakes the traced branch in.  The processor's positions run 0 .. the
    sequence length - 1, so the choice follows from the static length; it is made here from the
    example positions (as TorchScript's trace does) and the rest is diffusers' computation.
    """
    import math

    import torch

    rope = model.rope
    long = int(inputs["position_ids"].max()) + 1 > rope.original_max_position_embeddings
    factors = torch.tensor(rope.long_factor if long else rope.short_factor, dtype=torch.float32)
    scale = rope.max_position_embeddings / rope.original_max_position_embeddings
    scaling = 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(rope.original_max_position_embeddings))

    def forward(hidden_states: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = 1.0 / (factors * rope.base ** (torch.arange(0, rope.dim, 2, dtype=torch.int64).float() / rope.dim))
        inv_freq_expanded = inv_freq[None, :, None].expand(position_ids.shape[0], -1, 1)
        freqs = (inv_freq_expanded @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)[0]
        return emb.cos() * scaling, emb.sin() * scaling

    rope.forward = forward


def real_rope_qwenimage21(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Qwen-Image 2.1's complex RoPE in the real (cos/sin) form.

    diffusers rotates q/k right after their RMSNorms as complex pairs (``view_as_complex``) by a
    complex table (``torch.polar``): TorchScript has no ``aten::view_as_complex`` (as for
    QwenImage).  The table depends only on the static layout (``img_shapes``, ``img_mask``), so it
    is computed once; each attention's ``norm_q`` / ``norm_k`` becomes the norm followed by the same
    rotation in the real form, and the processor gets no complex table.  The layout's token
    metadata is made constant too (see below): the forward is diffusers' for the static layout.
    """
    import math

    import torch
    from diffusers.models.transformers.transformer_qwenimage21 import (
        QwenImage21Attention,
        QwenImage21AttnProcessor,
        _qwenimage21_prefix_segments,
    )

    with torch.no_grad():
        img_mask = fixed["img_mask"]
        pad_mask = torch.repeat_interleave(img_mask[0], torch.where(img_mask, 4, 1)[0])
        freqs = model.pos_embed(fixed["img_shapes"][0], pad_mask, device=torch.device("cpu"))  # [S, D/2] complex
    cos = freqs.real.repeat_interleave(2, dim=-1).float()[None, :, None, :].contiguous()
    sin = freqs.imag.repeat_interleave(2, dim=-1).float()[None, :, None, :].contiguous()

    class NormThenRope(torch.nn.Module):
        cos: torch.Tensor
        sin: torch.Tensor

        def __init__(self, norm: torch.nn.Module) -> None:
            super().__init__()
            self.norm = norm
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, S, H, D]
            x = self.norm(x)
            x_real, x_imag = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
            rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
            return (x.float() * self.cos + rotated * self.sin).type_as(x)

    # the layout metadata diffusers derives from img_mask in every forward (repeat_interleave by mask-dependent
    # repeats, boolean-mask scatter, nonzero, tolist): TorchScript leaves a NonZero whose shape depends on values
    # (rkpart exit 3), torch.export fails ("Could not guard on data-dependent expression", build_token_metadata);
    # computed once here as constant indices, the forward below is diffusers' without KV cache or flex attention
    repeats = torch.where(img_mask, 4, 1)[0]
    gather = torch.repeat_interleave(torch.arange(repeats.numel()), repeats)  # repeat_interleave as a gather
    image_pos = pad_mask.nonzero(as_tuple=True)[0]
    image_ids, target_mask = model.build_token_metadata(pad_mask, fixed["img_shapes"][0])
    text_pos = (~pad_mask).nonzero(as_tuple=True)[0]
    prefix_len = int((~target_mask).sum())
    segments = _qwenimage21_prefix_segments(image_ids, prefix_len)
    target_tokens = math.prod(fixed["img_shapes"][0][-1])
    # the text slots of the encoder sequence as indices (a bool index leaves a NonZero of a constant in the
    # TorchScript export, which rkpart does not fold: exit 3)
    vlm_text = (~img_mask[0][: inputs["encoder_hidden_states"].shape[1]]).nonzero(as_tuple=True)[0]

    def forward(hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor, timestep: torch.Tensor,
                encoder_hidden_states_mask: torch.Tensor | None = None, return_dict: bool = False,
                **_: Any) -> tuple[torch.Tensor]:
        batch_size = hidden_states.shape[0]
        hidden_states = model.img_in(hidden_states)
        encoder_hidden_states = model.txt_in(encoder_hidden_states)
        joint = torch.cat([encoder_hidden_states,
                           encoder_hidden_states.new_zeros(batch_size, target_tokens // 4,
                                                           encoder_hidden_states.shape[2])], dim=1)
        joint = joint[:, gather]
        joint[:, image_pos] = hidden_states
        timestep = timestep.to(hidden_states.dtype)
        modulation_mask = None
        if model.config.causal_condition:
            timestep = torch.cat([timestep, timestep.new_zeros(1)], dim=0)
            modulation_mask = target_mask
        temb = model.time_text_embed(timestep, hidden_states)
        modulation = model.modulation(temb)
        key_valid = None
        if encoder_hidden_states_mask is not None:
            key_valid = torch.ones(batch_size, pad_mask.shape[0], dtype=torch.bool)
            key_valid[:, text_pos] = encoder_hidden_states_mask.bool()[:, vlm_text]
        for block in model.transformer_blocks:
            joint = block(hidden_states=joint, modulation=modulation, rotary_emb=None, attention_mask=None,
                          target_token_mask=modulation_mask, segments=segments, key_valid=key_valid)
        joint = model.norm_out(joint, temb, modulation_mask)
        return (model.proj_out(joint),)

    for module in model.modules():
        if isinstance(module, QwenImage21Attention):
            assert type(module.processor) is QwenImage21AttnProcessor
            module.norm_q, module.norm_k = NormThenRope(module.norm_q), NormThenRope(module.norm_k)
    model.forward = forward


def real_rope_anyflow(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """AnyFlow's RoPE rewritten to the real (cos/sin) form.

    diffusers rotates q/k viewed as complex pairs by complex frequencies (``view_as_complex``,
    complex128): TorchScript cannot export complex tensors ("ScalarType ComplexDouble") and the
    dynamo exporter fails to convert the complex frequency table (``split_with_sizes`` of complex).
    The same rotation of interleaved pairs is ``x * cos + rot(x) * sin`` with each frequency's
    cos/sin repeated per pair.  The positions depend only on the static latent shape, so the
    tables are computed once from the model's own frequencies and become constants.  The patched
    model's output on the example inputs must equal the unpatched model's (within 1e-5).
    """
    import torch
    from diffusers.models.transformers.transformer_anyflow import AnyFlowAttnProcessor

    _, frames, _, height, width = inputs["hidden_states"].shape
    p = model.config.patch_size
    layout = {"total_frames": frames, "full_frame_shape": (height // p[1], width // p[2])}
    freqs = model.rope(layout_cfg=layout, device=torch.device("cpu"))["query"]  # [1, 1, S, D/2] complex
    cos = freqs.real.repeat_interleave(2, dim=-1).float().contiguous()
    sin = freqs.imag.repeat_interleave(2, dim=-1).float().contiguous()

    class StaticRealRope(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

        def forward(self, layout_cfg: Any, device: Any) -> dict[str, Any]:
            return {"query": (self.cos, self.sin), "key": (self.cos, self.sin)}

    def rotate(x: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
        rot = torch.stack((-x2, x1), dim=-1).flatten(-2)
        return (x.float() * table[0] + rot.float() * table[1]).type_as(x)

    class RealRopeAnyFlowProcessor(AnyFlowAttnProcessor):
        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: Any = None,
                     attention_mask: Any = None, rotary_emb: Any = None) -> torch.Tensor:
            from diffusers.models.attention_dispatch import dispatch_attention_fn

            if encoder_hidden_states is None:
                encoder_hidden_states = hidden_states
            query = attn.to_q(hidden_states)
            key = attn.to_k(encoder_hidden_states)
            value = attn.to_v(encoder_hidden_states)
            if attn.norm_q is not None:
                query = attn.norm_q(query)
            if attn.norm_k is not None:
                key = attn.norm_k(key)
            query = query.unflatten(2, (attn.heads, -1)).transpose(1, 2)
            key = key.unflatten(2, (attn.heads, -1)).transpose(1, 2)
            value = value.unflatten(2, (attn.heads, -1)).transpose(1, 2)
            if rotary_emb is not None:  # the one change: real cos/sin instead of complex products
                query = rotate(query, rotary_emb["query"])
                key = rotate(key, rotary_emb["key"])
            hidden_states = dispatch_attention_fn(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                                  attn_mask=attention_mask, dropout_p=0.0, is_causal=False)
            hidden_states = hidden_states.flatten(2, 3).type_as(query)
            hidden_states = attn.to_out[0](hidden_states)
            return attn.to_out[1](hidden_states)

    model.rope = StaticRealRope()
    for module in model.modules():
        if type(getattr(module, "processor", None)) is AnyFlowAttnProcessor:
            module.set_processor(RealRopeAnyFlowProcessor())


def real_rope_sana_wm(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """SANA-WM with its camera transforms and RoPE precomputed, the RoPE in the real form.

    The forward derives UCPE ray matrices from the raw camera conditions (``torch.rad2deg``, no
    TorchScript symbolic) and rotates by complex RoPE frequencies (``view_as_complex``; dynamo cannot
    convert the complex table).  The forward also takes them precomputed (``cam_pos_embeds`` with
    ``absmap``, ``P``, ``P_inv``; ``pos_embeds``), as a pipeline reusing them across steps passes them:
    ``P`` and ``P_inv`` (per video) become graph inputs, the RoPE table (static shapes) a constant
    held as stacked ``(cos, sin)``.  diffusers' ``_apply_rotary_emb`` and ``_apply_ucpe_transform``
    are wrapped to apply a stacked table in the real form (``re*c - im*s, re*s + im*c`` per pair; the
    inverse rotation negates ``s``) and to call the originals on complex tables, so other models are
    unaffected.
    """
    import types

    import torch
    from diffusers.models.transformers import transformer_sana_wm as tsw

    cam = inputs.pop("camera_conditions")
    _, _, f, h, w = inputs["hidden_states"].shape
    raymats, absmap = tsw._process_camera_conditions_ucpe(cam, cam.shape[0], (f, h, w), model.patch_size)
    p = raymats.reshape(cam.shape[0], -1, 4, 4)
    inputs["cam_p"], inputs["cam_p_inv"] = p, tsw._invert_SE3(p)
    freqs = model.rope((f, h, w), device=torch.device("cpu"))
    fixed["pos_embeds"] = torch.stack([freqs.real, freqs.imag]).float().unsqueeze(1)  # (2, 1, 1, N, D/2)
    fixed["camera_conditions"] = cam  # only tested for None and for its batch size once P is given
    fixed["cam_absmap"] = absmap.permute(0, 4, 1, 2, 3)
    rotary, ucpe = tsw._apply_rotary_emb, tsw._apply_ucpe_transform

    def pairs(x: torch.Tensor, table: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        cos, sin = table[0], -table[1] if inverse else table[1]
        x = x.to(torch.float32).unflatten(-1, (-1, 2))
        re, im = x[..., 0], x[..., 1]
        return torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1).flatten(-2, -1)

    def real_rotary(hidden_states: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        if freqs.is_complex():
            return rotary(hidden_states, freqs)
        return pairs(hidden_states.permute(0, 1, 3, 2), freqs).permute(0, 1, 3, 2).type_as(hidden_states)

    def real_ucpe(feats: torch.Tensor, matrix: torch.Tensor, rotary_emb: Any = None,
                  inverse_rope: bool = False) -> torch.Tensor:
        if rotary_emb is None or rotary_emb.is_complex():
            return ucpe(feats, matrix, rotary_emb, inverse_rope)
        batch, num_heads, seq_len, head_dim = feats.shape
        projected, rotated = feats.split(head_dim // 2, dim=-1)
        projected = torch.einsum("bnij,bhnkj->bhnki", matrix,
                                 projected.reshape(batch, num_heads, seq_len, -1, matrix.shape[-1]))
        projected = projected.reshape(batch, num_heads, seq_len, head_dim // 2)
        return torch.cat([projected, pairs(rotated, rotary_emb, inverse_rope).type_as(rotated)], dim=-1)

    tsw._apply_rotary_emb, tsw._apply_ucpe_transform = real_rotary, real_ucpe
    forward = model.forward

    def forward_precomputed(self: Any, hidden_states: Any, timestep: Any, encoder_hidden_states: Any, mask: Any,
                            chunk_plucker: Any, cam_p: Any, cam_p_inv: Any, pos_embeds: Any, camera_conditions: Any,
                            cam_absmap: Any, return_dict: bool = True) -> Any:
        return forward(hidden_states, timestep, encoder_hidden_states, mask=mask, chunk_plucker=chunk_plucker,
                       camera_conditions=camera_conditions, pos_embeds=pos_embeds, return_dict=return_dict,
                       cam_pos_embeds={"absmap": cam_absmap, "P": cam_p, "P_inv": cam_p_inv})

    model.forward = types.MethodType(forward_precomputed, model)


def static_rope_easyanimate(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """EasyAnimate's RoPE tables made once for the static example shape (same tables, now constants).

    ``EasyAnimateRotaryPosEmbed`` crops its position grid with ``int(round(th / h * w))`` of the
    latent's sizes, which TorchScript traces as tensors ("type Tensor doesn't define __round__").
    The tables depend only on the shape, so they are computed here from the embedder itself and
    returned as they are; the output must equal the unpatched model's.
    """
    import torch

    with torch.no_grad():
        cos, sin = model.rope_embedding(inputs["hidden_states"])

    class StaticRope(torch.nn.Module):
        cos: torch.Tensor
        sin: torch.Tensor

        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cos", cos.float().contiguous(), persistent=False)
            self.register_buffer("sin", sin.float().contiguous(), persistent=False)

        def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.cos, self.sin

    model.rope_embedding = StaticRope()


def real_rope_static_experts_nucleus(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """NucleusMoE's complex RoPE in the real (cos/sin) form and its experts split statically.

    diffusers rotates q/k viewed as complex pairs (``view_as_complex``) by complex tables
    (``torch.polar``): TorchScript has no ``aten::view_as_complex`` and the dynamo exporter
    cannot convert the complex product (as for QwenImage, whose RoPE this is).  The tables depend
    only on ``img_shapes`` and the text length, so they become constants; the same rotation of
    interleaved pairs is ``x * cos + rot(x) * sin`` with each frequency repeated per pair.

    The experts' loop splits the routed tokens by ``num_tokens_per_expert.tolist()``: TorchScript
    makes a SplitToSequence / ConcatFromSequence whose shapes depend on values (rkpart exit 3) and
    the dynamo exporter fails on the unbacked sizes ("should have been constant, but got u0 + u1 +
    u2 + u3").  Expert-choice routing gives every expert the same count (``bs * capacity``), so
    the split is by that static size.
    """
    import torch
    import torch.nn.functional as F
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers.transformer_nucleusmoe_image import NucleusMoEAttnProcessor2_0, SwiGLUExperts

    with torch.no_grad():
        text = inputs["encoder_hidden_states"].shape[1]
        img, txt = model.pos_embed(fixed["img_shapes"], max_txt_seq_len=text)

    def real(freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [S, D/2] complex -> [S, D] cos, sin
        return (freqs.real.repeat_interleave(2, dim=-1).float().contiguous(),
                freqs.imag.repeat_interleave(2, dim=-1).float().contiguous())

    tables = (real(img), real(txt))

    def rotate(x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:  # x: [B, S, H, D]
        cos, sin = (t[None, :, None, :] for t in cos_sin)
        x_real, x_imag = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
        rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
        return (x.float() * cos + rotated * sin).type_as(x)

    class RealRopeProcessor(NucleusMoEAttnProcessor2_0):
        """diffusers' processor (no cached text keys) with the rotation in the real form."""

        def __call__(self, attn: Any, hidden_states: torch.Tensor,  # type: ignore[override]
                     encoder_hidden_states: torch.Tensor | None = None,
                     attention_mask: torch.Tensor | None = None, image_rotary_emb: Any = None,
                     **_: Any) -> torch.Tensor:
            head_dim = attn.inner_dim // attn.heads
            num_kv_heads = attn.inner_kv_dim // head_dim
            num_kv_groups = attn.heads // num_kv_heads
            img_query = attn.to_q(hidden_states).unflatten(-1, (attn.heads, -1))
            img_key = attn.to_k(hidden_states).unflatten(-1, (num_kv_heads, -1))
            img_value = attn.to_v(hidden_states).unflatten(-1, (num_kv_heads, -1))
            img_query = attn.norm_q(img_query)
            img_key = attn.norm_k(img_key)
            img_query, img_key = rotate(img_query, tables[0]), rotate(img_key, tables[0])
            txt_key = attn.add_k_proj(encoder_hidden_states).unflatten(-1, (num_kv_heads, -1))
            txt_value = attn.add_v_proj(encoder_hidden_states).unflatten(-1, (num_kv_heads, -1))
            txt_key = rotate(attn.norm_added_k(txt_key), tables[1])
            joint_key = torch.cat([img_key, txt_key], dim=1)
            joint_value = torch.cat([img_value, txt_value], dim=1)
            if num_kv_groups > 1:
                joint_key = joint_key.repeat_interleave(num_kv_groups, dim=2)
                joint_value = joint_value.repeat_interleave(num_kv_groups, dim=2)
            out = dispatch_attention_fn(img_query, joint_key, joint_value, attn_mask=attention_mask, dropout_p=0.0,
                                        is_causal=False)
            out = out.flatten(2, 3).to(img_query.dtype)
            return attn.to_out[0](out)

    def static_experts(experts: SwiGLUExperts) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        def forward(x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
            # expert-choice routing gives every expert the same count (torch.full(bs * capacity)), no padding
            outs = []
            for e, x_e in enumerate(x.split(x.shape[0] // experts.num_experts)):
                gate, up = torch.matmul(x_e, experts.gate_up_proj[e]).chunk(2, dim=-1)
                outs.append(torch.matmul(F.silu(gate) * up, experts.down_proj[e]))
            return torch.cat(outs, dim=0)
        return forward

    model.pos_embed.forward = lambda *args, **kwargs: None
    for module in model.modules():
        if isinstance(module, SwiGLUExperts):
            module.forward = static_experts(module)  # type: ignore[method-assign,assignment]
    for module in model.modules():
        if type(getattr(module, "processor", None)) is NucleusMoEAttnProcessor2_0:
            module.set_processor(RealRopeProcessor())


def real_rope_zimage(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Z-Image's complex RoPE in the real (cos/sin) form.

    The RoPE table is complex (``torch.polar``) and q/k are rotated as complex pairs
    (``view_as_complex``: no TorchScript symbolic); the table, a function of the static positions,
    is carried as real ``[..., D/2, 2]`` (real, imaginary) pairs through the same splits, pads and
    concatenations, and the processor rotates in the real form.
    """
    import torch
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers.transformer_z_image import ZSingleStreamAttnProcessor

    rope = model.rope_embedder
    tables = [torch.stack([f.real, f.imag], dim=-1).float()  # per axis [len, d/2, 2]: no complex op is traced
              for f in rope.precompute_freqs_cis(rope.axes_dims, rope.axes_lens, theta=rope.theta)]

    def real_rope(ids: torch.Tensor) -> torch.Tensor:
        return torch.cat([table[ids[:, i]] for i, table in enumerate(tables)], dim=-2)

    class RealRopeProcessor(ZSingleStreamAttnProcessor):
        """diffusers' processor with the rotation by real (cos, sin) pairs ``[B, S, D/2, 2]``."""

        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                     attention_mask: torch.Tensor | None = None, freqs_cis: torch.Tensor | None = None
                     ) -> torch.Tensor:
            query = attn.to_q(hidden_states).unflatten(-1, (attn.heads, -1))
            key = attn.to_k(hidden_states).unflatten(-1, (attn.heads, -1))
            value = attn.to_v(hidden_states).unflatten(-1, (attn.heads, -1))
            if attn.norm_q is not None:
                query = attn.norm_q(query)
            if attn.norm_k is not None:
                key = attn.norm_k(key)

            def rotate(x: torch.Tensor) -> torch.Tensor:
                # each frequency's cos / sin repeated per pair: [B, S, D/2, 2] -> [B, S, 1, D] (a repeat_interleave
                # here gets ranks from uninitialised memory in TorchScript's shape inference: SDPA's key Transpose
                # then has 6 axes and the ONNX peephole pass asserts or segfaults)
                assert freqs_cis is not None
                cos = freqs_cis[..., :1].expand(*freqs_cis.shape).flatten(-2).unsqueeze(2)
                sin = freqs_cis[..., 1:].expand(*freqs_cis.shape).flatten(-2).unsqueeze(2)
                x_real, x_imag = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
                rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
                return (x.float() * cos + rotated * sin).type_as(x)

            if freqs_cis is not None:
                query, key = rotate(query), rotate(key)
            if attention_mask is not None and attention_mask.ndim == 2:
                attention_mask = attention_mask[:, None, None, :]
            out = dispatch_attention_fn(query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False)
            out = out.flatten(2, 3).to(query.dtype)
            return attn.to_out[0](out)

    model.rope_embedder = real_rope
    for module in model.modules():
        if type(getattr(module, "processor", None)) is ZSingleStreamAttnProcessor:
            module.set_processor(RealRopeProcessor())
