"""The evaluation protocol: the session that sequences a run (:mod:`.session`), what it is
prepared from (:mod:`.prepare`), its phases and checks (:mod:`.evaluation`, :mod:`.digests`,
:mod:`.clock`), an experiment's factors (:mod:`.factors`) and the results it builds."""

from arena.core.protocol.evaluation import SPOT_CHECKS, evaluation_plan
from arena.core.protocol.prepare import PreparedRun, prepare
from arena.core.protocol.session import Session, run

__all__ = ["SPOT_CHECKS", "PreparedRun", "Session", "evaluation_plan", "prepare", "run"]
