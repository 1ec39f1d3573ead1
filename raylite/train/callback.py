"""``train.UserCallback``: Ray Train V2's base class for ``RunConfig(callbacks=[...])``, whose hooks
the driver calls (``run_context`` is None here: raylite has no TrainRunContext)."""
from __future__ import annotations

from raylite.train.checkpoint import Checkpoint


class UserCallback:
    """Subclass and override the hooks you need; they run in the driver, not in the workers."""

    def after_report(self, run_context, metrics: list[dict], checkpoint: Checkpoint | None) -> None:
        """After every worker reported a round: ``metrics[i]`` is rank i's; ``checkpoint`` is the
        persisted one, or None when no rank passed one."""

    def after_exception(self, run_context, worker_exceptions: dict[int, BaseException]) -> None:
        """After one or more workers failed (raised, or died): their errors by world rank."""
