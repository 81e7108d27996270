"""SkillRL (aiming-lab/SkillRL): a teacher-distilled hierarchical SkillBank, cold-start SFT, GRPO
with skill-augmented prompts, and recursive evolution of the bank from validation failures.

Registered like any third-party plugin.
"""

from __future__ import annotations

from collections.abc import Callable

import arena
from arena.plugins.skillrl.method import SkillRL


@arena.hookimpl
def register_methods(register: Callable[..., None]) -> None:
    register("skillrl", SkillRL, **arena.plugin_files(__file__),
             description="SkillRL: teacher-distilled SkillBank, cold-start SFT, GRPO with skills, evolution on valid.")
