"""A request-level engine's common machinery, written once (vLLM and transformers' continuous batching use it):
an engine that serves whole requests and keeps the K/V cache itself in blocks.

- :mod:`.protocol`: what its backend offers (:class:`~.protocol.RequestBackend`: ``block_size``, ``reset()``,
  ``run(requests, budget) -> [Done]``, ``read(blocks, positions)``, ``write(blocks, state)``, ``hooks.between``)
  and a finished request (:class:`~.protocol.Done`: its tokens, top-k logit rows, the cached prompt tokens that
  prove a hit, its block table, its engine steps);
- :mod:`.cells`: requests to cells (:class:`~.cells.RequestCellBuilder`, the record's ``cell_builder``);
- :mod:`.hits`: the prefix cache's partial, whole-block and cross-request hits, each proven by the engine's count;
- :mod:`.transplants`: the anatomy, and transplants written through a request's blocks between its prefill and
  its first decode step;
- :mod:`.arithmetic`: which request builds a construction, the stop rule's cut, a request's counted cost and the
  plan's price of the requests;
- :mod:`.stop`: the stop rule as the engine applies it while decoding (:class:`~.stop.StopRow`);
- :mod:`.state`: a request's K/V copied out of its blocks (:class:`~.state.PagedState`), and the state reader
  over it (fingerprint, compare, first difference, transplant): a record's ``state_reader``."""
