"""Every change attnkit makes to diffusers is one of attnkit/diffusers/hooks.py's hooks,
nothing else changes diffusers, ``hooks.uninstall()`` gives diffusers back as it was,
and a hook diffusers does not allow is named and left out.

The whole-process checks run in a fresh interpreter: diffusers' classes, module globals,
backend enum and registry are read before ``import attnkit``, after it, after models ran
on every route (apply, set_attn_processor, set_attention_backend, the attention_backend
context), after undo(), and after uninstall(); each difference must be a hook's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import attnkit
from attnkit.diffusers import backend as diffusers_backend
from attnkit.diffusers import hooks, hooks_base
from tests.zoo._zoo import BY_ID

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent(
    r"""
    import gc, json, sys, warnings, logging
    warnings.simplefilter("ignore")
    mode = sys.argv[1]
    import torch
    import diffusers
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel, UNet2DConditionModel
    from diffusers.models import attention_dispatch as d
    from diffusers.models import attention_processor as ap
    from diffusers.models.attention import AttentionMixin

    def snapshot():
        state = {}
        for name, mod in list(sys.modules.items()):
            if mod is None or not (name == "diffusers" or name.startswith("diffusers.")):
                continue
            for key, value in list(vars(mod).items()):
                state[f"{name}:{key}"] = id(value)
                if isinstance(value, type) and value.__module__ == name:
                    for attr, item in list(vars(value).items()):
                        if attr != "__slotnames__":  # copyreg's cache, written by any copy.copy
                            state[f"{name}:{key}.{attr}"] = id(item)
        state["enum"] = sorted(d.AttentionBackendName._value2member_map_)
        state["registry"] = sorted(str(m.value) for m in d._AttentionBackendRegistry._backends)
        return state

    def diff(a, b):
        keys = set(a) | set(b)
        return sorted(k for k in keys if a.get(k) != b.get(k) and k not in ("enum", "registry"))

    out = {}
    if mode == "missing":  # a diffusers whose AttentionMixin has no set_attn_processor
        del AttentionMixin.set_attn_processor
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        logging.getLogger("attnkit").addHandler(handler)
        import attnkit
        from attnkit.diffusers import hooks
        out["warnings"] = [r.getMessage() for r in records if r.levelno == logging.WARNING]
        out["status"] = hooks.status()
        print(json.dumps(out))
        sys.exit(0)

    diffusers.ModelMixin, diffusers.models.ModelMixin  # diffusers' lazy modules cache what is read
    active0 = d._AttentionBackendRegistry._active_backend
    s0 = snapshot()
    import attnkit
    from attnkit.diffusers import hooks
    from tests.zoo._zoo import BY_ID
    s1 = snapshot()
    changed = diff(s0, s1)
    wrapped = {}
    for key in changed:
        mod, _, rest = key.partition(":")
        cls_name, _, attr = rest.partition(".")
        obj = vars(sys.modules[mod]).get(cls_name)
        item = vars(obj).get(attr) if isinstance(obj, type) and attr else None
        fn = getattr(item, "__func__", item)
        wrapped[key] = bool(getattr(fn, "_attnkit_wrapped", False))
    out["import"] = {"changed": changed, "wrapped": wrapped,
                     "names": sorted(set(s1["enum"]) - set(s0["enum"])),
                     "registry": sorted(set(s1["registry"]) - set(s0["registry"]))}

    # every route, then everything undone and dropped
    ran = []
    with torch.no_grad():
        flux = BY_ID["FluxTransformer2DModel-masked"]
        model = flux.build(0)
        applied = attnkit.apply(model, attnkit.auto())
        flux.run(model, flux.make_inputs(model, 0))
        sd3 = BY_ID["SD3Transformer2DModel"]
        model2 = sd3.build(0)
        model2.set_attn_processor(attnkit.auto())
        sd3.run(model2, sd3.make_inputs(model2, 0))
        model3 = flux.build(1)
        model3.set_attention_backend("attnkit")
        flux.run(model3, flux.make_inputs(model3, 0))
        unet = BY_ID["UNet2DConditionModel"]
        model4 = unet.build(0)
        from diffusers.models.attention_dispatch import attention_backend
        with attention_backend("attnkit"):
            unet.run(model4, unet.make_inputs(model4, 0))
            out["watching"] = hooks.watching()
        model4.set_attn_processor(attnkit.auto())
        model4.set_default_attn_processor()
    s2 = snapshot()
    # diffusers' model.set_attention_backend made attnkit the process-wide backend too (its
    # reset_attention_backend does not undo that): set back as diffusers' context does
    d._AttentionBackendRegistry.set_active_backend(active0)
    out["watching_after_reset"] = hooks.watching()
    out["running"] = {"changed": diff(s1, s2), "names": sorted(set(s2["enum"]) - set(s1["enum"]))}
    applied.undo()
    del applied, model, model2, model3, model4
    gc.collect()
    attnkit.diffusers.backend.registered_names()  # names of freed choosers leave at the next look-up
    s3 = snapshot()
    out["undone"] = {"changed": diff(s1, s3), "names": s3["enum"] == s1["enum"], "registry": s3["registry"] == s1["registry"]}

    out["stayed"] = hooks.uninstall()
    s4 = snapshot()
    out["uninstalled"] = {"changed": diff(s0, s4), "enum": s4["enum"] == s0["enum"],
                          "registry": s4["registry"] == s0["registry"]}

    class LaterModel(diffusers.ModelMixin):  # defined while uninstalled: diffusers' own
        def set_default_attn_processor(self):
            return "stock"

    hooks.install()
    s5 = snapshot()
    out["reinstalled"] = {"same_keys": diff(s0, s5) == changed, "enum": s5["enum"] == s1["enum"],
                          "later_wrapped": getattr(LaterModel.set_default_attn_processor, "_attnkit_wrapped", False)}
    print(json.dumps(out))
    """
)


def _run(mode: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, mode], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def whole_process():
    return _run("routes")


def test_import_changes_only_what_the_hooks_say(whole_process):
    at_import = whole_process["import"]
    assert at_import["changed"], "import attnkit changed nothing of diffusers: the snapshot reads nothing"
    unexplained = [k for k, ok in at_import["wrapped"].items() if not ok]
    assert not unexplained, f"changed at import, not by a hook: {unexplained}"
    # what hooks.py says it changes, and nothing else
    attrs = {k.rsplit(".", 1)[-1] for k in at_import["changed"]}
    assert attrs == {
        "set_processor",
        "set_attn_processor",
        "set_default_attn_processor",
        "set_attention_backend",
        "set_active_backend",
        "__init_subclass__",
    }, attrs
    assert at_import["names"] and all(n.startswith("attnkit") for n in at_import["names"])
    assert set(at_import["registry"]) == set(at_import["names"])


def test_running_every_route_then_undo_leaves_nothing(whole_process):
    running = whole_process["running"]
    assert whole_process["watching"], "the attention_backend context did not watch the first call"
    assert not whole_process["watching_after_reset"], "ModelMixin.__call__ stayed attnkit's"
    # while models are served: the sdpa route's per-chooser module globals, a name per chooser,
    # and, while an attnkit name is the process-wide backend, the watched ModelMixin.__call__
    assert set(running["changed"]) - {
        "diffusers.models.attention_dispatch:_AttentionBackendRegistry._active_backend",
        "diffusers.models.modeling_utils:ModelMixin.__call__",
    } == {k for k in running["changed"] if k.split(":")[1].startswith("_attnkit_")}, running["changed"]
    assert any(k.split(":")[1].startswith("_attnkit_") for k in running["changed"])
    undone = whole_process["undone"]
    assert undone["changed"] == [] and undone["names"] and undone["registry"], undone


def test_uninstall_gives_diffusers_back_and_install_again_works(whole_process):
    assert whole_process["stayed"] == []
    uninstalled = whole_process["uninstalled"]
    assert uninstalled == {"changed": [], "enum": True, "registry": True}, uninstalled
    assert whole_process["reinstalled"] == {"same_keys": True, "enum": True, "later_wrapped": True}


def test_a_hook_diffusers_does_not_allow_is_named_and_left_out():
    result = _run("missing")
    status = {s["name"]: s for s in result["status"]}
    assert not status["set_attn_processor"]["installed"]
    assert "AttentionMixin.set_attn_processor is missing" in status["set_attn_processor"]["problem"]
    assert all(s["installed"] for name, s in status.items() if name != "set_attn_processor" and not s["on_demand"])
    warnings = result["warnings"]
    assert len(warnings) == 1, warnings
    import diffusers

    assert f"diffusers {diffusers.__version__}" in warnings[0] and "set_attn_processor" in warnings[0]
    assert "does not say which modules attnkit keeps" in warnings[0] and "works without them" in warnings[0]


def test_status_on_this_diffusers():
    at_import = [s for s in hooks.status() if not s["on_demand"]]
    assert len(at_import) == len(hooks.HOOKS)
    assert all(s["installed"] and s["problem"] is None for s in at_import), hooks.status()
    assert [s["name"] for s in hooks.status() if s["on_demand"]] == [h.name for h in hooks.ON_DEMAND]


def test_the_gloo_hook_is_installed_on_demand_and_uninstall_takes_it_out(reinstall):
    """attnkit.diffusers.context_parallel.enable_parallelism's changes to diffusers' context parallelism are
    a hook like the others: not made by import attnkit, made by the call that needs them,
    named by status(), and undone by uninstall() (diffusers' own function back, the
    logger without the method attnkit gave it)."""
    from diffusers.hooks import context_parallel as cp

    wanted = hooks.GLOO.wanted
    if hooks.GLOO.installed:  # an earlier test ran enable_parallelism in this process
        hooks.GLOO.uninstall()
    hooks.GLOO.wanted = False
    original = cp._all_gather_anything
    had_warning_once = "warning_once" in vars(cp.logger)
    assert not getattr(original, hooks_base.WRAPPED, False)
    hooks.install()
    assert cp._all_gather_anything is original, "install() made an on-demand change"
    assert hooks.install_on_demand(hooks.GLOO) and hooks.install_on_demand(hooks.GLOO)  # idempotent
    wrapped = cp._all_gather_anything
    assert wrapped is not original and getattr(wrapped, hooks_base.WRAPPED) and wrapped.__wrapped__ is original
    assert callable(cp.logger.warning_once)
    assert {s["name"]: s["installed"] for s in hooks.status()}[hooks.GLOO.name]
    hooks.uninstall()
    assert cp._all_gather_anything is original
    assert ("warning_once" in vars(cp.logger)) == had_warning_once
    assert not hooks.GLOO.installed
    hooks.install()  # puts back what was asked for: a model set up over gloo keeps working
    assert cp._all_gather_anything is not original and getattr(cp._all_gather_anything, hooks_base.WRAPPED)
    hooks.uninstall()
    hooks.GLOO.wanted = wanted


# -- in this process: uninstall() with models served, and install() again ----------------------
@pytest.fixture
def reinstall():
    registry = hooks_base.diffusers_dispatch._AttentionBackendRegistry
    active = registry._active_backend
    yield active
    registry.set_active_backend(active)  # model.set_attention_backend sets diffusers' process-wide one too
    hooks.install()


def _flux():
    case = BY_ID["FluxTransformer2DModel-masked"]
    model = case.build(0)
    inputs = case.make_inputs(model, 0)
    return case, model, inputs


def test_a_name_in_use_stays_and_is_said(seed, reinstall):
    case, model, inputs = _flux()
    with torch.no_grad():
        stock = case.run(model, inputs)
        model.set_attention_backend("attnkit")  # diffusers makes it the process-wide backend as well
        served = case.run(model, inputs)
        assert dict(hooks.uninstall()).get("attnkit") == "diffusers' process-wide backend"
        hooks.install()
        hooks_base.diffusers_dispatch._AttentionBackendRegistry.set_active_backend(reinstall)
        stayed = dict(hooks.uninstall())
        assert stayed.get("attnkit") == "a processor's backend (set_attention_backend)", stayed
        assert "attnkit_sdpa" not in hooks.attnkit_names()  # a name nothing uses left
        again = case.run(model, inputs)  # the model still runs what it ran
    for a, b in zip(served, again):
        assert torch.equal(a, b)
    for a, b in zip(stock, served):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_after_uninstall_dispatch_modules_are_kept_with_the_reason(seed, reinstall, caplog):
    case, model, inputs = _flux()
    with torch.no_grad():
        stock = case.run(model, inputs)
        hooks.uninstall()
        assert diffusers_backend.problem() is not None
        applied = attnkit.apply(model, attnkit.auto())
        assert applied.routes and all(not r.served and "hooks.uninstall()" in r.reason for r in applied.routes.values())
        kept = case.run(model, inputs)
        applied.undo()
        hooks.install()
        assert diffusers_backend.problem() is None and "attnkit" in hooks.attnkit_names()
        applied = attnkit.apply(model, attnkit.auto())
        assert all(r.served for r in applied.routes.values())
    for a, b in zip(stock, kept):
        assert torch.equal(a, b)  # kept: stock's output bit for bit


def test_install_twice_changes_nothing():
    from diffusers.models.attention import AttentionMixin

    before = AttentionMixin.__dict__["set_attn_processor"]
    assert hooks.install() == []
    assert AttentionMixin.__dict__["set_attn_processor"] is before


# -- per-chooser caches: any object of the chooser protocol -----------------------------------
class SlotChooser:
    """A chooser with no __dict__ (the protocol: attention() and resolved())."""

    __slots__ = ("inner", "__weakref__")

    def __init__(self) -> None:
        self.inner = attnkit.auto().chooser

    def attention(self, *args, **kwargs):
        return self.inner.attention(*args, **kwargs)

    def resolved(self, sig):
        return None


def test_a_chooser_without_a_dict_serves_the_sdpa_route_and_leaves(seed):
    import gc
    import weakref

    case = BY_ID["SD3Transformer2DModel"]
    model = case.build(0)
    inputs = case.make_inputs(model, 0)
    with torch.no_grad():
        stock = case.run(model, inputs)
        chooser = SlotChooser()
        applied = attnkit.apply(model, attnkit.AttnkitProcessor(chooser))
        assert {r.kind for r in applied.routes.values()} == {"sdpa"} and all(r.served for r in applied.routes.values())
        out = case.run(model, inputs)
    for a, b in zip(stock, out):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
    ref = weakref.ref(chooser)
    applied.undo()
    del applied, chooser
    gc.collect()
    assert ref() is None, "the chooser outlived undo(): a per-chooser cache held it"
