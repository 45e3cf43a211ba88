"""The checkpoint gate's logic (``--kvaudit-baseline``), apart from pytest: the rules that say which movement
fails it (:mod:`.rules`), what a baseline must share with a run (:mod:`.identity`) and the two ledgers compared
token for token (:mod:`.ledger_diff`). The pytest side is :mod:`pytest_kvaudit.gate`."""
