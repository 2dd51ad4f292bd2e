"""Zoo cases: audio models: ACE-Step (DiT, condition encoder, audio tokenizer and detokenizer), AudioLDM2's UNet, LongCat audio DiT, MiniMax Music 3, Stable Audio Open (and 3), T5FilmDecoder.

See tests/zoo/cases/__init__.py for what a case keeps of its model.
"""

from __future__ import annotations

import math

import torch

from tests.zoo._zoo_common import ZooCase
from tests.zoo.cases._helpers import _Case, _keep, _like, _pd, _r, _rn, _steps, _t

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


# --- AceStepTransformer1DModel ------------------------------------------------------------


def _ace_step_inputs(model, gen):
    b, t = 2, 16
    return {
        "hidden_states": _rn(model, gen, b, t, 8),
        "timestep": torch.rand(b, generator=gen).to(**_like(model)),
        "timestep_r": torch.rand(b, generator=gen).to(**_like(model)),
        "encoder_hidden_states": _rn(model, gen, b, 5, 32),
        "context_latents": _rn(model, gen, b, t, 8),
    }


CASES.append(
    ZooCase(
        name="AceStepTransformer1DModel",
        config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            in_channels=16,
            audio_acoustic_hidden_dim=8,
            patch_size=2,
            sliding_window=2,
        ),
        inputs=_ace_step_inputs,
        note=(
            "AceStepAttention (AttentionModuleMixin) + AceStepAttnProcessor2_0 -> dispatch_attention_fn: "
            "GQA (enable_gqa, 4 q / 2 kv heads), RMS qk-norm, rotary (cos, sin) built inside; "
            "self-attention layers alternate a sliding-window additive 4-D mask (finfo.min) and none; "
            "cross-attention to the text without mask."
        ),
        extra={"shape_like": "hidden_states"},
    )
)


# --- ACE-Step's pipeline models: condition encoder, audio tokenizer and detokenizer ---------
# Each runs a stack of AceStepEncoderLayer: AceStepAttention (the DiT's module) self-attention,
# layers alternating a sliding-window band mask and full attention, with rotary built inside.

_ACE_STEP_ENCODER = dict(
    hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=2
)
_ACE_STEP_ENCODER_NOTE = (
    "AceStepAttention (AttentionModuleMixin) + AceStepAttnProcessor2_0 -> dispatch_attention_fn: GQA (4 q / 2 kv "
    "heads), RMS qk-norm, rotary (cos, sin) built inside; AceStepEncoderLayer stacks whose self-attention layers "
    "alternate a sliding-window additive 4-D mask (finfo.min) and "
)


def _ace_step_condition_inputs(model, gen):
    device, _ = _pd(model)
    cfg = model.config
    return {
        "text_hidden_states": _r(gen, model, 2, 5, cfg.text_hidden_dim),
        "text_attention_mask": _keep([5, 3], 5, device, dtype=torch.long),
        # lengths 7 and 5 of 7: with the window of 2 every padded query still has a valid key
        "lyric_hidden_states": _r(gen, model, 2, 7, cfg.text_hidden_dim),
        "lyric_attention_mask": _keep([7, 5], 7, device, dtype=torch.long),
        # three reference clips, packed: one for batch item 0, two for item 1
        "refer_audio_acoustic_hidden_states_packed": _r(gen, model, 3, 6, cfg.timbre_hidden_dim),
        "refer_audio_order_mask": torch.tensor([0, 1, 1], device=device),
    }


_add(
    ZooCase(
        "AceStepConditionEncoder",
        dict(
            _ACE_STEP_ENCODER,
            text_hidden_dim=24,
            timbre_hidden_dim=8,
            num_lyric_encoder_hidden_layers=2,
            num_timbre_encoder_hidden_layers=2,
        ),
        _ace_step_condition_inputs,
        note=(
            _ACE_STEP_ENCODER_NOTE + "none in the timbre encoder, the lyric padding mask (B, L) folded into both "
            "(additive (B, 1, L, L)) in the lyric encoder. The masks are required inputs (the text mask only packs). "
            "Output: the packed [lyrics, timbre, text] hidden states (the packed mask is not compared)."
        ),
        extra={"out_shape": (2, 7 + 2 + 5, 32)},
    ),
    ZooCase(
        "AceStepAudioTokenizer",
        dict(
            _ACE_STEP_ENCODER,
            audio_acoustic_hidden_dim=8,
            pool_window_size=5,
            fsq_dim=32,
            num_attention_pooler_hidden_layers=2,
        ),
        # (B, patches, pool window, acoustic dim), as tokenize() reshapes the 25 Hz latents
        lambda model, gen: {"hidden_states": _r(gen, model, 2, 3, 5, 8)},
        note=(
            _ACE_STEP_ENCODER_NOTE + "none, in the attention pooler over [CLS, 5 frames] of each patch (the CLS "
            "output pooled); then a residual FSQ quantizer (in float32, floor: a stock draw whose attention output "
            "is perturbed moves many codes). Output: the quantized embeddings (the code indices are not compared)."
        ),
        extra={"out_shape": (2, 3, 32)},
    ),
    _Case(
        name="AceStepAudioTokenDetokenizer",
        # The learned per-position tokens are all that tells the pool window's copies of a token
        # apart: at the init scale (~0.05 against ~0.6 for the embedded token) attention over the
        # window averages near-identical values, and its weights barely matter (dropping the
        # sliding-window mask moved the output by ~1e-2). x10 brings them to the token's scale
        # (~1e-1).
        gains=((r"^special_tokens$", 10.0),),
        config=dict(
            _ACE_STEP_ENCODER, audio_acoustic_hidden_dim=8, pool_window_size=5, num_attention_pooler_hidden_layers=2
        ),
        inputs=lambda model, gen: {"hidden_states": _r(gen, model, 2, 3, 32)},
        note=(
            _ACE_STEP_ENCODER_NOTE + "none, over the 5 copies of each 5 Hz token (plus learned per-position "
            "tokens) that become its 25 Hz frames."
        ),
        extra={"out_shape": (2, 15, 8)},
    ),
)


# --- AudioLDM2's UNet -----------------------------------------------------------------------

# As AudioLDM2's checkpoints: every cross-attention block holds three Transformer2DModels,
# cross_attention_dim [None, GPT-2's width, T5's width]: self-attention only (None: its attn2
# is a second self-attention), cross-attention to the language model's generated embeddings
# (encoder_hidden_states), and cross-attention to the T5 embeddings (encoder_hidden_states_1).
_AUDIOLDM2_UNET = dict(
    sample_size=8,
    in_channels=4,
    out_channels=4,
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    block_out_channels=(16, 32),
    layers_per_block=1,
    attention_head_dim=2,  # SD's naming: the number of heads
    norm_num_groups=8,
    cross_attention_dim=[[None, 24, 20], [None, 24, 20]],
)


def _audioldm2_unet_inputs(lengths=None, lengths_1=None, batch=2, text_len=5, text_len_1=6):
    def inputs(model, gen):
        device, _ = _pd(model)
        kw = dict(
            sample=_r(gen, model, batch, 4, 8, 8),
            timestep=_steps(gen, model, batch),
            encoder_hidden_states=_r(gen, model, batch, text_len, 24),
            encoder_hidden_states_1=_r(gen, model, batch, text_len_1, 20),
        )
        if lengths is not None:
            kw["encoder_attention_mask"] = _keep(lengths, text_len, device, dtype=torch.long)
            kw["encoder_attention_mask_1"] = _keep(lengths_1, text_len_1, device, dtype=torch.long)
        return kw

    return inputs


_AUDIOLDM2_UNET_NOTE = (
    "diffusers Attention + AttnProcessor2_0 (F.scaled_dot_product_attention) in three Transformer2DModel blocks per "
    "layer of the cross-attention down/mid/up blocks: one of two self-attentions, one self-attention + "
    "cross-attention to encoder_hidden_states (the GPT-2 embeddings), one self-attention + cross-attention to "
    "encoder_hidden_states_1 (the T5 embeddings)."
)
_add(
    ZooCase(
        "AudioLDM2UNet2DConditionModel",
        _AUDIOLDM2_UNET,
        _audioldm2_unet_inputs(),
        note=_AUDIOLDM2_UNET_NOTE + " No mask.",
    ),
    ZooCase(
        "AudioLDM2UNet2DConditionModel",
        _AUDIOLDM2_UNET,
        _audioldm2_unet_inputs([5, 2], [6, 3]),
        variant="masked",
        note=_AUDIOLDM2_UNET_NOTE
        + " Both text masks (the pipeline passes the T5 one) made additive (-10000), (B, 1, L), each for its own "
        "cross-attention.",
        extra={"mask_keys": ("encoder_attention_mask", "encoder_attention_mask_1")},
    ),
)


# --- LongCat audio DiT --------------------------------------------------------------------

_LONGCAT_AUDIO = dict(dit_dim=32, dit_depth=2, dit_heads=2, dit_text_dim=24, latent_dim=8, ff_mult=2.0)


def _longcat_audio_inputs(text_lengths, audio_lengths=None, text_len=6, audio_len=10):
    def inputs(model, gen):
        device, _ = _pd(model)
        batch = len(text_lengths)
        kw = dict(
            hidden_states=_r(gen, model, batch, audio_len, model.config.latent_dim),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.dit_text_dim),
            encoder_attention_mask=_keep(text_lengths, text_len, device),
            timestep=_t(gen, model, batch),
            latent_cond=_r(gen, model, batch, audio_len, model.config.latent_dim),
        )
        if audio_lengths is not None:
            kw["attention_mask"] = _keep(audio_lengths, audio_len, device)
        return kw

    return inputs


_LONGCAT_AUDIO_NOTE = (
    "AudioDiTAttention (AttentionModuleMixin, no _default_processor_cls) + AudioDiTSelfAttnProcessor / "
    "AudioDiTCrossAttnProcessor -> dispatch_attention_fn: audio self-attention with 1-D RoPE, cross-attention "
    "with RoPE on q (audio positions) and on k (text positions); qk RMSNorm over the inner dim. No "
    "set_attn_processor on the model."
)
_add(
    ZooCase(
        "LongCatAudioDiTTransformer",
        _LONGCAT_AUDIO,
        _longcat_audio_inputs([6]),
        note=_LONGCAT_AUDIO_NOTE + " Text mask (required) all ones, no audio mask.",
    ),
    ZooCase(
        "LongCatAudioDiTTransformer",
        _LONGCAT_AUDIO,
        _longcat_audio_inputs([6, 3], [10, 7]),
        variant="masked",
        note=_LONGCAT_AUDIO_NOTE
        + " 2-D bool masks (B, L): text keys in cross-attention, audio keys in self-attention; outputs of "
        "padded audio tokens are zeroed after attention.",
    ),
)


# --- MiniMax Music 3 ----------------------------------------------------------------------

_add(
    ZooCase(
        "MiniMaxMusic3RVQDepthDecoder",
        dict(
            hidden_size=32,
            num_layers=2,
            num_attention_heads=2,
            intermediate_size=48,
            audio_vocab_size=16,
            num_codebooks=4,
            max_position_embeddings=8,
        ),
        lambda model, gen: dict(inputs_embeds=_r(gen, model, 2, 7, model.config.hidden_size)),
        note=(
            "MiniMaxMusic3DepthAttention + MiniMaxMusic3DepthAttnProcessor -> dispatch_attention_fn with "
            "is_causal=True (no mask, no RoPE: learned positions): a small causal language model over the "
            "codebook steps."
        ),
    ),
    ZooCase(
        "MiniMaxMusic3Transformer1DModel",
        dict(
            in_channels=8,
            condition_dim=12,
            num_layers=2,
            num_attention_heads=2,
            attention_head_dim=16,
            ff_inner_dim=48,
            rotary_dim=8,
            fourier_embedding_dim=16,
        ),
        lambda model, gen: dict(
            hidden_states=_r(gen, model, 2, 8, 10),
            timestep=_t(gen, model, 2),
            encoder_hidden_states=_r(gen, model, 2, 10, 12),
        ),
        note=(
            "MiniMaxMusic3Attention + MiniMaxMusic3AttnProcessor -> dispatch_attention_fn, no mask: self-attention "
            "over [time token, latent frames] with partial rotate-half RoPE (cos, sin on the first rotary_dim head "
            "dims). No set_attn_processor on the model."
        ),
    ),
)


# --- Stable Audio Open DiT ----------------------------------------------------------------

_STABLE_AUDIO = dict(
    sample_size=8,
    in_channels=4,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    num_key_value_attention_heads=1,
    out_channels=4,
    cross_attention_dim=24,
    time_proj_dim=16,
    global_states_input_dim=12,
    cross_attention_input_dim=20,
)


def _half_split_rotary(gen, tokens, dim, dtype, device):
    """(cos, sin) of random angles, each (tokens, dim), in the rotate-half layout (the angles of the
    first half repeated in the second), as get_1d_rotary_pos_embed(repeat_interleave_real=False) builds."""
    angles = torch.rand(tokens, dim // 2, generator=gen) * (2 * math.pi)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(device, dtype), angles.sin().to(device, dtype)


def _stable_audio_inputs(lengths=None, text_lengths=None, batch=2, length=10, text_len=6):
    def inputs(model, gen):
        device, dtype = _pd(model)
        cfg = model.config
        kw = dict(
            hidden_states=_r(gen, model, batch, cfg.in_channels, length),
            timestep=_steps(gen, model, 1),
            encoder_hidden_states=_r(gen, model, batch, text_len, cfg.cross_attention_input_dim),
            global_hidden_states=_r(gen, model, batch, 1, cfg.global_states_input_dim),
            # partial RoPE over half the head dim, for [global token, latents], random angles
            rotary_embedding=_half_split_rotary(gen, length + 1, cfg.attention_head_dim // 2, dtype, device),
        )
        if lengths is not None:
            kw["attention_mask"] = _keep(lengths, length, device)
            kw["encoder_attention_mask"] = _keep(text_lengths, text_len, device)
        return kw

    return inputs


_STABLE_AUDIO_NOTE = (
    "diffusers Attention + StableAudioAttnProcessor2_0 (not dispatch: F.scaled_dot_product_attention): self-attention "
    "with partial RoPE (rotary_embedding input, (cos, sin) over half the head dim, rotate-half layout) and GQA by "
    "repeating k/v heads; cross-attention to text (RoPE on q only)."
)
_add(
    ZooCase(
        "StableAudioDiTModel",
        _STABLE_AUDIO,
        _stable_audio_inputs(),
        note=_STABLE_AUDIO_NOTE + " No mask (the pipeline zeroes padded text embeddings instead).",
    ),
    ZooCase(
        "StableAudioDiTModel",
        _STABLE_AUDIO,
        _stable_audio_inputs([10, 7], [6, 3]),
        variant="masked",
        note=_STABLE_AUDIO_NOTE
        + " Bool key masks given: self (B, N) with the global token prepended, cross (B, L); prepare_attention_mask "
        "expands them to (B, heads, 1, L) bool.",
    ),
)


_STABLE_AUDIO3 = dict(
    io_channels=8,
    patch_size=1,
    embed_dim=32,
    depth=2,
    num_heads=2,
    cond_token_dim=16,
    global_cond_dim=12,
    local_add_cond_dim=5,
    timestep_features_dim=16,
    ff_mult=2,
    num_memory_tokens=3,
    use_differential_attention=True,  # as the released SA3 Medium
)


def _stable_audio3_inputs(text_lengths=None, batch=2, length=12, text_len=5):
    def inputs(model, gen):
        device, _ = _pd(model)
        cfg = model.config
        kw = dict(
            hidden_states=_r(gen, model, batch, cfg.io_channels, length),
            timestep=_t(gen, model, batch),
            encoder_hidden_states=_r(gen, model, batch, text_len, cfg.cond_token_dim),
            global_hidden_states=_r(gen, model, batch, cfg.global_cond_dim),
        )
        if text_lengths is not None:
            kw["encoder_attention_mask"] = _keep(text_lengths, text_len, device)
        return kw

    return inputs


_STABLE_AUDIO3_NOTE = (
    "StableAudio3SelfAttention + StableAudio3SelfAttnProcessor and StableAudio3CrossAttention + "
    "StableAudio3CrossAttnProcessor -> dispatch_attention_fn. Differential attention: each module returns "
    "attn(q1, k1, v) - attn(q2, k2, v), two dispatch calls sharing v; self-attention over [memory tokens, latents] "
    "with partial rotate-half RoPE, qk RMSNorm; cross-attention to text, no RoPE."
)
_add(
    ZooCase("StableAudio3DiTModel", _STABLE_AUDIO3, _stable_audio3_inputs(), note=_STABLE_AUDIO3_NOTE + " No mask."),
    ZooCase(
        "StableAudio3DiTModel",
        _STABLE_AUDIO3,
        _stable_audio3_inputs([5, 2]),
        variant="masked",
        note=_STABLE_AUDIO3_NOTE
        + " With a text mask the model swaps padded text for a learned padding embedding and drops the mask: "
        "the attention calls still get none (the cross processor accepts a context_mask the model never passes).",
    ),
    ZooCase(
        "StableAudio3DiTModel",
        dict(_STABLE_AUDIO3, use_differential_attention=False),
        _stable_audio3_inputs(),
        variant="plain",
        note=(
            "StableAudio3SelfAttention + StableAudio3SelfAttnProcessor and StableAudio3CrossAttention + "
            "StableAudio3CrossAttnProcessor -> dispatch_attention_fn, configured without differential attention "
            "(one call per module): self-attention over [memory tokens, latents] with partial rotate-half RoPE, qk "
            "RMSNorm; cross-attention to text, no RoPE. No mask."
        ),
    ),
)


# --- T5FilmDecoder (spectrogram diffusion) ------------------------------------------------

_T5FILM = dict(
    input_dims=8,
    targets_length=12,
    d_model=32,
    num_layers=2,
    num_heads=2,
    d_kv=16,
    d_ff=48,
    dropout_rate=0.1,  # as released; inactive in eval mode
)


def _t5film_inputs(note_lengths, ctx_len=7, batch=2):
    """Two encodings (notes, continuous context) with their masks, as the spectrogram-diffusion pipeline
    builds them."""

    def inputs(model, gen):
        device, _ = _pd(model)
        cfg = model.config
        return dict(
            encodings_and_masks=[
                (_r(gen, model, batch, 6, cfg.d_model), _keep(note_lengths, 6, device)),
                (_r(gen, model, batch, ctx_len, cfg.d_model), _keep([ctx_len] * batch, ctx_len, device)),
            ],
            decoder_input_tokens=_r(gen, model, batch, cfg.targets_length, cfg.input_dims),
            decoder_noise_time=_t(gen, model, batch),
        )

    return inputs


_T5FILM_NOTE = (
    "diffusers Attention with scale_qk=False, hence the classic AttnProcessor (not dispatch: baddbmm + softmax, "
    "scale 1.0 instead of 1/sqrt(d)): decoder self-attention (no mask) and cross-attention to the concatenated "
    "encodings with an additive (B, N, L) float mask (0 / -1e10) made from the encodings' masks."
)
_add(
    ZooCase("T5FilmDecoder", _T5FILM, _t5film_inputs([6, 6]), note=_T5FILM_NOTE),
    ZooCase("T5FilmDecoder", _T5FILM, _t5film_inputs([6, 2]), variant="masked", note=_T5FILM_NOTE),
)


NO_ATTENTION.update(
    {
        "AudioLDM2ProjectionModel": (
            "two linear projections of the text encoders' embeddings, learned start/end tokens and the masks "
            "concatenated: no attention"
        ),
        "MMAudioVocoder": "BigVGAN-style vocoder (transposed convolutions, AMP blocks, anti-aliased Snake): no attention",
        "MiniMaxMusic3ConditionEncoder": (
            "a softmax over learned layer-mixing weights, a 1-D convolution and resampling: no attention between tokens"
        ),
        "MiniMaxMusic3Vocoder": "1-D convolutional vocoder (transposed convolutions, Snake residual units): no attention",
        "StableAudio3DurationEmbedder": (
            "fixed exponential Fourier features of the duration and one linear projection: no attention"
        ),
        "StableAudioProjectionModel": (
            "a linear projection of the T5 embeddings and two number conditioners (Fourier features + linear) for "
            "the start and end seconds: no attention"
        ),
    }
)
