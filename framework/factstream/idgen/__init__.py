"""Stream ID generators: reserving IDs, tracking completion, positions and the watermark."""

from factstream.idgen.generator import IdGeneratorError, MultiWriterIdGenerator
from factstream.idgen.leases import WriterLeases
from factstream.idgen.positions import PositionTracker
from factstream.idgen.sequence import create_sequence_sql

__all__ = [
    "IdGeneratorError",
    "MultiWriterIdGenerator",
    "PositionTracker",
    "WriterLeases",
    "create_sequence_sql",
]
