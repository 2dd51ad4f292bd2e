"""Zoo cases: Sana (Sprint, ControlNet, Video), SANA-WM and its LTX-2-based refiner.

See tests/zoo/cases/__init__.py for what a case keeps of its model.
"""

from __future__ import annotations

import torch

from tests.zoo._zoo_common import ZooCase, random_angles_rotary
from tests.zoo.cases._helpers import _first_tuple, _keep, _pd, _r, _steps, _t

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


# --- Sana, Sana Sprint, Sana ControlNet ---------------------------------------------------

_SANA = dict(
    in_channels=4,
    out_channels=4,
    num_attention_heads=2,
    attention_head_dim=16,
    num_layers=2,
    num_cross_attention_heads=2,
    cross_attention_head_dim=16,
    cross_attention_dim=32,
    caption_channels=24,
    sample_size=8,
    patch_size=1,
)
# Sana Sprint: guidance embedding, q/k RMSNorm across heads, scaled timesteps
_SANA_SPRINT = dict(_SANA, guidance_embeds=True, qk_norm="rms_norm_across_heads", timestep_scale=1000.0)


def _sana_inputs(text_lengths, hw=(6, 8), text_len=6, guidance=False, controlnet=False):
    def inputs(model, gen):
        device, _ = _pd(model)
        batch = len(text_lengths)
        cfg = model.config
        kw = dict(
            hidden_states=_r(gen, model, batch, cfg.in_channels, *hw),
            encoder_hidden_states=_r(gen, model, batch, text_len, cfg.caption_channels),
            timestep=_t(gen, model, batch) if guidance else _steps(gen, model, batch),
            # the Gemma tokenizer's int64 mask, as the pipeline passes it
            encoder_attention_mask=_keep(text_lengths, text_len, device, dtype=torch.long),
        )
        if guidance:
            kw["guidance"] = _t(gen, model, batch, 2.0, 5.0)
        if controlnet:
            kw["controlnet_cond"] = _r(gen, model, batch, cfg.in_channels, *hw)
            kw["conditioning_scale"] = 0.9
            kw["return_dict"] = False
        return kw

    return inputs


_SANA_NOTE = (
    "diffusers Attention: self-attention with SanaLinearAttnProcessor2_0 (ReLU linear attention, not softmax: "
    "matmuls in float32, no mask), text cross-attention with SanaAttnProcessor2_0 (F.scaled_dot_product_attention; "
    "the text mask made additive (-10000) and expanded to (B, heads, 1, L) float)."
)
_add(
    ZooCase("SanaTransformer2DModel", _SANA, _sana_inputs([6, 6]), note=_SANA_NOTE + " Mask all ones."),
    ZooCase("SanaTransformer2DModel", _SANA, _sana_inputs([6, 2]), variant="masked", note=_SANA_NOTE),
    ZooCase(
        "SanaTransformer2DModel",
        _SANA,
        _sana_inputs([4, 0]),
        variant="fullpad",
        note=_SANA_NOTE + " Item 2 has every text token masked: the additive mask makes it a uniform average.",
    ),
    ZooCase(
        "SanaTransformer2DModel",
        _SANA_SPRINT,
        _sana_inputs([6, 3], guidance=True),
        variant="sprint",
        note=_SANA_NOTE + " Sana Sprint: q/k RMSNorm across heads in both attentions, guidance embedding.",
    ),
    ZooCase(
        "SanaControlNetModel",
        dict(_SANA, num_layers=2),
        _sana_inputs([6, 3], controlnet=True),
        outputs=_first_tuple,
        note=_SANA_NOTE,
    ),
)


_SANA_VIDEO = dict(
    in_channels=4,
    out_channels=4,
    num_attention_heads=2,
    attention_head_dim=16,
    num_layers=2,
    num_cross_attention_heads=2,
    cross_attention_head_dim=16,
    cross_attention_dim=32,
    caption_channels=24,
    sample_size=8,
    patch_size=(1, 2, 2),
    rope_max_seq_len=32,
)


def _sana_video_inputs(text_lengths, frames=2, hw=(4, 6), text_len=6):
    def inputs(model, gen):
        device, _ = _pd(model)
        batch = len(text_lengths)
        return dict(
            hidden_states=_r(gen, model, batch, model.config.in_channels, frames, *hw),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.caption_channels),
            timestep=_steps(gen, model, batch),
            encoder_attention_mask=_keep(text_lengths, text_len, device, dtype=torch.long),
        )

    return inputs


_SANA_VIDEO_NOTE = (
    "diffusers Attention: self-attention with SanaLinearAttnProcessor3_0 (ReLU linear attention with 3-D RoPE on "
    "the numerator's q/k only, not softmax; float32 matmuls), text cross-attention with SanaAttnProcessor2_0 -> "
    "dispatch_attention_fn (text mask additive (-10000), expanded to (B, heads, 1, L) float); q/k RMSNorm "
    "across heads."
)
_add(
    ZooCase("SanaVideoTransformer3DModel", _SANA_VIDEO, _sana_video_inputs([6, 6]), note=_SANA_VIDEO_NOTE),
    ZooCase(
        "SanaVideoTransformer3DModel", _SANA_VIDEO, _sana_video_inputs([6, 2]), variant="masked", note=_SANA_VIDEO_NOTE
    ),
)


# --- SANA-WM (world model, camera control) ------------------------------------------------

_SANA_WM = dict(
    in_channels=4,
    num_layers=2,  # with softmax_every_n=2: block 0 is a GDN block, block 1 a softmax block
    hidden_size=32,
    num_attention_heads=2,
    patch_size=(1, 1, 1),
    softmax_every_n=2,
    linear_head_dim=16,
    t_kernel_size=3,
    conv_kernel_size=4,
    caption_channels=12,
    mlp_ratio=2.0,
    chunk_plucker_channels=8,
    chunk_plucker_post_attn_blocks=2,
)


def _camera_conditions(batch, frames, hw, device):
    """(B, F, 20): a flat 4x4 camera-to-world matrix (a small random rotation about y and a forward
    translation) then pinhole intrinsics [fx, fy, cx, cy] centred on the latent grid."""
    h, w = hw
    angle = torch.linspace(0, 0.2, frames)
    c2w = torch.eye(4).repeat(batch, frames, 1, 1)
    c2w[..., 0, 0], c2w[..., 0, 2] = angle.cos(), angle.sin()
    c2w[..., 2, 0], c2w[..., 2, 2] = -angle.sin(), angle.cos()
    c2w[..., 2, 3] = torch.arange(frames, dtype=torch.float32) * 0.1
    intrinsics = torch.tensor([float(w), float(h), w / 2, h / 2]).expand(batch, frames, 4)
    return torch.cat([c2w.flatten(start_dim=-2), intrinsics], dim=-1).to(device)


def _sana_wm_inputs(text_lengths, frames=4, hw=(6, 8), text_len=6, valid_frames=None):
    def inputs(model, gen):
        device, dtype = _pd(model)
        batch = len(text_lengths)
        cfg = model.config
        kw = dict(
            hidden_states=_r(gen, model, batch, cfg.in_channels, frames, *hw),
            timestep=torch.randint(0, 1000, (batch, 1, frames), generator=gen).to(device, dtype),
            encoder_hidden_states=_r(gen, model, batch, 1, text_len, cfg.caption_channels),
            encoder_attention_mask=_keep(text_lengths, text_len, device, dtype=torch.long),
            camera_conditions=_camera_conditions(batch, frames, hw, device).to(dtype),
            chunk_plucker=_r(gen, model, batch, cfg.chunk_plucker_channels, frames, *hw),
        )
        if valid_frames is not None:
            kw["frame_valid_mask"] = _keep(valid_frames, frames, device)
        return kw

    return inputs


_SANA_WM_NOTE = (
    "Not diffusers attention processors except the text cross-attention: MultiHeadCrossAttention "
    "(AttentionModuleMixin) + SanaWMCrossAttnProcessor -> dispatch_attention_fn with a bool text key mask "
    "(B, 1, 1, L). Self-attention of GDN blocks: SanaWMBidirectionalGDNAttention (bidirectional gated-delta-rule "
    "linear attention, RoPE on the numerator only) and SanaWMBidirectionalGDNCamAttention (the same in UCPE camera "
    "ray space) -- not softmax; of softmax blocks: SanaWMSoftmaxAttention (F.scaled_dot_product_attention with RoPE, "
    "q/k/v cast to bfloat16 even in a float32 model) and SanaWMSoftmaxCamAttention (UCPE ray transforms, bfloat16, "
    "head dim zero-padded to 128 so the default scale is 1/sqrt(128), additive -1e9 key bias on padded frames)."
)
# None of the four self-attention classes is a diffusers Attention or an AttentionModuleMixin.
_SANA_WM_EXTRA = {
    "attention_classes": (
        "SanaWMBidirectionalGDNAttention",
        "SanaWMBidirectionalGDNCamAttention",
        "SanaWMSoftmaxAttention",
        "SanaWMSoftmaxCamAttention",
    )
}
_add(
    ZooCase("SanaWMTransformer3DModel", _SANA_WM, _sana_wm_inputs([6]), note=_SANA_WM_NOTE, extra=_SANA_WM_EXTRA),
    ZooCase(
        "SanaWMTransformer3DModel",
        _SANA_WM,
        _sana_wm_inputs([6, 3], valid_frames=[4, 3]),
        variant="masked",
        note=_SANA_WM_NOTE + " Item 2: text padding and a padded last frame (frame_valid_mask).",
        extra=_SANA_WM_EXTRA,
    ),
)


# --- SANA-WM stage-2 refiner (LTX-2 based, video only) ------------------------------------

_SANA_WM_REFINER = dict(
    in_channels=4,
    out_channels=4,
    patch_size=1,
    patch_size_t=1,
    num_attention_heads=2,
    attention_head_dim=16,
    cross_attention_dim=32,
    audio_in_channels=4,
    audio_out_channels=4,
    audio_num_attention_heads=2,
    audio_attention_head_dim=8,
    audio_cross_attention_dim=16,
    num_layers=2,
    qk_norm="rms_norm_across_heads",
    caption_channels=24,
    rope_double_precision=False,
)


def _sana_wm_refiner_inputs(text_lengths, frames=2, hw=(4, 4), text_len=6):
    def inputs(model, gen):
        device, dtype = _pd(model)
        batch = len(text_lengths)
        n = frames * hw[0] * hw[1]
        inner = model.config.num_attention_heads * model.config.attention_head_dim
        # the caller supplies the video RoPE: random angles in the interleaved layout, (B, N, inner)
        cos, sin = random_angles_rotary(gen, n, inner, dtype=dtype, device=device)
        return dict(
            hidden_states=_r(gen, model, batch, n, model.config.in_channels),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.caption_channels),
            timestep=(torch.rand(batch, n, generator=gen) * 1000).to(device, dtype),
            video_rotary_emb=(cos.expand(batch, -1, -1), sin.expand(batch, -1, -1)),
            encoder_attention_mask=_keep(text_lengths, text_len, device, dtype=dtype),
        )

    return inputs


_SANA_WM_REFINER_NOTE = (
    "SanaWMLTX2Attention: video self-attention with SanaWMLTX2RefinerAttnProcessor -> dispatch_attention_fn (no mask; "
    "interleaved RoPE from the video_rotary_emb input; the KV-cache sink/history paths are not exercised), video->text "
    "cross-attention with SanaWMLTX2AudioVideoAttnProcessor -> dispatch_attention_fn (text mask additive, "
    "(B, heads, 1, L) float); qk RMSNorm across heads. The audio attention modules are built (checkpoint layout) "
    "but the video-only forward never calls them."
)
# Built but never called by this model's forward.
_SANA_WM_REFINER_EXTRA = {
    "uncalled_attention": (
        ("audio_attn1", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn"),
        "the refiner's forward is video-only; the LTX-2 audio submodules exist so checkpoints load",
    )
}
_add(
    ZooCase(
        "SanaWMLTX2RefinerTransformer3DModel",
        _SANA_WM_REFINER,
        _sana_wm_refiner_inputs([6, 6]),
        note=_SANA_WM_REFINER_NOTE,
        extra=_SANA_WM_REFINER_EXTRA,
    ),
    ZooCase(
        "SanaWMLTX2RefinerTransformer3DModel",
        _SANA_WM_REFINER,
        _sana_wm_refiner_inputs([6, 2]),
        variant="masked",
        note=_SANA_WM_REFINER_NOTE,
        extra=_SANA_WM_REFINER_EXTRA,
    ),
)
