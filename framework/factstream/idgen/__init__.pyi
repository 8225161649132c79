"""The types of ``factstream.idgen``'s names, which ``__init__.py`` imports at first use (``_LAZY``)."""

from factstream.idgen.errors import IdGeneratorError
from factstream.idgen.generator import MultiWriterIdGenerator
from factstream.idgen.leases import WriterLeases
from factstream.idgen.positions import PositionTracker
from factstream.idgen.sequence import create_sequence_sql

__all__ = ["IdGeneratorError", "MultiWriterIdGenerator", "PositionTracker", "WriterLeases", "create_sequence_sql"]
