"""``arena view``: the viewer's data answers, and the page in headless Chromium (an episode step
by step, two runs side by side, a learning curve, and a screenshot looked at)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from arena.core import protocol
from arena.report.viewer import Viewer, make_server
from tests.helpers.browser import evaluate, find_chromium, headless_page, until

FAKE = ["llm.backend=fake", "embedder.name=hashing", "env.n_train=20", "env.n_valid=4", "env.n_test=4",
        "eval.max_steps=6", "eval.limit=2", "learn.budget.episodes=3", "run.seeds=[0,1]"]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("runs")
    return [protocol.run(method, overrides=FAKE, out=root / method)[0] for method in ("memrl", "rag")]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def answer(viewer: Viewer, url: str) -> Any:
    status, _, body = viewer.answer(url)
    return status, json.loads(body)


def test_the_viewer_serves_episodes_trajectories_pairs_and_metrics(two_runs) -> None:
    viewer = Viewer(two_runs)
    status, runs = answer(viewer, "/api/runs")
    assert status == 200 and [r["method"] for r in runs] == ["memrl", "rag"]
    _, episodes = answer(viewer, "/api/episodes?run=0")
    recorded = lines(two_runs[0] / "episodes.jsonl")
    assert len(episodes) == len(recorded) and all(e["has_trajectory"] for e in episodes)
    trajectories = {tuple(t["key"]): t for t in lines(two_runs[0] / "trajectories.jsonl")}
    for episode in episodes:
        _, shown = answer(viewer, f"/api/trajectory?run=0&episode={episode['index']}")
        key = (episode["phase"], episode["split"], episode["task_id"], episode["seed"], episode["variant"])
        assert [s["action"] for s in shown["trajectory"]["steps"]] == [s["action"] for s in trajectories[key]["steps"]]
        # Each step of a constrained choice keeps its three next-best options, best first.
        assert all(len(s["alternatives"]) == 3 and s["alternatives"][0][1] >= s["alternatives"][-1][1]
                   and s["action"] not in [a for a, _ in s["alternatives"]] for s in shown["trajectory"]["steps"])
        assert len(shown["experiences"]) == len(trajectories[key]["experience_ids"])
    _, paired = answer(viewer, "/api/pair?a=0&b=1")
    evaluated = [e for e in recorded if e["phase"] == "evaluate"]
    assert len(paired) == len(evaluated) == 2 * 2 * 2  # 2 splits x 2 tasks x 2 seeds, in both runs
    _, metrics = answer(viewer, "/api/metrics?run=0")
    assert [m["step"] for m in metrics if m["phase"] == "learn"] == [1, 2, 3]
    status, error = answer(viewer, "/api/trajectory?run=5&episode=0")
    assert status == 404 and "run 5 is not being viewed (0 to 1)" in error["error"]


@pytest.mark.slow
def test_the_page_shows_an_episode_a_pair_and_a_curve_in_headless_chromium(two_runs, tmp_path) -> None:
    browser = find_chromium()
    if browser is None:
        pytest.skip("Debian's chromium is not installed (CI set-up: apt-get install -y chromium)")
    import matplotlib.image

    server = make_server(Viewer(two_runs))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port_number = server.server_address[:2]
    url = f"http://{host}:{port_number}/"
    with ExitStack() as stack:
        stack.callback(server.shutdown)
        devtools, session = stack.enter_context(headless_page(browser, tmp_path / "profile"))
        devtools.call("Page.navigate", {"url": url}, session=session)
        devtools.wait_for("Page.loadEventFired")
        listed = until(devtools, session, "document.querySelectorAll('#episodes tbody tr.ep').length")
        # One episode, step by step: its actions as recorded.
        evaluate(devtools, session, "document.querySelector('#episodes tbody tr.ep').click()")
        actions = until(devtools, session, "document.querySelector('table.steps') && Array.from("
                        "document.querySelectorAll('table.steps tbody tr td:nth-child(2) b')).map(b => b.textContent)")
        alternatives = evaluate(devtools, session, "document.querySelector('table.steps td.alternatives').innerText")
        first = lines(two_runs[0] / "trajectories.jsonl")[0]
        # The two runs side by side on the same task and seed.
        evaluate(devtools, session, "(() => { const s = document.querySelector('#other'); s.value = '1';"
                                    " s.dispatchEvent(new Event('change')); })()")
        paired = until(devtools, session, "document.querySelector('#count').textContent.includes('paired')"
                                          " && document.querySelectorAll('#episodes tbody tr.ep').length")
        evaluate(devtools, session, "document.querySelector('#episodes tbody tr.ep').click()")
        sides = until(devtools, session, "document.querySelector('#side-a table.steps') && "
                                         "document.querySelector('#side-b table.steps') && "
                                         "[document.querySelector('#side-a h4').textContent, "
                                         "document.querySelector('#side-b h4').textContent]")
        # The learning curves of MemRL (metrics.jsonl).
        evaluate(devtools, session, "document.querySelector('#curves').click()")
        curves = until(devtools, session, "Array.from(document.querySelectorAll('.curve')).map("
                                          "c => [c.querySelector('b').textContent, c.querySelectorAll('circle').length])")
        shot = devtools.call("Page.captureScreenshot", {"format": "png"}, session=session)
        screenshot = tmp_path / "viewer.png"
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        devtools.call("Runtime.evaluate", {"expression": "1"}, session=session)  # drain late events
    errors = [e["params"] for e in devtools.events if e.get("method") == "Runtime.exceptionThrown"
              or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]
    assert errors == [], errors
    requests = [e["params"]["request"]["url"] for e in devtools.events if e.get("method") == "Network.requestWillBeSent"]
    assert requests and all(u.startswith(url) for u in requests), requests  # nothing leaves the machine
    assert listed == len(lines(two_runs[0] / "episodes.jsonl"))
    assert actions == [s["action"] for s in first["steps"]]
    assert alternatives.splitlines() == [f"{a} ({lp:.2f})" for a, lp in first["steps"][0]["alternatives"]]
    assert paired == 8 and sides == ["A: memrl", "B: rag"]
    names = dict(curves)
    assert {"success", "memories", "reward"} <= set(names) and names["memories"] == 3
    # The screenshot shows a page, not a blank frame: its pixels vary and the header's dark band is there.
    pixels = matplotlib.image.imread(screenshot)
    assert pixels.shape[:2] == (900, 1400) and pixels.std() > 0.05
    assert pixels[5, 5, :3].mean() < 0.4  # the header bar (#234) at the top left
    os.environ.get("ARENA_TEST_ARTIFACTS") and Path(os.environ["ARENA_TEST_ARTIFACTS"], "viewer.png").write_bytes(
        screenshot.read_bytes())


@pytest.mark.slow
def test_arena_view_serves_until_stopped_and_names_a_busy_port(two_runs, tmp_path) -> None:
    import socket
    import sys
    import urllib.request

    command = [sys.executable, "-c", "from arena.cli import cli; cli()", "view", str(two_runs[0]), "--port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = process.stdout.readline()  # type: ignore[union-attr]
        assert "Viewing 1 run(s) at http://127.0.0.1:" in line, line
        url = line.split(" at ", 1)[1].split()[0]
        with urllib.request.urlopen(url + "api/runs", timeout=30) as response:
            assert json.loads(response.read())[0]["method"] == "memrl"
    finally:
        process.terminate()
        process.wait(timeout=10)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        result = subprocess.run([*command[:-1], str(taken)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and f"Cannot listen on 127.0.0.1:{taken}" in result.stderr + result.stdout
