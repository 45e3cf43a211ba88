"""kvaudit's core, which never imports pytest: usable and testable alone. Its subpackages import one way, each
only those below it (``tests/project/test_layers.py`` holds the table):

* :mod:`.model`: plain data (the config, items, chunk schedules, the cell's declared pipeline, records, the
  engines and cache kinds by name, digests);
* :mod:`.itemsets`: the built-in item sets;
* :mod:`.cost`: arithmetic on lengths (pricing, the ledger, the evidence a claim needs);
* :mod:`.runtime`: torch and the engines (loading, GGUF, chat templates, the decoder, cache state adapters,
  backends);
* :mod:`.compute`: a run's computation (the cell builder, transplants, probes, the store), each step with
  its declared price;
* :mod:`.planning`: the plan (calibration, estimates, the price on a recorded ledger) and the baseline.

:mod:`.errors` and :mod:`.atomic` sit under all of them.
"""
