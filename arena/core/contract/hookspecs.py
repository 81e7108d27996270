"""Arena's hook specifications: the whole contract between the harness and a plugin.

A plugin is a module or an object whose functions are decorated with ``@arena.hookimpl`` and
named after the hooks below. There are two kinds of hook:

**Registration hooks** are called once on the global plugin manager when Arena starts. Built-in
methods, environments and LLM backends register themselves through them exactly as a third-party
package does (entry-point group ``arena``)::

    # pyproject.toml of a third-party package
    [project.entry-points.arena]
    my_method = "my_package.plugin"

    # my_package/plugin.py
    import arena

    @arena.hookimpl
    def register_methods(register):
        register("my_method", MyMethod, config=Path(__file__).with_name("config.yaml"))

**Method hooks** (``learn``, ``extract``, ``retrieve``, ``solve``, ``evaluation_variants``,
``update``, ``episode_end``, ``state_digest``, ``state_size``, ``export``) are called on a
*per-run* plugin manager that holds only the harness defaults and the one selected method object, so
two methods never mix in a run. A method object implements the method hooks it needs; every hook
it leaves out falls back to the harness default (a standard solver, no retrieval, no learning).
Every method hook receives ``run``, typed as :class:`arena.Run` (config, LLM, environment,
experience store, embedder, budgets, episodes): the protocol of what a method may call on the
harness's run context. A hook may declare only the arguments it uses.

During the frozen evaluation phase the harness never calls ``update``, ``extract`` or ``learn``,
the experience store is read-only, and the method's ``state_digest`` must not change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from arena.core.contract.run_api import Run
    from arena.core.contract.types import EpisodeResult, Experience, Task, Trajectory

hookspec = pluggy.HookspecMarker("arena")
hookimpl = pluggy.HookimplMarker("arena")


# ---------------------------------------------------------------------------------------------
# Registration hooks and warm_start_for (global plugin manager)
# ---------------------------------------------------------------------------------------------


@hookspec
def register_methods(register: Callable[..., None]) -> None:
    """Register experience-driven methods by name.

    Call ``register(name, factory, *, config=None, description="", presets=None)`` once per
    method. ``factory(run)`` receives the run (an :class:`arena.Run`) and returns the
    method object whose ``@hookimpl`` functions implement the method hooks. ``config`` is the path
    (or a list of paths, merged in order) of the method's OmegaConf YAML defaults, a top-level
    fragment that may set ``method``, ``learn``, ``solver`` and ``llm`` but not ``eval``,
    ``run`` or ``env``. ``presets`` maps names to more such YAML files, chosen with ``--preset NAME``.
    """


@hookspec
def register_envs(register: Callable[..., None]) -> None:
    """Register environments by name.

    Call ``register(name, factory, *, config=None, description="")``; ``factory(cfg)`` receives
    the env section of the resolved config and returns an :class:`~arena.core.contract.env.Environment`.
    ``config`` is the path of its YAML defaults (merged under the key ``env``).
    """


@hookspec
def register_backends(register: Callable[..., None]) -> None:
    """Register LLM backends by name.

    Call ``register(name, factory, *, config=None, description="")``; ``factory(cfg)`` receives
    the ``llm`` section of the resolved config and returns an :class:`~arena.core.contract.llm.LLMBackend`.
    """


@hookspec(firstresult=True)
def warm_start_for(env: Mapping[str, Any], llm: Mapping[str, Any]) -> str | None:
    """``llm.warmstart: auto``: the folder of a built warm-start base for this world (the run's
    ``env`` section) and model (its ``llm`` section), or None where the plugin knows none.

    Answered when the config is composed, so the run's config.yaml names the base it used (or
    null); the backend that serves the model checks the base against the model's weights.
    """


#: The hooks of a plugin module, asked by the global plugin manager; every other hook is a method's.
PLUGIN_HOOKS = ("register_methods", "register_envs", "register_backends", "warm_start_for")


# ---------------------------------------------------------------------------------------------
# Method hooks (per-run plugin manager: harness defaults + the selected method)
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def learn(run: Run) -> bool | None:
    """Drive the whole learning phase on the train split.

    Override it for a method with its own training loop (e.g. RL over several roles). The default
    is ``run.experience_loop()``: train tasks within the learn budget, each
    ``retrieve -> solve -> extract -> update``, then recorded (``episode_end``). Play episodes
    with ``run.play`` (one request or many) so budgets, costs and resume records are kept.
    Return True when handled.
    """


@hookspec(firstresult=True)
def extract(run: Run, trajectories: list[Trajectory]) -> list[Experience] | None:
    """Turn finished trajectories into experiences (insights, skills, memories).

    Called while learning, and after each test episode on the ``online`` track (never on the
    frozen track's test episodes). The default extracts nothing.
    """


@hookspec(firstresult=True)
def retrieve(run: Run, task: Task) -> list[Experience] | None:
    """Experiences to give the solver for ``task``. The default retrieves nothing.

    Called in both phases; in the frozen evaluation phase the store is read-only.
    """


@hookspec(firstresult=True)
def solve(
    run: Run, task: Task, experiences: list[Experience], seed: int
) -> Trajectory | None:
    """Play one episode of ``task`` with ``experiences`` and return its trajectory.

    The default is the harness's standard solver: a prompt with the goal, experiences, recent
    history and admissible actions, and a constrained choice of one admissible action per step.
    """


@hookspec(firstresult=True)
def evaluation_variants(run: Run) -> list[str] | None:
    """The helper variants of a test task the method plays besides its result, declared once
    before the evaluation plays anything (e.g. Evolving-RL's ``["without_skill"]``, reported
    paired with the result). Each is played at most once per (task, seed), inside that task's
    ``solve``, recorded and counted as an extra episode; a variant not declared here is refused.
    The default declares none.
    """


@hookspec
def update(run: Run, trajectories: list[Trajectory], experiences: list[Experience]) -> None:
    """Learn from finished episodes: store writes, votes, Q-values, gradient steps.

    ``experiences`` are those ``extract`` produced from ``trajectories``. Never called during
    frozen evaluation; called after each test episode on the ``online`` track.
    """


@hookspec
def episode_end(run: Run, result: EpisodeResult, trajectory: Trajectory) -> None:
    """Observe every finished episode, in any phase (logging, statistics). Must not learn."""


@hookspec
def state_digest(run: Run) -> str | None:
    """A digest of method state outside the experience store (weights, tables, files).

    The harness combines it with the store digest before and after frozen evaluation; a change
    marks the run invalid.
    """


@hookspec(firstresult=True)
def export(run: Run) -> list[Experience] | None:
    """What the method learned that another model can use as it is: skill cards, insights,
    memories, trajectories (``arena experiment transfer``, poisoning). None, the default, says it
    exports nothing: what it learned is not text another model reads (e.g. its weights).

    Called after evaluation, on the frozen state: it must not write.
    """


@hookspec
def state_size(run: Run) -> dict[str, Any] | None:
    """Extra size figures of the method's state (e.g. ``{"skills": 12}``) for ``results.json``."""
