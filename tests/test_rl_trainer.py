"""The RL trainer core: advantages, the joint two-role loss, and PolicyTrainer on the tiny Llama.

Loss terms are checked against numbers worked out by hand; trainer behaviour (what changes,
what is reported, what a checkpoint restores) on the tiny random model, in float32 so that
results are exact and repeatable.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from omegaconf import OmegaConf

from arena.backends.embedded import tiny_model_dir
from arena.backends.transformers_backend import TransformersBackend
from arena.core.contract.llm import SamplingParams
from arena.core.rl import (
    LoraSettings,
    PolicyTrainer,
    Sample,
    TrainerConfig,
    Turn,
    assign_advantages,
    clipped_surrogate,
    concat_turns,
    group_advantages,
    low_var_kl,
    mini_batches,
    policy_loss,
    sample_from_choice,
    token_entropy,
    token_logprobs,
    with_signal,
)
from arena.core.rl import loss as loss_module
from tests.helpers.models import EVOLVING, fresh_model, make_samples

FP32 = {"precision": "fp32", "entropy_coef": EVOLVING, "micro_batch_size": 3}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny model's operations are too small to gain from threads, and spinning threads
    slow down ~10x when another process shares the two cores; one thread keeps this file fast."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir(), local_files_only=True)


def trainable_snapshot(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.trainable.items()}


# ----------------------------------------------------------------------------------------------
# Data and advantages
# ----------------------------------------------------------------------------------------------


def test_group_advantages_by_hand() -> None:
    rewards = [1.0, 0.0, 2.0, 5.0, 3.0, 10.0]
    groups = ["a", "c", "a", "b", "a", "c"]
    got = group_advantages(rewards, groups)
    # a: mean 2, unbiased std 1. c: mean 5, unbiased std sqrt(50). b: a group of one -> 0.
    expected = [-1 / (1 + 1e-6), -5 / (math.sqrt(50) + 1e-6), 0.0, 0.0, 1 / (1 + 1e-6)]
    expected.append(5 / (math.sqrt(50) + 1e-6))
    assert got == pytest.approx(expected, abs=1e-12)
    assert group_advantages([3.0, 3.0], ["x", "x"]) == [0.0, 0.0]  # no spread: no signal
    # Evolving-RL's grpo_normalize divides the variance by n: a's std is sqrt(2/3), c's 5.
    population = group_advantages(rewards, groups, std="population")
    a, c = math.sqrt(2 / 3) + 1e-6, 5 + 1e-6
    assert population == pytest.approx([-1 / a, -5 / c, 0.0, 0.0, 1 / a, 5 / c], abs=1e-12)
    with pytest.raises(ValueError, match="std must be one of"):
        group_advantages(rewards, groups, std="biased")


def test_assign_advantages_scales_each_role() -> None:
    def s(role: str, group: str, reward: float) -> Sample:
        return sample_from_choice([1, 2], [3], [-1.0], role, group, reward)

    samples = [s("extractor", "e", 0), s("extractor", "e", 1), s("solver", "t", 1)]
    samples += [s("solver", "t", 0), s("critic", "k", 4), s("critic", "k", 2)]
    assign_advantages(samples, {"extractor": 0.2, "solver": 1.0})
    unit = 0.5 / (math.sqrt(0.5) + 1e-6)  # rewards {0, 1}: mean 0.5, unbiased std sqrt(0.5)
    k = 1 / (math.sqrt(2) + 1e-6)  # rewards {4, 2}: mean 3, unbiased std sqrt(2); scale 1
    expected = [-0.2 * unit, 0.2 * unit, unit, -unit, k, -k]
    assert [x.advantage for x in samples] == pytest.approx(expected, abs=1e-12)


def test_with_signal_keeps_only_samples_of_groups_that_differ() -> None:
    samples = [sample_from_choice([1], [2], [-1.0], "solver", group, reward)
               for group, reward in (("won_some", 10), ("won_some", 0), ("all_lost", 0),
                                     ("all_lost", 0), ("all_won", 10), ("all_won", 10))]
    assign_advantages(samples, {})
    kept = with_signal(samples)
    assert [(s.group, s.reward) for s in kept] == [("won_some", 10), ("won_some", 0)]
    assert all(s.advantage != 0 for s in kept)


def test_samples_mask_only_generated_tokens() -> None:
    single = sample_from_choice([5, 6, 7], [8, 9], [-0.5, -1.5], "solver", "g", 1.0)
    assert single.input_ids == [5, 6, 7, 8, 9]
    assert single.loss_mask == [0, 0, 0, 1, 1]
    assert single.old_logprobs == [0.0, 0.0, 0.0, -0.5, -1.5]

    episode = concat_turns(
        [
            Turn([1, 2, 3], False),  # prompt
            Turn([4, 5], True, [-0.1, -0.2]),  # action 1
            ([6, 7, 8], False, None),  # observation: context only
            ([9], True, [-0.3]),  # action 2
        ],
        role="solver",
        group="g",
        reward=10,
    )
    assert episode.input_ids == list(range(1, 10))
    assert episode.loss_mask == [0, 0, 0, 1, 1, 0, 0, 0, 1]
    assert episode.old_logprobs == [0, 0, 0, -0.1, -0.2, 0, 0, 0, -0.3]
    assert episode.n_trained == 3

    with pytest.raises(ValueError, match="first token"):
        Sample([1, 2], [1, 0], [-1.0, 0.0], "solver", "g", 0.0)
    with pytest.raises(ValueError, match="same length"):
        Sample([1, 2], [0, 1], [0.0], "solver", "g", 0.0)
    with pytest.raises(ValueError, match="one log-prob per token"):
        concat_turns([([1], False, None), ([2, 3], True, [-1.0])], role="r", group="g", reward=0)


# ----------------------------------------------------------------------------------------------
# Loss terms
# ----------------------------------------------------------------------------------------------


def test_clipped_surrogate_by_hand() -> None:
    ratio = torch.tensor([1.05, 1.30, 0.80, 1.12, 0.95, 1.30, 0.80, 0.88])
    adv = torch.tensor([1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0])
    old = torch.full_like(ratio, -2.0)
    logp = (old + ratio.log()).requires_grad_()
    loss, clipped = clipped_surrogate(logp, old, adv, eps_low=0.1, eps_high=0.15)
    expected = [
        -1.05,  # A>0, inside the range
        -1.15,  # A>0, ratio above 1 + eps_high: clipped to 1.15
        -0.80,  # A>0, ratio below 1 - eps_low: the unclipped (pessimistic) term
        -1.12,  # A>0, inside only because eps_high (0.15) > eps_low (0.1)
        0.95,  # A<0, inside
        1.30,  # A<0, ratio above the range: unclipped
        0.90,  # A<0, ratio below 1 - eps_low: clipped to 0.9
        0.90,  # A<0, 0.88 < 0.9: clipped by eps_low, not the looser eps_high
    ]
    assert loss.tolist() == pytest.approx(expected, abs=1e-6)
    assert clipped.tolist() == [False, True, False, False, False, False, True, True]
    loss.sum().backward()
    # Clipped tokens carry no gradient; the others d(-ratio*A)/dlogp = -ratio*A.
    expected_grad = [-1.05, 0.0, -0.80, -1.12, 0.95, 1.30, 0.0, 0.0]
    assert logp.grad.tolist() == pytest.approx(expected_grad, abs=1e-6)


def test_dual_clip_bounds_the_loss_of_negative_advantages_by_hand() -> None:
    ratio = torch.tensor([2.0, 4.0, 5.0, 4.0])
    adv = torch.tensor([-1.0, -1.0, -2.0, 1.0])
    old = torch.full_like(ratio, -3.0)
    logp = (old + ratio.log()).requires_grad_()
    loss, clipped = clipped_surrogate(logp, old, adv, eps_low=0.2, eps_high=0.2, dual_clip=3.0)
    # A<0: -ratio*A until it passes -c*A = 3|A|; a positive advantage is never dual-clipped.
    assert loss.tolist() == pytest.approx([2.0, 3.0, 6.0, -1.2], abs=1e-6)
    assert clipped.tolist() == [False, True, True, True]
    loss.sum().backward()
    assert logp.grad.tolist() == pytest.approx([2.0, 0.0, 0.0, 0.0], abs=1e-6)
    plain, _ = clipped_surrogate(logp.detach(), old, adv, eps_low=0.2, eps_high=0.2)
    assert plain.tolist() == pytest.approx([2.0, 4.0, 10.0, -1.2], abs=1e-6)  # without it
    with pytest.raises(ValueError, match="greater than 1"):
        clipped_surrogate(logp, old, adv, eps_low=0.2, eps_high=0.2, dual_clip=1.0)
    with pytest.raises(ValueError, match="dual_clip must be greater than 1"):
        TrainerConfig(dual_clip=0.5)


def test_mini_batches_split_an_update_into_optimizer_steps() -> None:
    samples = [Sample(input_ids=[i, i + 1], loss_mask=[0, 1], old_logprobs=[0.0, -1.0], role="solver",
                      group="g", reward=0.0) for i in range(10)]
    assert mini_batches(samples, None, random.Random(0)) == [samples]
    assert mini_batches(samples, 64, random.Random(0)) == [samples]
    batches = mini_batches(samples, 4, random.Random(0))
    assert [len(b) for b in batches] == [4, 4, 2]
    assert sorted(id(s) for b in batches for s in b) == sorted(id(s) for s in samples)
    assert batches == mini_batches(samples, 4, random.Random(0))  # seeded
    assert batches != mini_batches(samples, 4)  # shuffled; without an rng, in order:
    assert mini_batches(samples, 4) == [samples[:4], samples[4:8], samples[8:]]
    with pytest.raises(ValueError, match="at least 1"):
        mini_batches(samples, 0)


def test_mini_batches_of_whole_episodes_never_split_one() -> None:
    """Under ``episode-mean`` an episode's decisions go to one optimizer step together."""
    def decision(episode: str | None, i: int) -> Sample:
        return Sample(input_ids=[i, i + 1], loss_mask=[0, 1], old_logprobs=[0.0, -1.0],
                      role="solver", group="g", reward=0.0, episode=episode)

    samples = ([decision("long", i) for i in range(5)] + [decision("short", i) for i in range(2)]
               + [decision(None, i) for i in range(13)])  # cards: each its own
    counts = set()
    for seed in range(20):
        batches = mini_batches(samples, 4, random.Random(seed), whole_episodes=True)
        assert sorted(id(s) for b in batches for s in b) == sorted(id(s) for s in samples)
        for episode in ("long", "short"):
            assert sum(any(s.episode == episode for s in b) for b in batches) == 1
        counts.add(len(batches))
        assert all(len(b) <= 4 + 5 - 1 for b in batches)  # a step holds one batch's share
    # 20 samples in mini-batches of 4: 5 steps, one fewer where the 5-decision episode fills one
    assert counts <= {4, 5} and 5 in counts
    split = mini_batches(samples, 4, random.Random(0))  # decisions shuffled one by one
    assert [len(b) for b in split] == [4] * 5
    assert sum(any(s.episode == "long" for s in b) for b in split) > 1


def test_low_var_kl_by_hand() -> None:
    logp = torch.tensor([-1.0, -2.0, -1.5, -40.0])
    ref = torch.tensor([-2.0, -1.0, -1.5, -5.0])
    kl = low_var_kl(logp, ref).tolist()
    assert kl[0] == pytest.approx(math.exp(-1) + 1 - 1, abs=1e-6)  # ref - logp = -1
    assert kl[1] == pytest.approx(math.e - 1 - 1, abs=1e-6)  # ref - logp = +1
    assert kl[2] == 0.0
    assert kl[3] == 10.0  # log-ratio 35 clamped to 20, then the value clamped to 10


def batch_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    vocab = 50
    logits = (torch.randn(2, 6, vocab, generator=gen) * 3).requires_grad_()
    targets = torch.randint(0, vocab, (2, 6), generator=gen)
    mask = torch.tensor([[0, 1, 1, 0, 0, 1], [0, 0, 1, 1, 1, 0]])
    return {"logits": logits, "targets": targets, "mask": mask}


def test_token_logprobs_and_entropy_equal_the_dense_definitions_across_blocks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocked row by row (3 rows a block here, so blocks split the batch unevenly), the values
    and the gradients are those of one full log-softmax."""
    monkeypatch.setattr(loss_module, "LOGSOFTMAX_ROWS", 3)
    t = batch_tensors(2)
    dense_logits = t["logits"].detach().clone().requires_grad_()
    logp, entropy = token_logprobs(t["logits"], t["targets"]), token_entropy(t["logits"])
    full = dense_logits.log_softmax(-1)
    dense_logp = full.gather(-1, t["targets"][..., None])[..., 0]
    dense_entropy = -(full.exp() * full).sum(-1)
    assert logp.shape == entropy.shape == t["targets"].shape
    torch.testing.assert_close(logp, dense_logp)
    torch.testing.assert_close(entropy, dense_entropy)
    (logp.sum() + 0.5 * entropy.sum()).backward()
    (dense_logp.sum() + 0.5 * dense_entropy.sum()).backward()
    torch.testing.assert_close(t["logits"].grad, dense_logits.grad)


def test_masked_tokens_get_no_gradient() -> None:
    t = batch_tensors()
    logp = token_logprobs(t["logits"], t["targets"])
    entropy = token_entropy(t["logits"])
    garbage = torch.full_like(logp, float("nan"))  # whatever sits at masked positions
    old = torch.where(t["mask"].bool(), logp.detach() - 0.05, garbage)
    ref = torch.where(t["mask"].bool(), logp.detach() + 0.3, garbage)
    out = policy_loss(
        logp,
        old,
        torch.tensor([1.0, -0.5]),
        t["mask"],
        ["extractor", "solver"],
        entropy=entropy,
        ref_logprobs=ref,
        entropy_coef=EVOLVING,
    )
    assert torch.isfinite(out.loss)
    out.loss.backward()
    grad = t["logits"].grad
    masked = ~t["mask"].bool()
    assert torch.count_nonzero(grad[masked]) == 0
    assert (grad[~masked].abs().sum(-1) > 0).all()


def test_entropy_coefficient_sign_and_role() -> None:
    t = batch_tensors(1)
    with torch.no_grad():
        logp = token_logprobs(t["logits"], t["targets"])
        entropy = token_entropy(t["logits"])
    roles = ["extractor", "solver"]
    args = (logp, logp - 0.01, torch.tensor([0.7, 0.7]), t["mask"], roles)
    kwargs = {"ref_logprobs": logp, "entropy_coef": EVOLVING}

    def loss(ent: torch.Tensor) -> float:
        return float(policy_loss(*args, entropy=ent, **kwargs).loss)

    base = loss(entropy)
    more_extractor = entropy.clone()
    more_extractor[0] += 1.0
    more_solver = entropy.clone()
    more_solver[1] += 1.0
    n_tokens = int(t["mask"].sum())
    n_extractor = int(t["mask"][0].sum())
    # extractor coef -0.03: loss = ... + 0.03 * H, token-mean over all trained tokens
    assert loss(more_extractor) - base == pytest.approx(0.03 * n_extractor / n_tokens, abs=1e-6)
    assert loss(more_solver) == pytest.approx(base, abs=1e-7)  # solver coef 0


# ----------------------------------------------------------------------------------------------
# PolicyTrainer
# ----------------------------------------------------------------------------------------------


def test_step_updates_the_served_weights_and_reports_both_roles() -> None:
    llm = TransformersBackend({"model": "tiny", "dtype": "float32"})
    digest = llm.weights_digest()
    calls = []

    def changed() -> None:
        calls.append(1)
        llm.mark_weights_changed()

    def changing() -> None:
        calls.append(0)
        llm.drop_cached_states()

    trainer = PolicyTrainer(llm.model, llm.tokenizer, FP32, on_weights_changed=changed,
                            on_weights_changing=changing)
    before = trainable_snapshot(trainer)
    samples = make_samples()
    llm.choose([[{"role": "user", "content": "go to the desk 1"}]], [["look", "go to desk 1"]], SamplingParams())
    assert llm._prefix_cache is not None and llm._prefix_cache.tokens_held > 0
    held_during_step = []
    metrics = trainer.step(samples, on_micro_batch=lambda *_: held_during_step.append(
        llm._prefix_cache.tokens_held))

    # Told before the step that the weights are changing (the cached prompt states are of the
    # old weights, and their memory serves the step) and after it that they changed (the new
    # weights are served): once each.
    assert calls == [0, 1] and metrics["step"] == 1 and metrics["skipped"] == 0
    assert held_during_step and set(held_during_step) == {0}
    assert not llm.model.training
    assert llm.weights_digest() != digest  # the backend serves the updated module
    assert any(not torch.equal(before[n], p) for n, p in trainer.trainable.items())
    for role in ("solver", "extractor"):
        assert metrics[f"{role}/pg_loss"] != 0
        assert metrics[f"{role}/loss"] != 0
        assert metrics[f"{role}/entropy"] > 0
    assert metrics["extractor/n_tokens"] == sum(s.n_trained for s in samples[4:])
    assert metrics["solver/loss"] + metrics["extractor/loss"] == pytest.approx(metrics["loss"])
    assert 0 < metrics["grad_norm"] < math.inf


def test_solver_only_batch_reports_zero_extractor(tokenizer) -> None:
    trainer = PolicyTrainer(fresh_model(), tokenizer, FP32)
    metrics = trainer.step(make_samples(solver_only=True))
    assert metrics["solver/n_tokens"] > 0 and metrics["solver/pg_loss"] != 0
    extractor = {k: v for k, v in metrics.items() if k.startswith("extractor/")}
    assert len(extractor) == 6 and set(extractor.values()) == {0.0}


def test_micro_batching_does_not_change_the_update(tokenizer) -> None:
    """Token weights are normalised over the whole step, so 1-sample micro-batches accumulate
    to the same gradient as one batch of all samples. (Compared through Adam's first moment,
    which is (1 - beta1) * gradient after one unclipped step: the weights themselves would not
    show a wrong scale, since Adam's first update is sign(gradient) times lr.)"""
    results = []
    for size in (1, 7):
        config = {**FP32, "micro_batch_size": size, "max_grad_norm": 0.0}
        trainer = PolicyTrainer(fresh_model(), tokenizer, config)
        metrics = trainer.step(make_samples())
        moments = [state["exp_avg"] for state in trainer.optimizer.state.values()]
        results.append((metrics, moments))
    (m1, g1), (m7, g7) = results
    assert m1["loss"] == pytest.approx(m7["loss"], rel=1e-5)
    assert m1["grad_norm"] == pytest.approx(m7["grad_norm"], rel=1e-5)
    one, seven = torch.cat([g.flatten() for g in g1]), torch.cat([g.flatten() for g in g7])
    assert float((one - seven).norm() / one.norm()) < 1e-5


@pytest.mark.parametrize("aggregation", ["token-mean", "sample-mean"])
def test_aggregation_by_hand(tokenizer, aggregation: str) -> None:
    """With recomputed old log-probs the ratio is 1, so each token's pg loss is -A and, with no
    KL (reference = policy at step 1) nor entropy term, the loss is a weighted mean of -A."""
    config = {**FP32, "entropy_coef": {}, "aggregation": aggregation, "old_logprobs": "recompute"}
    trainer = PolicyTrainer(fresh_model(), tokenizer, config)
    samples = make_samples()
    metrics = trainer.step(samples)
    n = [s.n_trained for s in samples]
    if aggregation == "token-mean":
        expected = -sum(k * s.advantage for k, s in zip(n, samples)) / sum(n)
    else:
        expected = -sum(s.advantage for s in samples) / len(samples)
    assert metrics["loss"] == pytest.approx(expected, abs=1e-6)
    assert metrics["solver/clip_frac"] == 0
    assert metrics["extractor/kl"] == pytest.approx(0, abs=1e-9)


@pytest.mark.parametrize("aggregation", ["episode-mean", "token-mean"])
def test_an_update_keeps_episodes_whole_only_under_episode_mean(aggregation: str) -> None:
    from contextlib import nullcontext
    from types import SimpleNamespace

    from arena.core.rl.checkpointed import CheckpointedTrainer

    steps: list[list[Sample]] = []
    fake = SimpleNamespace(config=TrainerConfig.from_mapping({"aggregation": aggregation}),
                           trainer=SimpleNamespace(step=lambda batch, on_micro_batch: steps.append(batch) or {}))
    samples = [Sample(input_ids=[i, i + 1], loss_mask=[0, 1], old_logprobs=[0.0, -1.0], role="solver",
                      group="g", reward=0.0, episode=f"episode-{i // 6}") for i in range(24)]
    metrics = CheckpointedTrainer.update(fake, samples, mini_batch_size=4, rng=random.Random(0),  # type: ignore[arg-type]
                                         progress=lambda label: nullcontext(SimpleNamespace(update=None)),
                                         label="it0")
    split = [len({s.episode for s in step}) for step in steps]
    assert metrics["updates"] == len(steps)
    if aggregation == "episode-mean":
        assert len(steps) == 4 and split == [1, 1, 1, 1]  # 4 episodes of 6 in mini-batches of 4
    else:
        assert len(steps) == 6 and max(split) > 1


def test_episode_mean_weighs_an_episode_of_several_decisions_once(tokenizer) -> None:
    """Under ``episode-mean`` two decision samples of one episode are one unit of the mean, as
    slime's one sequence per episode is; ``sample-mean`` counts them twice."""
    config = {**FP32, "entropy_coef": {}, "old_logprobs": "recompute"}
    samples = make_samples()
    samples[1].episode = samples[2].episode = "won-episode"  # both rewarded 10: one advantage
    assert samples[1].advantage == samples[2].advantage > 0
    losses = {}
    for aggregation in ("episode-mean", "sample-mean"):
        trainer = PolicyTrainer(fresh_model(), tokenizer, {**config, "aggregation": aggregation})
        losses[aggregation] = trainer.step(samples)["loss"]
    units = [samples[0], samples[1], *samples[3:]]
    assert losses["episode-mean"] == pytest.approx(-sum(s.advantage for s in units) / len(units), abs=1e-6)
    assert losses["sample-mean"] == pytest.approx(-sum(s.advantage for s in samples) / len(samples), abs=1e-6)


def test_an_episode_trained_decision_by_decision_under_episode_mean_steps_as_one_sequence() -> None:
    """Two transcript episodes of different lengths: as two whole sequences under
    ``sample-mean`` (slime's, the authors') and as their decisions under ``episode-mean``, the
    step has the same loss and gradient; under ``token-mean`` the longer episode weighs more."""
    from arena.core.execution.solver import StandardSolver, play
    from arena.core.rl import decision_samples, episode_sample
    from arena.envs.household import HouseholdEnvironment

    llm = TransformersBackend({"model": "tiny", "dtype": "float32"})
    env = HouseholdEnvironment(level="easy", n_train=2, n_valid=0, n_test=0)
    solver = StandardSolver.from_config(llm, {"history": 2, "show_admissible": True,
                                              "max_experiences": 4, "max_experience_chars": 800,
                                              "layout": "transcript"})
    episodes = []
    for task, steps, advantage in zip(env.tasks("train"), (2, 5), (1.0, -0.5)):
        trajectory = play(env.open(task), solver.policy(task, [], 3, temperature=1.0),
                          max_steps=steps, max_invalid_actions=10)
        episodes.append((trajectory, advantage))
    whole = [episode_sample(t, role="solver", group="g", reward=0.0, advantage=a) for t, a in episodes]
    decisions = [s for t, a in episodes
                 for s in decision_samples(t, role="solver", group="g", reward=0.0, advantage=a)]
    assert all(s is not None for s in whole) and len(decisions) == 2 + 5

    def step(samples: list, aggregation: str) -> tuple[float, torch.Tensor]:
        model = TransformersBackend({"model": "tiny", "dtype": "float32"}).model
        config = {**FP32, "entropy_coef": {}, "aggregation": aggregation, "max_grad_norm": 0.0}
        trainer = PolicyTrainer(model, llm.tokenizer, config)
        metrics = trainer.step(samples)
        moments = torch.cat([state["exp_avg"].flatten() for state in trainer.optimizer.state.values()])
        return metrics["loss"], moments

    loss_whole, grad_whole = step(whole, "sample-mean")
    loss_episodes, grad_episodes = step(decisions, "episode-mean")
    _, grad_tokens = step(decisions, "token-mean")
    assert loss_episodes == pytest.approx(loss_whole, rel=1e-4, abs=1e-6)
    assert float((grad_episodes - grad_whole).norm() / grad_whole.norm()) < 1e-3
    assert float((grad_tokens - grad_whole).norm() / grad_whole.norm()) > 0.05


def test_positive_advantage_raises_the_completion_logprob(tokenizer) -> None:
    trainer = PolicyTrainer(fresh_model(), tokenizer, {**FP32, "lr": 1e-4, "kl_coef": 0.0})
    samples = make_samples(solver_only=True)
    current = trainer.logprobs(samples)
    for sample, logprobs in zip(samples, current):
        sample.old_logprobs = logprobs  # on-policy, as after a fresh rollout
    good = [s for s in samples if s.advantage > 0]
    bad = [s for s in samples if s.advantage < 0]
    before_good = [sum(x) for x in trainer.logprobs(good)]
    before_bad = [sum(x) for x in trainer.logprobs(bad)]
    trainer.step(samples)
    after_good = [sum(x) for x in trainer.logprobs(good)]
    after_bad = [sum(x) for x in trainer.logprobs(bad)]
    assert all(a > b for a, b in zip(after_good, before_good))
    assert all(a < b for a, b in zip(after_bad, before_bad))


def test_lora_trains_adapters_only_and_reference_is_the_base(tokenizer) -> None:
    model = fresh_model()
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    config = {**FP32, "lr": 1e-3, "lora": {"r": 4, "alpha": 8, "dropout": 0.0}}
    trainer = PolicyTrainer(model, tokenizer, config)
    assert trainer.is_lora and all("lora_" in name for name in trainer.trainable)
    adapters = trainable_snapshot(trainer)
    samples = make_samples()
    probe = torch.tensor([samples[0].input_ids])
    with torch.no_grad():
        served_before = model(probe).logits
    trainer.step(samples)
    metrics = trainer.step(samples)  # the second step also has a non-zero KL to the base
    assert metrics["solver/kl"] > 0
    with torch.no_grad():  # the module given to the trainer (a backend's) now carries adapters
        assert not torch.allclose(model(probe).logits, served_before)

    after = {k.replace("base_layer.", ""): v for k, v in model.state_dict().items()}
    for name, value in base_state.items():
        assert torch.equal(after[name], value), name  # base weights untouched
    assert any(not torch.equal(adapters[n], p) for n, p in trainer.trainable.items())

    untouched = PolicyTrainer(fresh_model(), tokenizer, {**FP32, "kl_coef": 0.0})
    base_logprobs = untouched.logprobs(samples)
    reference = trainer.logprobs(samples, reference=True)
    policy = trainer.logprobs(samples)
    for ref_row, base_row, policy_row in zip(reference, base_logprobs, policy):
        assert ref_row == pytest.approx(base_row, abs=1e-5)
        assert policy_row != pytest.approx(base_row, abs=1e-5)


@pytest.mark.parametrize("mode", ["full", "lora", "bf16-masters"])
def test_checkpoint_resume_matches_an_uninterrupted_run(
    tokenizer, tmp_path: Path, mode: str
) -> None:
    # LoRA dropout makes the step random, so the RNG state must be restored too.
    lora = {"lora": {"r": 4, "alpha": 8, "dropout": 0.2}} if mode == "lora" else {}
    config = {**(MIXED if mode == "bf16-masters" else FP32), "lr": 1e-3, **lora}
    first, second = make_samples(seed=1), make_samples(seed=2)

    def model_for_mode() -> torch.nn.Module:
        model = fresh_model()
        return model.to(torch.bfloat16) if mode == "bf16-masters" else model

    trainer = PolicyTrainer(model_for_mode(), tokenizer, config)
    trainer.step(first)
    trainer.save(tmp_path / "ckpt")
    trainer.save(tmp_path / "ckpt")  # overwriting an existing checkpoint
    saved_state = {name: trainer.optimizer.state[p]["exp_avg"].clone() for name, p in trainer.optimized.items()}
    trainer.step(second)
    uninterrupted = trainable_snapshot(trainer)

    torch.manual_seed(12345)  # a resumed process starts from some other RNG state
    resumed = PolicyTrainer(model_for_mode(), tokenizer, config)
    resumed.load(tmp_path / "ckpt")
    assert resumed.step_count == 1
    assert len(resumed.optimizer.state) == len(saved_state)
    for name, param in resumed.optimized.items():
        assert torch.equal(resumed.optimizer.state[param]["exp_avg"], saved_state[name]), name
    resumed.step(second)
    assert resumed.step_count == 2
    for name, value in trainable_snapshot(resumed).items():
        assert torch.equal(value, uninterrupted[name]), name
    for name, master in resumed.masters.items():  # the float32 masters, not their rounding
        assert torch.equal(master, trainer.masters[name]), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary left behind


@pytest.mark.parametrize("mode", ["lora", "bf16-masters"])
def test_a_checkpoint_without_its_optimizer_state_serves_the_same_weights_and_refuses_to_train(
    tokenizer, tmp_path: Path, mode: str
) -> None:
    """``arena slim``: a finished run's checkpoints keep their weights (the float32 masters of
    half-precision ones) and lose Adam's moments, two thirds of a LoRA checkpoint."""
    from arena.core.rl.trainer import drop_optimizer_state

    lora = {"lora": {"r": 4, "alpha": 8, "dropout": 0.0}} if mode == "lora" else {}
    config = {**(MIXED if mode == "bf16-masters" else FP32), "lr": 1e-3, **lora}

    def model_for_mode() -> torch.nn.Module:
        model = fresh_model()
        return model.to(torch.bfloat16) if mode == "bf16-masters" else model

    trainer = PolicyTrainer(model_for_mode(), tokenizer, config)
    trainer.step(make_samples(seed=1))
    trainer.save(tmp_path / "ckpt")
    sizes = [sum(f.stat().st_size for f in (tmp_path / "ckpt").rglob("*") if f.is_file())]
    assert drop_optimizer_state(tmp_path / "ckpt") is True
    sizes.append(sum(f.stat().st_size for f in (tmp_path / "ckpt").rglob("*") if f.is_file()))
    assert sizes[1] < 0.45 * sizes[0], sizes  # the weights and two moments of each: a third is left
    assert drop_optimizer_state(tmp_path / "ckpt") is False  # nothing more to drop
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary left behind

    resumed = PolicyTrainer(model_for_mode(), tokenizer, config)
    resumed.load(tmp_path / "ckpt")
    assert resumed.step_count == 1 and not resumed.can_train
    for name, value in trainable_snapshot(resumed).items():
        assert torch.equal(value, trainer.trainable[name]), name
    for name, master in resumed.masters.items():
        assert torch.equal(master, trainer.masters[name]), name
    with pytest.raises(ValueError, match="without its optimizer state.*full copy"):
        resumed.step(make_samples(seed=2))


def test_a_checkpoint_of_the_first_format_still_resumes(tokenizer, tmp_path: Path) -> None:
    """Runs checkpointed before sharded training (safetensors weights, a torch optimizer state)
    resume as they were; new checkpoints are torch.distributed.checkpoint folders."""
    import json

    from safetensors.torch import save_file

    config = {**FP32, "lr": 1e-3}
    trainer = PolicyTrainer(fresh_model(), tokenizer, config)
    trainer.step(make_samples(seed=1))
    old = tmp_path / "old"
    old.mkdir()
    save_file({n: p.detach().contiguous() for n, p in trainer.trainable.items()}, old / "weights.safetensors")
    torch.save(trainer.optimizer.state_dict(), old / "optimizer.pt")
    torch.save({"cpu": torch.get_rng_state()}, old / "rng.pt")
    (old / "trainer_state.json").write_text(json.dumps({"format": 1, "step": 1, "mode": "full"}))
    trainer.save(tmp_path / "new")
    assert (tmp_path / "new" / ".metadata").exists() and not (tmp_path / "new" / "weights.safetensors").exists()
    trainer.step(make_samples(seed=2))

    resumed = PolicyTrainer(fresh_model(), tokenizer, config)
    resumed.load(old)
    resumed.step(make_samples(seed=2))
    for name, value in trainable_snapshot(resumed).items():
        assert torch.equal(value, trainer.trainable[name]), name


def test_activation_checkpointing_gives_the_same_step(tokenizer) -> None:
    results = []
    for checkpointing in (False, True):
        trainer = PolicyTrainer(fresh_model(), tokenizer, {**FP32, "lr": 1e-3, "activation_checkpointing": checkpointing})
        results.append((trainer.step(make_samples()), trainable_snapshot(trainer)))
        assert trainer._lm().is_gradient_checkpointing is checkpointing
    (plain, plain_weights), (recomputed, recomputed_weights) = results
    assert recomputed["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-6)
    assert recomputed["loss"] == pytest.approx(plain["loss"], rel=1e-6)
    for name, value in plain_weights.items():
        assert torch.allclose(recomputed_weights[name], value, atol=1e-7), name


def test_non_finite_gradient_skips_the_step(tokenizer) -> None:
    calls = []
    trainer = PolicyTrainer(
        fresh_model(), tokenizer, FP32, on_weights_changed=lambda: calls.append(1),
        on_weights_changing=lambda: calls.append(0),
    )
    before = trainable_snapshot(trainer)
    samples = make_samples()
    samples[0].advantage = float("nan")
    metrics = trainer.step(samples)
    # Told as every step starts (the served caches are dropped), not after: nothing changed.
    assert metrics["skipped"] == 1 and trainer.step_count == 0 and calls == [0]
    for name, value in trainable_snapshot(trainer).items():
        assert torch.equal(value, before[name])


def test_config_from_mapping() -> None:
    cfg = OmegaConf.create(
        {
            "lr": 2e-6,
            "betas": [0.9, 0.95],
            "entropy_coef": EVOLVING,
            "lora": {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]},
        }
    )
    config = TrainerConfig.from_mapping(cfg)
    assert config.betas == (0.9, 0.95) and config.entropy_coef == EVOLVING
    expected = LoraSettings(r=8, alpha=16, dropout=0.05, target_modules=("q_proj", "v_proj"))
    assert config.lora == expected
    assert TrainerConfig.from_mapping({}).lora is None
    with pytest.raises(ValueError, match="unknown trainer settings"):
        TrainerConfig.from_mapping({"entropy_coeff": {}})
    with pytest.raises(ValueError, match="precision"):
        TrainerConfig(precision="fp16")


def test_fp32_precision_refuses_half_precision_weights(tokenizer) -> None:
    with pytest.raises(ValueError, match="llm.dtype=float32.*master weights"):
        PolicyTrainer(fresh_model().to(torch.bfloat16), tokenizer, FP32)


MIXED = {**FP32, "precision": "bf16"}


def test_full_fine_tuning_of_bf16_weights_keeps_float32_masters(tokenizer) -> None:
    """The paper presets' case on a GPU: bf16 weights, lr 1e-6. The step lands in the float32
    masters (bf16 alone would round almost all of it away), the served weights are the masters
    rounded, micro-batches accumulate in float32, and the update follows the float32 one."""
    model = fresh_model().to(torch.bfloat16)
    trainer = PolicyTrainer(model, tokenizer, {**MIXED, "lr": 1e-6, "micro_batch_size": 2})
    assert set(trainer.masters) == set(trainer.trainable)
    start = {name: m.clone() for name, m in trainer.masters.items()}
    metrics = trainer.step(make_samples())
    assert metrics["skipped"] == 0 and 0 < metrics["grad_norm"] < math.inf
    moved = rounded_away = total = 0
    for name, master in trainer.masters.items():
        delta = master - start[name]
        moved += int((delta != 0).sum())
        rounded_away += int(((start[name] + delta).to(torch.bfloat16) == start[name].to(torch.bfloat16)).sum())
        total += master.numel()
        assert torch.equal(trainer.trainable[name], master.to(torch.bfloat16)), name
        assert trainer.trainable[name].grad is None and master.dtype == torch.float32
    assert moved > 0.9 * total  # Adam's first step moves (almost) every weight by ~lr
    assert rounded_away > 0.99 * total  # which a bf16 optimizer would have lost

    same_start = fresh_model().to(torch.bfloat16).to(torch.float32)
    reference = PolicyTrainer(same_start, tokenizer, {**FP32, "lr": 1e-6, "micro_batch_size": 2})
    reference.step(make_samples())
    agree = total_signs = 0
    for name, master in trainer.masters.items():
        fp32_delta = reference.trainable[name].detach() - start[name]
        agree += int((torch.sign(master - start[name]) == torch.sign(fp32_delta)).sum())
        total_signs += master.numel()
    assert agree > 0.8 * total_signs  # the float32 update's direction (random signs: half)


@pytest.mark.parametrize("native_bf16", [True, False])
def test_each_step_logs_the_precision_auto_resolved_to(tokenizer, monkeypatch, native_bf16) -> None:
    """``precision: auto`` autocasts to bf16 only on a CPU that computes it natively, so one
    config trains in two precisions on two machines: every step says which (the board shows it)."""
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native_bf16)
    trainer = PolicyTrainer(fresh_model(), tokenizer, {**FP32, "precision": "auto", "lora": {"r": 4}})
    assert trainer.autocast_dtype == (torch.bfloat16 if native_bf16 else None)
    assert trainer.step(make_samples())["bf16_autocast"] == float(native_bf16)
    fixed = PolicyTrainer(fresh_model(), tokenizer, {**FP32, "lora": {"r": 4}})  # precision fp32
    assert fixed.step(make_samples())["bf16_autocast"] == 0.0


def test_lora_on_a_bf16_model_with_autocast() -> None:
    """The backend's default on a bf16 CPU: bf16 base weights, float32 adapters, bf16 autocast."""
    llm = TransformersBackend({"model": "tiny", "dtype": "bfloat16"})
    config = {"precision": "bf16", "lr": 1e-3, "lora": {"r": 4}, "entropy_coef": EVOLVING}
    trainer = PolicyTrainer(llm.model, llm.tokenizer, config)
    assert {p.dtype for p in trainer.trainable.values()} == {torch.float32}
    assert trainer.autocast_dtype == torch.bfloat16
    samples = make_samples()
    trainer.step(samples)
    metrics = trainer.step(samples)
    assert metrics["skipped"] == 0 and math.isfinite(metrics["loss"]) and metrics["solver/kl"] > 0


def test_merged_adapters_serve_the_same_policy_and_unmerge_exactly() -> None:
    """Merging (for fast evaluation) keeps the policy; training afterwards restores the exact
    base weights first, so bf16 rounding never accumulates into them."""
    llm = TransformersBackend({"model": "tiny", "dtype": "bfloat16", "prefix_cache": False})
    config = {"precision": "bf16", "lr": 1e-2, "lora": {"r": 4}, "entropy_coef": EVOLVING}
    trainer = PolicyTrainer(llm.model, llm.tokenizer, config,
                            on_weights_changed=llm.mark_weights_changed)
    trainer.step(make_samples())  # non-zero adapters
    prompt = [{"role": "user", "content": "go to the desk 1 and take the mug"}]
    options = [["look", "go to desk 1", "take mug 1 from desk 1"]]
    before = llm.choose([prompt], options, SamplingParams())[0].option_logprobs
    state_before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    digest_before = llm.weights_digest()

    trainer.merge_adapters()
    assert trainer.merged and llm.weights_digest() != digest_before  # the served weights changed
    kept = Path(trainer._unmerged_weights.name)  # the base weights wait on disk, not in memory
    assert (kept / "base.safetensors").is_file()
    merged = llm.choose([prompt], options, SamplingParams())[0].option_logprobs
    assert merged == pytest.approx(before, rel=0.01)  # the same policy up to bf16 rounding
    trainer.merge_adapters()  # idempotent

    trainer.unmerge_adapters()
    assert not trainer.merged and llm.weights_digest() == digest_before
    assert not kept.exists()  # and are removed once restored
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(value, state_before[name]), name
    trainer.merge_adapters()
    metrics = trainer.step(make_samples(seed=3))  # a step unmerges first
    assert not trainer.merged and metrics["skipped"] == 0


# ----------------------------------------------------------------------------------------------
# Learning end to end: rollouts from the backend, GRPO advantages, trainer steps
# ----------------------------------------------------------------------------------------------


def test_grpo_learns_to_pick_the_rewarded_option() -> None:
    """The whole loop on a toy bandit: sample a group of choices from the served model, reward
    one option, normalise within the group, step. The tiny random model starts near indifferent
    between the two options and must come to prefer the rewarded one within a bounded number of
    steps; this fails if sampling, the sample's tokens, the advantage sign, the loss or the
    weight update is wrong anywhere along the way."""
    llm = TransformersBackend({"model": "tiny", "dtype": "float32"})
    trainer = PolicyTrainer(
        llm.model, llm.tokenizer,
        {**FP32, "lr": 3e-4, "kl_coef": 0.0, "entropy_coef": {}, "micro_batch_size": 8},
        on_weights_changed=llm.mark_weights_changed,
    )
    prompt = [{"role": "user", "content": "Pick the action that wins."}]
    options = ["go north", "go south"]  # two tokens each; the model starts at about 0.63 / 0.37
    rewarded = options[1]  # the less likely one, so following the prior cannot pass

    def rewarded_probability() -> float:
        choice = llm.choose([prompt], [options], SamplingParams(temperature=0.0))[0]
        logps = torch.tensor(choice.option_logprobs)
        return float(torch.softmax(logps, 0)[options.index(rewarded)])

    start = rewarded_probability()
    assert 0.2 < start < 0.8, f"the toy task must start near indifferent, got {start:.2f}"
    history = [start]
    for step in range(25):
        params = [SamplingParams(temperature=1.0, seed=100 * step + i) for i in range(8)]
        choices = llm.choose([prompt] * 8, [options] * 8, params)
        samples = [
            sample_from_choice(c.prompt_token_ids, c.token_ids, c.logprobs, "solver", "bandit",
                               float(c.text == rewarded))
            for c in choices
        ]
        trainer.step(assign_advantages(samples, {"solver": 1.0}))
        history.append(rewarded_probability())
        if history[-1] > 0.95:
            break
    assert len(history) > 2, "learned in one step: the toy task is too easy to show anything"
    assert history[-1] > 0.95, f"no learning within 25 steps: {[round(p, 2) for p in history]}"


@pytest.mark.parametrize("layout", ["transcript", "window"])
def test_episode_sample_replays_the_exact_context_of_every_decision(layout: str) -> None:
    """A transcript episode is one sample whose generated tokens are every decision's, at the
    positions the model wrote them: the trainer's log-probs there equal the rollout's. A window
    episode rebuilds its prompt each step, so it has no such sample."""
    from arena.core.execution.solver import StandardSolver, play
    from arena.core.rl import episode_sample
    from arena.envs.household import HouseholdEnvironment

    llm = TransformersBackend({"model": "tiny", "dtype": "float32"})
    env = HouseholdEnvironment(level="easy", n_train=1, n_valid=0, n_test=0)
    solver = StandardSolver.from_config(llm, {"history": 2, "show_admissible": True,
                                              "max_experiences": 4, "max_experience_chars": 800,
                                              "layout": layout})
    task = env.tasks("train")[0]
    trajectory = play(env.open(task), solver.policy(task, [], 7, temperature=1.0),
                      max_steps=5, max_invalid_actions=10)
    assert len(trajectory.steps) >= 3
    sample = episode_sample(trajectory, role="solver", group="g", reward=1.0, advantage=0.5)
    if layout == "window":
        assert sample is None
        return
    assert sample is not None and sample.advantage == 0.5
    rollouts = [step.rollout for step in trajectory.steps]
    generated = [t for t, m in zip(sample.input_ids, sample.loss_mask) if m]
    assert generated == [t for r in rollouts for t in r.token_ids]
    last = rollouts[-1]
    assert sample.input_ids == list(last.prompt_token_ids) + list(last.token_ids)
    trainer = PolicyTrainer(llm.model, llm.tokenizer, FP32)
    (recomputed,) = trainer.logprobs([sample])
    at_generated = [lp for lp, m in zip(recomputed, sample.loss_mask) if m]
    rollout_logprobs = [lp for r in rollouts for lp in r.logprobs]
    assert at_generated == pytest.approx(rollout_logprobs, abs=2e-3)
    assert [lp for lp, m in zip(sample.old_logprobs, sample.loss_mask) if m] == rollout_logprobs


def test_the_harness_trainer_drops_the_served_prompt_states_as_a_step_starts(tmp_path) -> None:
    """The run's checkpointed trainer tells the transformers backend to drop its prefix cache
    as each step starts (its memory serves the step) and that the weights changed once after."""
    from contextlib import contextmanager

    from arena.core.rl.checkpointed import CheckpointedTrainer
    from arena.core.storage.method_state import Checkpoints

    llm = TransformersBackend({"model": "tiny", "dtype": "float32"})
    changed = []
    mark = llm.mark_weights_changed
    llm.mark_weights_changed = lambda: (changed.append(1), mark())[1]  # type: ignore[method-assign]
    trainer = CheckpointedTrainer(llm, FP32, Checkpoints(tmp_path / "method"), seed=0)
    llm.choose([[{"role": "user", "content": "go to the desk 1"}]], [["look", "go to desk 1"]], SamplingParams())
    assert llm._prefix_cache is not None and llm._prefix_cache.tokens_held > 0
    held = []

    @contextmanager
    def progress(label):
        class Shown:
            def update(self, *args):
                held.append(llm._prefix_cache.tokens_held)

        yield Shown()

    trainer.update(make_samples(), mini_batch_size=None, progress=progress, label="test")
    assert held and set(held) == {0} and changed == [1]
