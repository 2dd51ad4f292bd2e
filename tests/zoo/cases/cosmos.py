"""Zoo cases: Cosmos3 Omni, Cosmos (Predict) and its ControlNet.

See tests/zoo/cases/__init__.py for what a case keeps of its model.
"""

from __future__ import annotations

import torch

from tests.zoo._zoo_common import ZooCase, model_param
from tests.zoo.cases._helpers import _like, _rn, _text_keep, _timestep

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


# --- Cosmos3 Omni, Cosmos (Predict) and its ControlNet ------------------------------------


def _cosmos3_inputs(model, gen):
    # A packed sequence: 6 causal text ("understanding") tokens, then 2 x 2 x 2 vision tokens
    # (the generation stream); mRoPE positions (t, h, w) random.
    und, t, h, w = 6, 2, 2, 2
    n_vis = t * h * w
    seq = und + n_vis
    vis = torch.arange(und, seq)
    dev = model_param(model).device
    return {
        "input_ids": torch.randint(0, 32, (und,), generator=gen).to(dev),
        "text_indexes": torch.arange(und).to(dev),
        "position_ids": torch.randint(0, 64, (3, seq), generator=gen).to(dev),
        "und_len": und,
        "sequence_length": seq,
        "vision_tokens": [_rn(model, gen, 1, 4, t, h, w)],
        "vision_token_shapes": [(t, h, w)],
        "vision_sequence_indexes": vis.to(dev),
        "vision_mse_loss_indexes": vis.to(dev),
        "vision_timesteps": torch.rand(n_vis, generator=gen).to(**_like(model)),
        "vision_noisy_frame_indexes": [torch.arange(t).to(dev)],
    }


CASES.append(
    ZooCase(
        name="Cosmos3OmniTransformer",
        config=dict(
            head_dim=16,
            hidden_size=32,
            intermediate_size=64,
            latent_channel=4,
            latent_patch_size=1,
            num_attention_heads=2,
            num_hidden_layers=2,
            num_key_value_heads=1,
            patch_latent_dim=4,
            rope_axes_dim=[2, 3, 3],
            rope_theta=10000.0,
            vocab_size=32,
        ),
        inputs=_cosmos3_inputs,
        outputs=lambda out: tuple(out.sample),
        note=(
            "Cosmos3PackedMoTAttention (AttentionModuleMixin) + Cosmos3AttnProcessor: two dispatch_attention_fn "
            "calls on an unbatched packed sequence (batch 1): text queries over text keys with is_causal=True, and "
            "vision queries over [text, vision] keys (non-causal); GQA (enable_gqa=True, 2 q / 1 kv heads), RMS "
            "qk-norm, interleaved 3-axis mRoPE (rotate-half) from position_ids, no mask"
        ),
        extra={"out_shape": (1, 4, 2, 2, 2)},
    )
)

_COSMOS = dict(
    in_channels=4,
    out_channels=4,
    num_attention_heads=2,
    attention_head_dim=12,
    num_layers=1,
    mlp_ratio=2.0,
    text_embed_dim=16,
    adaln_lora_dim=8,
    max_size=(4, 16, 16),
    patch_size=(1, 2, 2),
    # The real configs concatenate a padding mask resized with torchvision, which `make setup`
    # does not install; the attention is the same without it.
    concat_padding_mask=False,
    extra_pos_embed_type="learnable",
)
_COSMOS_NOTE = (
    "Attention + CosmosAttnProcessor2_0 -> dispatch_attention_fn *without* backend= (only the process-wide "
    "backend applies: set_attention_backend does nothing): self-attention with RMS qk-norm and rotate-half "
    "rotary (cos, sin) built inside, K/V repeat_interleave'd for GQA before the call; cross-attention to the text"
)


def _cosmos_inputs(masked=False, img_context=False, lengths=(7, 3)):
    def make(model, gen):
        b = 2 if masked else 1
        text = _rn(model, gen, b, 7, 16)
        out = {
            "hidden_states": _rn(model, gen, b, 4, 2, 8, 8),
            "timestep": _timestep(model, gen, b),
            "encoder_hidden_states": (text, _rn(model, gen, b, 4, 8)) if img_context else text,
            "fps": 24,
        }
        if masked:
            out["attention_mask"] = _text_keep(lengths, 7).to(model_param(model).device)
        return out

    return make


CASES.append(ZooCase(name="CosmosTransformer3DModel", config=_COSMOS, inputs=_cosmos_inputs(), note=_COSMOS_NOTE))
CASES.append(
    ZooCase(
        name="CosmosTransformer3DModel",
        variant="masked",
        config=_COSMOS,
        inputs=_cosmos_inputs(masked=True),
        note=_COSMOS_NOTE + "; attention_mask (B, T) bool -> (B, 1, 1, T) for the cross-attention; batch 2 with 7 "
        "and 3 valid text tokens",
        extra={"mask_keys": ("attention_mask",)},
    )
)
CASES.append(
    ZooCase(
        name="CosmosTransformer3DModel",
        variant="fullpad",
        config=_COSMOS,
        inputs=_cosmos_inputs(masked=True, lengths=(7, 0)),
        note=_COSMOS_NOTE + "; batch 2, the second with no valid text token: its cross-attention rows are fully "
        "masked (zeros from SDPA)",
    )
)
CASES.append(
    ZooCase(
        name="CosmosTransformer3DModel",
        variant="imgctx",
        config=dict(
            _COSMOS, extra_pos_embed_type=None, img_context_dim_in=8, img_context_num_tokens=4, img_context_dim_out=24
        ),
        inputs=_cosmos_inputs(img_context=True),
        note=_COSMOS_NOTE + "; Cosmos 2.5: cross-attention is CosmosAttention + CosmosAttnProcessor2_5 with "
        "encoder_hidden_states = (text, image context): two dispatch calls (text; image tokens through "
        "q_img/k_img/v_img with their own RMS norms) summed (a tensor attention_mask crashes this path: "
        "`if attention_mask` on a tensor)",
    )
)


def _cosmos_controlnet_inputs(model, gen):
    return {
        "controls_latents": _rn(model, gen, 1, 4, 2, 8, 8),
        "latents": _rn(model, gen, 1, 4, 2, 8, 8),
        "timestep": _timestep(model, gen, 1),
        "encoder_hidden_states": (_rn(model, gen, 1, 7, 16), _rn(model, gen, 1, 4, 8)),
        "condition_mask": (torch.rand(1, 1, 2, 8, 8, generator=gen) > 0.5).to(**_like(model)),
        "padding_mask": torch.zeros(1, 1, 8, 8).to(**_like(model)),
        "conditioning_scale": 0.8,
        "fps": 24,
    }


CASES.append(
    ZooCase(
        name="CosmosControlNetModel",
        # controls: 4 channels + condition mask + padding mask; base latents the same
        config=dict(
            n_controlnet_blocks=2,
            in_channels=6,
            latent_channels=6,
            model_channels=24,
            num_attention_heads=2,
            attention_head_dim=12,
            mlp_ratio=2.0,
            text_embed_dim=16,
            adaln_lora_dim=8,
            patch_size=(1, 2, 2),
            max_size=(4, 16, 16),
            img_context_dim_in=8,
            img_context_dim_out=24,
        ),
        inputs=_cosmos_controlnet_inputs,
        outputs=lambda out: tuple(out.control_block_samples),
        note=(
            "CosmosTransformerBlocks (Transfer 2.5): self-attention Attention + CosmosAttnProcessor2_0, "
            "cross-attention CosmosAttention + CosmosAttnProcessor2_5 over (text, image context); dispatch without "
            "backend=; the forward resizes padding_mask with torchvision (required)"
        ),
        extra={"out_shape": (1, 32, 24), "requires": ("torchvision",)},
    )
)
