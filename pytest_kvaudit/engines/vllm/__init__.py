"""The vLLM engine, a request-level engine: it serves whole requests and keeps the K/V cache itself. Its
opener and backend (:mod:`.backend`, :mod:`.engine`, :mod:`.force`), the read and write of its blocks
(:mod:`.state`, :mod:`.layout`, :mod:`.ranks`), its cells built from requests (:mod:`.cells`, :mod:`.hits`,
:mod:`.transplants`, :mod:`.lossy`, :mod:`.requests`), its calibration (:mod:`.calibrate`) and its record
(:mod:`.record`). Importing this package imports no vLLM: the engine loads when its opener runs."""
