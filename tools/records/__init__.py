"""The per-GPU backend preferences auto() takes from the committed GPU records.

    python -m tools.records            # writes attnkit/choose/records.py
    python -m tools.records --check    # exits 1 if that file is not what the records give

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

No tile table is generated: the ``tiles-*/`` folders hold correctness runs
(``tiles.jsonl``: every tile against float64, no time), and the only tiles chosen by
timing, the autotuner's choices in the H100's ``timing/timing.json``, were not all
faster than the default they replaced (head dim 128 forward: 1.306 ms autotuned against
1.250 ms with the default tile, in the same run), so they are not evidence of a better
default.
"""
