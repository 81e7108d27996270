"""mem0 against its authors' own outputs (tests/golden/mem0.yaml): the facts a reply yields and
the memory an ADD / UPDATE / DELETE / NONE reply leaves, read as the paper preset reads them
(``method.parser = authors``)."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from arena.core.config.compose import compose
from arena.core.contract.types import Experience, Provenance
from arena.core.services.embedder import HashingEmbedder
from arena.core.services.store import ExperienceStore
from arena.plugins.mem0.method import MEMORY, apply_events
from arena.plugins.mem0.prompts import parse_events, parse_facts

CASES = yaml.safe_load((Path(__file__).parent / "golden" / "mem0.yaml").read_text())["cases"]
FACTS = [case for case in CASES if case["kind"] == "facts"]
EVENTS = [case for case in CASES if case["kind"] == "events"]


@pytest.fixture(scope="module")
def paper_method() -> Any:
    from arena.core.config.plugins import Plugins

    plugins = Plugins()
    plugins.load_defaults()
    return compose(plugins, "mem0", preset="paper").method


@pytest.mark.parametrize("golden", FACTS, ids=[case["name"] for case in FACTS])
def test_facts_are_read_as_mem0_reads_them(paper_method, golden) -> None:
    facts = parse_facts(golden["input"]["reply"], int(paper_method.max_facts), str(paper_method.parser))
    assert facts == golden["expected"]["facts"]


@pytest.mark.parametrize("golden", EVENTS, ids=[case["name"] for case in EVENTS])
def test_events_leave_the_memory_mem0_leaves(paper_method, golden) -> None:
    store = ExperienceStore(None, HashingEmbedder())
    source = Provenance(("household/train/a",), "train")
    shown = {key: Experience(MEMORY, text, source, {"task_type": "t"})
             for key, text in golden["input"]["shown"].items()}
    store.add(list(shown.values()))
    events = parse_events(golden["input"]["reply"], str(paper_method.parser))
    apply_events(types.SimpleNamespace(store=store), events, dict(shown),  # type: ignore[arg-type]
                 Provenance(("household/train/b",), "train"), "t")
    assert sorted(m.text for m in store.all(kind=MEMORY)) == sorted(golden["expected"]["memories"])
