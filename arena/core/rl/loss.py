"""The joint policy loss of several roles sharing one set of weights.

Per generated token ``t`` of a sample of role ``r``::

    ratio  = exp(logp - old_logp)
    pg     = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
    pg     = min(pg, -c * A)   where A < 0, with dual clip c (Ye et al. 2019; off by default)
    kl     = exp(ref - logp) - (ref - logp) - 1          # "k3" / low_var_kl, clamped as in verl
    loss_t = pg + kl_coef * kl - entropy_coef[r] * H      # H: entropy of the full distribution

and the total is ``sum_t w_t * loss_t`` over trained tokens. With token-mean aggregation
``w_t = 1 / N`` where N counts the trained tokens of the whole optimizer step (all micro-batches,
all roles), so every generated token weighs the same, whatever its sample's length or role; this
is verl's default ``token-mean``. Sample-mean (slime's default, which Evolving-RL ran: each
sample's token mean, averaged over samples) is the trainer's second choice, and episode-mean
its third: sample-mean where the decisions of one episode, trained as separate samples, count
as the one sequence slime would have trained.

A negative entropy coefficient *penalises* entropy (Evolving-RL's extractor: -0.03).

Why not trl's ``GRPOTrainer``: it generates its own single-turn completions from a prompt
dataset, groups by prompt, and applies one entropy/KL setting to every sample. Arena's samples
come from multi-turn episodes with masked observations, from several roles with their own
advantage scales and entropy coefficients, so only trl's numerically careful helpers
(``selective_log_softmax``, ``entropy_from_logits``) are reused here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

#: verl's clamps: the log-ratio before exponentiating, the k3 value after.
KL_LOG_RATIO_CLAMP = 20.0
KL_VALUE_CLAMP = 10.0


#: Rows of logits turned into log-probabilities at a time: a row of SmolLM2's vocabulary is 49k
#: floats, and the whole ``[tokens, vocab]`` table in log-space would double the logits' memory.
LOGSOFTMAX_ROWS = 256


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Log-prob of each target token under ``logits`` (computed in float32).

    The target's logit minus the row's log-sum-exp, a block of rows at a time, so no full
    log-softmax table is materialised. trl's ``selective_log_softmax`` does the same; importing
    trl for it brought datasets and pandas into every run (84 MB resident, docs/speed.md).
    """
    flat = logits.float().reshape(-1, logits.shape[-1])
    picked = flat.gather(-1, targets.reshape(-1, 1)).squeeze(-1)
    norms = torch.cat([torch.logsumexp(block, dim=-1) for block in flat.split(LOGSOFTMAX_ROWS)])
    return (picked - norms).reshape(targets.shape)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of the full next-token distribution at each position, a block of rows at a
    time (as :func:`token_logprobs`)."""
    flat = logits.float().reshape(-1, logits.shape[-1])
    entropies = []
    for block in flat.split(LOGSOFTMAX_ROWS):
        logp = block.log_softmax(-1)
        entropies.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(entropies).reshape(logits.shape[:-1])


def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped policy-gradient loss per token, and where a clipped branch was taken.

    The asymmetric range ``[1 - eps_low, 1 + eps_high]`` lets a token's probability rise further
    than it may fall (DAPO's clip-higher). ``dual_clip`` (c > 1) also bounds the loss of a
    negative advantage by ``-c * A``: a token whose probability already grew ``c``-fold gets no
    further push, so one stale sample cannot dominate a step (verl's default c = 3; slime has
    none unless ``--eps-clip-c`` is given).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    taken = clipped > unclipped
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be greater than 1, got {dual_clip}")
        bound = -dual_clip * advantages
        capped = (advantages < 0) & (loss > bound)
        loss = torch.where(capped, bound, loss)
        taken = taken | capped
    return loss, taken


def low_var_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimate of KL(policy || reference) per token: non-negative, unbiased,
    low variance. Clamped like verl so one wild token cannot dominate the batch."""
    log_ratio = (ref_logprobs - logprobs).clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-KL_VALUE_CLAMP, KL_VALUE_CLAMP)


@dataclass
class RoleStats:
    """Sums over one role's trained tokens; add them across micro-batches, then read
    :meth:`metrics` (means per token, plus the role's share of the total loss)."""

    n_tokens: int = 0
    loss: float = 0.0  # the role's contribution to the total loss: sum of w_t * loss_t
    pg_sum: float = 0.0
    kl_sum: float = 0.0
    entropy_sum: float = 0.0
    clipped: int = 0

    def __iadd__(self, other: RoleStats) -> RoleStats:
        self.n_tokens += other.n_tokens
        self.loss += other.loss
        self.pg_sum += other.pg_sum
        self.kl_sum += other.kl_sum
        self.entropy_sum += other.entropy_sum
        self.clipped += other.clipped
        return self

    def metrics(self) -> dict[str, float]:
        n = max(self.n_tokens, 1)
        return {
            "loss": self.loss,
            "pg_loss": self.pg_sum / n,
            "kl": self.kl_sum / n,
            "entropy": self.entropy_sum / n,
            "clip_frac": self.clipped / n,
            "n_tokens": float(self.n_tokens),
        }


@dataclass
class LossOutput:
    """The scalar to back-propagate and, per role, the statistics that went into it."""

    loss: torch.Tensor
    roles: dict[str, RoleStats] = field(default_factory=dict)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    roles: Sequence[str],
    *,
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    eps_low: float = 0.1,
    eps_high: float = 0.15,
    dual_clip: float | None = None,
    kl_coef: float = 0.01,
    entropy_coef: Mapping[str, float] | None = None,
    token_weights: torch.Tensor | None = None,
) -> LossOutput:
    """The joint loss of a batch (see the module docstring).

    All tensors are ``(batch, seq)``; ``advantages`` may also be ``(batch,)`` (one per
    sequence). ``roles`` names each row's role. ``token_weights`` default to a token-mean over
    this batch's trained tokens; the trainer passes weights normalised over the whole step so
    micro-batches add up to the same gradient as one big batch. The KL term needs
    ``ref_logprobs`` (optional when ``kl_coef == 0``; KL is then only reported if given); the
    entropy term needs ``entropy`` when a role of the batch has a non-zero coefficient. Each role
    in ``roles`` gets a :class:`RoleStats`.

    Values at masked positions are replaced before any exponential, so padding or garbage there
    can neither produce NaN nor receive gradient.
    """
    if len(roles) != logprobs.shape[0]:
        raise ValueError(f"{len(roles)} roles for a batch of {logprobs.shape[0]} rows")
    entropy_coef = dict(entropy_coef or {})
    mask = loss_mask.bool()
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logprobs)
    if token_weights is None:
        token_weights = mask.float() / mask.sum().clamp(min=1)
    weights = torch.where(mask, token_weights, 0.0)

    zero = torch.zeros_like(logprobs)
    logp = torch.where(mask, logprobs, zero)
    old = torch.where(mask, old_logprobs, zero)
    pg, clipped = clipped_surrogate(logp, old, advantages, eps_low, eps_high, dual_clip)
    per_token = pg
    kl = zero
    if ref_logprobs is not None:
        kl = low_var_kl(logp, torch.where(mask, ref_logprobs, zero))
        per_token = per_token + kl_coef * kl
    elif kl_coef:
        raise ValueError("kl_coef is non-zero but no ref_logprobs were given")
    row_coef = torch.tensor(
        [float(entropy_coef.get(role, 0.0)) for role in roles],
        dtype=logprobs.dtype,
        device=logprobs.device,
    )
    ent = zero
    if entropy is not None:
        ent = torch.where(mask, entropy, zero)
        per_token = per_token - row_coef[:, None] * ent
    elif bool((row_coef != 0).any()):
        raise ValueError("an entropy coefficient is non-zero but no entropy was given")

    weighted = weights * per_token
    loss = weighted.sum()

    stats: dict[str, RoleStats] = {}
    with torch.no_grad():
        for role in dict.fromkeys(roles):
            rows = torch.tensor([r == role for r in roles], device=mask.device)
            selected = mask & rows[:, None]
            stats[role] = RoleStats(
                n_tokens=int(selected.sum()),
                loss=float(weighted[selected].sum()),
                pg_sum=float(pg[selected].sum()),
                kl_sum=float(kl[selected].sum()),
                entropy_sum=float(ent[selected].sum()),
                clipped=int((clipped & selected).sum()),
            )
    return LossOutput(loss=loss, roles=stats)
