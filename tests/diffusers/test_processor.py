"""The diffusers-facing processor: every Attention option, masks, and clear refusals.

Each module option is checked in float64 against diffusers' own processor that
honours it (AttnProcessor, or AttnProcessor2_0 where qk-norm is involved, since
AttnProcessor skips norm_q/norm_k), and against a written-out reference where no stock
processor is right (qk-norm together with a custom scale, qk-norm across heads).
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from diffusers.models.attention_processor import (
    Attention,
    AttnAddedKVProcessor,
    AttnAddedKVProcessor2_0,
    AttnProcessor,
    AttnProcessor2_0,
)

import attnkit
from attnkit.errors import UnsupportedModule
from attnkit.testing import reference_attention, rel_error
from tests._masks import additive

PROCESSORS = {
    "vanilla": lambda: attnkit.VanillaProcessor(),
    "sliced": lambda: attnkit.SlicedProcessor(slice_size=3),
    "sdpa": lambda: attnkit.SDPAProcessor(),
    "sdpa-math": lambda: attnkit.SDPAProcessor(kernel="math"),
    "auto": lambda: attnkit.auto(),
}


def _module(**kw) -> Attention:
    torch.manual_seed(1234)
    attn = Attention(**kw).double().eval()
    # random, non-trivial norm parameters so a skipped norm cannot pass
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return attn


def _written_out_reference(attn: Attention, x: torch.Tensor, ehs: torch.Tensor | None, mask=None) -> torch.Tensor:
    """Attention's documented computation, step by step, in float64."""
    b, m, _ = x.shape
    ctx = x if ehs is None else ehs
    q, k, v = attn.to_q(x), attn.to_k(ctx), attn.to_v(ctx)
    h = attn.heads
    d = q.shape[-1] // h
    if attn.norm_q is not None and getattr(attn.norm_q, "normalized_shape", (d,))[0] == h * d:
        q, k = attn.norm_q(q), attn.norm_k(k)
        per_head = False
    else:
        per_head = attn.norm_q is not None
    q = q.view(b, m, h, d).transpose(1, 2)
    k = k.view(b, -1, h, d).transpose(1, 2)
    v = v.view(b, -1, h, d).transpose(1, 2)
    if per_head:
        q, k = attn.norm_q(q), attn.norm_k(k)
    out = reference_attention(q, k, v, mask, attn.scale)
    out = attn.to_out[0](out.transpose(1, 2).reshape(b, m, h * d))
    return out


def _run(attn, proc, *args, **kw):
    attn.set_processor(proc)
    with torch.no_grad():
        return attn(*args, **kw)


OPTION_CASES = {
    # name: (Attention kwargs, input kind, which stock processor is right)
    "self": (dict(query_dim=64, heads=4, dim_head=16), "seq", AttnProcessor),
    "cross": (dict(query_dim=64, cross_attention_dim=24, heads=2, dim_head=40), "cross", AttnProcessor),
    "scale_qk_false": (dict(query_dim=64, heads=4, dim_head=16, scale_qk=False), "seq", AttnProcessor),
    # diffusers casts float64 to float32 when upcasting, so the reference is written out.
    "upcast": (dict(query_dim=64, heads=4, dim_head=16, upcast_attention=True, upcast_softmax=True), "seq", None),
    "group_norm_residual_4d": (
        dict(
            query_dim=64,
            heads=1,
            dim_head=64,
            norm_num_groups=8,
            residual_connection=True,
            rescale_output_factor=2.0,
            bias=True,
        ),
        "image",
        AttnProcessor,
    ),
    "spatial_norm": (dict(query_dim=32, heads=1, dim_head=32, spatial_norm_dim=4), "image-temb", AttnProcessor),
    "norm_cross_layer": (
        dict(query_dim=64, cross_attention_dim=24, heads=2, dim_head=32, cross_attention_norm="layer_norm"),
        "cross",
        AttnProcessor,
    ),
    "norm_cross_group": (
        dict(
            query_dim=64,
            cross_attention_dim=24,
            heads=2,
            dim_head=32,
            cross_attention_norm="group_norm",
            cross_attention_norm_num_groups=4,
        ),
        "cross",
        AttnProcessor,
    ),
    "qk_layer_norm": (dict(query_dim=64, heads=4, dim_head=16, qk_norm="layer_norm"), "seq", AttnProcessor2_0),
    "qk_rms_norm": (dict(query_dim=64, heads=4, dim_head=16, qk_norm="rms_norm"), "seq", AttnProcessor2_0),
    "qk_l2": (dict(query_dim=64, heads=4, dim_head=16, qk_norm="l2"), "seq", AttnProcessor2_0),
    "qk_norm_custom_scale": (dict(query_dim=64, heads=4, dim_head=16, qk_norm="rms_norm", scale_qk=False), "seq", None),
    "qk_norm_across_heads": (
        dict(query_dim=64, heads=4, kv_heads=4, dim_head=16, qk_norm="layer_norm_across_heads"),
        "seq",
        None,
    ),
    "out_dim": (dict(query_dim=48, heads=3, dim_head=16, out_dim=48), "seq", AttnProcessor),
}


def _inputs(kind, attn):
    if kind == "seq":
        return (torch.randn(2, 37, attn.query_dim, dtype=torch.float64),), {}
    if kind == "cross":
        return (
            torch.randn(2, 37, attn.query_dim, dtype=torch.float64),
            torch.randn(2, 77, attn.cross_attention_dim, dtype=torch.float64),
        ), {}
    if kind == "image":
        return (torch.randn(2, attn.query_dim, 6, 5, dtype=torch.float64),), {}
    if kind == "image-temb":
        return (torch.randn(2, attn.query_dim, 6, 6, dtype=torch.float64),), {
            "temb": torch.randn(2, 4, 3, 3, dtype=torch.float64)
        }
    raise AssertionError(kind)


@pytest.mark.parametrize("proc_name", list(PROCESSORS))
@pytest.mark.parametrize("case", list(OPTION_CASES))
def test_every_attention_option_is_honoured(seed, case, proc_name):
    kw, kind, stock = OPTION_CASES[case]
    attn = _module(**kw)
    args, extra = _inputs(kind, attn)
    if stock is not None:
        ref = _run(attn, stock(), *args, **extra)
    else:
        with torch.no_grad():
            ref = _written_out_reference(attn, args[0], args[1] if len(args) > 1 else None)
    out = _run(attn, PROCESSORS[proc_name](), *args, **extra)
    assert out.shape == ref.shape
    assert rel_error(out, ref) < 1e-12


def test_stock_processors_miss_what_we_honour(seed):
    """The reason this package exists: diffusers' AttnProcessor skips qk-norm and
    AttnProcessor2_0 ignores attn.scale; attnkit gets both right."""
    attn = _module(query_dim=64, heads=4, dim_head=16, qk_norm="rms_norm", scale_qk=False)
    x = torch.randn(2, 37, 64, dtype=torch.float64)
    with torch.no_grad():
        ref = _written_out_reference(attn, x, None)
    assert rel_error(_run(attn, AttnProcessor(), x), ref) > 1e-3
    assert rel_error(_run(attn, AttnProcessor2_0(), x), ref) > 1e-3
    assert rel_error(_run(attn, attnkit.SDPAProcessor(), x), ref) < 1e-12


# -- masks, as diffusers hands them over ---------------------------------------------


def _mask_variants(b, h, m, n):
    keep = torch.rand(b, n) > 0.3
    keep[:, 0] = True
    add = (~keep).double() * -10000.0
    full = torch.randn(b, m, n, dtype=torch.float64)
    return {
        # the UNet turns encoder_attention_mask (B, N) into (B, 1, N) -10000 bias
        "unet-encoder-mask": (add[:, None, :], add[:, None, None, :]),
        "bool-2d": (keep, additive(keep[:, None, None, :])),
        "bool-3d": (keep[:, None, :], additive(keep[:, None, None, :])),
        "additive-2d": (add, add[:, None, None, :]),
        # after Attention.prepare_attention_mask: (B*H, 1, N)
        "prepared-bh": (add.repeat_interleave(h, 0)[:, None, :], add[:, None, None, :]),
        "full-3d": (full, full[:, None]),
        "per-head-4d": (torch.randn(1, h, 1, n, dtype=torch.float64),) * 2,
        "full-4d": (torch.randn(b, h, m, n, dtype=torch.float64),) * 2,
    }


@pytest.mark.parametrize("proc_name", ["vanilla", "sliced", "sdpa"])
@pytest.mark.parametrize("variant", list(_mask_variants(2, 2, 5, 7)))
def test_masks_in_every_form_diffusers_produces(seed, proc_name, variant):
    attn = _module(query_dim=32, cross_attention_dim=16, heads=2, dim_head=16)
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    ehs = torch.randn(2, 7, 16, dtype=torch.float64)
    mask, as_bias4d = _mask_variants(2, 2, 5, 7)[variant]
    with torch.no_grad():
        ref = _written_out_reference(attn, x, ehs, mask=as_bias4d)
    out = _run(attn, PROCESSORS[proc_name](), x, ehs, attention_mask=mask)
    assert rel_error(out, ref) < 1e-12


def test_diffusers_mask_matches_stock_processor(seed):
    """A -10000 additive key-padding mask gives what diffusers' AttnProcessor gives."""
    attn = _module(query_dim=32, cross_attention_dim=16, heads=2, dim_head=16)
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    ehs = torch.randn(2, 7, 16, dtype=torch.float64)
    keep = torch.rand(2, 7) > 0.4
    keep[:, 0] = True
    mask = ((~keep).double() * -10000.0)[:, None, :]
    ref = _run(attn, AttnProcessor(), x, ehs, attention_mask=mask)
    for name in PROCESSORS:
        assert rel_error(_run(attn, PROCESSORS[name](), x, ehs, attention_mask=mask), ref) < 1e-12, name


# -- refusals: a clear ValueError, never a wrong answer or a deep shape error ---------


# Modules with options attnkit's own computation does not cover: served exactly as their
# stock processor computes them where that processor calls scaled_dot_product_attention
# (attnkit takes that call), kept on the stock processor otherwise (one warning naming the
# module), and refused in strict mode when kept.
def _added_kv_args():
    return torch.randn(1, 32, 2, 2, dtype=torch.float64), torch.randn(1, 3, 8, dtype=torch.float64)


def _seq_args(ctx_dim=None):
    x = torch.randn(1, 4, 32, dtype=torch.float64)
    return lambda: (x,) if ctx_dim is None else (x, torch.randn(1, 3, ctx_dim, dtype=torch.float64))


_ADDED_KV = dict(
    query_dim=32,
    heads=2,
    dim_head=16,
    added_kv_proj_dim=8,
    norm_num_groups=4,
    cross_attention_norm="group_norm",
    cross_attention_norm_num_groups=4,
    residual_connection=True,
)
UNUSUAL_MODULES = {
    # name: (Attention kwargs, stock processor, inputs, kept (True) or served through its SDPA call)
    "added-kv-matmul": (_ADDED_KV, AttnAddedKVProcessor, _added_kv_args, True),
    "added-kv-sdpa": (_ADDED_KV, AttnAddedKVProcessor2_0, _added_kv_args, False),
    "joint": (
        dict(query_dim=32, heads=2, dim_head=16, added_kv_proj_dim=32, context_pre_only=False),
        AttnProcessor2_0,
        _seq_args(32),
        False,
    ),
    "causal": (dict(query_dim=32, heads=2, dim_head=16, is_causal=True), AttnProcessor2_0, _seq_args(), False),
}


@pytest.mark.parametrize("case", sorted(UNUSUAL_MODULES))
@pytest.mark.parametrize("name", ["vanilla", "sdpa", "auto"])
def test_module_with_unusual_options_computes_what_its_stock_processor_does(case, name, caplog):
    kw, stock, make_args, kept = UNUSUAL_MODULES[case]
    attn = _module(**kw)
    attn.set_processor(stock())
    args = make_args()
    with torch.no_grad():
        want = attn(*args)
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        got = _run(attn, PROCESSORS[name](), *args)
    assert torch.isfinite(got).all()
    if kept:  # the stock processor itself: bit-equal
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    else:  # attnkit's computation of the same attention, float64
        assert rel_error(got, want) < 1e-12
    said = [r.getMessage() for r in caplog.records if r.name == "attnkit" and "keeps" in r.getMessage()]
    if kept:
        assert len(said) == 1 and stock.__name__ in said[0] and "Attention(heads=2" in said[0], said
    else:
        assert not said


@pytest.mark.parametrize("case", sorted(UNUSUAL_MODULES))
def test_strict_refuses_only_what_it_would_keep(case):
    kw, stock, make_args, kept = UNUSUAL_MODULES[case]
    attn = _module(**kw)
    attn.set_processor(stock())
    args = make_args()
    with torch.no_grad():
        want = attn(*args)
    attn.set_processor(attnkit.SDPAProcessor(strict=True))
    if not kept:
        assert rel_error(attn(*args).detach(), want) < 1e-12
        return
    with pytest.raises(UnsupportedModule, match=rf"strict.*cannot serve Attention.*{stock.__name__} computes"):
        attn(*args)


def test_strict_from_the_environment(monkeypatch):
    kw, stock, make_args, _ = UNUSUAL_MODULES["added-kv-matmul"]
    monkeypatch.setenv("ATTNKIT_STRICT", "1")
    attn = _module(**kw)
    attn.set_processor(stock())
    attn.set_processor(attnkit.auto())
    with pytest.raises(UnsupportedModule, match="ATTNKIT_STRICT"):
        attn(*make_args())


def test_refuses_ip_adapter_tuple_and_names_the_fix():
    attn = Attention(query_dim=32, cross_attention_dim=16, heads=2, dim_head=16)
    attn.set_processor(attnkit.SDPAProcessor())
    with pytest.raises(UnsupportedModule, match=r"IP-Adapter.*attnkit\.apply"):
        attn(torch.randn(1, 4, 32), (torch.randn(1, 3, 16), [torch.randn(1, 4, 16)]))


@pytest.mark.parametrize(
    "mask,match",
    [
        (torch.zeros(2, 1, 9), "has 9 keys .* keys have 7 tokens"),
        (torch.zeros(3, 1, 7), r"shape \(3, 1, 7\) does not broadcast to \(batch=2, heads=2"),
        (torch.zeros(2, 4, 7), r"does not broadcast"),
        (torch.ones(2, 1, 7, dtype=torch.int64), "dtype torch.int64"),
    ],
    ids=["wrong-key-length", "wrong-batch", "wrong-query-length", "int-mask"],
)
def test_bad_masks_are_refused_clearly(mask, match):
    attn = Attention(query_dim=32, cross_attention_dim=16, heads=2, dim_head=16)
    attn.set_processor(attnkit.SDPAProcessor())
    with pytest.raises(ValueError, match=match):
        attn(torch.randn(2, 5, 32), torch.randn(2, 7, 16), attention_mask=mask)


def test_named_backend_refuses_instead_of_falling_back():
    """A pinned kernel that cannot take the call raises with its reasons."""
    attn = Attention(query_dim=32, heads=2, dim_head=16)
    attn.set_processor(attnkit.SDPAProcessor(kernel="efficient"))
    with pytest.raises(attnkit.BackendUnavailable, match=r"'sdpa' cannot serve .*device=cpu \(supported: cuda\)"):
        attn(torch.randn(1, 4, 32))


def test_processor_factory_and_errors():
    assert isinstance(attnkit.processor("vanilla"), attnkit.VanillaProcessor)
    assert attnkit.processor("sliced", slice_size="max").backend.slice_size == "max"
    assert attnkit.processor("sdpa", kernel="math").backend.kernel == "math"
    with pytest.raises(ValueError, match="unknown processor 'fast'.*vanilla, sliced, sdpa"):
        attnkit.processor("fast")
    with pytest.raises(TypeError):
        attnkit.processor("vanilla", slice_size=2)


def test_deprecated_scale_kwarg_is_accepted_quietly(caplog):
    attn = _module(query_dim=32, heads=2, dim_head=16)
    x = torch.randn(1, 4, 32, dtype=torch.float64)
    ref = _run(attn, AttnProcessor(), x)
    attn.set_processor(attnkit.SDPAProcessor())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with caplog.at_level(logging.WARNING):
            with torch.no_grad():
                out = attn(x, scale=0.5)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert rel_error(out, ref) < 1e-12


def test_one_instance_serves_every_module_of_a_model(seed):
    """set_attn_processor shares one processor object: it must hold no per-layer state."""
    from diffusers.models.attention_processor import AttnProcessor2_0

    from tests.diffusers._models import cast_inputs, float64_copy, tiny_sd15_unet, unet_inputs

    unet = tiny_sd15_unet()
    kw = unet_inputs(unet, batch=1)
    with torch.no_grad():
        unet.set_attn_processor(AttnProcessor2_0())
        stock = unet(**kw).sample
        ref = float64_copy(unet)(**cast_inputs(kw, torch.float64)).sample
        proc = attnkit.SDPAProcessor()
        unet.set_attn_processor(proc)
        assert all(p is proc for p in unet.attn_processors.values())
        a = unet(**kw).sample
        b = unet(**kw).sample
    assert torch.equal(a, b)
    # every module through the one instance: as close to float64 as diffusers' own is
    assert rel_error(a, ref) <= 2 * rel_error(stock, ref) + 1e-6


def test_apply_keeps_ip_adapter_processors_and_names_modules():
    from diffusers.models.attention_processor import IPAdapterAttnProcessor2_0

    from tests.diffusers._models import tiny_sd15_unet

    unet = tiny_sd15_unet()
    names = list(unet.attn_processors)
    ip_name = next(n for n in names if "attn2" in n)
    procs = {n: AttnProcessor2_0() for n in names}
    procs[ip_name] = IPAdapterAttnProcessor2_0(hidden_size=160, cross_attention_dim=64, num_tokens=(4,))
    unet.set_attn_processor(procs)
    report = attnkit.apply(unet, attnkit.SDPAProcessor())
    ip_module = ip_name.rsplit(".processor", 1)[0]  # the report is by module name
    assert report[ip_module] == "IPAdapterAttnProcessor2_0"
    assert report.routes[ip_module].kind == "kept" and "carries weights" in report.routes[ip_module].reason
    assert sum(v == "attnkit" for v in report.values()) == len(names) - 1
    assert isinstance(unet.attn_processors[ip_name], IPAdapterAttnProcessor2_0)
    module = dict(unet.named_modules())[ip_module]
    assert module._attnkit_name == ip_module
    from attnkit.text import describe_module

    assert describe_module(module).startswith(module._attnkit_name + " [Attention(heads=")


@pytest.mark.parametrize("proc_name", ["vanilla", "sliced", "sdpa", "sdpa-math"])
def test_processors_compile_without_graph_breaks(seed, proc_name):
    """torch.compile(fullgraph=True) traces the whole processor: no graph break, same result."""
    import torch._dynamo as dynamo

    attn = Attention(query_dim=32, cross_attention_dim=16, heads=2, dim_head=16).eval()
    attn.set_processor(PROCESSORS[proc_name]())
    x, ehs = torch.randn(2, 9, 32), torch.randn(2, 7, 16)
    mask = torch.zeros(2, 1, 7)
    mask[0, :, 3:] = -10000.0
    dynamo.reset()
    explained = dynamo.explain(attn)(x, ehs, attention_mask=mask)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(attn, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        assert rel_error(compiled(x, ehs, attention_mask=mask), attn(x, ehs, attention_mask=mask)) < 1e-6


@pytest.mark.parametrize("proc_name", ["sdpa", "vanilla", "auto"])
def test_compiled_processor_does_not_recompile(seed, proc_name):
    """The capability check is a trace-time constant: calls after the first compiled one,
    and eager calls in between, reuse the graph instead of failing a guard."""
    import torch._dynamo as dynamo
    from torch._dynamo.testing import CompileCounter

    attn = Attention(query_dim=32, cross_attention_dim=16, heads=2, dim_head=16).eval()
    proc = PROCESSORS[proc_name]()
    attn.set_processor(proc)
    dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(attn, fullgraph=True, backend=counter)
    x, ehs = torch.randn(2, 9, 32), torch.randn(2, 7, 16)
    with torch.no_grad():
        compiled(x, ehs)
        attn(torch.randn(1, 5, 32), torch.randn(1, 3, 16))  # eager call of another shape
        attn(x, ehs)
        compiled(x, ehs)
        compiled(torch.randn(2, 9, 32), torch.randn(2, 7, 16))
    assert counter.frame_count == 1


def _python_constants(value) -> bool:
    """Whether torch.compile of every torch version we support takes this as a constant."""
    if isinstance(value, (tuple, list)):
        return all(_python_constants(x) for x in value)
    return value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device))


@pytest.mark.parametrize("proc_name", ["sdpa", "vanilla", "auto"])
def test_trace_time_choices_take_only_constants(monkeypatch, seed, proc_name):
    """Found on an H100 with torch 2.11: every compiled attnkit processor failed with
    InternalTorchDynamoError ("UserDefinedObjectVariable(FixedChooser) is not a
    constant"): a trace-time constant (torch.compiler.assume_constant_result) was handed
    the chooser itself. torch 2.13 accepts that, so this test records what the trace-time
    functions are given while the processor compiles, and requires plain constants."""
    import importlib

    import torch._dynamo as dynamo

    from attnkit.choose.compiling import mark_compile_constant

    processor_mod = importlib.import_module("attnkit.choose.fixed")  # FixedChooser's trace-time function
    chooser_mod = importlib.import_module("attnkit.choose.auto")

    given = []
    for mod, name in ((processor_mod, "_fixed_problem"), (chooser_mod, "_compiled_choice")):
        real = getattr(mod, name)

        def spy(*args, _real=real, _name=name):
            given.append((_name, args))
            return _real(*args)

        monkeypatch.setattr(mod, name, spy)
        mark_compile_constant(spy)
    attn = Attention(query_dim=32, cross_attention_dim=16, heads=2, dim_head=16).eval()
    attn.set_processor(PROCESSORS[proc_name]())
    dynamo.reset()
    compiled = torch.compile(attn, fullgraph=True, backend="aot_eager")
    x, ehs = torch.randn(2, 9, 32), torch.randn(2, 7, 16)
    with torch.no_grad():
        assert rel_error(compiled(x, ehs), attn(x, ehs)) < 1e-6
    assert given, "the processor made no trace-time choice while compiling"
    for name, args in given:
        assert _python_constants(args), f"{name} was given {[type(a).__name__ for a in args]}"


@pytest.mark.parametrize("proc_name", ["sdpa", "auto"])
def test_compiles_with_dynamic_shapes_and_with_the_processor_as_an_argument(seed, proc_name):
    """torch.compile(dynamic=True) traces a processor (the dropout flag of its trace-time
    choice was a symbolic bool there), and a compiled function handed one processor after
    another compiles for each (a chooser's token read from an argument stays a constant:
    an int token became symbolic on the second processor)."""
    import torch._dynamo as dynamo

    attn = Attention(query_dim=32, cross_attention_dim=16, heads=2, dim_head=16).eval()
    attn.set_processor(PROCESSORS[proc_name]())
    dynamo.reset()
    compiled = torch.compile(attn, fullgraph=True, backend="eager", dynamic=True)
    with torch.no_grad():
        for length in (9, 13):
            x, ehs = torch.randn(2, length, 32), torch.randn(2, 7, 16)
            assert rel_error(compiled(x, ehs), attn(x, ehs)) < 1e-6

    def call(proc, module, x, ehs):
        return proc(module, x, ehs)

    dynamo.reset()
    compiled_call = torch.compile(call, fullgraph=True, backend="eager")
    x, ehs = torch.randn(2, 9, 32), torch.randn(2, 7, 16)
    with torch.no_grad():
        for proc in (PROCESSORS[proc_name]() for _ in range(3)):
            assert rel_error(compiled_call(proc, attn, x, ehs), attn(x, ehs)) < 1e-6
    dynamo.reset()


def test_copies_of_a_processor_choose_for_compile_with_their_own_chooser():
    """A chooser stands for itself in trace-time choices by a token; a deep copy and an
    unpickled copy get their own token, which leads back to the copy."""
    import copy
    import pickle

    from attnkit.choose.compiling import compile_owner

    for proc in (attnkit.auto(), attnkit.SDPAProcessor()):
        copies = [copy.deepcopy(proc), pickle.loads(pickle.dumps(proc)), copy.copy(proc.chooser)]
        tokens = {proc.chooser.compile_token}
        for c in copies:
            chooser = getattr(c, "chooser", c)
            assert chooser.compile_token not in tokens
            tokens.add(chooser.compile_token)
            assert compile_owner(chooser.compile_token) is chooser
        assert compile_owner(proc.chooser.compile_token) is proc.chooser


def test_grouped_query_attention(seed):
    """kv_heads < heads: each key/value head serves heads // kv_heads query heads."""
    attn = _module(query_dim=64, heads=4, kv_heads=2, dim_head=16)
    x = torch.randn(2, 13, 64, dtype=torch.float64)
    with torch.no_grad():
        q = attn.to_q(x).view(2, 13, 4, 16).transpose(1, 2)
        k = attn.to_k(x).view(2, 13, 2, 16).transpose(1, 2).repeat_interleave(2, dim=1)
        v = attn.to_v(x).view(2, 13, 2, 16).transpose(1, 2).repeat_interleave(2, dim=1)
        ref = attn.to_out[0](reference_attention(q, k, v, None, attn.scale).transpose(1, 2).reshape(2, 13, 64))
    for name in ("vanilla", "sdpa"):
        assert rel_error(_run(attn, PROCESSORS[name](), x), ref) < 1e-12, name


def test_fused_qkv_projections(seed):
    """After unet.fuse_qkv_projections() the fused to_qkv / to_kv weights are used, with
    the same result as the separate projections."""
    from tests.diffusers._models import tiny_sd15_unet, unet_inputs

    unet = tiny_sd15_unet()
    kw = unet_inputs(unet, batch=1, text_len=9)
    unet.set_attn_processor(attnkit.SDPAProcessor())
    with torch.no_grad():
        ref = unet(**kw).sample
        unet.fuse_qkv_projections()
        unet.set_attn_processor(attnkit.SDPAProcessor())
        modules = [m for m in unet.modules() if isinstance(m, Attention)]
        assert all(m.fused_projections for m in modules)
        # the separate weights must not be what runs: spoil them
        for m in modules:
            m.to_k.weight.add_(1.0)
        out = unet(**kw).sample
    assert rel_error(out, ref) < 1e-5


def test_a_transformer_attention_module_compiles_before_its_first_call(seed):
    """A diffusers transformer module (AttentionModuleMixin) given an attnkit processor by
    set_processor is bound there and then (binding reads its processor's source, which
    torch.compile cannot trace): fullgraph=True compiles it before any eager call, and
    matches eager. A processor called on a module it was never set on cannot be bound
    while tracing: fullgraph stops with attnkit's message (what to do)."""
    import torch._dynamo as dynamo

    flux = pytest.importorskip("diffusers.models.transformers.transformer_flux")

    def module(proc=None):
        torch.manual_seed(0)
        attn = flux.FluxAttention(query_dim=32, heads=2, dim_head=16).eval()
        if proc is not None:
            attn.set_processor(proc)
        return attn

    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        expected = module(attnkit.auto())(x)
        dynamo.reset()
        assert rel_error(torch.compile(module(attnkit.auto()), fullgraph=True, backend="eager")(x), expected) < 1e-6
        dynamo.reset()
        proc, attn = attnkit.auto(), module()

        def call(x):
            return proc(attn, x)

        with pytest.raises(Exception, match="for the first time under torch.compile"):
            torch.compile(call, fullgraph=True, backend="eager")(x)
    dynamo.reset()
