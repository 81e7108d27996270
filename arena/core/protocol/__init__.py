"""The evaluation protocol: one code path that every method's run goes through."""

from arena.core.protocol.session import SPOT_CHECKS, PreparedRun, Session, evaluation_plan, prepare, run

__all__ = ["SPOT_CHECKS", "PreparedRun", "Session", "evaluation_plan", "prepare", "run"]
