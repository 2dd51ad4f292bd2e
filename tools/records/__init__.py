"""The per-GPU backend preferences auto() takes from the committed GPU records.

    python -m tools.records            # writes attnkit/choose/gpu_rules.py and attnkit/kernels/tile_rules.py
    python -m tools.records --check    # exits 1 if either is not what the records give

Inputs, all under ``bench/results/<gpu>/`` (one folder per device, named after
``torch.cuda.get_device_name()`` in lower case with dashes):

* ``results.json``: the device's name and compute capability (its ``environment``);
* every ``timing.json`` below it, at any depth: ``bench/gpu_tiles.py``'s timing of
  attnkit's Triton kernel beside torch's SDPA on the same GPU, in the same process
  (``speedup_vs_sdpa`` = SDPA's time / the kernel's), one JSON object per case;
* the ``summary.md`` beside each ``timing.json``: the dtype of its timings (the heading
  "Speed beside torch's SDPA (fp16)") and the date of the run.

A measurement's class is what a call can be matched on: the mask kind
(``key_padding``; ``full`` is a ``bias``), dtype, head dim, causal, forward or forward
and backward; its lengths are the lower bound of the class (smaller calls are bound by
the kernel's host time, which no record here measures against SDPA's). Per GPU and case
(name, autotuning on or off), only the newest run counts. A class gets a rule, "triton
ahead of sdpa", only where every current measurement of it has the kernel at least
:data:`THRESHOLD` times as fast as SDPA; the rule's ratio is the smallest of them and its
record the row that measured it. Nothing is extrapolated: another dtype, head dim, mask,
a causal call, a shorter one, or another GPU gets no rule.

:data:`WITHDRAWN` lists measurements that no longer describe the code, each with why;
the generated module names them in its header.

Default tiles per GPU (``attnkit/kernels/tile_rules.py``, the same command):
where a ``timing.json`` logs the autotuner's choices (``gpu_tiles.py``'s "autotuner
choices" row) and times a case both with autotuning off (the shipped default tile) and on
(the choice), in the same run, with the choice at least :data:`THRESHOLD` times as fast,
the choice becomes the GPU's default for each list the case ran, for calls at least as
long (``generate.make_tile_rules``). The H100's ``timing/timing.json`` gives four: the
head-dim-64 band without a bias (SD1.5's D=40, SDXL's D=64), forward 1.32-1.40x and
forward and backward 1.14x. Its head dim 128 choices were slower than the default they
would replace (1.306 ms autotuned against 1.250 ms), so that list keeps its default. The
``tiles-*/`` folders hold correctness runs (every tile against float64, no time); the
H200's timings logged no choices.
"""
