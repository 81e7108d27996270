"""The shared warm-start base: behaviour cloning on the expert's train demonstrations.

A policy that acts below chance gives every method nothing to build on, so a board may name a
warm start (``llm.warmstart``) that every one of its runs shares: a LoRA adapter cloned from the
environment's expert on train tasks only, by a recipe declared in YAML (``recipes/``) and fixed
before any test result is seen. Runs record its recipe and digests; the leaderboard never ranks
runs of two bases in one table. ``arena warmstart RECIPE`` builds one ahead of time.
"""

from arena.warmstart.recipe import Recipe, load_recipe, recipe_names

__all__ = ["Recipe", "load_recipe", "recipe_names"]
