"""Single ops neither exporter converts, or converts into a graph ONNX Runtime refuses.

Each rewrite is the same function written with ops every exporter handles: a boolean-mask write
as ``where``, a QR factor of weights computed once, ``rms_norm`` decomposed, ``pad_sequence`` as
``pad`` + ``stack``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def prior_drop_where_glm(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """GLM-Image's prior-code dropping as a ``where``.

    ``prior_embedding[prior_token_drop] *= 0.0`` (boolean-mask indexing) exports a ``NonZero``
    whose output shape depends on the mask's values (rkpart: exit 3).  ``where(drop, 0 * e, e)`` is
    the same tensor.  ``forward`` is diffusers' with that one line changed (no KV cache: text-to-image).
    """
    import torch

    def forward(hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor, prior_token_id: torch.Tensor,
                prior_token_drop: torch.Tensor, timestep: torch.Tensor, target_size: torch.Tensor,
                crop_coords: torch.Tensor, image_rotary_emb: Any = None, return_dict: bool = True) -> Any:
        self = model
        batch_size, _, height, width = hidden_states.shape
        if image_rotary_emb is None:
            image_rotary_emb = self.rope(hidden_states)
        p = self.config.patch_size
        hidden_states = self.image_projector(hidden_states)
        encoder_hidden_states = self.glyph_projector(encoder_hidden_states)
        prior_embedding = self.prior_token_embedding(prior_token_id)
        prior_embedding = torch.where(prior_token_drop[..., None], prior_embedding * 0.0, prior_embedding)  # the change
        hidden_states = hidden_states + self.prior_projector(prior_embedding)
        temb = self.time_condition_embed(timestep, target_size, crop_coords, hidden_states.dtype)
        for block in self.transformer_blocks:
            hidden_states, encoder_hidden_states = block(hidden_states, encoder_hidden_states, temb,
                                                         image_rotary_emb, None, None, kv_cache=None)
        hidden_states = self.proj_out(self.norm_out(hidden_states, temb))
        hidden_states = hidden_states.reshape(batch_size, height // p, width // p, -1, p, p)
        return (hidden_states.permute(0, 3, 1, 4, 2, 5).flatten(4, 5).flatten(2, 3),)

    model.forward = forward


def static_motion_qr_wan_animate(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Wan-Animate's motion encoder with the QR factor of its weight computed once.

    ``WanAnimateMotionEncoder`` orthogonalises a parameter on every call (``torch.linalg.qr(weight)``):
    neither exporter converts ``aten::linalg_qr`` (TorchScript: "not supported", dynamo: a
    ConversionError on the node).  The factor depends only on the weights, so it is computed here and
    held as a buffer.  TorchScript has no ``aten::diag_embed`` either: ``diag_embed(f) @ Q.T`` (row ``j``
    of ``Q.T`` scaled by ``f[j]``) is written as the broadcast product ``f[..., None] * Q.T``, summed
    over ``j`` as diffusers sums it.  Every other step of the forward is diffusers' own.
    """
    import types

    import torch

    enc = model.motion_encoder
    with torch.no_grad():
        q = torch.linalg.qr((enc.motion_synthesis_weight + 1e-8).to(torch.float32))[0]
    enc.register_buffer("motion_q", q.contiguous(), persistent=False)

    def forward(self: Any, face_image: torch.Tensor, channel_dim: int = 1) -> torch.Tensor:
        face_image = self.conv_in(face_image, channel_dim)
        for block in self.res_blocks:
            face_image = block(face_image, channel_dim)
        face_image = self.conv_out(face_image, channel_dim)
        motion_feat = face_image.squeeze(-1).squeeze(-1)
        for linear_layer in self.motion_network:
            motion_feat = linear_layer(motion_feat, channel_dim=channel_dim)
        original_motion_dtype = motion_feat.dtype
        motion_feat = motion_feat.to(torch.float32)
        # diag_embed(feat) @ Q.T scales row j of Q.T by feat[j]: the same products, broadcast
        motion_decomposition = motion_feat.unsqueeze(-1) * self.motion_q.T
        return torch.sum(motion_decomposition, dim=1).to(dtype=original_motion_dtype)

    enc.forward = types.MethodType(forward, enc)


def decomposed_rms_norm_krea2(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Krea2's RMSNorms (``F.rms_norm`` with weight ``1 + w``: ``aten::rms_norm``, no TorchScript symbolic
    below opset 23) in the decomposed form :func:`decompose_rms_norm` gives ``torch.nn.RMSNorm``."""
    import torch
    from diffusers.models.transformers.transformer_krea2 import Krea2RMSNorm

    def decomposed(norm: Krea2RMSNorm) -> Callable[[torch.Tensor], torch.Tensor]:
        def forward(x: torch.Tensor) -> torch.Tensor:
            y = x.float()
            y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + norm.eps)
            return (y * (norm.weight + 1.0)).to(x.dtype)
        return forward

    for module in model.modules():
        if isinstance(module, Krea2RMSNorm):
            module.forward = decomposed(module)  # type: ignore[method-assign,assignment]


def decompose_rms_norm(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Replace ``torch.nn.RMSNorm`` (``aten::rms_norm``: no TorchScript symbolic below opset 23)
    by the decomposed form every exporter understands, keeping the weights."""
    import torch

    class DecomposedRMSNorm(torch.nn.Module):
        def __init__(self, src: torch.nn.RMSNorm) -> None:
            super().__init__()
            self.eps = src.eps if src.eps is not None else torch.finfo(torch.float32).eps
            self.weight = src.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            return y * self.weight if self.weight is not None else y

    for _name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            if isinstance(child, torch.nn.RMSNorm):
                setattr(mod, child_name, DecomposedRMSNorm(child))

def pad_sequence_zimage(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """torch's ``pad_sequence`` (``aten::pad_sequence``: no TorchScript symbolic) as ``F.pad`` + ``stack``
    while Z-Image's forward runs (diffusers calls it on the per-sample token lists)."""
    import torch
    import torch.nn.functional as F
    from diffusers.models.transformers import transformer_z_image as zimage

    def pad_sequence(seqs: list[torch.Tensor], batch_first: bool = False, padding_value: float = 0.0,
                     **_: Any) -> torch.Tensor:
        assert batch_first
        longest = max(len(q) for q in seqs)
        return torch.stack([F.pad(q, (0, 0) * (q.dim() - 1) + (0, longest - len(q)), value=padding_value)
                            for q in seqs])

    original = model.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        saved, zimage.pad_sequence = zimage.pad_sequence, pad_sequence  # type: ignore[assignment]
        try:
            return original(*args, **kwargs)
        finally:
            zimage.pad_sequence = saved

    model.forward = forward
