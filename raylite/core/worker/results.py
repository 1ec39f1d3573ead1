"""What a call's arguments and outcome become in a worker: argument values (an upstream error
raised), errors as the caller's RayTaskError with the user's part of the traceback, and the rules
for retries and generator results."""
from __future__ import annotations

import os
import sys
import traceback

from raylite import exceptions
from raylite.core.client import streams
from raylite.core.wire import serialization
from raylite.core.wire.protocol import TaskSpec


def streamed(spec: TaskSpec, refs: list) -> streams.DynamicObjectRefGenerator | int:
    """A generator task's own result: with "dynamic", the refs of what it yielded (held by that
    value); with "streaming", how many values (the caller took each ref as it came, and holding
    them here too would keep every value until the generator is dropped)."""
    return streams.DynamicObjectRefGenerator(refs) if spec.stream == "dynamic" else len(refs)


def safe_repr(obj, limit: int = 200) -> str:
    try:
        text = repr(obj)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not break the actor
        return type(obj).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def is_retryable(spec: TaskSpec, e: BaseException) -> bool:
    """retry_exceptions=True retries any Exception; a list, those types and their subclasses."""
    wanted = spec.retry_exceptions
    if not wanted or not isinstance(e, Exception) or spec.kind == "actor_create":
        return False
    return wanted is True or any(f"{c.__module__}.{c.__name__}" in wanted for c in type(e).__mro__)


def arg_value(ser):
    """A ref argument's value; an upstream task's error is raised instead (the call fails with it)."""
    value = serialization.loads(ser)
    if ser.is_error:
        raise raisable(value)
    return value


def raisable(err: BaseException) -> BaseException:
    return err.as_instanceof_cause() if isinstance(err, exceptions.RayTaskError) else err


_RUNTIME_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # raylite/core


def user_traceback(e: BaseException) -> str:
    """The exception's traceback from the user's code on: the runtime's own frames that called it
    (execute, _call, invoke, ...) say nothing to the reader, and Ray shows none either."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_RUNTIME_DIR):
        if tb.tb_next is None:   # raised by the runtime itself: a failed argument, as Ray words it
            if isinstance(e, exceptions.RayTaskError):
                return ("At least one of the input arguments for this task could not be computed:\n"
                        + "".join(traceback.format_exception_only(type(e), e)))
            break
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))


def error_result(name: str, e: BaseException):
    if isinstance(e, exceptions.RayTaskError) and type(e) is not exceptions.RayTaskError:
        cause = e.cause  # a nested task's error: keep the original cause, add this frame's trace
    else:
        cause = e
    text = user_traceback(e)
    try:
        ser = serialization.dumps(exceptions.RayTaskError(name, text, cause, os.getpid()), None, is_error=True)
    except Exception as why:  # as Ray: the cause becomes a RayError that says so, with the text
        kind = f"{type(cause).__module__}.{type(cause).__name__}"
        print(f"The original cause of the RayTaskError ({kind}) isn't serializable.", file=sys.stderr)
        cause = exceptions.RayError(f"Exception {kind} isn't serializable: {why}.\nOriginal exception details:\n{text}")
        return serialization.dumps(exceptions.RayTaskError(name, text, cause, os.getpid()), None, is_error=True)
    try:
        serialization.loads(ser)   # one whose __init__ takes other arguments than its args cannot be rebuilt
        return ser
    except Exception:  # Ray's UnserializableException, with its text and traceback
        cause = exceptions.UnserializableException(text)
        return serialization.dumps(exceptions.RayTaskError(name, text, cause, os.getpid()), None, is_error=True)
