"""The engines kvaudit ships, one folder each: everything an engine is (its opener and backend, the read and
write of its state, its cell builder, its calibration and pricing, its settings and its record) lives in
``engines/<name>/``, and its record is declared as an entry point of the ``kvaudit.engines`` group in
``pyproject.toml`` exactly as a third party's engine would be. An engine may import the core; the core imports
no engine (``tests/project/test_layers.py``)."""
