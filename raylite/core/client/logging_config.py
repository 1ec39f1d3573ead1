"""`ray.LoggingConfig`: one logging setup for the job's root logger, in the driver and in every
worker (`init(logging_config=...)`), so `logging.getLogger(__name__).info(...)` inside a task
prints like the driver's, with the job, worker, node and task ids appended (TEXT) or as one JSON
object per line (JSON). `logging` and `json` are imported only when a config is given."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

ENCODINGS = ("TEXT", "JSON")
# attributes every LogRecord has (what additional_log_standard_attrs may name)
_STANDARD_ATTRS = frozenset({"args", "asctime", "created", "exc_info", "exc_text", "filename", "funcName",
                             "levelname", "levelno", "lineno", "module", "msecs", "message", "msg", "name",
                             "pathname", "process", "processName", "relativeCreated", "stack_info", "thread",
                             "threadName", "taskName"})


@dataclass
class LoggingConfig:
    encoding: str = "TEXT"
    log_level: str | int = "INFO"
    additional_log_standard_attrs: list = field(default_factory=list)

    def __post_init__(self):
        if self.encoding not in ENCODINGS:
            raise ValueError(f"LoggingConfig: encoding must be one of {list(ENCODINGS)}, got encoding={self.encoding!r}")
        import logging
        level = self.log_level
        if not ((isinstance(level, int) and not isinstance(level, bool))
                or (isinstance(level, str) and isinstance(logging.getLevelName(level), int))):
            raise ValueError(f"LoggingConfig: log_level must be a logging level name or number, got "
                             f"log_level={self.log_level!r}")
        unknown = [a for a in self.additional_log_standard_attrs if a not in _STANDARD_ATTRS]
        if unknown:
            raise ValueError(f"LoggingConfig: additional_log_standard_attrs has {unknown}, which LogRecords do not "
                             f"have; valid names: {sorted(_STANDARD_ATTRS)}")

    def to_dict(self) -> dict:
        return asdict(self)

    def _apply(self) -> None:
        """Give this process's root logger one stderr handler in this format and level."""
        import logging
        handler = logging.StreamHandler()
        handler.setFormatter(_Formatter(self.encoding, tuple(self.additional_log_standard_attrs)))
        root = logging.getLogger()
        for old in [h for h in root.handlers if isinstance(h.formatter, _Formatter)]:
            root.removeHandler(old)   # a second init() replaces the first one's handler
        root.addHandler(handler)
        root.setLevel(self.log_level)


def _context() -> dict:
    from raylite.core.client import context
    if not context.connected():   # a record logged after shutdown(): no ids to give (and none to make up)
        return {}
    state, call = context.state, context.now()
    out = {"job_id": state.job_id, "worker_id": f"{state.worker_id:016x}", "node_id": state.node_id}
    for key, value in (("actor_id", None if call.actor_id is None else f"{call.actor_id:028x}"),
                       ("task_id", None if call.task_id is None else f"{call.task_id:028x}"),
                       ("actor_name", (state.actor_name or None) if call.actor_id is not None else None),
                       ("task_name", call.name or None), ("task_func_name", context.task_function_name())):
        if value is not None:
            out[key] = value
    return out


def _extra(record) -> dict:
    """What the call added with ``extra={...}`` (Ray writes those fields too)."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")}


class _Formatter:
    """TEXT: `time LEVEL file:line -- message key=value ...`; JSON: one object per record."""

    def __init__(self, encoding: str, extra: tuple):
        import logging
        self.encoding, self.extra = encoding, extra
        self.text = logging.Formatter("%(asctime)s\t%(levelname)s %(filename)s:%(lineno)s -- %(message)s")

    def format(self, record) -> str:
        fields = {a: getattr(record, a, None) for a in self.extra}
        fields.update(_extra(record))
        fields.update(_context())
        fields["timestamp_ns"] = time.time_ns()
        if self.encoding == "TEXT":
            return self.text.format(record) + "".join(f" {k}={v}" for k, v in fields.items())
        import json
        out = {"asctime": self.text.formatTime(record), "levelname": record.levelname, "message": record.getMessage(),
               "filename": record.filename, "lineno": record.lineno, **fields}
        if record.exc_info:
            out["exc_text"] = self.text.formatException(record.exc_info)
        return json.dumps(out, default=str)
