"""Arena's public API for plugins: everything a method, environment or backend may import.

A plugin imports from ``arena`` (which re-exports this module) and from its own package, never
from ``arena.core``: the core is the harness's and may be reorganised between releases, while
the names here are the contract (``tests/test_architecture.py`` holds the built-in plugins, the
example plugin and the ``arena new-method`` template to it). As ``pytest`` re-exports
``_pytest``, these are re-exports: each object lives, and is documented, where the core defines
it; the few helpers the built-in plugins share that are no part of the harness are in
:mod:`arena.helpers`. Importing this module imports no torch (``arena plugins`` stays fast); ``rl``'s trainer
classes load torch on first use.
"""

from __future__ import annotations

from arena.core import rl
from arena.core.contract.env import TEST_SPLITS, Environment, Episode, Instructions
from arena.core.contract.errors import BudgetExhausted, HookReturnError, NotTrainable, ProtocolViolation
from arena.core.contract.hookspecs import hookimpl, hookspec
from arena.core.contract.llm import Chat, Generation, LLMBackend, SamplingParams, TrainableBackend
from arena.core.contract.method_config import typed_config
from arena.core.contract.run_api import STANDARD, BudgetView, EpisodeRequest, PolicyChoice, Run, Store
from arena.core.contract.types import (
    EpisodeResult,
    Experience,
    Observation,
    Provenance,
    Step,
    Task,
    Termination,
    Trajectory,
)
from arena.core.execution.episodes import run_in_threads
from arena.core.execution.phase import EVALUATE, LEARN
from arena.core.execution.solver import (
    Action,
    EndOnRepeat,
    Policy,
    StandardSolver,
    build_prompt,
    episode_seed,
    with_task_message,
)
from arena.core.execution.tasks import select_tasks
from arena.core.execution.views import EnvironmentView
from arena.core.protocol.continuation import begin_learning_phase
from arena.core.services.embedder import Embedder
from arena.core.services.progress import ProgressTask
from arena.core.storage.method_state import Checkpoints, MethodState
from arena.core.storage.rundir import write_json_atomic
from arena.helpers import (
    HeldOutCurve,
    PluginFiles,
    checkpoint_update,
    clip_middle,
    export_stored,
    play_round,
    plugin_files,
    require_at_least,
    resume_training,
    run_stages,
    stored,
)

__all__ = [
    "EVALUATE",
    "LEARN",
    "STANDARD",
    "TEST_SPLITS",
    "Action",
    "BudgetExhausted",
    "BudgetView",
    "Chat",
    "Checkpoints",
    "Embedder",
    "EndOnRepeat",
    "Environment",
    "EnvironmentView",
    "Episode",
    "EpisodeRequest",
    "EpisodeResult",
    "Experience",
    "Generation",
    "HeldOutCurve",
    "HookReturnError",
    "Instructions",
    "LLMBackend",
    "MethodState",
    "NotTrainable",
    "Observation",
    "PluginFiles",
    "Policy",
    "PolicyChoice",
    "ProgressTask",
    "ProtocolViolation",
    "Provenance",
    "Run",
    "SamplingParams",
    "StandardSolver",
    "Step",
    "Store",
    "Task",
    "Termination",
    "TrainableBackend",
    "Trajectory",
    "begin_learning_phase",
    "build_prompt",
    "checkpoint_update",
    "clip_middle",
    "episode_seed",
    "export_stored",
    "hookimpl",
    "hookspec",
    "play_round",
    "plugin_files",
    "require_at_least",
    "resume_training",
    "rl",
    "run_in_threads",
    "run_stages",
    "select_tasks",
    "stored",
    "typed_config",
    "with_task_message",
    "write_json_atomic",
]
