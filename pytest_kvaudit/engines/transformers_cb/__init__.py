"""transformers' continuous batching as an engine kvaudit audits (``--kvaudit-backend=transformers-cb``):
``generate_batch``, ``ContinuousBatchingManager`` and ``transformers serve --continuous-batching``, whose prefix
block sharing is on by default. One folder, one entry point (``kvaudit.engines``: ``transformers-cb``)."""
