"""Every touch of diffusers, in one wing: how attnkit reaches a diffusers model's attention.

* :mod:`~attnkit.diffusers.protocol`: diffusers' Attention protocol as attnkit computes it;
* :mod:`~attnkit.diffusers.processor`: attnkit's attention processor (named ones, auto());
* :mod:`~attnkit.diffusers.routes`: which route reaches a module's attention, and
  :mod:`~attnkit.diffusers.adapters`: what serves it inside a model's own code;
* :mod:`~attnkit.diffusers.binding`: set_attn_processor, serving or keeping each module;
  :mod:`~attnkit.diffusers.stock`: what attnkit replaced on a module, pickling, undo;
* :mod:`~attnkit.diffusers.backend`: attnkit as one of diffusers' attention backends (its
  names), and :mod:`~attnkit.diffusers.backend_call`: what such a name runs;
* :mod:`~attnkit.diffusers.hooks` (with hooks_base, hooks_methods, hooks_registry): every
  change attnkit makes to diffusers, each checked against its version, and uninstall();
* :mod:`~attnkit.diffusers.context_parallel`: diffusers' enable_parallelism, served by
  :mod:`attnkit.parallel`;
* :mod:`~attnkit.diffusers.apply`: processor(name), apply(), plan().

The wing imports the choosers (:mod:`attnkit.choose`), the backends and
:mod:`attnkit.parallel`; none of them imports it.
"""
