"""``attnkit info --model``: a diffusers model's config, loaded and built without weights.

Which attention route serves each module depends on the model's classes, not on its
weights, so the model is built on the meta device from its config alone: no download, no
memory. Every error names what was given and what ``--model`` takes, in one line, since
a wrong path is the usual way this fails.
"""

from __future__ import annotations

import json

import torch

from .diffusers.apply import plan
from .text import describe_exception


def shipped_models() -> list[str]:
    """The configs shipped in attnkit/configs that describe a model (a torch module,
    with attention modules to route), by what diffusers builds from them: the schedulers'
    configs beside them are not models."""
    from importlib import resources

    names = []
    for entry in sorted(resources.files("attnkit").joinpath("configs").iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".json"):
            cls = _diffusers_class(json.loads(entry.read_text()).get("_class_name"))
            if _subclass(cls, torch.nn.Module):
                names.append(entry.name[: -len(".json")])
    return names


def _accepted() -> str:
    """What --model takes, for the end of every error about it."""
    return (
        "give a diffusers model's config: a folder holding config.json (a model's unet/, vae/ or "
        "transformer/ folder), that config.json, or one of attnkit's: " + ", ".join(shipped_models())
    )


def _diffusers_class(name: object):
    import diffusers

    return getattr(diffusers, name, None) if isinstance(name, str) and name else None


def load_config(where: str) -> dict:
    """A diffusers config: a folder holding config.json, a config.json file, or the name
    of one shipped in attnkit/configs (e.g. flux_dev_transformer). Anything else raises
    FileNotFoundError or ValueError with one line that names ``where`` and what --model
    takes."""
    from importlib import resources
    from pathlib import Path

    path = Path(where)
    shipped = resources.files("attnkit").joinpath("configs", where if where.endswith(".json") else where + ".json")
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    elif not path.is_file() and shipped.is_file():
        path = shipped
    elif path.is_dir():
        inner = sorted(p.name + "/" for p in path.iterdir() if (p / "config.json").is_file())
        files = sorted(p.name for p in path.glob("*.json"))
        if inner:  # a pipeline's folder: its models are in subfolders
            hint = f" (its subfolders {', '.join(inner)} have one: give one of those)"
        elif files:
            hint = f" (it holds {len(files)} .json file{'s' if len(files) > 1 else ''}: give one's path)"
        else:
            hint = ""
        raise FileNotFoundError(f"--model {where!r} is a folder without config.json{hint}; {_accepted()}")
    elif not path.is_file():
        raise FileNotFoundError(
            f"--model {where!r}: no such file or folder, nor a config shipped with attnkit; {_accepted()}"
        )
    try:
        config = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"--model {where!r} is not a JSON file ({e}); {_accepted()}") from None
    if not isinstance(config, dict):
        raise ValueError(
            f"--model {where!r} holds a JSON {type(config).__name__}, not a config (a JSON object "
            f"with _class_name); {_accepted()}"
        )
    if not isinstance(config.get("_class_name"), str) or not config["_class_name"]:
        raise ValueError(f"--model {where!r} is not a diffusers config (it names no _class_name); {_accepted()}")
    return config


def _not_a_model(cls: object, config: dict) -> str:
    """What a config whose class is not a torch module describes, in words."""
    import diffusers

    if _subclass(cls, getattr(diffusers, "SchedulerMixin", None)):
        return "is a scheduler's config, which has no attention modules"
    # a pipeline's model_index.json: {component: [library, class]}; its class may be a
    # stand-in (below) when transformers is not installed, so it is known by these too
    components = [
        k
        for k, v in config.items()
        if not k.startswith("_")
        and isinstance(v, list)
        and len(v) == 2
        and (v[0] is None or v[0] in ("diffusers", "transformers"))
        and isinstance(v[1], (str, type(None)))
    ]
    if components or _subclass(cls, getattr(diffusers, "DiffusionPipeline", None)):
        where = f": its models are in its subfolders ({', '.join(c + '/' for c in components)})" if components else ""
        return f"is a pipeline's config (model_index.json){where}, not a model's"
    needs = getattr(cls, "_backends", None)  # diffusers' stand-in for a class whose packages are missing
    if needs:
        return f"names a class diffusers builds only with {', '.join(needs)} installed (pip install {' '.join(needs)})"
    return "is the config of something that is not a model (no torch module, so no attention modules)"


def _subclass(cls: object, base: object) -> bool:
    return isinstance(cls, type) and isinstance(base, type) and issubclass(cls, base)


def model_plan(where: str):
    """The route of every attention module of the model a config describes (built on
    the meta device: no weights, no memory), as attnkit.plan gives it."""
    import diffusers

    config = load_config(where)
    name = config["_class_name"]
    cls = _diffusers_class(name)
    if cls is None:
        raise ValueError(
            f"--model {where!r} names class {name!r}, which diffusers {diffusers.__version__} does "
            f"not export (a newer diffusers may); {_accepted()}"
        )
    if not _subclass(cls, torch.nn.Module):
        raise ValueError(f"--model {where!r} ({name}) {_not_a_model(cls, config)}; {_accepted()}")
    try:
        with torch.device("meta"):
            model = cls.from_config({k: v for k, v in config.items() if not k.startswith("_")})
    except Exception as e:  # a config diffusers cannot build: its own words, on one line
        raise ValueError(
            f"--model {where!r}: diffusers {diffusers.__version__} cannot build {name} from it "
            f"({describe_exception(e)}); check the config against that version's {name}"
        ) from e
    return name, plan(model)
