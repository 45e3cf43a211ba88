"""The transformers engine: a checkpoint loaded by the core's loader and run one forward at a time on a
transformers ``Cache`` (:mod:`.backend`), declared by its record (:mod:`.record`)."""
