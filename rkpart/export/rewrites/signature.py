"""Adapters: ``forward`` on tensors where diffusers takes lists, cache objects or dicts.

An exporter traces a function of tensors.  Each adapter wraps the model's own ``forward`` (an
instance attribute: module names and computation unchanged) so that it takes the pipeline's
lists / caches as stacked tensors and returns the prediction.  The unpatched forward cannot be
called on the export inputs, so an adapter is not checked against it: it calls it.
"""

from __future__ import annotations

from typing import Any


def list_inputs(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Every list-of-tensors input ``x`` becomes graph inputs ``x_0``, ``x_1``, ... that ``forward``
    gathers back into the list (an instance-level ``forward``: module names and computation unchanged)."""
    lists = {k: len(v) for k, v in inputs.items() if isinstance(v, list)}
    for k in lists:
        for i, t in enumerate(inputs.pop(k)):
            inputs[f"{k}_{i}"] = t
    forward = model.forward

    def gathered(**kwargs: Any) -> Any:
        for k, n in lists.items():
            kwargs[k] = [kwargs.pop(f"{k}_{i}") for i in range(n)]
        return forward(**kwargs)

    model.forward = gathered


def one_video_cosmos3(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Cosmos3's forward takes a list of videos and returns lists of predictions: one video in, its
    prediction out."""
    forward = model.forward

    def one_video(*, vision_tokens: Any, **kwargs: Any) -> tuple[Any]:
        return (forward(vision_tokens=[vision_tokens], **kwargs)[0][0],)

    model.forward = one_video


def kv_cache_inputs_far(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """AnyFlow FAR's cached autoregressive step with its KV caches as two stacked tensors.

    The forward takes the caches as a dict of dicts of tensors per layer and a ``kv_cache_flag``
    dict it mutates: here it takes ``full_cache`` / ``compressed_cache`` stacked over layers
    (``[layer, k/v, batch, heads, tokens, head_dim]``) and returns the prediction only.  The step's
    layout is static: ``fixed["chunk_partition"]`` (frames per chunk) and
    ``fixed["num_cached_chunks"]``.
    """
    forward = model.forward

    def step(*, full_cache: Any, compressed_cache: Any, chunk_partition: list[int], num_cached_chunks: int,
             **kwargs: Any) -> tuple[Any]:
        kv_cache = [{"full_cache": full_cache[i], "compressed_cache": compressed_cache[i]}
                    for i in range(full_cache.shape[0])]
        out = forward(chunk_partition=list(chunk_partition), kv_cache=kv_cache,
                      kv_cache_flag={"num_cached_chunks": num_cached_chunks, "is_cache_step": False}, **kwargs)
        return (out[0],)

    model.forward = step


def kv_cache_inputs_sana_wm_refiner(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """The SANA-WM refiner's ``kv_cache_mode="inject"`` step with its cache as tensors.

    The refiner reads the sink and history K/V of every layer from a ``SanaWMRefinerKVCache`` object
    and takes the active block's RoPE as a ``(cos, sin)`` tuple.  ``forward`` is wrapped to build the
    cache from stacked ``(layers, batch, tokens, inner)`` inputs (``sink_k_pre``, ``sink_v``,
    ``history_k``, ``history_v``); the RoPE tables depend only on static positions and become
    constants, made by the model's own ``build_rotary_emb_for_absolute_positions`` from
    ``fixed["rope_layout"]`` (removed from ``fixed``): ``frame_positions`` of the active block,
    ``sink_frame_positions``, the latent ``height`` / ``width`` and ``fps``, as the pipeline places them.
    """
    import types

    from diffusers.models.transformers.transformer_sana_wm_refiner import SanaWMRefinerKVCache

    layout = fixed.pop("rope_layout")
    rope = model.build_rotary_emb_for_absolute_positions
    grid = {"height": layout["height"], "width": layout["width"], "device": "cpu", "fps": layout["fps"]}
    fixed["video_rotary_emb"] = rope(batch_size=1, frame_positions=list(layout["frame_positions"]), **grid)
    sink_pe = rope(batch_size=1, frame_positions=list(layout["sink_frame_positions"]), **grid)
    forward = model.forward

    def forward_with_cache(self: Any, hidden_states: Any, encoder_hidden_states: Any, timestep: Any,
                           encoder_attention_mask: Any, sink_k_pre: Any, sink_v: Any, history_k: Any, history_v: Any,
                           video_rotary_emb: Any, return_dict: bool = True) -> Any:
        cache = SanaWMRefinerKVCache(len(self.transformer_blocks))
        cache.sink_pe = sink_pe
        for i in range(len(self.transformer_blocks)):
            cache.get(i).store_sink(sink_k_pre[i], sink_v[i])
            cache.get(i).store_history(history_k[i], history_v[i])
        return forward(hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states, timestep=timestep,
                       video_rotary_emb=video_rotary_emb, encoder_attention_mask=encoder_attention_mask,
                       kv_cache=cache, kv_cache_mode="inject", return_dict=return_dict)

    model.forward = types.MethodType(forward_with_cache, model)

def list_forward_zimage(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Z-Image's forward on batch tensors: it takes ``x`` and ``cap_feats`` as lists of per-sample
    tensors and returns a list (the pipeline passes ``list(latents.unbind(0))``); here the forward
    unbinds the batch inputs and stacks the outputs."""
    import torch

    original = model.forward

    def forward(x: torch.Tensor, t: torch.Tensor, cap_feats: torch.Tensor, return_dict: bool = False,
                **kwargs: Any) -> tuple[torch.Tensor]:
        out = original(list(x.unbind(0)), t, list(cap_feats.unbind(0)), return_dict=False, **kwargs)[0]
        return (torch.stack(out),)

    model.forward = forward
