"""Zoo cases: Wan (2.1 / 2.2, VACE, Animate, Animate-2), SkyReels-V2, ChronoEdit (Wan layout).

See tests/zoo/cases/__init__.py for what a case keeps of its model.
"""

from __future__ import annotations

import torch

from tests.zoo._zoo_common import ZooCase
from tests.zoo.cases._helpers import _pd, _r, _ReferenceThenGenerateCase, _rn, _steps, _timestep

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


# --- ChronoEdit (Wan layout) --------------------------------------------------------------

_CHRONO = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=12,
    in_channels=4,
    out_channels=4,
    text_dim=16,
    freq_dim=16,
    ffn_dim=32,
    num_layers=1,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=32,
)
_CHRONO_NOTE = (
    "WanAttention (AttentionModuleMixin, ChronoEdit's copy) + WanAttnProcessor -> dispatch_attention_fn, no mask: "
    "self-attention with real-valued interleaved rotary (cos, sin) built inside (2 frames: temporal positions "
    "0 and temporal_skip_len-1), RMS qk-norm across heads; cross-attention to the text"
)


def _chrono_inputs(i2v):
    def make(model, gen):
        out = {
            "hidden_states": _rn(model, gen, 1, 4, 2, 8, 8),
            "timestep": _timestep(model, gen, 1),
            # The I2V processor splits the context at len - 512: the text is 512 tokens there.
            "encoder_hidden_states": _rn(model, gen, 1, 512 if i2v else 7, 16),
        }
        if i2v:
            out["encoder_hidden_states_image"] = _rn(model, gen, 1, 5, 12)
        return out

    return make


CASES.append(
    ZooCase(name="ChronoEditTransformer3DModel", config=_CHRONO, inputs=_chrono_inputs(False), note=_CHRONO_NOTE)
)
CASES.append(
    ZooCase(
        name="ChronoEditTransformer3DModel",
        variant="i2v",
        config=dict(_CHRONO, image_dim=12, added_kv_proj_dim=24),
        inputs=_chrono_inputs(True),
        note=_CHRONO_NOTE + "; I2V: the image tokens (context[:, :-512]) go through add_k/add_v and a second "
        "dispatch_attention_fn call (no mask, parallel_config=None), summed with the text attention",
    )
)


# --- SkyReels-V2 --------------------------------------------------------------------------

_SKYREELS = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=4,
    out_channels=4,
    text_dim=24,
    freq_dim=16,
    ffn_dim=48,
    num_layers=2,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=32,
)
# image-to-video: CLIP image tokens through added k/v projections
_SKYREELS_I2V = dict(_SKYREELS, image_dim=12, added_kv_proj_dim=32, in_channels=8)
# diffusion forcing: block-causal self-attention over frames, one timestep per frame
_SKYREELS_DF = dict(_SKYREELS, num_frame_per_block=2, inject_sample_info=True)

# the I2V processors split the context at a hard-coded 512 text tokens
_WAN_TEXT_LEN_I2V = 512


def _wan_like_inputs(batch=2, frames=4, hw=(4, 6), text_len=6, image_tokens=0, diffusion_forcing=False, fps=False):
    def inputs(model, gen):
        cfg = model.config
        kw = dict(
            hidden_states=_r(gen, model, batch, cfg.in_channels, frames, *hw),
            timestep=_steps(gen, model, batch),
            encoder_hidden_states=_r(gen, model, batch, text_len, cfg.text_dim),
        )
        if image_tokens:
            kw["encoder_hidden_states_image"] = _r(gen, model, batch, image_tokens, cfg.image_dim)
        if diffusion_forcing:
            kw["timestep"] = torch.randint(1, 1000, (batch, frames), generator=gen).to(kw["hidden_states"])
            kw["enable_diffusion_forcing"] = True
        if fps:
            # the pipeline's fps index: 0 for 16 fps, 1 otherwise (one value for the whole batch)
            kw["fps"] = [0] * batch
        return kw

    return inputs


_SKYREELS_NOTE = (
    "SkyReelsV2Attention + SkyReelsV2AttnProcessor -> dispatch_attention_fn: video self-attention with 3-D RoPE "
    "(cos, sin, interleaved pairs), text cross-attention; qk RMSNorm across heads."
)
_add(
    ZooCase("SkyReelsV2Transformer3DModel", _SKYREELS, _wan_like_inputs(), note=_SKYREELS_NOTE + " No mask."),
    ZooCase(
        "SkyReelsV2Transformer3DModel",
        _SKYREELS_I2V,
        _wan_like_inputs(text_len=_WAN_TEXT_LEN_I2V, image_tokens=5),
        variant="i2v",
        note=_SKYREELS_NOTE
        + " I2V: a second dispatch_attention_fn call per cross-attention over the image tokens (add_k/v_proj, "
        "norm_added_k), summed with the text attention; the context is split at 512 text tokens.",
    ),
    ZooCase(
        "SkyReelsV2Transformer3DModel",
        _SKYREELS_DF,
        # batch 1, as the pipeline runs it: the fps term broadcasts wrongly for batch > 1
        _wan_like_inputs(batch=1, diffusion_forcing=True, fps=True),
        variant="df",
        note=_SKYREELS_NOTE
        + " Diffusion forcing: a block-causal bool self-attention mask (1, 1, N, N) over 2-frame blocks, "
        "per-frame timesteps, fps conditioning.",
    ),
)


# --- Wan 2.1 / 2.2, Wan-VACE --------------------------------------------------------------

_WAN = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=4,
    out_channels=4,
    text_dim=24,
    freq_dim=16,
    ffn_dim=48,
    num_layers=2,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=32,
)
# Wan 2.1 I2V: CLIP image tokens with added k/v projections
_WAN_I2V = dict(_WAN, in_channels=8, image_dim=12, added_kv_proj_dim=32)


def _wan_ti2v_inputs(model, gen, batch=2, frames=4, hw=(4, 6), text_len=6):
    """Wan 2.2 TI2V: one timestep per patch token (the first frame's tokens at 0, as the pipeline does)."""
    kw = _wan_like_inputs(batch=batch, frames=frames, hw=hw, text_len=text_len)(model, gen)
    tokens_per_frame = (hw[0] // 2) * (hw[1] // 2)
    t = torch.randint(1, 1000, (batch, 1), generator=gen).float().expand(batch, frames * tokens_per_frame).clone()
    t[:, :tokens_per_frame] = 0
    kw["timestep"] = t.to(kw["hidden_states"])
    return kw


_WAN_NOTE = (
    "WanAttention + WanAttnProcessor -> dispatch_attention_fn: video self-attention with 3-D RoPE (cos, sin, "
    "interleaved pairs), text cross-attention; qk RMSNorm across heads; no mask."
)
_WAN_I2V_NOTE = (
    " I2V: the cross-attention makes a second dispatch_attention_fn call over the image tokens (add_k/v_proj, "
    "norm_added_k) and sums it with the text attention; the context is split at a hard-coded 512 text tokens."
)
_add(
    ZooCase("WanTransformer3DModel", _WAN, _wan_like_inputs(), note=_WAN_NOTE),
    ZooCase(
        "WanTransformer3DModel",
        _WAN_I2V,
        _wan_like_inputs(text_len=_WAN_TEXT_LEN_I2V, image_tokens=5),
        variant="i2v",
        note=_WAN_NOTE + _WAN_I2V_NOTE,
    ),
    ZooCase(
        "WanTransformer3DModel",
        _WAN,
        _wan_ti2v_inputs,
        variant="ti2v",
        note=_WAN_NOTE + " Wan 2.2 TI2V: per-token timesteps (B, N).",
    ),
)

_WAN_VACE = dict(_WAN, num_layers=2, vace_layers=[0, 1], vace_in_channels=6)


def _wan_vace_inputs(model, gen, batch=2, frames=4, hw=(4, 6)):
    kw = _wan_like_inputs(batch=batch, frames=frames, hw=hw)(model, gen)
    kw["control_hidden_states"] = _r(gen, model, batch, model.config.vace_in_channels, frames, *hw)
    kw["control_hidden_states_scale"] = torch.tensor([0.8, 1.2], device=kw["hidden_states"].device)
    return kw


_add(
    ZooCase(
        "WanVACETransformer3DModel",
        _WAN_VACE,
        _wan_vace_inputs,
        note="WanAttention + WanAttnProcessor -> dispatch_attention_fn in the main and the VACE control blocks: "
        "video self-attention with 3-D RoPE, text cross-attention, qk RMSNorm across heads; no mask.",
    )
)


# --- Wan-Animate --------------------------------------------------------------------------

_WAN_ANIMATE = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=12,  # 2 * latent + 4
    latent_channels=4,
    out_channels=4,
    text_dim=24,
    freq_dim=16,
    ffn_dim=48,
    num_layers=2,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    image_dim=16,
    added_kv_proj_dim=32,  # the released checkpoint's layout (= inner dim)
    rope_max_seq_len=32,
    motion_encoder_channel_sizes={"4": 16, "8": 16, "16": 16},
    motion_encoder_size=16,
    motion_style_dim=8,
    motion_dim=4,
    motion_encoder_dim=16,
    face_encoder_hidden_dim=16,
    face_encoder_num_heads=2,
    inject_face_latents_blocks=2,
)


def _wan_animate_inputs(model, gen, batch=1, frames=5, hw=(8, 8), face_frames=13, image_tokens=5):
    """frames latent frames (the reference frame first); the face encoder turns face_frames pixel frames
    into frames - 1 motion frames, plus a leading zero one."""
    cfg = model.config
    return dict(
        hidden_states=_r(gen, model, batch, cfg.in_channels, frames, *hw),
        timestep=_steps(gen, model, batch),
        encoder_hidden_states=_r(gen, model, batch, _WAN_TEXT_LEN_I2V, cfg.text_dim),
        encoder_hidden_states_image=_r(gen, model, batch, image_tokens, cfg.image_dim),
        pose_hidden_states=_r(gen, model, batch, cfg.latent_channels, frames - 1, *hw),
        face_pixel_values=_r(gen, model, batch, 3, face_frames, cfg.motion_encoder_size, cfg.motion_encoder_size),
    )


_add(
    ZooCase(
        "WanAnimateTransformer3DModel",
        _WAN_ANIMATE,
        _wan_animate_inputs,
        note=(
            "WanAttention + WanAttnProcessor -> dispatch_attention_fn (video self-attention with 3-D RoPE; text "
            "cross-attention plus a second call over the CLIP-image tokens (added k/v), the context split at 512 "
            "text tokens), and "
            "WanAnimateFaceBlockCrossAttention + WanAnimateFaceBlockAttnProcessor -> dispatch_attention_fn: per-frame "
            "cross-attention of each frame's video tokens to that frame's face-motion tokens (batch and frames "
            "folded: (B * T, S / T) queries over (B * T, N) keys); qk RMSNorm; no mask."
        ),
    )
)


# Wan-Animate-2: a 5-frame 32x32 segment -> 4x4 latents, 2 reference latent frames, 3 generation ones.
_WAN_ANIMATE2 = dict(
    patch_size=(1, 2, 2),
    text_len=16,
    in_dim=4 + 8,  # latents + conditioning latents (with their i2v mask channels)
    dim=32,
    ffn_dim=48,
    freq_dim=16,
    text_dim=24,
    out_dim=4,
    num_heads=2,
    num_layers=2,
    cross_attn_norm=True,
    use_img_emb=True,
)
_WAN_ANIMATE2_CLIP_DIM = 1280  # the image projection hard-codes CLIP's width


def _wan_animate2_inputs(model, gen, ref_frames=2, hw=(4, 4), text_len=8, clip_len=4, generation_pass=False):
    device, _ = _pd(model)
    cfg = model.config
    patches = (hw[0] // 2) * (hw[1] // 2)
    latent, cond = cfg.out_dim, cfg.in_dim - cfg.out_dim

    def one_pass(frames):
        return dict(
            hidden_states=[_r(gen, model, latent, frames, *hw)],
            encoder_hidden_states=[_r(gen, model, text_len, cfg.text_dim)],
            condition_latents=[_r(gen, model, cond, frames, *hw)],
            encoder_hidden_states_image=_r(gen, model, 1, clip_len, _WAN_ANIMATE2_CLIP_DIM),
            seq_len=frames * patches,
        )

    grid = torch.tensor([[ref_frames, hw[0] // 2, hw[1] // 2]], dtype=torch.long)
    reference = dict(one_pass(ref_frames), timestep=torch.tensor([1.0], device=device), offset_grid_sizes=grid)
    if not generation_pass:
        return dict(reference=reference)
    generation = dict(
        one_pass(ref_frames + 1),
        timestep=_steps(gen, model, 1),
        reference_grid_sizes=grid,
        origin_len=5,
        origin_area=[8 * hw[0], 8 * hw[1]],
    )
    return dict(reference=reference, generation=generation)


_WAN_ANIMATE2_NOTE = (
    "WanAnimate2Attention: self-attention with WanAnimate2AttnProcessor; the reference pass runs it dense through "
    "dispatch_attention_fn (module backend, no mask) and caches K/V; the generation pass packs [generation | cached "
    "reference] into 128-aligned buffers and calls dispatch_attention_fn with backend=FLEX hard-coded and a flex "
    "BlockMask (each frame sees all generation tokens plus the same-frame reference tokens). RoPE via rope_apply "
    "(float64). Cross-attention: WanAnimate2CrossAttnProcessor -> dispatch_attention_fn, text plus a second call over "
    "the CLIP image tokens (added k/v). qk RMSNorm."
)
_add(
    _ReferenceThenGenerateCase(
        "WanAnimate2Transformer3DModel",
        _WAN_ANIMATE2,
        _wan_animate2_inputs,
        note="The reference pass only. " + _WAN_ANIMATE2_NOTE,
    ),
    _ReferenceThenGenerateCase(
        "WanAnimate2Transformer3DModel",
        _WAN_ANIMATE2,
        lambda model, gen: _wan_animate2_inputs(model, gen, generation_pass=True),
        variant="generate",
        note="Reference pass, then the generation pass (flex BlockMask, eager flex here). " + _WAN_ANIMATE2_NOTE,
        # the generation pass builds its BlockMask with create_block_mask(_compile=True): torch.compile on the CPU
        extra={"slow": "create_block_mask(_compile=True) compiles with torch.compile: ~20 s on a CPU"},
    ),
    _ReferenceThenGenerateCase(
        "WanAnimate2Transformer3DModel",
        _WAN_ANIMATE2,
        lambda model, gen: _wan_animate2_inputs(model, gen, generation_pass=True),
        variant="generate-eager-mask",
        note="Reference pass, then the generation pass, its BlockMask (the model's own mask_mod) built without "
        "torch.compile, so that the flex call runs in the default suite. " + _WAN_ANIMATE2_NOTE,
        extra={"eager_mask": True},
    ),
)
