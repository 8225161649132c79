"""Stream ID generators: reserving IDs, tracking completion, positions and the watermark.

* :mod:`~factstream.idgen.generator`: ``MultiWriterIdGenerator``, one stream's generator;
* :mod:`~factstream.idgen.errors`: ``IdGeneratorError`` (public, as ``factstream.IdGeneratorError``);
* :mod:`~factstream.idgen.sequence`: the stream's PostgreSQL sequence (``create_sequence_sql``);
* :mod:`~factstream.idgen.leases`: ``WriterLeases``, which instances are alive as writers;
* :mod:`~factstream.idgen.positions`: the position-tracking state machine (``PositionTracker``);
* the generator's parts: ``append`` (the INSERT that reserves IDs), ``capture`` (how replication
  receives a writer's rows), ``durable`` (reading the durable state, repairing the sequence),
  ``recovery`` (the start-up state), ``persist`` (writing this process's position) and ``metrics``.

This package's ``__init__`` imports nothing up front: ``import factstream`` (which needs only the error
type and the sequence helper) does not load the generator. The names above are imported from their
modules at first use (``from factstream.idgen import MultiWriterIdGenerator`` works).
"""

from __future__ import annotations

from factstream.lazy import lazy_names

#: The names this package offers (name -> the module defining it), each imported at first use.
_LAZY = {
    "IdGeneratorError": "errors",
    "MultiWriterIdGenerator": "generator",
    "PositionTracker": "positions",
    "WriterLeases": "leases",
    "create_sequence_sql": "sequence",
}

__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
