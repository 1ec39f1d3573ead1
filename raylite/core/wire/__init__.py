"""What crosses a process boundary: the protocol's frames and messages, ids, resource quantities,
labels, signatures, shared-memory segments and serialization. The lowest layer: it imports nothing
from raylite/core above it (raylite.exceptions only)."""
