"""The pipeline's post-loop path as one module: final loop latent in, image in ``[0, 1]`` out.

What a pipeline does after its loop is found from the recorded ``output_type="np"`` call, not
from a table: the final loop latent ``L`` (the last step's ``prev_sample``) and the input ``z``
that ``vae.decode`` got are compared through a small set of candidate layouts (:data:`UNPACKS`:
as is, Flux-style 2x2 packing, 2x2 patch channels and their tokens, a frame axis of one), and the
per-channel affine map between them (``L / scaling_factor + shift_factor``, a per-channel mean and
std, or batch-norm statistics applied to the loop latent's channels before the unpack) is fitted
and checked exactly.  The image the pipeline returned is compared with the candidate post-processings
(``x / 2 + 0.5`` clamped, or clamped as is).  :class:`DecodeToImage` is that path, checked once
more end to end against the recorded image before it is exported.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rkpart.export.describe import DescribeError, same

if TYPE_CHECKING:
    import torch

    from rkpart.export.record import Recording

Unpack = Callable[["torch.Tensor", tuple[int, ...]], "torch.Tensor | None"]


def _identity(x: torch.Tensor, target: tuple[int, ...]) -> torch.Tensor | None:
    return x if tuple(x.shape) == target else None


def _flux_2x2(x: torch.Tensor, target: tuple[int, ...]) -> torch.Tensor | None:
    # FluxPipeline._unpack_latents: tokens of 2x2 patches, channels major within a token
    if x.dim() != 3 or len(target) != 4:
        return None
    b, c, h, w = target
    if h % 2 or w % 2 or tuple(x.shape) != (b, (h // 2) * (w // 2), c * 4):
        return None
    return x.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def _patch_2x2(x: torch.Tensor, target: tuple[int, ...]) -> torch.Tensor | None:
    # channels of 2x2 patches, channel-major (Flux.2 / ERNIE-Image ``_unpatchify_latents``): pixel_shuffle(2)
    if x.dim() != 4 or len(target) != 4:
        return None
    b, c, h, w = target
    if h % 2 or w % 2 or tuple(x.shape) != (b, c * 4, h // 2, w // 2):
        return None
    return x.reshape(b, c, 2, 2, h // 2, w // 2).permute(0, 1, 4, 2, 5, 3).reshape(b, c, h, w)


def _tokens_patch_2x2(x: torch.Tensor, target: tuple[int, ...]) -> torch.Tensor | None:
    # row-major tokens of those patches (Flux.2's packed loop latent)
    if x.dim() != 3 or len(target) != 4:
        return None
    b, c, h, w = target
    if h % 2 or w % 2 or tuple(x.shape) != (b, (h // 2) * (w // 2), c * 4):
        return None
    return _patch_2x2(x.reshape(b, h // 2, w // 2, c * 4).permute(0, 3, 1, 2), target)


def _frame_squeeze(x: torch.Tensor, target: tuple[int, ...]) -> torch.Tensor | None:
    if x.dim() == 5 and x.shape[2] == 1 and tuple(x.shape[:2]) + tuple(x.shape[3:]) == target:
        return x[:, :, 0]
    return None


def _flux_2x2_frame(x: torch.Tensor, target: tuple[int, ...]) -> torch.Tensor | None:
    # Flux-style tokens unpacked onto a frame axis of one (Qwen-Image's video VAE: Krea 2, Nucleus-MoE)
    if len(target) != 5 or target[2] != 1:
        return None
    u = _flux_2x2(x, (*target[:2], *target[3:]))
    return None if u is None else u.unsqueeze(2)


def _frames_first(x: torch.Tensor, target: tuple[int, ...]) -> torch.Tensor | None:
    # a video latent looped on as (B, F, C, H, W) and decoded as (B, C, F, H, W) (CogVideoX)
    if x.dim() != 5 or len(target) != 5 or tuple(x.permute(0, 2, 1, 3, 4).shape) != target:
        return None
    return x.permute(0, 2, 1, 3, 4)


def _tokens(x: torch.Tensor, target: tuple[int, ...]) -> torch.Tensor | None:
    # row-major tokens of the positions, channels last: (B, F*H*W, C) -> (B, C, F, H, W) (LTX with patch size 1;
    # the inverse of ``latent.init: tokens``)
    if x.dim() != 3 or len(target) < 4 or tuple(x.shape) != (target[0], math.prod(target[2:]), target[1]):
        return None
    return x.transpose(1, 2).reshape(target)


#: candidate layouts of the loop latent, by the name ``latent.packing`` records (``None``: as is)
UNPACKS: dict[str, Unpack] = {"identity": _identity, "flux-2x2": _flux_2x2, "patch-2x2": _patch_2x2,
                              "tokens-patch-2x2": _tokens_patch_2x2, "frame-squeeze": _frame_squeeze,
                              "flux-2x2-frame": _flux_2x2_frame, "frames-first": _frames_first,
                              "tokens": _tokens}
#: the packing name recorded in the description for each unpack (``identity`` is no packing)
PACKING = {"identity": None, "flux-2x2": "flux-2x2", "patch-2x2": "patch-2x2", "tokens-patch-2x2": "tokens-patch-2x2",
           "frame-squeeze": None, "flux-2x2-frame": "flux-2x2", "frames-first": "frames-first", "tokens": "tokens"}


def _denormalize(x: torch.Tensor) -> torch.Tensor:
    return (x / 2 + 0.5).clamp(0, 1)


def _clamp(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(0, 1)


POSTPROCESS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"x / 2 + 0.5": _denormalize, "clamp": _clamp}


@dataclass
class PostLoop:
    """The post-loop path found in a recording."""

    unpack: str
    #: ``z = latent * scale + shift`` per channel: of the unpacked latent (axis 1) or, ``affine_first``, of
    #: the loop latent before the unpack (its channel axis: Flux.2's batch-norm statistics of patch channels)
    scale: np.ndarray
    shift: np.ndarray
    affine_first: bool
    postprocess: str
    latent_shape: tuple[int, ...]
    #: what vae.decode got (the unpacked latent)
    decode_shape: tuple[int, ...]
    image_shape: tuple[int, ...]
    #: the pipeline keeps frame 0 of the decoder's ``(B, C, 1, H, W)`` (an image pipeline with a video VAE)
    squeeze_frame: bool = False


def _fit_affine(u: np.ndarray, z: np.ndarray, groups: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-group ``a, b`` with ``z == a[g] * u + b[g]`` (flat arrays; checked to float tolerance), or ``None``."""
    a, b = np.empty(n), np.empty(n)
    for g in range(n):
        x, y = u[groups == g], z[groups == g]
        var = float(((x - x.mean()) ** 2).sum()) if x.size else 0.0
        if var == 0:
            return None
        a[g] = float(((x - x.mean()) * (y - y.mean())).sum()) / var
        b[g] = float(y.mean() - a[g] * x.mean())
    if np.abs(a[groups] * u + b[groups] - z).max() > 1e-5 * max(1.0, float(np.abs(z).max())):
        return None
    return a, b


def _channel_axis(x: torch.Tensor) -> int:
    return 2 if x.dim() == 3 else 1  # tokens (B, N, C) keep their channels last


def _affines(latent: torch.Tensor, z: torch.Tensor, unpack: Unpack) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """The per-channel affine between the unpacked ``latent`` and ``z``: applied after the unpack (on ``z``'s
    channels), else before it (on the loop latent's channels), or ``None``."""
    import torch

    u = unpack(latent, tuple(z.shape))
    if u is None:
        return None
    uu, zz = u.detach().double().numpy().ravel(), z.detach().double().numpy().ravel()
    after = np.broadcast_to(np.arange(z.shape[1]).reshape(1, -1, *([1] * (z.dim() - 2))), z.shape).ravel()
    fit = _fit_affine(uu, zz, after, z.shape[1])
    if fit is not None:
        return fit[0], fit[1], False
    # which loop-latent channel each element of the unpacked latent came from
    axis = _channel_axis(latent)
    shape = [1] * latent.dim()
    shape[axis] = latent.shape[axis]
    channel_of = torch.arange(latent.shape[axis], dtype=torch.float64).reshape(shape).expand(latent.shape)
    moved = unpack(channel_of.contiguous(), tuple(z.shape))
    if moved is None:
        return None
    fit = _fit_affine(uu, zz, moved.numpy().astype(np.int64).ravel(), latent.shape[axis])
    return None if fit is None else (fit[0], fit[1], True)


def _named_affine(a: np.ndarray, b: np.ndarray, config: Any) -> tuple[np.ndarray, np.ndarray]:
    """``a, b`` as the VAE config spells them when they are (``1 / scaling_factor``, ``shift_factor``):
    exact constants instead of fitted ones."""
    sf = getattr(config, "scaling_factor", None)
    shift = getattr(config, "shift_factor", None) or 0.0
    if isinstance(sf, (int, float)) and sf and np.allclose(a, 1 / sf, rtol=1e-5) and np.allclose(b, shift, atol=1e-6):
        return np.full_like(a, 1 / sf), np.full_like(b, float(shift))
    return a, b


def find_post_loop(rec: Recording, vae_config: Any) -> PostLoop:
    """The path from the final loop latent to the returned image, found in ``rec`` (an ``np`` call)."""
    import torch

    if rec.decode_input is None or rec.decode_output is None:
        raise DescribeError("the pipeline did not call vae.decode for output_type='np'")
    latent = rec.steps[-1].prev_sample
    z, x = rec.decode_input, rec.decode_output
    found: tuple[str, np.ndarray, np.ndarray, bool] | None = None
    for name, unpack in UNPACKS.items():
        fit = _affines(latent, z, unpack)
        if fit is not None:
            a, b, first = fit
            found = (name, *(_named_affine(a, b, vae_config) if not first else (a, b)), first)
            break
    if found is None:
        raise DescribeError(f"the final loop latent {tuple(latent.shape)} does not become vae.decode's input "
                            f"{tuple(z.shape)} by any layout rkpart knows ({', '.join(UNPACKS)}) and a per-channel "
                            "scale and shift")
    image = torch.as_tensor(np.asarray(rec.result))
    post = None
    # an image pipeline keeps frame 0 of a video VAE's (B, C, 1, H, W) (Qwen-Image's); a video pipeline returns
    # (B, F, H, W, C) frames of the decoder's (B, C, F, H, W)
    squeeze = x.dim() == 5 and x.shape[2] == 1 and image.dim() == 4
    if squeeze:
        x = x[:, :, 0]
    if x.dim() == image.dim() and x.dim() in (4, 5):
        for pname, fn in POSTPROCESS.items():
            if same(fn(x.float()).movedim(1, -1), image, rtol=1e-4):
                post = pname
                break
    if post is None:
        raise DescribeError(f"the pipeline's image {tuple(image.shape)} is not vae.decode's output "
                            f"{tuple(x.shape)} post-processed as rkpart knows ({', '.join(POSTPROCESS)})")
    return PostLoop(found[0], found[1], found[2], found[3], post, tuple(latent.shape), tuple(z.shape),
                    tuple(x.shape), squeeze)


def decode_module(vae: Any, post: PostLoop) -> Any:
    """:class:`DecodeToImage` for ``vae`` and the path ``post`` (a float32 torch module in eval mode)."""
    import torch

    class DecodeToImage(torch.nn.Module):
        """Final loop latent (as the pipeline holds it) -> image NCHW float32 in [0, 1]."""

        def __init__(self) -> None:
            super().__init__()
            self.vae = vae
            c = len(post.scale)
            # plain attributes, not buffers: exported as constants, and nothing for a state dict
            shape = [1] * (len(post.latent_shape) if post.affine_first else len(post.decode_shape))
            shape[_axis(post) if post.affine_first else 1] = c
            self.scale = torch.tensor(post.scale, dtype=torch.float32).reshape(shape)
            self.shift = torch.tensor(post.shift, dtype=torch.float32).reshape(shape)

        def forward(self, latent: torch.Tensor, return_dict: bool = True) -> Any:
            # return_dict=False gives a tuple, as a diffusers model does (the export core calls it so)
            image = self.image(latent)
            return image if return_dict else (image,)

        def image(self, latent: torch.Tensor) -> torch.Tensor:
            if post.affine_first:
                latent = latent * self.scale + self.shift
            z = UNPACKS[post.unpack](latent, post.decode_shape)
            assert z is not None
            if not post.affine_first:
                z = z * self.scale + self.shift
            x = self.vae.decode(z.to(self.vae.dtype), return_dict=False)[0]
            if post.squeeze_frame:
                x = x[:, :, 0]
            return POSTPROCESS[post.postprocess](x.float())

    return DecodeToImage().eval()


def _axis(post: PostLoop) -> int:
    return 2 if len(post.latent_shape) == 3 else 1


def check_module(module: Any, rec: Recording) -> float:
    """Run ``module`` on the recorded final latent; its max |error| against the recorded image (raises when off)."""
    import torch

    with torch.no_grad():
        out = module(rec.steps[-1].prev_sample)
    image = torch.as_tensor(np.asarray(rec.result)).movedim(-1, 1)
    err = float((out.double() - image.double()).abs().max())
    if not err <= 1e-4:
        raise DescribeError(f"the exported post-loop path (unpack, scale and shift, vae.decode, postprocess) differs "
                            f"from the pipeline's image by {err:.3g}")
    return err
