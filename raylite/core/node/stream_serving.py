"""Streaming generators on the node (raylite.core.client.streams holds a stream's items): a generator
task's values as they come, and the callers' ObjectRefGenerator asking for the next one."""
from __future__ import annotations

from raylite.core.client import streams
from raylite.core.node.records import WorkerProc
from raylite.core.node.state import NodeState
from raylite.core.wire import segments


class Streams:
    """A stream's items and the callers waiting for them; needs nothing but the state."""

    def __init__(self, state: NodeState):
        self.s = state

    def msg_item(self, w: WorkerProc, completion_id: int, index: int, value) -> None:
        """A generator task yielded a value: store it, and hand it to a caller waiting for it."""
        s = self.s
        stream = s.table.streams.get(completion_id)
        if stream is None or index < len(stream.items):   # gone, or a retried task yields it again
            segments.unlink_segments(name for name, _ in value.segments())
            return
        oid = streams.item_id(completion_id, index)
        s.table.put(oid, value)   # its one count is the stream's until a caller takes the ref
        stream.items.append(oid)
        self.answer(completion_id, stream.wake())

    def stream_next(self, completion_id: int, index: int, reply) -> bool:
        """A caller's ObjectRefGenerator wants value `index` (see raylite.core.client.streams); False
        when the reply has to wait for the task."""
        s = self.s
        stream = s.table.streams.get(completion_id)
        found = stream.answer(index) if stream is not None else ("end",)
        if found is None:
            stream.waiting.append((index, reply))
            return False
        self.answer(completion_id, [(reply, found)])
        return True

    def answer(self, completion_id: int, due: list) -> None:
        s = self.s
        for reply, found in due:
            if found[0] == "error":   # the caller gets a ref to the failed task's result
                s.table.addref(completion_id)
            reply(found)
