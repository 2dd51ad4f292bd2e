"""Zoo cases: Flux and the Flux-like: Flux, Flux ControlNets, Flux2, Flux3, Chroma, Bria (and Fibo), LongCat-Image, Ovis-Image.

See tests/zoo/cases/__init__.py for what a case keeps of its model.
"""

from __future__ import annotations

import torch

from tests.zoo._zoo_common import ZooCase, model_param
from tests.zoo.cases._helpers import _Case, _like, _pd, _r, _rn, _t, _text_keep, _time_gain, _timestep

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


# --- Bria (Flux-like) ---------------------------------------------------------------------


def _random_ids(gen, tokens, axes=3, span=16.0):
    """(tokens, axes) random positions: the rotary angles they give are random too (as in
    diffusers' own tests of these models), never the identity."""
    return torch.rand(tokens, axes, generator=gen) * span


def _bria_inputs(model, gen):
    b, n_img, n_txt = 1, 16, 6
    return {
        "hidden_states": _rn(model, gen, b, n_img, 4),
        "encoder_hidden_states": _rn(model, gen, b, n_txt, 16),
        "timestep": _timestep(model, gen, b),
        "img_ids": _random_ids(gen, n_img).to(**_like(model)),
        "txt_ids": _random_ids(gen, n_txt).to(**_like(model)),
    }


CASES.append(
    _Case(
        name="BriaTransformer2DModel",
        gains=_time_gain(r"^time_embed\."),
        config=dict(
            patch_size=1,
            in_channels=4,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=16,
            axes_dims_rope=[4, 6, 6],
        ),
        inputs=_bria_inputs,
        note=(
            "BriaAttention (AttentionModuleMixin) + BriaAttnProcessor -> dispatch_attention_fn, no mask: Flux layout "
            "(joint [text, image] with added projections and RMS qk-norm in double blocks, pre_only single blocks); "
            "image_rotary_emb (cos, sin) from txt_ids/img_ids"
        ),
    )
)

_FIBO = dict(
    patch_size=1,
    in_channels=4,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=16,
    text_encoder_dim=8,
    axes_dims_rope=[4, 6, 6],
)


def _fibo_inputs(masked):
    def make(model, gen):
        b = 2 if masked else 1
        n_img, n_txt = 16, 6
        text = _rn(model, gen, b, n_txt, 16)
        out = {
            "hidden_states": _rn(model, gen, b, n_img, 4),
            "encoder_hidden_states": text,
            "text_encoder_layers": [_rn(model, gen, b, n_txt, 8) for _ in range(2)],
            "timestep": _timestep(model, gen, b),
            "img_ids": _random_ids(gen, n_img).to(**_like(model)),
            "txt_ids": _random_ids(gen, n_txt).to(**_like(model)),
        }
        if masked:
            # As the pipeline builds it: bool key padding over [text, image], (B, 1, 1, S).
            keep = torch.cat([_text_keep([6, 2], n_txt), torch.ones(b, n_img, dtype=torch.bool)], dim=1)
            out["joint_attention_kwargs"] = {"attention_mask": keep[:, None, None, :].to(model_param(model).device)}
        return out

    return make


_FIBO_NOTE = (
    "double blocks: BriaFiboAttention (AttentionModuleMixin) + BriaFiboAttnProcessor; single blocks: legacy "
    "Attention (pre_only, RMS qk-norm) + BriaAttnProcessor; both -> dispatch_attention_fn over [text, image] "
    "with image_rotary_emb from the ids; the pipeline's mask goes through joint_attention_kwargs['attention_mask']"
)
CASES.append(ZooCase(name="BriaFiboTransformer2DModel", config=_FIBO, inputs=_fibo_inputs(False), note=_FIBO_NOTE))
CASES.append(
    ZooCase(
        name="BriaFiboTransformer2DModel",
        variant="masked",
        config=_FIBO,
        inputs=_fibo_inputs(True),
        note=_FIBO_NOTE + "; batch 2: 6 and 2 valid text tokens, bool (B, 1, 1, S) key padding",
        extra={"mask_keys": ("joint_attention_kwargs",)},
    )
)

_FIBO2 = dict(
    in_channels=4,
    patch_size=2,
    dim=32,
    n_layers=2,
    n_refiner_layers=1,
    n_heads=2,
    cap_feat_dim=16,
    injection_layer_ids=(1,),
    perceiver_num_layers=1,
    min_num_gist_tokens=4,
    max_num_gist_tokens=8,
    gist_step=4,
    gist_min_text_len=2,
    gist_max_text_len=10,
    axes_dims=(4, 6, 6),
    axes_lens=(32, 16, 16),
)


def _fibo2_inputs(masked):
    def make(model, gen):
        b = 2 if masked else 1
        out = {
            "hidden_states": _rn(model, gen, b, 4, 8, 8),
            "timestep": torch.rand(b, generator=gen).to(**_like(model)),
            # the Perceiver's bundle, then one per injection block
            "encoder_hidden_states": _rn(model, gen, b, 2, 10, 16),
        }
        if masked:
            # 10 and 2 text tokens: 8 and 4 gist tokens, so the gist tokens are padded and
            # masked in the self-attention too.
            out["encoder_attention_mask"] = _text_keep([10, 2], 10).to(model_param(model).device)
        return out

    return make


_FIBO2_NOTE = (
    "BriaFibo2Attention (AttentionModuleMixin) + BriaFibo2AttnProcessor -> dispatch_attention_fn: self-attention "
    "with complex rotary freqs_cis (from ids, built inside) and RMS qk-norm; Perceiver cross- and self-attention "
    "over gist tokens; gated cross-attention to the text in injection blocks; masks: encoder_attention_mask (B, T) "
    "bool -> (B, 1, 1, T) for cross-attention, gist padding (B, 1, 1, S) bool for self-attention"
)
# cross_attn_gate is a zero-initialised scalar gate (tanh): random_init_ draws it at ~0.05,
# which would mute the injection cross-attention; at 1 its tanh is 0.76.
_FIBO2_GAINS = ((r"cross_attn_gate$", 20.0),)
CASES.append(
    _Case(
        name="BriaFibo2Transformer2DModel",
        config=_FIBO2,
        inputs=_fibo2_inputs(False),
        note=_FIBO2_NOTE,
        gains=_FIBO2_GAINS,
    )
)
CASES.append(
    _Case(
        name="BriaFibo2Transformer2DModel",
        variant="masked",
        config=_FIBO2,
        inputs=_fibo2_inputs(True),
        note=_FIBO2_NOTE + "; batch 2 with 10 and 2 text tokens (8 and 4 gist tokens)",
        gains=_FIBO2_GAINS,
        extra={"mask_keys": ("encoder_attention_mask",)},
    )
)


# --- Flux, Chroma and the Flux ControlNets ------------------------------------------------

_FLUX = dict(
    patch_size=1,
    in_channels=4,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=16,
    pooled_projection_dim=8,
    axes_dims_rope=(4, 6, 6),
)
_FLUX_NOTE = (
    "FluxAttention (AttentionModuleMixin) + FluxAttnProcessor -> dispatch_attention_fn: joint [text, image] with "
    "added projections and RMS qk-norm (double blocks), pre_only single blocks over the concatenation; "
    "image_rotary_emb (cos, sin) from txt_ids/img_ids; a mask only through joint_attention_kwargs['attention_mask']"
)


def _flux_inputs(masked, guidance=False, n_img=16, n_txt=6):
    def make(model, gen):
        b = 2 if masked else 1
        out = {
            "hidden_states": _rn(model, gen, b, n_img, 4),
            "encoder_hidden_states": _rn(model, gen, b, n_txt, 16),
            "pooled_projections": _rn(model, gen, b, 8),
            "timestep": torch.rand(b, generator=gen).to(**_like(model)),
            "img_ids": _random_ids(gen, n_img).to(**_like(model)),
            "txt_ids": _random_ids(gen, n_txt).to(**_like(model)),
        }
        if guidance:
            out["guidance"] = (1.0 + 4.0 * torch.rand(b, generator=gen)).to(**_like(model))
        if masked:
            keep = torch.cat([_text_keep([n_txt, 2], n_txt), torch.ones(b, n_img, dtype=torch.bool)], dim=1)
            out["joint_attention_kwargs"] = {"attention_mask": keep[:, None, None, :].to(model_param(model).device)}
        return out

    return make


_FLUX_GAINS = _time_gain(r"time_text_embed\.")
CASES.append(
    _Case(name="FluxTransformer2DModel", config=_FLUX, inputs=_flux_inputs(False), note=_FLUX_NOTE, gains=_FLUX_GAINS)
)
CASES.append(
    _Case(
        name="FluxTransformer2DModel",
        variant="masked",
        config=dict(_FLUX, guidance_embeds=True),
        gains=_FLUX_GAINS,
        inputs=_flux_inputs(True, guidance=True),
        note=_FLUX_NOTE + "; guidance embedding; batch 2 with 6 and 2 valid text tokens, bool (B, 1, 1, S)",
        extra={"mask_keys": ("joint_attention_kwargs",)},
    )
)

_CHROMA = dict(
    patch_size=1,
    in_channels=4,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=16,
    axes_dims_rope=(4, 6, 6),
    approximator_num_channels=16,
    approximator_hidden_dim=32,
    approximator_layers=1,
)


def _chroma_inputs(masked):
    def make(model, gen):
        b, n_img, n_txt = (2 if masked else 1), 16, 6
        out = {
            "hidden_states": _rn(model, gen, b, n_img, 4),
            "encoder_hidden_states": _rn(model, gen, b, n_txt, 16),
            "timestep": torch.rand(b, generator=gen).to(**_like(model)),
            "img_ids": _random_ids(gen, n_img).to(**_like(model)),
            "txt_ids": _random_ids(gen, n_txt).to(**_like(model)),
        }
        if masked:
            # As ChromaPipeline builds it: text tokens valid up to and including the first
            # padding token, in the model's float dtype, then the image tokens (bool ones)
            # concatenated: the result is float 0/1 of shape (B, text + image).
            text = (torch.arange(n_txt)[None, :] <= torch.tensor([[n_txt - 1], [2]])).to(**_like(model))
            out["attention_mask"] = torch.cat([text, torch.ones(b, n_img, dtype=torch.bool)], dim=1)
        return out

    return make


_CHROMA_NOTE = (
    "FluxAttention + FluxAttnProcessor -> dispatch_attention_fn (Flux layout, pruned adaLN from an approximator); "
    "attention_mask (B, S) is expanded per block to a pairwise (B, 1, S, S) product and passed as is: the "
    "pipeline's mask is float 0/1, which SDPA adds to the scores (+1 on kept pairs) rather than masking"
)
CASES.append(ZooCase(name="ChromaTransformer2DModel", config=_CHROMA, inputs=_chroma_inputs(False), note=_CHROMA_NOTE))
CASES.append(
    ZooCase(
        name="ChromaTransformer2DModel",
        variant="masked",
        config=_CHROMA,
        inputs=_chroma_inputs(True),
        note=_CHROMA_NOTE + "; batch 2 with 6 and 3 text tokens kept (the pipeline's float mask)",
        extra={"mask_keys": ("attention_mask",)},
    )
)

_FLUX_CN = dict(_FLUX, num_mode=None)


def _flux_cn_outputs(out):
    # FluxControlNetModel returns FluxControlNetOutput, FluxMultiControlNetModel a tuple.
    blocks, singles = (
        (out.controlnet_block_samples, out.controlnet_single_block_samples)
        if hasattr(out, "controlnet_block_samples")
        else out
    )
    return (*blocks, *singles)


def _flux_cn_inputs(model, gen):
    out = _flux_inputs(False)(model, gen)
    out["controlnet_cond"] = _rn(model, gen, 1, 16, 4)
    out["conditioning_scale"] = 0.7
    return out


CASES.append(
    _Case(
        name="FluxControlNetModel",
        config=_FLUX_CN,
        inputs=_flux_cn_inputs,
        outputs=_flux_cn_outputs,
        gains=_FLUX_GAINS,
        note=(
            "FluxAttention + FluxAttnProcessor -> dispatch_attention_fn (Flux blocks); joint_attention_kwargs is "
            "not passed to the blocks, so no mask reaches the attention; outputs: every block's residual"
        ),
        extra={"out_shape": (1, 16, 32)},
    )
)


def _flux_multi_make(config):
    import diffusers

    return diffusers.FluxMultiControlNetModel([diffusers.FluxControlNetModel(**config)])


def _flux_multi_inputs(model, gen):
    out = _flux_inputs(False)(model, gen)
    out["controlnet_cond"] = [_rn(model, gen, 1, 16, 4), _rn(model, gen, 1, 16, 4)]
    out["controlnet_mode"] = [torch.tensor([0]), torch.tensor([2])]
    out["conditioning_scale"] = [0.7, 0.4]
    # As the pipelines call it: with return_dict=True the wrapper unpacks each ControlNet's
    # output dataclass into its field names.
    out["return_dict"] = False
    return out


CASES.append(
    _Case(
        name="FluxMultiControlNetModel",
        config=dict(_FLUX, num_mode=3),
        make=_flux_multi_make,
        gains=_FLUX_GAINS,
        inputs=_flux_multi_inputs,
        outputs=_flux_cn_outputs,
        note=(
            "wraps one FluxControlNetModel (ControlNet-Union, num_mode=3) run once per condition; the mode "
            "embedding is prepended to the text tokens; FluxAttention + FluxAttnProcessor -> dispatch_attention_fn"
        ),
        extra={"out_shape": (1, 16, 32)},
    )
)


# --- Flux2 --------------------------------------------------------------------------------

_FLUX2 = dict(
    patch_size=1,
    in_channels=4,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=16,
    timestep_guidance_channels=32,
    mlp_ratio=2.0,
    axes_dims_rope=(4, 4, 4, 4),
    guidance_embeds=True,
)
_FLUX2_NOTE = (
    "double blocks: Flux2Attention (AttentionModuleMixin) + Flux2AttnProcessor; single blocks: "
    "Flux2ParallelSelfAttention + Flux2ParallelSelfAttnProcessor (fused qkv+MLP in); both -> dispatch_attention_fn "
    "over [text, image] with RMS qk-norm and image_rotary_emb (cos, sin) from 4-axis txt_ids/img_ids; a mask only "
    "through joint_attention_kwargs['attention_mask']"
)


def _flux2_inputs(masked=False, n_ref=0, cache=False, lengths=(6, 2)):
    def make(model, gen):
        b, n_img, n_txt = (2 if masked else 1), 16, 6
        n_all = n_img + n_ref
        out = {
            "hidden_states": _rn(model, gen, b, n_all, 4),
            "encoder_hidden_states": _rn(model, gen, b, n_txt, 16),
            "timestep": torch.rand(b, generator=gen).to(**_like(model)),
            "guidance": (1.0 + 4.0 * torch.rand(b, generator=gen)).to(**_like(model)),
            "img_ids": _random_ids(gen, n_all, axes=4).to(**_like(model)),
            "txt_ids": _random_ids(gen, n_txt, axes=4).to(**_like(model)),
        }
        if masked:
            # 2-D bool key padding over [text, image].
            keep = torch.cat([_text_keep(lengths, n_txt), torch.ones(b, n_img, dtype=torch.bool)], dim=1)
            out["joint_attention_kwargs"] = {"attention_mask": keep.to(model_param(model).device)}
        if n_ref:
            out.update(kv_cache_mode="extract", num_ref_tokens=n_ref, ref_fixed_timestep=0.0)
        if cache:
            # Reference-image keys/values cached by an earlier "extract" step: random here,
            # (batch, ref tokens, heads, head_dim) per layer.
            from diffusers.models.transformers.transformer_flux2 import Flux2KVCache

            heads, d = model.config.num_attention_heads, model.config.attention_head_dim
            kv = Flux2KVCache(model.config.num_layers, model.config.num_single_layers)
            kv.num_ref_tokens = 8
            for layer in kv.double_block_caches + kv.single_block_caches:
                layer.store(_rn(model, gen, b, 8, heads, d), _rn(model, gen, b, 8, heads, d))
            out.update(kv_cache=kv, kv_cache_mode="cached")
        return out

    return make


def _flux2_kv_processors(model):
    # What Flux2KleinKVPipeline does before its first step.
    from diffusers.models.transformers.transformer_flux2 import Flux2KVAttnProcessor, Flux2KVParallelSelfAttnProcessor

    for block in model.transformer_blocks:
        block.attn.set_processor(Flux2KVAttnProcessor())
    for block in model.single_transformer_blocks:
        block.attn.set_processor(Flux2KVParallelSelfAttnProcessor())


_FLUX2_GAINS = _time_gain(r"^time_guidance_embed\.")
CASES.append(
    _Case(name="Flux2Transformer2DModel", config=_FLUX2, inputs=_flux2_inputs(), note=_FLUX2_NOTE, gains=_FLUX2_GAINS)
)
CASES.append(
    _Case(
        name="Flux2Transformer2DModel",
        variant="masked",
        config=_FLUX2,
        inputs=_flux2_inputs(masked=True),
        gains=_FLUX2_GAINS,
        note=_FLUX2_NOTE + "; batch 2 with 6 and 2 valid text tokens, 2-D bool (B, S) key padding",
        extra={"mask_keys": ("joint_attention_kwargs",)},
    )
)
CASES.append(
    _Case(
        name="Flux2Transformer2DModel",
        variant="fullpad",
        config=_FLUX2,
        gains=_FLUX2_GAINS,
        inputs=_flux2_inputs(masked=True, lengths=(6, 0)),
        note=_FLUX2_NOTE + "; batch 2, the second with no valid text token (2-D bool key padding): its text keys "
        "are all masked, the image keys remain",
    )
)
CASES.append(
    _Case(
        name="Flux2Transformer2DModel",
        variant="kvextract",
        config=_FLUX2,
        inputs=_flux2_inputs(n_ref=8),
        gains=_FLUX2_GAINS,
        setup=_flux2_kv_processors,
        note=(
            "Flux2KVAttnProcessor / Flux2KVParallelSelfAttnProcessor (Klein KV pipeline), kv_cache_mode='extract' "
            "with 8 reference tokens: two dispatch_attention_fn calls per module (text+image queries over all keys; "
            "reference queries over reference keys only), no mask, parallel_config not passed"
        ),
        extra={"out_shape": (1, 16, 4)},  # the reference tokens are not predicted
    )
)
CASES.append(
    _Case(
        name="Flux2Transformer2DModel",
        variant="kvcached",
        config=_FLUX2,
        inputs=_flux2_inputs(cache=True),
        gains=_FLUX2_GAINS,
        setup=_flux2_kv_processors,
        note=(
            "Flux2KV processors, kv_cache_mode='cached': 8 cached reference keys/values (random) inserted between "
            "the text and image keys, one dispatch_attention_fn call without mask"
        ),
    )
)


# --- Flux3 --------------------------------------------------------------------------------


def _flux3_inputs(model, gen):
    b, n_img, n_cond, n_txt = 1, 16, 16, 12
    return {
        "hidden_states": _rn(model, gen, b, n_img, 4),
        "encoder_hidden_states": _rn(model, gen, b, n_txt, 16),
        "timestep": torch.rand(b, generator=gen).to(**_like(model)),
        "img_ids": _random_ids(gen, n_img, axes=4).to(**_like(model)),
        "txt_ids": _random_ids(gen, n_txt, axes=4).to(**_like(model)),
        # Reference-image tokens (image-to-image): their per-mode blocks only run with them.
        "image_cond_hidden_states": _rn(model, gen, b, n_cond, 4),
        "image_cond_ids": _random_ids(gen, n_cond, axes=4).to(**_like(model)),
    }


CASES.append(
    _Case(
        name="Flux3Transformer2DModel",
        # timestep embedding at unit scale; the text and reference-image streams' input
        # projections x0.25 and the per-mode attention outputs x4: at the default scale a
        # per-mode block barely changes its stream, and its attention would barely show.
        gains=(
            (r"^timestep_embedder\.linear_2\.", 10.0),
            (r"mode_blocks\.(\w+\.)?\d+\.attn\.to_out\.0\.weight", 4.0),
            (r"^context_embedder\.", 0.25),
            (r"^x_embedders\.image_cond\.", 0.25),
        ),
        config=dict(
            in_channels=4,
            cond_in_channels=4,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=16,
            timestep_channels=32,
            mlp_ratio=2.0,
            axes_dims_rope=(4, 4, 4, 4),
        ),
        inputs=_flux3_inputs,
        note=(
            "Flux3Attention (AttentionModuleMixin) + Flux3AttnProcessor -> dispatch_attention_fn, never a mask: "
            "per-mode self-attention (text / image / reference image) then joint single blocks over [text, image, "
            "reference]; fp32 RMS qk-norm, image_rotary_emb (cos, sin) from 4-axis ids"
        ),
    )
)


# --- Flux-like single-sequence image transformers: LongCat-Image, Ovis-Image --------------


def _flux_ids(text_len, grid, image_start=None, device="cpu"):
    """(txt_ids, img_ids), each (N, 3) float: text positions on axes 1 and 2, image grid after them."""
    gh, gw = grid
    txt = torch.zeros(text_len, 3)
    txt[:, 1] = torch.arange(text_len)
    txt[:, 2] = torch.arange(text_len)
    s = text_len if image_start is None else image_start
    img = torch.zeros(gh, gw, 3)
    img[..., 1] = torch.arange(gh)[:, None] + s
    img[..., 2] = torch.arange(gw)[None, :] + s
    return txt.to(device), img.reshape(-1, 3).to(device)


def _flux_like_inputs(text_dim_key, batch=2, text_len=5, grid=(2, 3), guidance=False, ids_image_start=None):
    def inputs(model, gen):
        device, _ = _pd(model)
        cfg = model.config
        txt_ids, img_ids = _flux_ids(text_len, grid, ids_image_start, device)
        kw = dict(
            hidden_states=_r(gen, model, batch, grid[0] * grid[1], cfg.in_channels),
            encoder_hidden_states=_r(gen, model, batch, text_len, cfg[text_dim_key]),
            timestep=_t(gen, model, batch),
            img_ids=img_ids,
            txt_ids=txt_ids,
        )
        if guidance:
            kw["guidance"] = _t(gen, model, batch, 1.0, 5.0)
        return kw

    return inputs


_add(
    ZooCase(
        "LongCatImageTransformer2DModel",
        dict(
            patch_size=1,
            in_channels=8,
            num_layers=1,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=24,
            pooled_projection_dim=24,
            axes_dims_rope=[4, 6, 6],
        ),
        _flux_like_inputs("joint_attention_dim"),
        note=(
            "LongCatImageAttention + LongCatImageAttnProcessor -> dispatch_attention_fn on the joint "
            "[text, image] sequence (double blocks: added k/v projections and norm_added_q/k; single blocks: "
            "one projection), qk RMSNorm, 3-axis Flux RoPE (cos, sin); no mask."
        ),
    ),
    ZooCase(
        "OvisImageTransformer2DModel",
        dict(
            patch_size=1,
            in_channels=8,
            out_channels=8,
            num_layers=1,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=24,
            axes_dims_rope=(4, 6, 6),
        ),
        _flux_like_inputs("joint_attention_dim"),
        note=(
            "OvisImageAttention + OvisImageAttnProcessor -> dispatch_attention_fn on the joint [text, image] "
            "sequence (Flux layout: double and single blocks), qk RMSNorm, 3-axis RoPE (cos, sin); no mask. "
            "No set_attn_processor on the model."
        ),
    ),
)


NO_ATTENTION.update(
    {
        "ReduxImageEncoder": (
            "Flux Redux's image-embedding projector: two linear layers around a SiLU (SigLIP features to T5 "
            "width): no attention"
        )
    }
)
