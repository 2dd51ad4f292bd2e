"""Zoo cases: RFD4 Proteina (protein structure): the denoiser and the autoencoder.

See tests/zoo/cases/__init__.py for what a case keeps of its model.
"""

from __future__ import annotations

import torch

from tests.zoo._zoo_common import ZooCase, randn
from tests.zoo.cases._helpers import _EncodeDecodeCase, _keep, _pd, _r

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


# --- RFD4 Proteina (protein structure): the denoiser and the autoencoder ------------------

_RFD4 = dict(
    nlayers=2,
    token_dim=32,
    nheads=2,
    dim_cond=16,
    pair_repr_dim=8,
    latent_dim=4,
    token_type_emb_dim=8,
    cath_emb_dim=4,
    t_emb_dim=16,
    seq_sep_dim=8,
    xt_pair_dist_dim=6,
    feats_seq=("xt_bb_ca", "xt_local_latents", "token_type"),
    feats_cond_seq=("time_emb_bb_ca", "time_emb_local_latents"),
    feats_pair_repr=("xt_bb_ca_pair_dists",),
    feats_pair_cond=("time_emb_bb_ca",),
    update_pair_repr_every_n=1,
    tri_mult_c=8,
    num_sequence_classes=10,
)


def _rfd4_conditioning(batch, tokens, device):
    return {
        "is_in_context_conditioning": torch.zeros(batch, tokens, dtype=torch.bool, device=device),
        "supports_local_latent": torch.ones(batch, tokens, dtype=torch.bool, device=device),
    }


def _rfd4_inputs(lengths, tokens=7):
    def inputs(model, gen):
        device, _ = _pd(model)
        batch = len(lengths)
        return dict(
            bb_ca=randn(gen, batch, tokens, 3, device=device),  # the sampler state stays float32
            local_latents=randn(gen, batch, tokens, model.config.latent_dim, device=device),
            bb_ca_time=torch.rand(batch, generator=gen).to(device),
            local_latents_time=torch.rand(batch, generator=gen).to(device),
            padding_mask=_keep(lengths, tokens, device),
            token_type=torch.randint(0, 3, (batch, tokens), generator=gen).to(device),
            conditioning=_rfd4_conditioning(batch, tokens, device),
        )

    return inputs


def _rfd4_outputs(out):
    return (out.backbone, out.local_latents, out.sequence_logits, out.insertion_logits)


_RFD4_NOTE = (
    "RFD4ProteinaPairAttention + RFD4ProteinaPairAttnProcessor -> dispatch_attention_fn with a per-head additive "
    "float pair bias (B, heads, N, N) projected from the pair representation, padding filled with -1e4 (padded "
    "queries see every key at -1e4: uniform, not NaN); q/k RMSNorm over the width, sigmoid output gate. "
    "insertion_logits are a bilinear q.k readout (torch.bmm), not attention."
)
_add(
    ZooCase("RFD4ProteinaTransformer", _RFD4, _rfd4_inputs([7, 7]), outputs=_rfd4_outputs, note=_RFD4_NOTE),
    ZooCase(
        "RFD4ProteinaTransformer",
        _RFD4,
        _rfd4_inputs([7, 4]),
        outputs=_rfd4_outputs,
        variant="masked",
        note=_RFD4_NOTE + " Item 2 has 3 padding tokens.",
    ),
)

_RFD4_RESIDUES, _RFD4_TOKEN_TYPES = 5, 3
_RFD4_AE = dict(
    # every atom slot valid for every residue type, every type allowed: the decoded atom mask then does
    # not depend on the (discrete) residue prediction
    atom37_mask=[[True] * 37] * _RFD4_RESIDUES,
    allowed_residue_types=[[True] * _RFD4_RESIDUES] * _RFD4_TOKEN_TYPES,
    latent_dim=4,
    n_residue_types=_RFD4_RESIDUES,
    num_token_types=_RFD4_TOKEN_TYPES,
    nlayers=1,
    token_dim=32,
    nheads=2,
    dim_cond=8,
    pair_repr_dim=8,
    token_type_emb_dim=8,
    encoder_feats_seq=("token_type", "x1_a37coors_nm", "x1_a37coors_nm_rel", "chain_idx_seq"),
    decoder_feats_seq=("ca_coors_nm", "z_latent_seq", "token_type"),
)


def _rfd4_ae_conditioning(batch, tokens, device):
    return {
        **_rfd4_conditioning(batch, tokens, device),
        "chain_iid": torch.zeros(batch, tokens, dtype=torch.long, device=device),
        # every atom slot "required": the decoded atom mask does not depend on the presence head's sign
        "condition_CoordinateGroup_1_atom": torch.zeros(batch, tokens, 37, dtype=torch.long, device=device),
    }


def _rfd4_ae_inputs(lengths, tokens=6):
    def inputs(model, gen):
        device, _ = _pd(model)
        batch = len(lengths)
        seeds = torch.randint(0, 2**31 - 1, (batch,), generator=gen).tolist()
        coords = _r(gen, model, batch, tokens, 37, 3)
        padding = _keep(lengths, tokens, device)
        token_type = torch.randint(0, _RFD4_TOKEN_TYPES, (batch, tokens), generator=gen).to(device)
        conditioning = _rfd4_ae_conditioning(batch, tokens, device)
        return dict(
            coords_nm=coords,
            padding_mask=padding,
            token_type=token_type,
            atom37_mask=torch.ones(batch, tokens, 37, dtype=torch.bool, device=device),
            conditioning=conditioning,
            generator=[torch.Generator().manual_seed(s) for s in seeds],
            # decoded from the CA atom (slot 1) of the encoded structure, as a round trip
            decode=dict(
                ca_coors_nm=coords[:, :, 1], padding_mask=padding, token_type=token_type, conditioning=conditioning
            ),
        )

    return inputs


_RFD4_AE_NOTE = (
    "RFD4ProteinaPairAttention + RFD4ProteinaPairAttnProcessor -> dispatch_attention_fn without pair bias: an "
    "additive float mask (B, heads, N, N) of zeros and -1e4 on padding; q/k LayerNorm, sigmoid output gate."
)
_add(
    _EncodeDecodeCase(
        "RFD4ProteinaAutoencoder",
        _RFD4_AE,
        _rfd4_ae_inputs([6, 4]),
        note="encode then forward (= decode; forward alone runs only the decoder). " + _RFD4_AE_NOTE,
    )
)
