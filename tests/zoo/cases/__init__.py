"""The zoo's cases, one module per model family: one tiny configuration per diffusers model
class with attention (more where a variant changes what the attention computes: masks,
causal, image conditioning, KV caches), and the classes without attention with the reason
(``NO_ATTENTION``). tests/zoo/_zoo.py collects them; tests/zoo/test_<family>.py runs them.

Every configuration keeps the attention layout of the real model (heads >= 2 where the
model has several, head_dim >= 8, GQA, qk-norm, rotary, joint text+image attention,
cross-attention, masks) at the smallest size that runs it (hidden sizes of a few dozen, one
or two blocks). Inputs are random from the generator; masks keep a different number of
valid tokens per batch item; rotary embeddings that are forward inputs are random angles.

``ZooCase.extra`` keys read by the zoo tests:
- ``"attention_classes"``: names of the module classes of a case that compute attention without
  being a diffusers ``Attention`` or ``AttentionModuleMixin`` (Mochi's ``MochiAttention``...);
- ``"uncalled_attention"``: ``(name fragments, reason)`` for attention modules a model builds but
  its forward never calls (the SANA-WM refiner's audio modules);
- ``"mask_keys"`` / ``"rotary_keys"``: the inputs that are masks / rotary embeddings;
- ``"out_shape"``, ``"shape_like"``, ``"requires"``, ``"slow"``.
"""

FAMILIES = (
    "audio",
    "autoencoders",
    "cogvideo",
    "cosmos",
    "dit",
    "flux",
    "hunyuan",
    "image",
    "kandinsky",
    "ltx",
    "lumina",
    "qwen",
    "rfd4",
    "sana",
    "sd3",
    "unets",
    "video",
    "wan",
)
