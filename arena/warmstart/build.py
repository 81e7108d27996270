"""Build, find and apply a warm-start base: a LoRA adapter cloned from the expert on train tasks.

A built warm start is a folder: ``recipe.yaml`` (as built), ``adapter/`` (peft's files) and
``manifest.json`` (the recipe's digest, the base model's weights digest, the demonstrations'
statistics and the adapter's digest). The backend merges the adapter into the base weights it
serves, so every method, its trainer and its reference start from the same weights.

Built warm starts are cached under ``$ARENA_CACHE/warmstart/`` (else ``~/.cache/arena/warmstart/``),
keyed by the recipe's digest and the base weights'; a board commits its folder beside its runs,
since training on another CPU rounds differently and would not give the same adapter bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from omegaconf import OmegaConf

from arena.core.config.compose import DEFAULTS_PATH, ConfigError, load_yaml, to_plain
from arena.core.contract.env import TRAIN_SPLIT, Environment, tasks_hash
from arena.core.contract.types import Observation, Termination, Trajectory
from arena.core.execution.solver import Action, StandardSolver, play
from arena.core.execution.tasks import select_tasks
from arena.warmstart.recipe import Recipe, load_recipe

#: Bump when what a build trains on or writes changes (a new cache key for every recipe).
FORMAT = 1
MANIFEST = "manifest.json"
ADAPTER = "adapter"
RECIPE_FILE = "recipe.yaml"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

Say = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"[warmstart] {message}", file=sys.stderr, flush=True)


def default_cache_dir() -> Path:
    from arena.core.host.cache import cache_root

    return cache_root() / "warmstart"


@dataclass(frozen=True)
class WarmStart:
    """A built warm start (its folder and manifest)."""

    folder: Path
    manifest: dict[str, Any]

    @property
    def adapter_dir(self) -> Path:
        return self.folder / ADAPTER

    def describe(self) -> dict[str, Any]:
        """What a run's provenance records of its base (``provenance.model.warmstart``)."""
        keys = ("recipe", "recipe_sha256", "adapter_sha256", "base_weights_sha256", "env",
                "demonstrations", "examples", "steps", "final_loss")
        return {key: self.manifest.get(key) for key in keys}


def adapter_digest(adapter_dir: Path) -> str:
    """SHA-256 over the adapter's tensors (name, dtype, shape, bytes), sorted by name: the
    weights alone, not peft's config file, which names the folder it was built from."""
    import torch
    from safetensors import safe_open

    path = adapter_dir / ADAPTER_WEIGHTS
    if not path.is_file():
        raise ConfigError(f"{adapter_dir} has no {ADAPTER_WEIGHTS}: not a built warm start. Build one "
                          "with `arena warmstart RECIPE`.")
    digest = hashlib.sha256()
    with safe_open(str(path), framework="pt") as handle:
        for name in sorted(handle.keys()):
            tensor = handle.get_tensor(name).contiguous()
            digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
            digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def base_weights_digest(model_folder: Path) -> str:
    """The base model's identity, whatever dtype a run serves it in: for the embedded model the
    SHA-256 of the GGUF it was converted from (the same file on every machine), else the SHA-256
    of the folder's weight files as stored."""
    from arena.core.host.cache import file_sha256, read_source

    gguf = read_source(model_folder).get("gguf_sha256")
    if gguf:
        return str(gguf)

    files = sorted(model_folder.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{model_folder} holds no .safetensors weights: a warm start needs a Hugging "
                          "Face folder (llm.model=embedded, tiny or a local folder)")
    return hashlib.sha256("".join(file_sha256(path) for path in files).encode()).hexdigest()


def cache_key(recipe: Recipe, base_sha256: str) -> str:
    return hashlib.sha256(f"{FORMAT}|{recipe.digest()}|{base_sha256}".encode()).hexdigest()


# -- demonstrations -----------------------------------------------------------------------------


def make_environment(recipe: Recipe) -> Environment:
    """The recipe's environment, its section merged over the environment's YAML defaults."""
    from arena.core.config.plugins import get_plugins

    entry = get_plugins().envs.get(str(recipe.env["name"]))
    settings = {key: value for key, value in recipe.env.items() if key != "name"}
    cfg = OmegaConf.merge(*[load_yaml(path) for path in entry.configs], settings)
    return cast(Environment, entry.factory(cfg))


def demonstrations(recipe: Recipe, env: Environment, say: Say = _stderr) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One prompt-completion example per expert step of ``recipe.demonstrations`` train tasks,
    each prompt exactly as the standard solver renders it at that step. Returns the rows and
    their statistics; an episode the expert does not win is left out (and counted)."""
    from arena.core.rl.sft import example

    solver_cfg = {**to_plain(load_yaml(DEFAULTS_PATH).solver), **recipe.prompt}
    solver = StandardSolver.from_config(cast(Any, None), solver_cfg, instructions=env.instructions())
    tasks = select_tasks(env.tasks(TRAIN_SPLIT), recipe.demonstrations)
    rows: list[dict[str, Any]] = []
    lost = 0
    started = time.perf_counter()
    for done, task in enumerate(tasks, start=1):
        episode = env.open(task)
        prompt_of = solver.prompts(task, [])
        episode_rows: list[dict[str, Any]] = []

        def expert(observation: Observation, trajectory: Trajectory,
                   episode: Any = episode, prompt_of: Any = prompt_of, episode_rows: Any = episode_rows) -> Action:
            action = episode.expert_action()
            if action is None:
                raise RuntimeError(f"the expert has no action for {trajectory.task.task_id}")
            episode_rows.append(example(prompt_of(observation, trajectory), action))
            return Action(text=action)

        trajectory = play(episode, expert, max_steps=200, max_invalid_actions=1)
        if trajectory.status is Termination.ERROR:
            raise RuntimeError(f"The expert's demonstration of {task.task_id} failed: {trajectory.error}")
        if trajectory.status is Termination.SUCCESS:
            rows.extend(episode_rows)
        else:
            lost += 1
        if done % 50 == 0 or done == len(tasks):
            say(f"demonstrations {done}/{len(tasks)} ({len(rows)} steps, {time.perf_counter() - started:.0f} s)")
    stats = {"demonstrations": len(tasks) - lost, "expert_lost": lost, "examples": len(rows),
             "train_tasks_sha256": tasks_hash(tasks),
             "task_types": sorted({task.task_type for task in tasks})}
    if not rows:
        raise RuntimeError(f"The expert won none of {len(tasks)} train tasks of {recipe.env}: nothing to clone")
    return rows, stats


# -- build ----------------------------------------------------------------------------------------


def build(recipe: Recipe, model_folder: Path, out: Path, say: Say = _stderr) -> dict[str, Any]:
    """Play the demonstrations, fine-tune a LoRA adapter on them (float32, the recipe's seed),
    write ``out`` (recipe, adapter, manifest) and return the manifest."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arena.core.rl.sft import ADAPTER_DIR, train_sft

    base_sha = base_weights_digest(model_folder)
    env = make_environment(recipe)
    try:
        rows, stats = demonstrations(recipe, env, say)
    finally:
        env.close()
    steps = max(1, math.ceil(recipe.epochs * len(rows) / recipe.batch_size))
    say(f"{len(rows)} examples from {stats['demonstrations']} expert episodes; {steps} steps of "
        f"{recipe.batch_size} ({recipe.epochs:g} epochs), LoRA r={recipe.lora.r}, lr {recipe.lr:g}")
    torch.manual_seed(recipe.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_folder, local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float32, local_files_only=True)
    started = time.perf_counter()
    last = [started]

    def on_step(done: int, total: int) -> None:
        now = time.perf_counter()
        if now - last[0] >= 30 or done == total:
            last[0] = now
            eta = (now - started) / done * (total - done)
            say(f"step {done}/{total}, {now - started:.0f} s, about {eta / 60:.1f} min left")

    settings = {"steps": steps, "batch_size": recipe.batch_size, "lr": recipe.lr,
                "lr_scheduler": recipe.lr_scheduler, "max_length": recipe.max_length,
                "lora": {"r": recipe.lora.r, "alpha": recipe.lora.alpha, "dropout": recipe.lora.dropout,
                         "target_modules": recipe.lora.target_modules}}
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    _, metrics = train_sft(model, tokenizer, rows, settings, work, recipe.seed, on_step=on_step)
    os.replace(work / ADAPTER_DIR, out / ADAPTER)
    (out / ADAPTER / "README.md").unlink(missing_ok=True)  # peft's model-card template, empty
    shutil.rmtree(work, ignore_errors=True)
    OmegaConf.save(OmegaConf.create(recipe.to_dict()), out / RECIPE_FILE)
    import arena

    manifest = {
        "format": FORMAT, "recipe": recipe.name, "recipe_sha256": recipe.digest(),
        "base_model": model_folder.name, "base_weights_sha256": base_sha, "env": dict(recipe.env),
        **stats, "steps": steps, "final_loss": round(float(metrics["sft/loss"]), 6),
        "train_seconds": round(float(metrics["sft/seconds"]), 1),
        "adapter_sha256": adapter_digest(out / ADAPTER),
        "arena_version": arena.__version__, "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    say(f"built {recipe.name}: adapter {manifest['adapter_sha256'][:12]} in {out}")
    return manifest


def load(folder: Path) -> WarmStart:
    """A built warm start from its folder, its adapter checked against its manifest."""
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise ConfigError(f"{folder} is not a built warm start (no {MANIFEST}). Build one with "
                          "`arena warmstart RECIPE --out FOLDER`, or pass a recipe name.")
    manifest = json.loads(manifest_path.read_text())
    found = adapter_digest(folder / ADAPTER)
    if found != manifest.get("adapter_sha256"):
        raise ConfigError(f"The adapter in {folder} does not match its manifest (sha256 {found[:12]}, "
                          f"manifest {str(manifest.get('adapter_sha256'))[:12]}): it was changed after the "
                          "build. Rebuild it with `arena warmstart`.")
    return WarmStart(folder, manifest)


def resolve(spec: str, model_folder: Path, cache_dir: Path | None = None, say: Say = _stderr) -> WarmStart:
    """``llm.warmstart``: a built folder (checked), or a recipe (name or YAML file) built on
    first use into the cache and reused after. Either way the base must be the run's model."""
    from arena.core.host.cache import build_once

    base = base_weights_digest(model_folder)
    folder = Path(spec).expanduser()
    if not folder.is_dir():
        recipe = load_recipe(spec)
        folder = Path(cache_dir or default_cache_dir()) / f"{recipe.name}-{cache_key(recipe, base)[:12]}"
        if not folder.is_dir():
            say(f"building the warm start '{recipe.name}' on first use (cached in {folder})")
        build_once(folder, lambda tmp: build(recipe, model_folder, tmp, say))
    warm = load(folder)
    if warm.manifest.get("base_weights_sha256") != base:
        raise ConfigError(f"The warm start in {warm.folder} was built on another base model "
                          f"({warm.manifest.get('base_model')!s}); this run's llm.model is "
                          f"{model_folder.name}. Use the model it was built on, or build one for this model.")
    return warm


def apply(model: Any, warm: WarmStart) -> Any:
    """``model`` with the warm start's adapter merged into its weights (in the model's dtype)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(warm.adapter_dir)).merge_and_unload().eval()


def copy_to(warm: WarmStart, out: Path) -> Path:
    """The built folder copied to ``out`` (beside a board), without peft's machine-local paths."""
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} exists and is not empty; choose another --out or remove it.")
    shutil.copytree(warm.folder, out, dirs_exist_ok=True)
    (out / ADAPTER / "README.md").unlink(missing_ok=True)
    config = out / ADAPTER / "adapter_config.json"
    if config.is_file():
        data = json.loads(config.read_text())
        data["base_model_name_or_path"] = warm.manifest.get("base_model")
        config.write_text(json.dumps(data, indent=2) + "\n")
    return out
