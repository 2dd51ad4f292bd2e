"""Zoo cases: UNets: UNet1D/2D/3D, SD / SDXL / unCLIP UNet2DCondition, SVD, I2VGen-XL, AnimateDiff, Stable Cascade, ControlNets (SD, Union, XS, SparseCtrl, Multi).

See tests/zoo/cases/__init__.py for what a case keeps of its model.
"""

from __future__ import annotations

import torch

from tests.zoo._zoo_common import ZooCase, random_init_
from tests.zoo.cases._helpers import (
    _Case,
    _Fresh,
    _HostedCase,
    _keep,
    _like,
    _pd,
    _r,
    _rn,
    _steps,
    _t,
    _timestep,
    _WrapperCase,
)

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


# --- UNet ControlNets ---------------------------------------------------------------------

_SD_CONTROLNET = dict(
    in_channels=4,
    conditioning_channels=3,
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    block_out_channels=(32, 64),
    layers_per_block=1,
    norm_num_groups=8,
    cross_attention_dim=16,
    attention_head_dim=2,
    conditioning_embedding_out_channels=(8, 16),
)
_UNET_ATTENTION_NOTE = (
    "Attention (BasicTransformerBlock of Transformer2DModel in the cross-attention down/mid blocks: attn1 "
    "self-attention over H*W, attn2 cross-attention to the text) + AttnProcessor2_0 -> "
    "F.scaled_dot_product_attention"
)


def _controlnet_outputs(out):
    samples, mid = (
        (out.down_block_res_samples, out.mid_block_res_sample) if hasattr(out, "down_block_res_samples") else out
    )
    return (*samples, mid)


CASES.append(
    ZooCase(
        name="ControlNetModel",
        config=_SD_CONTROLNET,
        inputs=lambda model, gen: {
            "sample": _rn(model, gen, 1, 4, 8, 8),
            "timestep": _timestep(model, gen, 1),
            "encoder_hidden_states": _rn(model, gen, 1, 7, 16),
            "controlnet_cond": _rn(model, gen, 1, 3, 16, 16),
            "conditioning_scale": 0.8,
        },
        outputs=_controlnet_outputs,
        note=_UNET_ATTENTION_NOTE + "; no encoder mask in the forward; outputs: every down and mid residual",
        extra={"out_shape": (1, 32, 8, 8)},
    )
)


def _controlnet_union_inputs(model, gen):
    b = 2  # see the note: the task transformer attends across the batch
    return {
        "sample": _rn(model, gen, b, 4, 8, 8),
        "timestep": _timestep(model, gen, b),
        "encoder_hidden_states": _rn(model, gen, b, 7, 16),
        "controlnet_cond": [_rn(model, gen, b, 3, 16, 16), _rn(model, gen, b, 3, 16, 16)],
        "control_type": torch.tensor([[1, 0, 1]] * b).to(**_like(model)),
        "control_type_idx": [0, 2],
        "conditioning_scale": [0.8, 0.6],
        "added_cond_kwargs": {"text_embeds": _rn(model, gen, b, 8), "time_ids": _rn(model, gen, b, 6)},
    }


CASES.append(
    ZooCase(
        name="ControlNetUnionModel",
        config=dict(
            _SD_CONTROLNET,
            addition_embed_type="text_time",
            addition_time_embed_dim=8,
            projection_class_embeddings_input_dim=8 + 6 * 8,
            num_control_type=3,
            num_trans_channel=32,
            num_trans_head=2,
            num_trans_layer=1,
            num_proj_channel=32,
        ),
        inputs=_controlnet_union_inputs,
        outputs=_controlnet_outputs,
        note=(
            _UNET_ATTENTION_NOTE + "; plus the task transformer: ResidualAttentionBlock with torch "
            "nn.MultiheadAttention (not a diffusers module, no processor) fed (B, conditions+1, C) although it is "
            "sequence-first: it attends across the batch (trivial with batch 1; batch 2 here, as with CFG)"
        ),
        extra={"out_shape": (2, 32, 8, 8)},
    )
)


def _controlnet_xs_make(config):
    # A ControlNetXSAdapter has no forward of its own (it raises): its attention runs inside the
    # UNetControlNetXSModel that joins it to a UNet, as every ControlNet-XS pipeline builds it.
    import diffusers

    unet = diffusers.UNet2DConditionModel(**config)
    adapter = diffusers.ControlNetXSAdapter.from_unet(unet, size_ratio=0.5, conditioning_embedding_out_channels=(8, 8))
    return diffusers.UNetControlNetXSModel.from_unet(unet, adapter)


CASES.append(
    _Case(
        name="ControlNetXSAdapter",
        # ControlNet-XS' zero-initialised control-to-base connections x4: at the default scale
        # the control branch (and its attention) barely reaches the base UNet.
        gains=((r"ctrl_to_base\.weight", 4.0),),
        config=dict(
            # ControlNet-XS blocks assume two layers per block (as SD), so layers_per_block=2.
            block_out_channels=(32, 64),
            layers_per_block=2,
            sample_size=8,
            in_channels=4,
            out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            cross_attention_dim=16,
            attention_head_dim=2,
            norm_num_groups=8,
            use_linear_projection=True,
        ),
        make=_controlnet_xs_make,
        inputs=lambda model, gen: {
            "sample": _rn(model, gen, 1, 4, 8, 8),
            "timestep": _timestep(model, gen, 1),
            "encoder_hidden_states": _rn(model, gen, 1, 7, 16),
            "controlnet_cond": _rn(model, gen, 1, 3, 16, 16),
            "conditioning_scale": 0.8,
        },
        note=(
            "built as UNetControlNetXSModel.from_unet(unet, adapter) (the adapter alone cannot run): "
            + _UNET_ATTENTION_NOTE
            + " in the base UNet and the adapter's (narrower) control blocks"
        ),
        extra={"shape_like": "sample"},
    )
)


# --- I2VGenXLUNet -------------------------------------------------------------------------

CASES.append(
    ZooCase(
        name="I2VGenXLUNet",
        # attention_head_dim is the head count of the spatial blocks and the head dim of
        # transformer_in (as in the real config, where it gives 64 heads of 5 at 320 channels).
        config=dict(
            sample_size=8,
            in_channels=4,
            out_channels=4,
            down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
            up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"),
            block_out_channels=(32, 64),
            layers_per_block=1,
            norm_num_groups=8,
            cross_attention_dim=16,
            attention_head_dim=8,
        ),
        inputs=lambda model, gen: {
            "sample": _rn(model, gen, 1, 4, 3, 8, 8),
            "timestep": _timestep(model, gen, 1),
            "fps": torch.tensor([8.0]).to(**_like(model)),
            "image_latents": _rn(model, gen, 1, 4, 3, 8, 8),
            "image_embeddings": _rn(model, gen, 1, 16),
            "encoder_hidden_states": _rn(model, gen, 1, 7, 16),
        },
        note=(
            "Attention + AttnProcessor2_0 -> F.scaled_dot_product_attention everywhere, no mask: spatial "
            "self/cross-attention (Transformer2DModel; context = text + image-latent tokens + image embedding), "
            "temporal self-attention over frames (TransformerTemporalModel, transformer_in), and the image-latent "
            "temporal encoder (I2VGenXLTransformerTemporalEncoder, 2 heads of dim in_channels = 4)"
        ),
        extra={"shape_like": "sample"},
    )
)


# --- AnimateDiff: UNetMotionModel and the MotionAdapter it loads --------------------------

_UNET_MOTION = dict(
    block_out_channels=(16, 32),
    norm_num_groups=8,
    down_block_types=("CrossAttnDownBlockMotion", "DownBlockMotion"),
    up_block_types=("UpBlockMotion", "CrossAttnUpBlockMotion"),
    cross_attention_dim=24,
    num_attention_heads=2,
    out_channels=4,
    in_channels=4,
    layers_per_block=1,
    sample_size=8,
    motion_num_attention_heads=2,
    motion_max_seq_length=8,
)


def _unet_motion_inputs(model, gen, batch=2, frames=3):
    # the AnimateDiff pipeline repeats the prompt per frame: (batch * frames, L, D)
    return dict(
        sample=_r(gen, model, batch, 4, frames, 8, 8),
        timestep=_steps(gen, model, 1)[0],
        encoder_hidden_states=_r(gen, model, batch * frames, 5, 24),
    )


_MOTION_NOTE = (
    "diffusers Attention + AttnProcessor2_0: spatial self- and text cross-attention per frame "
    "(Transformer2DModel), temporal self-attention per pixel in the motion modules "
    "(AnimateDiffTransformer3D / TransformerTemporalModel, sinusoidal positions); no mask."
)
_add(ZooCase("UNetMotionModel", _UNET_MOTION, _unet_motion_inputs, note=_MOTION_NOTE))

_MOTION_ADAPTER = dict(
    block_out_channels=(16, 32),
    motion_layers_per_block=1,
    motion_num_attention_heads=2,
    motion_norm_num_groups=8,
    motion_max_seq_length=8,
    use_motion_mid_block=True,
)


def _motion_adapter_inputs(model, gen):
    from diffusers import UNet2DConditionModel, UNetMotionModel

    device, dtype = _pd(model)
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    torch.manual_seed(seed)
    unet2d = UNet2DConditionModel(
        block_out_channels=(16, 32),
        norm_num_groups=8,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=24,
        attention_head_dim=2,
        layers_per_block=1,
        sample_size=8,
    )
    random_init_(unet2d, seed)
    host = UNetMotionModel.from_unet2d(unet2d, motion_adapter=model)
    # share, not copy, the adapter's motion modules (from_unet2d copies their weights)
    for host_block, block in zip(host.down_blocks, model.down_blocks):
        host_block.motion_modules = block.motion_modules
    for host_block, block in zip(host.up_blocks, model.up_blocks):
        host_block.motion_modules = block.motion_modules
    host.mid_block.motion_modules = model.mid_block.motion_modules
    host = host.to(device=device, dtype=dtype).eval()
    return dict(host=host, **_unet_motion_inputs(model, gen))


_add(
    _HostedCase(
        "MotionAdapter",
        _MOTION_ADAPTER,
        _motion_adapter_inputs,
        note=(
            "MotionAdapter's forward is a no-op: its motion modules (AnimateDiffTransformer3D, diffusers "
            "Attention + AttnProcessor2_0, temporal self-attention with sinusoidal positions) run inside a "
            "UNetMotionModel built from a tiny UNet2DConditionModel by the inputs (the `host` input), sharing "
            "the adapter's modules."
        ),
    )
)


# --- MultiControlNetModel (two tiny SD ControlNets) ---------------------------------------

_MULTI_SD_CONTROLNET = dict(
    block_out_channels=(16, 32),
    layers_per_block=1,
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    cross_attention_dim=24,
    attention_head_dim=2,
    norm_num_groups=8,
    conditioning_embedding_out_channels=(8, 16),
)


def _multi_controlnet_inputs(model, gen, batch=2, text_len=5):
    device, _ = _pd(model)
    return dict(
        sample=_r(gen, model, batch, 4, 8, 8),
        timestep=_steps(gen, model, 1)[0],
        encoder_hidden_states=_r(gen, model, batch, text_len, 24),
        controlnet_cond=[_r(gen, model, batch, 3, 16, 16) for _ in model.nets],
        conditioning_scale=[0.7, 1.2][: len(model.nets)],
        # as the pipelines call it (return_dict=True unpacks the nets' output dicts by key)
        return_dict=False,
    )


def _down_and_mid(out):
    down, mid = out[0], out[1]
    return (*down, mid)


_add(
    _WrapperCase(
        "MultiControlNetModel",
        dict(
            controlnets=[
                _Fresh("ControlNetModel", **_MULTI_SD_CONTROLNET),
                _Fresh("ControlNetModel", **_MULTI_SD_CONTROLNET),
            ]
        ),
        _multi_controlnet_inputs,
        outputs=_down_and_mid,
        note=(
            "Two ControlNetModel: diffusers Attention + AttnProcessor2_0 (self- and text cross-attention in "
            "Transformer2DModel blocks, mid-block attention); no mask. No set_attn_processor on the wrapper."
        ),
    )
)


# --- Stable Cascade (Würstchen v3) UNets: the prior (stage C) and the decoder (stage B) ---

_CASCADE_PRIOR = dict(
    in_channels=4,
    out_channels=4,
    timestep_ratio_embedding_dim=16,
    conditioning_dim=32,
    block_out_channels=(32, 32),
    num_attention_heads=(2, 2),
    down_num_layers_per_block=(1, 1),
    up_num_layers_per_block=(1, 1),
    clip_text_in_channels=24,
    clip_text_pooled_in_channels=24,
    clip_image_in_channels=12,
    clip_seq=2,
    dropout=(0.1, 0.1),  # as released; inactive in eval mode
    switch_level=[False],
)
_CASCADE_DECODER = dict(
    in_channels=4,
    out_channels=4,
    timestep_ratio_embedding_dim=16,
    conditioning_dim=32,
    block_out_channels=(16, 32),
    num_attention_heads=(0, 2),
    down_num_layers_per_block=(1, 1),
    up_num_layers_per_block=(1, 1),
    block_types_per_layer=(
        ("SDCascadeResBlock", "SDCascadeTimestepBlock"),
        ("SDCascadeResBlock", "SDCascadeTimestepBlock", "SDCascadeAttnBlock"),
    ),
    clip_text_pooled_in_channels=24,
    clip_seq=2,
    effnet_in_channels=6,
    pixel_mapper_in_channels=3,
    self_attn=True,
    dropout=(0, 0),
    switch_level=None,
)


def _cascade_inputs(decoder=False, batch=2, hw=8, text_len=5):
    def inputs(model, gen):
        cfg = model.config
        kw = dict(
            sample=_r(gen, model, batch, cfg.in_channels, hw, hw),
            timestep_ratio=_t(gen, model, batch),
            clip_text_pooled=_r(gen, model, batch, 1, cfg.clip_text_pooled_in_channels),
        )
        if decoder:
            kw["effnet"] = _r(gen, model, batch, cfg.effnet_in_channels, hw // 2, hw // 2)
            kw["pixels"] = _r(gen, model, batch, 3, 8, 8)
        else:
            kw["clip_text"] = _r(gen, model, batch, text_len, cfg.clip_text_in_channels)
            kw["clip_img"] = _r(gen, model, batch, 1, cfg.clip_image_in_channels)
        return kw

    return inputs


_CASCADE_NOTE = (
    "diffusers Attention + AttnProcessor2_0 in SDCascadeAttnBlock: attention of the image tokens over [image "
    "tokens, mapped conditioning tokens] (self_attn=True concatenates them as keys); no mask. No set_attn_processor "
    "on the model."
)
_add(
    ZooCase("StableCascadeUNet", _CASCADE_PRIOR, _cascade_inputs(), note="Prior (stage C). " + _CASCADE_NOTE),
    ZooCase(
        "StableCascadeUNet",
        _CASCADE_DECODER,
        _cascade_inputs(decoder=True),
        variant="decoder",
        note="Decoder (stage B): attention in the second level only, conditioned on the pooled text. " + _CASCADE_NOTE,
    ),
)


# --- SparseCtrl (AnimateDiff sparse ControlNet) -------------------------------------------

_SPARSECTRL = dict(
    in_channels=4,
    conditioning_channels=4,
    down_block_types=("CrossAttnDownBlockMotion", "DownBlockMotion"),
    block_out_channels=(16, 32),
    layers_per_block=1,
    norm_num_groups=8,
    cross_attention_dim=24,
    attention_head_dim=2,
    conditioning_embedding_out_channels=(8, 16),
    motion_max_seq_length=8,
    motion_num_attention_heads=2,
    concat_conditioning_mask=True,
    use_simplified_condition_embedding=True,
)


def _sparsectrl_inputs(model, gen, batch=2, frames=3, hw=8, text_len=5):
    device, dtype = _pd(model)
    # frames 0 and 2 carry a condition, frame 1 does not (the "sparse" in SparseCtrl)
    mask = torch.zeros(batch, 1, frames, hw, hw)
    mask[:, :, ::2] = 1
    cond = _r(gen, model, batch, model.config.conditioning_channels, frames, hw, hw) * mask.to(device, dtype)
    return dict(
        sample=_r(gen, model, batch, model.config.in_channels, frames, hw, hw),
        timestep=_steps(gen, model, 1)[0],
        # the AnimateDiff pipeline repeats the prompt per frame
        encoder_hidden_states=_r(gen, model, batch * frames, text_len, 24),
        controlnet_cond=cond,
        conditioning_mask=mask.to(device, dtype),
        conditioning_scale=0.9,
        return_dict=False,
    )


_add(
    ZooCase(
        "SparseControlNetModel",
        _SPARSECTRL,
        _sparsectrl_inputs,
        outputs=_down_and_mid,
        note=(
            "diffusers Attention + AttnProcessor2_0: spatial self- and text cross-attention per frame "
            "(Transformer2DModel) and temporal self-attention in the motion modules; no mask."
        ),
    )
)


# --- UNet1DModel (Dance Diffusion blocks) -------------------------------------------------

_UNET1D = dict(
    block_out_channels=(32, 32, 64),
    extra_in_channels=64,  # the Fourier time features concatenated to the input (2 x 32)
    sample_size=64,
    sample_rate=16_000,
    in_channels=2,
    out_channels=2,
    flip_sin_to_cos=True,
    use_timestep_embedding=False,
    time_embedding_type="fourier",
    mid_block_type="UNetMidBlock1D",
    down_block_types=("DownBlock1DNoSkip", "DownBlock1D", "AttnDownBlock1D"),
    up_block_types=("AttnUpBlock1D", "UpBlock1D", "UpBlock1DNoSkip"),
)
_add(
    ZooCase(
        "UNet1DModel",
        _UNET1D,
        lambda model, gen: dict(sample=_r(gen, model, 2, 2, 64), timestep=_t(gen, model, 2, 0.1, 0.9)),
        note=(
            "SelfAttention1d (neither a diffusers Attention nor an AttentionModuleMixin): hand-written "
            "matmul + softmax with q and k each scaled by d**-0.25, heads of 32 channels, no mask, in the "
            "attention down/up and mid blocks. The ResNet-only block types (the RL value function) have no "
            "attention. No set_attn_processor on the model."
        ),
        extra={"attention_classes": ("SelfAttention1d",)},
    )
)


# --- UNet2DModel, UNet2DConditionModel ----------------------------------------------------

_UNET2D = dict(
    sample_size=8,
    in_channels=3,
    out_channels=3,
    block_out_channels=(16, 32),
    layers_per_block=1,
    down_block_types=("DownBlock2D", "AttnDownBlock2D"),
    up_block_types=("AttnUpBlock2D", "UpBlock2D"),
    attention_head_dim=8,
    norm_num_groups=8,
)
_add(
    ZooCase(
        "UNet2DModel",
        _UNET2D,
        lambda model, gen: dict(sample=_r(gen, model, 2, 3, 8, 8), timestep=_steps(gen, model, 2)),
        note=(
            "diffusers Attention + AttnProcessor2_0 in the attention down/up and mid blocks: spatial self-attention "
            "with group norm and residual inside the module (4-D input), heads of 8; no mask. No set_attn_processor "
            "on the model."
        ),
    )
)

_UNET2D_COND = dict(
    sample_size=8,
    in_channels=4,
    out_channels=4,
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    block_out_channels=(16, 32),
    layers_per_block=1,
    attention_head_dim=2,  # SD's naming: the number of heads
    norm_num_groups=8,
    cross_attention_dim=24,
)
# SDXL: text_time added conditioning, linear projections, two transformer layers
_UNET2D_SDXL = dict(
    _UNET2D_COND,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
    transformer_layers_per_block=(1, 2),
    use_linear_projection=True,
    addition_embed_type="text_time",
    addition_time_embed_dim=8,
    projection_class_embeddings_input_dim=16 + 6 * 8,
)
# unCLIP / Kandinsky 2.x layout: the simple cross-attention mid block, added k/v projections of the text
_UNET2D_SIMPLE = dict(
    _UNET2D_COND,
    down_block_types=("ResnetDownsampleBlock2D", "SimpleCrossAttnDownBlock2D"),
    up_block_types=("SimpleCrossAttnUpBlock2D", "ResnetUpsampleBlock2D"),
    mid_block_type="UNetMidBlock2DSimpleCrossAttn",
    attention_head_dim=8,
    only_cross_attention=False,
    resnet_time_scale_shift="scale_shift",
)


def _unet2d_cond_inputs(text_lengths=None, batch=2, text_len=5, sdxl=False):
    def inputs(model, gen):
        device, _ = _pd(model)
        kw = dict(
            sample=_r(gen, model, batch, 4, 8, 8),
            timestep=_steps(gen, model, batch),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.cross_attention_dim),
        )
        if text_lengths is not None:
            kw["encoder_attention_mask"] = _keep(text_lengths, text_len, device, dtype=torch.long)
        if sdxl:
            kw["added_cond_kwargs"] = {"text_embeds": _r(gen, model, batch, 16), "time_ids": _r(gen, model, batch, 6)}
        return kw

    return inputs


_UNET2D_COND_NOTE = (
    "diffusers Attention + AttnProcessor2_0 (not dispatch: F.scaled_dot_product_attention): self-attention and "
    "text cross-attention in Transformer2DModel blocks, mid-block attention."
)
_add(
    ZooCase("UNet2DConditionModel", _UNET2D_COND, _unet2d_cond_inputs(), note=_UNET2D_COND_NOTE + " No mask."),
    ZooCase(
        "UNet2DConditionModel",
        _UNET2D_COND,
        _unet2d_cond_inputs([5, 2]),
        variant="masked",
        note=_UNET2D_COND_NOTE + " encoder_attention_mask made additive (-10000), (B, heads, 1, L) float.",
    ),
    ZooCase(
        "UNet2DConditionModel",
        _UNET2D_SDXL,
        _unet2d_cond_inputs(sdxl=True),
        variant="sdxl",
        note=_UNET2D_COND_NOTE + " SDXL layout: text_time conditioning, linear projections, 2 transformer layers.",
    ),
    ZooCase(
        "UNet2DConditionModel",
        _UNET2D_SIMPLE,
        _unet2d_cond_inputs([5, 3]),
        variant="simple",
        note=(
            "unCLIP / Kandinsky layout: diffusers Attention + AttnAddedKVProcessor2_0 (F.scaled_dot_product_attention "
            "over [text via add_k/v_proj, image] keys, group norm, residual inside the module), with the text mask "
            "additive and padded by zeros for the image keys."
        ),
    ),
)


# --- UNet3DConditionModel, UNetSpatioTemporalConditionModel, UNetControlNetXSModel --------

_UNET3D = dict(
    sample_size=8,
    in_channels=4,
    out_channels=4,
    down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
    up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"),
    # attention_head_dim is the number of heads of the spatial/temporal blocks (SD's naming) but the head
    # width of the first temporal transformer (8 heads): 64 channels and 8 give heads of 8 in both
    block_out_channels=(64, 64),
    layers_per_block=1,
    norm_num_groups=8,
    cross_attention_dim=24,
    attention_head_dim=8,
)
_add(
    ZooCase(
        "UNet3DConditionModel",
        _UNET3D,
        lambda model, gen: dict(
            sample=_r(gen, model, 2, 4, 3, 8, 8),
            timestep=_steps(gen, model, 1)[0],
            encoder_hidden_states=_r(gen, model, 2, 5, 24),
        ),
        note=(
            "diffusers Attention + AttnProcessor2_0: spatial self- and text cross-attention per frame, temporal "
            "self-attention over frames (TransformerTemporalModel, with the first one ahead of the down blocks), "
            "no mask."
        ),
    )
)

_SVD = dict(
    sample_size=8,
    in_channels=8,
    out_channels=4,
    block_out_channels=(32, 64),
    down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
    up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
    cross_attention_dim=24,
    num_attention_heads=(2, 4),
    layers_per_block=1,
    addition_time_embed_dim=8,
    projection_class_embeddings_input_dim=3 * 8,
    num_frames=3,
)


def _svd_inputs(model, gen, batch=2, frames=3, hw=8):
    device, dtype = _pd(model)
    return dict(
        sample=_r(gen, model, batch, frames, model.config.in_channels, hw, hw),
        timestep=_steps(gen, model, 1)[0],
        # the CLIP image embedding: one token
        encoder_hidden_states=_r(gen, model, batch, 1, model.config.cross_attention_dim),
        # fps, motion bucket id, noise augmentation strength
        added_time_ids=torch.tensor([[6.0, 127.0, 0.02]] * batch, device=device, dtype=dtype),
    )


_add(
    ZooCase(
        "UNetSpatioTemporalConditionModel",
        _SVD,
        _svd_inputs,
        note=(
            "diffusers Attention + AttnProcessor2_0 in TransformerSpatioTemporalModel: spatial self- and "
            "cross-attention per frame (to one image token), temporal self- and cross-attention over frames; no mask."
        ),
    )
)

_CONTROLNET_XS = dict(
    sample_size=8,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
    block_out_channels=(16, 32),
    cross_attention_dim=24,
    transformer_layers_per_block=1,
    num_attention_heads=2,
    norm_num_groups=8,
    upcast_attention=False,
    ctrl_block_out_channels=[8, 16],
    ctrl_num_attention_heads=1,
    ctrl_max_norm_num_groups=4,
    ctrl_conditioning_embedding_out_channels=(4, 4),
)
_add(
    ZooCase(
        "UNetControlNetXSModel",
        _CONTROLNET_XS,
        lambda model, gen: dict(
            sample=_r(gen, model, 2, 4, 8, 8),
            timestep=_steps(gen, model, 1)[0],
            encoder_hidden_states=_r(gen, model, 2, 5, 24),
            controlnet_cond=_r(gen, model, 2, 3, 16, 16),
            conditioning_scale=0.9,
        ),
        note=(
            "diffusers Attention + AttnProcessor2_0: self- and text cross-attention in the base UNet's and the "
            "control branch's Transformer2DModel blocks (interleaved, block by block); no mask."
        ),
    )
)


NO_ATTENTION.update(
    {
        "CLIPImageProjection": (
            "GLIGEN's (Stable Diffusion) projection of CLIP image embeddings: one linear layer, no attention"
        ),
        "MultiAdapter": "a weighted sum of T2IAdapter outputs: convolutional, no attention",
        "T2IAdapter": (
            "convolutional adapter (full, full_xl and light variants: pixel unshuffle, ResNet-like conv blocks): "
            "no attention"
        ),
    }
)
