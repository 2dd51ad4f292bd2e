"""Every entry point serves exactly or refuses, and a failed call poisons nothing.

Tiny models from the zoo (diffusers' own classes, random weights): set_attention_backend
says what it does not reach; an input error demotes no backend; ATTNKIT_CHECK_FINITE
names the layer on every route; a model saved after attnkit.apply loads without attnkit,
as the stock model; apply undoes itself and serves a whole pipeline; bad masks and
options get errors that say what to pass.
"""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import textwrap

import pytest
import torch

import attnkit
from attnkit.testing import rel_error
from tests.zoo._zoo import BY_ID


@pytest.fixture(autouse=True)
def _no_forced_backend(monkeypatch):
    monkeypatch.delenv("ATTNKIT_BACKEND", raising=False)
    monkeypatch.delenv("ATTNKIT_CHECK_FINITE", raising=False)


def _run(case, model):
    with torch.no_grad():
        return case.run(model, case.make_inputs(model, 0))


def _processor_classes(model) -> list[str]:
    return sorted({type(m.processor).__name__ for m in model.modules() if getattr(m, "processor", None) is not None})


# -- set_attention_backend("attnkit") on a model whose processors never dispatch --------------------
@pytest.mark.parametrize("case_id", ["SD3Transformer2DModel", "AuraFlowTransformer2DModel"])
def test_set_attention_backend_warns_once_naming_what_it_does_not_reach(case_id, caplog, restore_active_backend):
    model = BY_ID[case_id].build(0)
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        model.set_attention_backend("attnkit")
        model.set_attention_backend("attnkit_sdpa")
    warnings = [r.getMessage() for r in caplog.records if r.name == "attnkit"]
    assert len(warnings) == 1, warnings
    assert "does not reach 2 of the 2 attention modules" in warnings[0]
    assert "transformer_blocks.0.attn" in warnings[0] and "attnkit.apply(model" in warnings[0]


def test_set_attention_backend_is_quiet_where_it_reaches_everything(caplog, restore_active_backend):
    model = BY_ID["FluxTransformer2DModel"].build(0)
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        model.set_attention_backend("attnkit")
    assert not [r for r in caplog.records if r.name == "attnkit"]


def test_no_refusal_recommends_set_attention_backend_for_a_module_it_does_not_reach():
    """A strict refusal of a module computed by its own matmul names strict mode and the
    plan, never the dispatcher (which would not reach that module either)."""
    from diffusers.models.attention_processor import Attention, AttnAddedKVProcessor

    attn = Attention(
        query_dim=32,
        heads=2,
        dim_head=16,
        added_kv_proj_dim=8,
        norm_num_groups=4,
        cross_attention_norm="group_norm",
        cross_attention_norm_num_groups=4,
    )
    attn.set_processor(AttnAddedKVProcessor())
    attn.set_processor(attnkit.auto(strict=True))
    with pytest.raises(attnkit.UnsupportedModule) as info:
        attn(torch.randn(1, 32, 2, 2), torch.randn(1, 3, 8))
    message = str(info.value)
    assert "set_attention_backend" not in message
    assert "strict=True or ATTNKIT_STRICT=1" in message and "attnkit.plan(model).explain()" in message


# -- an input error is not a backend failure -----------------------------------------------------------
def test_a_malformed_dispatch_call_raises_and_demotes_nothing(seed, restore_active_backend):
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    proc = attnkit.auto()
    member = attnkit.diffusers.backend.member_for(proc)
    q, v = torch.randn(1, 16, 2, 64), torch.randn(1, 16, 2, 64)
    with pytest.raises(ValueError, match=r"query \(1, 16, 2, 64\), key \(1, 16, 2, 32\).*same head_dim and batch"):
        dispatch_attention_fn(q, torch.randn(1, 16, 2, 32), v, backend=member)
    k = torch.randn(1, 16, 2, 64)
    out = dispatch_attention_fn(q, k, v, backend=member)
    assert (
        rel_error(
            out,
            torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            ).transpose(1, 2),
        )
        < 1e-5
    )
    (record,) = proc.decisions
    assert record.backend == "sdpa" and record.how == "priority" and not record.failed


@pytest.mark.parametrize("forced", ["", "vanilla"])
def test_a_key_batch_of_one_broadcasts_as_native_takes_it(seed, forced, monkeypatch, restore_active_backend):
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    monkeypatch.setenv("ATTNKIT_BACKEND", forced)
    proc = attnkit.auto()  # held: the registry holds its chooser weakly
    member = attnkit.diffusers.backend.member_for(proc)
    q, k, v = torch.randn(3, 8, 2, 16), torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 16)
    expected = dispatch_attention_fn(q, k, v, backend="native")
    assert rel_error(dispatch_attention_fn(q, k, v, backend=member), expected) < 1e-5


def test_a_call_every_backend_refuses_demotes_nothing(seed):
    """Past the up-front checks (the chooser called directly): every backend raises, the
    first error comes back, and the signature keeps its backend."""
    proc = attnkit.auto()
    q, v = torch.randn(1, 2, 16, 64), torch.randn(1, 2, 16, 64)
    k_bad = torch.randn(1, 2, 16, 32)
    proc.chooser.attention(None, q, torch.randn(1, 2, 16, 64), v, None, None, False)
    with pytest.raises(RuntimeError):
        proc.chooser.attention(None, q, k_bad, v, None, None, False)
    (record,) = proc.decisions
    assert record.backend == "sdpa" and record.how == "priority", proc.explain()


def test_a_real_backend_failure_is_a_visible_fallback(seed):
    from attnkit.backends.sdpa import SDPABackend

    class Broken(SDPABackend):
        def forward(self, *args, **kwargs):
            raise RuntimeError("broken for the test")

    proc = attnkit.auto(backends={"sdpa": Broken()})
    q, k, v = (torch.randn(1, 2, 16, 64) for _ in range(3))
    out = proc.chooser.attention(None, q, k, v, None, None, False)
    assert rel_error(out, torch.nn.functional.scaled_dot_product_attention(q, k, v)) < 1e-5
    text = proc.explain()
    assert "-> sliced  [fallback" in text and "failed at run time (RuntimeError: broken for the test)" in text


# -- ATTNKIT_CHECK_FINITE on every route -------------------------------------------------------------
def _nan_inputs(case, model):
    inputs = case.make_inputs(model, 0)
    inputs["hidden_states"] = inputs["hidden_states"].clone()
    inputs["hidden_states"].view(-1)[0] = float("nan")
    return inputs


@pytest.mark.parametrize("route", ["apply", "set_attn_processor", "set_attention_backend"])
@pytest.mark.parametrize("case_id", ["FluxTransformer2DModel", "SD3Transformer2DModel"])
def test_check_finite_names_the_layer_on_every_route(case_id, route, monkeypatch, restore_active_backend):
    monkeypatch.setenv("ATTNKIT_CHECK_FINITE", "1")
    case = BY_ID[case_id]
    model = case.build(0)
    if route == "apply":
        attnkit.apply(model, attnkit.auto())
    elif route == "set_attn_processor":
        model.set_attn_processor(attnkit.auto())
    else:
        if case_id == "SD3Transformer2DModel":
            pytest.skip("SD3's processors never dispatch: set_attention_backend does not reach them (warned)")
        # "attnkit"'s chooser is made once per process and reads the variable then: a new one
        from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

        holder = _AttentionBackendRegistry._backends[AttentionBackendName("attnkit")].keywords["_holder"]
        monkeypatch.setattr(holder, "chooser", None)
        model.set_attention_backend("attnkit")
    assert torch.isfinite(_run(case, model)[0]).all()
    with pytest.raises(FloatingPointError, match=r"ATTNKIT_CHECK_FINITE: \w+ of \S*transformer_blocks\.0\.attn"):
        with torch.no_grad():
            case.run(model, _nan_inputs(case, model))


# -- saving, loading, undoing ----------------------------------------------------------------------
_LOAD_WITHOUT_ATTNKIT = textwrap.dedent("""
    import sys, io, torch
    sys.modules["attnkit"] = None  # importing attnkit now fails
    model = torch.load(io.BytesIO(sys.stdin.buffer.read()), weights_only=False)
    print(sorted({type(m.processor).__name__ for m in model.modules() if getattr(m, "processor", None) is not None}))
    print(sorted(k for m in model.modules() for k in vars(m) if "attnkit" in k))
""")


@pytest.mark.parametrize(
    "case_id", ["FluxTransformer2DModel", "SD3Transformer2DModel", "UNet2DConditionModel", "UNet1DModel"]
)
@pytest.mark.parametrize("how", ["apply", "set_attn_processor"])
def test_a_saved_model_loads_without_attnkit_as_the_stock_model(case_id, how):
    case = BY_ID[case_id]
    stock = case.build(0)
    if how == "set_attn_processor" and not hasattr(stock, "set_attn_processor"):
        pytest.skip(f"{case_id} has no set_attn_processor")
    expected = _run(case, stock)
    model = case.build(0)
    if how == "apply":
        attnkit.apply(model, attnkit.processor("vanilla"))
    else:
        model.set_attn_processor(attnkit.processor("vanilla"))
    buf = io.BytesIO()
    torch.save(model, buf)
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_WITHOUT_ATTNKIT], input=buf.getvalue(), capture_output=True, timeout=300
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    classes, leftovers = done.stdout.decode().splitlines()[-2:]
    assert classes == str(_processor_classes(stock)) and leftovers == "[]"
    loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)  # here, with attnkit imported
    assert _processor_classes(loaded) == _processor_classes(stock)
    assert all(torch.equal(a, b) for a, b in zip(_run(case, loaded), expected))
    # the model itself is still served by attnkit, and a deep copy too
    import copy

    twin = copy.deepcopy(model)
    assert _processor_classes(twin) == _processor_classes(model)


@pytest.mark.parametrize(
    "case_id",
    [
        "FluxTransformer2DModel",
        "SD3Transformer2DModel",
        "UNet2DConditionModel",
        "UNet1DModel",
        "CogVideoXTransformer3DModel",
    ],
)
def test_undo_gives_back_the_stock_model(case_id):
    case = BY_ID[case_id]
    stock = case.build(0)
    expected = _run(case, stock)
    model = case.build(0)
    before = {n: (m.processor, dict(vars(m))) for n, m in model.named_modules() if hasattr(m, "processor")}
    applied = attnkit.apply(model, attnkit.processor("vanilla"))
    served = _run(case, model)
    assert all(rel_error(a, b) < 1e-4 for a, b in zip(served, expected))
    applied.undo()
    for name, module in model.named_modules():
        if name in before:
            assert module.processor is before[name][0], name
        assert not [k for k in vars(module) if k.startswith("_attnkit_") and k != "_attnkit_name"], name
        assert "forward" not in vars(module) and "__getstate__" not in vars(module), name
    assert all(torch.equal(a, b) for a, b in zip(_run(case, model), expected))


def test_apply_serves_every_component_of_a_pipeline():
    from diffusers import DiffusionPipeline

    class TinyPipeline(DiffusionPipeline):
        def __init__(self, transformer, vae, scheduler=None):
            super().__init__()
            self.register_modules(transformer=transformer, vae=vae, scheduler=scheduler)

    flux, vae = BY_ID["FluxTransformer2DModel"], BY_ID["AutoencoderKL"]
    pipe = TinyPipeline(flux.build(0), vae.build(0))
    plan = attnkit.plan(pipe)
    assert set(plan) == {"transformer", "vae"}
    applied = attnkit.apply(pipe, attnkit.processor("vanilla"))
    assert set(applied) == {"transformer", "vae"}
    assert applied["transformer"].summary().endswith("through diffusers' dispatch_attention_fn")
    assert "vae: " in applied.explain() and "by attnkit's processor" in applied["vae"].summary()
    for name, case in (("transformer", flux), ("vae", vae)):
        stock = case.build(0)
        assert all(rel_error(a, b) < 1e-4 for a, b in zip(_run(case, getattr(pipe, name)), _run(case, stock)))
    applied.undo()
    assert _processor_classes(pipe.vae) == ["AttnProcessor2_0"]
    with pytest.raises(TypeError, match="a model .* or a diffusers pipeline"):
        attnkit.apply(object(), attnkit.auto())


# -- errors that say what to pass ----------------------------------------------------------------------
@pytest.mark.parametrize("mask", [torch.tensor(1.0), [[1, 1, 0]], "numpy"], ids=["0-d", "list", "numpy"])
def test_a_mask_that_is_not_a_tensor_of_the_right_rank_is_refused_clearly(mask):
    from diffusers.models.attention_processor import Attention

    if mask == "numpy":
        np = pytest.importorskip("numpy")
        mask = np.ones((1, 3), dtype=bool)
    attn = Attention(query_dim=32, heads=2, dim_head=16)
    attn.set_processor(attnkit.auto())
    with pytest.raises(ValueError, match=r"attention_mask is a .*pass a torch\.Tensor of shape \(batch, 3\)"):
        attn(torch.randn(1, 3, 32), attention_mask=mask)
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    q = torch.randn(1, 3, 2, 16)
    if not isinstance(mask, torch.Tensor):
        with pytest.raises(ValueError, match=r"attn_mask is a .*pass a torch\.Tensor of shape \(batch=1, keys=3\)"):
            dispatch_attention_fn(q, q, q, attn_mask=mask, backend="attnkit")


def test_auto_names_an_unknown_option_and_lists_the_options():
    with pytest.raises(TypeError, match=r"attnkit\.auto\(\) has no option 'foo'; its options are ") as info:
        attnkit.auto(foo=1)
    listed = str(info.value).split("its options are ")[1].split(" (")[0].split(", ")
    assert {"strict", "tune", "cache_path", "order", "exclude", "lossy", "guard"} <= set(listed)


def test_a_module_built_with_attnkits_processor_pickles_as_diffusers_default(seed):
    """Given attnkit's processor at construction (no processor replaced): saved with
    diffusers' default processor for that module, and the same output."""
    from diffusers.models.attention_processor import Attention

    attn = Attention(query_dim=32, heads=2, dim_head=16, processor=attnkit.auto())
    x = torch.randn(1, 5, 32)
    with torch.no_grad():
        expected = attn(x)
        buf = io.BytesIO()
        torch.save(attn, buf)
        loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
        assert type(loaded.processor).__name__ == "AttnProcessor2_0"
        assert rel_error(loaded(x), expected) < 1e-5


def test_a_kept_processor_gets_only_the_arguments_its_module_would_give_it():
    """attnkit's processor advertises every argument a diffusers processor takes, so the
    module passes them all; the stock processor it runs gets what the module would have
    given it (Flux's IP-Adapter loading passes ip_adapter_masks to every block, which
    FluxAttnProcessor does not take: a TypeError, where stock drops it quietly)."""
    case = BY_ID["FluxTransformer2DModel"]

    def run(model):
        inputs = case.make_inputs(model, 0)
        inputs["joint_attention_kwargs"] = {"ip_adapter_masks": None}
        with torch.no_grad():
            return case.run(model, inputs)

    expected = run(case.build(0))
    model = case.build(0)
    model.set_attn_processor(attnkit.processor("vanilla"))
    assert rel_error(run(model)[0], expected[0]) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    "case_id",
    [
        "FluxTransformer2DModel-masked",
        "SD3Transformer2DModel",
        "CogVideoXTransformer3DModel",
        "QwenImageTransformer2DModel",
    ],
)
def test_set_attn_processor_in_16_bits_is_as_close_to_float64_as_stock(case_id, dtype, seed):
    """The same input gives the same answer in every dtype, up to rounding: through
    set_attn_processor, a 16-bit model's error against float64 is at most twice stock's."""
    from tests.zoo._zoo import cast_floats

    case = BY_ID[case_id]
    m64 = case.build(seed, dtype=torch.float64)
    inputs = case.make_inputs(m64, seed)
    with torch.no_grad():
        ref = case.run(m64, cast_floats(inputs, torch.float64))
        stock = case.build(seed, dtype=dtype)
        base = case.run(stock, cast_floats(inputs, dtype))
        model = case.build(seed, dtype=dtype)
        model.set_attn_processor(attnkit.processor("vanilla"))
        out = case.run(model, cast_floats(inputs, dtype))
    for o, b, r in zip(out, base, ref):
        assert torch.isfinite(o).all()
        assert rel_error(o, r) <= 2 * rel_error(b, r), (rel_error(o, r), rel_error(b, r))


def test_arguments_stock_warns_about_are_dropped_with_its_warning(caplog):
    """SD3's JointAttnProcessor2_0 takes **kwargs, which diffusers' module does not count
    as a name: given image_rotary_emb, stock warns and drops it; so does attnkit."""
    case = BY_ID["SD3Transformer2DModel"]
    diffusers_logger = logging.getLogger("diffusers")  # it does not propagate to the root

    def run(model):
        inputs = case.make_inputs(model, 0)
        inputs["joint_attention_kwargs"] = {"image_rotary_emb": torch.randn(3)}
        caplog.clear()
        diffusers_logger.addHandler(caplog.handler)
        try:  # at WARNING whatever an earlier test left diffusers' verbosity at
            with (
                caplog.at_level(logging.WARNING),
                caplog.at_level(logging.WARNING, logger="diffusers"),
                torch.no_grad(),
            ):
                out = case.run(model, inputs)
        finally:
            diffusers_logger.removeHandler(caplog.handler)
        return out, [r.getMessage() for r in caplog.records if "not expected by" in r.getMessage()]

    expected, stock_warnings = run(case.build(0))
    model = case.build(0)
    model.set_attn_processor(attnkit.processor("vanilla"))
    out, warnings = run(model)
    assert rel_error(out[0], expected[0]) < 1e-5
    assert len(warnings) == len(stock_warnings) == 2
    assert all("['image_rotary_emb'] are not expected by JointAttnProcessor2_0" in w for w in warnings)


def test_a_processor_keeps_no_model_alive():
    import gc
    import weakref

    proc, refs = attnkit.auto(), []
    for _ in range(2):
        model = BY_ID["FluxTransformer2DModel"].build(0)
        attnkit.apply(model, proc)
        refs.append(weakref.ref(model))
        del model
    gc.collect()
    assert all(r() is None for r in refs)
    assert "FluxTransformer2DModel: 2 attention modules" in proc.explain()  # what it did is still said


@pytest.mark.parametrize(
    "kw, stock_name, what",
    [
        (dict(qk_norm="layer_norm"), "AttnProcessor", "qk-norm"),
        (dict(scale_qk=False), "AttnProcessor2_0", "attn.scale"),
    ],
    ids=["qk-norm-under-AttnProcessor", "scale-under-AttnProcessor2_0"],
)
def test_where_the_protocol_computes_what_a_generic_processor_skips_it_says_so(seed, kw, stock_name, what, caplog):
    """diffusers' AttnProcessor skips qk-norm and AttnProcessor2_0 ignores attn.scale;
    attnkit's processor set on such a module follows the module's configuration (its
    whole reason), which then differs from stock: never silently."""
    from diffusers.models import attention_processor as ap

    # said once per kind of module and process: a kind of module of this test's own
    fresh = type("Attention", (ap.Attention,), {})
    attn = fresh(query_dim=32, heads=2, dim_head=16, **kw).eval()
    attn.set_processor(getattr(ap, stock_name)())
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        attn.set_processor(attnkit.processor("vanilla"))
    (message,) = [r.getMessage() for r in caplog.records if r.name == "attnkit"]
    assert what in message and f"which the {stock_name} it replaces skips" in message
    assert "attnkit.apply reproduces" in message


@pytest.mark.parametrize("batch", [1, 2, 3])
@pytest.mark.parametrize("text_tokens", [8, 32], ids=["text<video", "text=video"])
def test_cogvideox_through_set_attn_processor_at_every_batch(seed, batch, text_tokens):
    """CogVideoX's processor returns (video, text): attnkit's protocol returned one tensor,
    which the block unpacked along the batch (shape errors at batch 1 and 3, and at batch 2
    with as many text as video tokens a silent answer 32% off)."""
    from diffusers import CogVideoXTransformer3DModel

    config = dict(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        time_embed_dim=8,
        text_embed_dim=16,
        num_layers=1,
        sample_width=8,
        sample_height=8,
        sample_frames=5,
        patch_size=2,
        temporal_compression_ratio=4,
        max_text_seq_length=text_tokens,
    )
    inputs = dict(
        hidden_states=torch.randn(batch, 2, 4, 8, 8),  # 2 x 4 x 4 = 32 video tokens
        encoder_hidden_states=torch.randn(batch, text_tokens, 16),
        timestep=torch.randint(0, 1000, (batch,)),
    )

    def run(proc):
        torch.manual_seed(seed)
        model = CogVideoXTransformer3DModel(**config).eval()
        if proc is not None:
            model.set_attn_processor(proc)
        with torch.no_grad():
            return model(**inputs).sample

    assert rel_error(run(attnkit.processor("vanilla")), run(None)) < 1e-5


@pytest.mark.parametrize("route", ["set_attn_processor", "apply", "set_attention_backend"])
@pytest.mark.parametrize("case_id", ["FluxTransformer2DModel", "SD3Transformer2DModel", "UNet2DConditionModel"])
def test_a_model_never_called_compiles_with_fullgraph_on_every_route(seed, case_id, route, restore_active_backend):
    """Every route binds its modules when it is set, not on the first call: nothing is
    left to read source code (or to take a lock) while torch.compile traces."""
    import torch._dynamo as dynamo

    case = BY_ID[case_id]
    model = case.build(seed)
    if route == "set_attention_backend":
        if case_id != "FluxTransformer2DModel":
            pytest.skip(f"{case_id}'s processors never dispatch: set_attention_backend does not reach them")
        model.set_attention_backend("attnkit")
    elif route == "apply":
        attnkit.apply(model, attnkit.auto())
    else:
        model.set_attn_processor(attnkit.auto())
    inputs = case.make_inputs(model, seed)
    dynamo.reset()
    try:
        with torch.no_grad():
            compiled = case.run(torch.compile(model, fullgraph=True, backend="eager"), inputs)
            eager = case.run(model, inputs)
    finally:
        dynamo.reset()
    assert all(rel_error(a, b) < 1e-5 for a, b in zip(compiled, eager))


def test_set_attention_backend_does_not_warn_about_modules_attnkit_already_serves(caplog, restore_active_backend):
    model = BY_ID["SD3Transformer2DModel"].build(0)
    attnkit.apply(model, attnkit.auto())
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        model.set_attention_backend("attnkit")
    assert not [r for r in caplog.records if r.name == "attnkit"]
