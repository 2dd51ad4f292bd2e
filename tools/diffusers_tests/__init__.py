"""diffusers' own test modules, run stock and with attnkit, compared per family. Not
installed with attnkit: run it from a checkout (``make diffusers-tests
DIFFUSERS_TESTS=/path/to/diffusers/tests``).

    python -m tools.diffusers_tests /path/to/diffusers/tests              # everything below
    python -m tools.diffusers_tests TESTS --files 'models/transformers/test_models_transformer_flux.py'
    python -m tools.diffusers_tests TESTS --reuse-stock                   # the attnkit run again, after a change

diffusers' test suite is not in its package: it runs from a checkout of its repository,
against that checkout's own ``src/`` (put first on ``PYTHONPATH`` when
``TESTS/../src/diffusers`` exists, so that tests and source match; ``--installed`` runs the
installed diffusers instead). The tests run in ``.venv-diffusers-tests``
(``tools/diffusers_tests/setup-env.sh``): the project's venv plus what the tests import.

What runs (``selection.py``; ``--files`` takes other globs under tests/):

* the model tests of every transformer, UNet, autoencoder and ControlNet
  (``models/{transformers,unets,autoencoders,controlnets}/test_*.py``), with
  ``models/test_attention_processor.py`` and ``models/test_layers_utils.py``;
* every pipeline test file (``pipelines/*/test_*.py``, ``pipelines/test_*.py``), offline
  (``HF_HUB_OFFLINE=1``). Nearly every pipeline test builds its dummy components with a
  tiny tokenizer or text encoder from the hub, so offline, without a local hub cache, it
  fails at once in ``get_dummy_components`` and counts as "stock failed". They are run
  all the same, not guessed at: a static guess of which are offline-capable (no
  ``from_pretrained`` in the file) keeps 7 of 229 files, and misses the ones whose hub
  use is in a shared mixin; run all, a failing test costs about half a second. With a
  filled hub cache (``HF_HOME``) more of them pass stock, and then run with attnkit.

Two runs:

1. stock: plain pytest;
2. attnkit: the tests that passed stock (passed or xpassed), with the plugin
   ``tools.diffusers_tests.plugin``, which gives every diffusers attention module one
   shared ``attnkit.auto()`` when it is constructed (plugin.py says how, and what it
   counts). ``--reuse-stock`` takes the stock run from the last one (its results in the
   output folder), for a new attnkit run after attnkit changed.

Each run: pytest with ``-p no:cacheprovider`` (nothing written into the checkout),
``--continue-on-collection-errors``, never ``-x``; pytest-timeout fails a test after
``--timeout`` seconds (300), and a watchdog kills a process that reports nothing for two
more minutes. Files run in chunks (``--chunk-files``, one pytest process a chunk,
``--jobs`` at once); a process that dies in a test (a crash, the watchdog) is resumed
after it, the test recorded as crashed or hung (run.py). Every result comes back through
the record plugin (record.py) as JSON lines in ``bench/out/diffusers-tests/<run>/``,
with pytest's own output beside them. A line per finished file shows the progress.

The report (``--report``, default ``bench/results/cpu/diffusers-tests/report.md``, and
``report.json`` beside it), per family (a model test file's model,
``test_models_transformer_flux.py`` -> flux; a pipeline test's folder): files, tests
collected, stock passed / failed / skipped, files that could not be collected, attnkit
passed / failed, how many of the passing tests had attention computed by attnkit, the
modules given attnkit's processor and attnkit's attention calls; then every test that
passes stock but not with attnkit, grouped by the first line of its exception; at the
top, the diffusers commit and the versions the tests imported.
"""
