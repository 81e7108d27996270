"""One optimizer step of multi-role policy-gradient training on a Hugging Face causal LM.

The trainer updates the very module a backend serves (``TransformersBackend.model``), so the
next rollout uses the new weights at once; pass the backend's ``mark_weights_changed`` as
``on_weights_changed``. Do not generate with that backend while :meth:`PolicyTrainer.step` runs.

With LoRA the adapters are injected into the given model in place (peft replaces its linear
layers), so a backend holding the same module serves the adapted policy, and the reference policy
is that model with its adapters disabled. With full fine-tuning the reference is a frozen copy of
the weights at construction, made only when the KL term is on; a resumed run must therefore build
its trainer on the same base weights before :meth:`PolicyTrainer.load`.

With ``sharded=True`` the trainer trains across the ranks of a ``torch.distributed`` process
group on FSDP2 (:mod:`arena.core.rl.sharding`): the given model is then the trainer's own (no
backend serves it; :meth:`PolicyTrainer.full_weights` streams the updated weights to one that
does), every rank calls every method with the same arguments, and checkpoints are
``torch.distributed.checkpoint`` folders that any world size reads.

Logits are computed only where a token is trained (the decoder runs on the whole sequence, the
vocabulary-wide output layer on the generated positions only), which is most of the memory of a
step on a 49k-token vocabulary. This assumes logits = output_embeddings(last hidden state), true
of Llama, Qwen and SmolLM; models with logit soft-capping or scaling would need their own hook.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from arena.core.host.allocator import return_freed_memory
from arena.core.host.torch_utils import eval_mode
from arena.core.rl import sharding
from arena.core.rl.data import Sample, episode_keys
from arena.core.rl.loss import RoleStats, policy_loss, token_entropy, token_logprobs
from arena.core.rl.sharding import World
from arena.core.storage.metrics import BF16_AUTOCAST

#: 1: safetensors weights and a torch optimizer state (read, no longer written); 2: a
#: torch.distributed.checkpoint folder, resharded on load to any world size.
CHECKPOINT_FORMAT = 2
_READABLE_FORMATS = (1, 2)
_PRECISIONS = ("auto", "bf16", "fp32")
_AGGREGATIONS = ("token-mean", "sample-mean", "episode-mean")
_OLD_LOGPROBS = ("rollout", "recompute")


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapter shape; ``target_modules="all-linear"`` is every linear layer but the head."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: str | tuple[str, ...] = "all-linear"


@dataclass(frozen=True)
class TrainerConfig:
    """How to train. Defaults follow Evolving-RL (slime: Adam, lr 1e-6 constant, weight decay
    0.1, betas 0.9/0.98, eps 0.1/0.15, low-var KL 0.01, grad clip 1.0), except the per-role maps,
    which the method sets (Evolving-RL: ``entropy_coef={extractor: -0.03, solver: 0}``,
    ``advantage_scale={extractor: 0.2, solver: 1.0}``); a role missing from a map gets 0 entropy
    coefficient and scale 1.

    ``advantage_scale`` is not applied by :meth:`PolicyTrainer.step`: the caller passes it to
    :func:`arena.core.rl.advantages.assign_advantages`, so advantages stay visible and explicit.
    ``precision``: ``auto`` uses bf16 autocast where the device computes it natively. Weights
    are trained in float32 either way: weights loaded in bf16 through float32 master copies
    (``fp32`` refuses them). ``aggregation``: ``token-mean`` (every trained token of the step
    weighs the same), ``sample-mean`` (slime's default: each sample's token mean,
    averaged over samples) or ``episode-mean`` (the token mean of each episode, averaged over
    the step's episodes: ``sample-mean`` where an episode trained decision by decision counts
    once, as slime counts its one sequence, not once per decision; a sample without an
    ``episode`` is one of its own). ``old_logprobs``: ``rollout`` takes the samples' own log-probs;
    ``recompute`` uses the trainer's log-probs under the current weights (slime's default;
    with one optimizer step per batch the ratio is then exactly 1 and clipping never acts).
    """

    lr: float = 1e-6
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-8
    eps_low: float = 0.1
    eps_high: float = 0.15
    #: Dual-clip bound c on the loss of a negative advantage (verl's 3.0; null: none, slime's).
    dual_clip: float | None = None
    kl_coef: float = 0.01
    entropy_coef: Mapping[str, float] = field(default_factory=dict)
    advantage_scale: Mapping[str, float] = field(default_factory=dict)
    micro_batch_size: int = 4
    max_grad_norm: float = 1.0
    lora: LoraSettings | None = None
    precision: str = "auto"
    #: Recompute each decoder layer's activations in the backward instead of keeping them:
    #: the same gradient, a fraction of the memory, about a third more compute. What lets a
    #: 16,384-token episode of a 7B model train on one GPU's share.
    activation_checkpointing: bool = False
    aggregation: str = "token-mean"
    old_logprobs: str = "rollout"

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("precision", self.precision, _PRECISIONS),
            ("aggregation", self.aggregation, _AGGREGATIONS),
            ("old_logprobs", self.old_logprobs, _OLD_LOGPROBS),
        ):
            if value not in allowed:
                raise ValueError(f"trainer.{name} must be one of {allowed}, not {value!r}")
        if self.micro_batch_size < 1:
            raise ValueError("trainer.micro_batch_size must be at least 1")
        if self.eps_low < 0 or self.eps_high < 0 or self.kl_coef < 0:
            raise ValueError("trainer.eps_low, eps_high and kl_coef must be non-negative")
        if self.dual_clip is not None and not self.dual_clip > 1.0:
            raise ValueError(f"trainer.dual_clip must be greater than 1 (or null), not {self.dual_clip}")

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any]) -> TrainerConfig:
        """Build from a config section (dict or OmegaConf); unknown keys are an error, since a
        misspelt coefficient would otherwise silently train with its default."""
        names = {f.name for f in fields(cls)}
        unknown = set(cfg) - names
        if unknown:
            raise ValueError(f"unknown trainer settings: {sorted(unknown)}")
        values: dict[str, Any] = {key: plain_data(value) for key, value in cfg.items()}
        if "betas" in values:
            values["betas"] = tuple(values["betas"])
        if values.get("lora") is not None:
            lora = dict(values["lora"])
            if not isinstance(lora.get("target_modules", "all-linear"), str):
                lora["target_modules"] = tuple(lora["target_modules"])
            values["lora"] = LoraSettings(**lora)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plain_data(value: Any) -> Any:
    """Mappings and lists as plain dicts and lists (OmegaConf containers included)."""
    if isinstance(value, Mapping):
        return {str(key): plain_data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [plain_data(item) for item in value]
    return value


def resolve_autocast(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for plain float32. ``auto`` picks bf16 only where it is
    native (CUDA with bf16, or a CPU with AVX-512-BF16/AMX), since emulated bf16 is slower."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else None


@dataclass
class _MicroBatch:
    """Right-padded tensors of a few samples; per-token tensors are shifted by one so column
    ``t`` is the prediction of token ``t + 1`` from the hidden state at ``t``."""

    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    trained: torch.Tensor  # (B, T-1) bool
    old_logprobs: torch.Tensor  # (B, T-1)
    weights: torch.Tensor  # (B, T-1): the token's weight in the step's loss
    advantages: torch.Tensor  # (B,)
    roles: list[str]


class _TrainedLogits(torch.nn.Module):
    """The training forward as one module: the decoder on whole sequences, the output layer on
    the trained positions only. FSDP gathers a module's own weights in its forward, so routing
    the forward through this root gathers the embeddings, final norm and a tied output layer
    together (calling the decoder and the head separately would bypass it)."""

    def __init__(self, lm: Any) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                trained: torch.Tensor) -> torch.Tensor:
        hidden = self.lm.get_decoder()(  # no KV cache: nothing is generated from a training pass
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state[:, :-1]
        return self.lm.get_output_embeddings()(hidden[trained]).float()


class PolicyTrainer:
    """Trains a causal LM on :class:`~arena.core.rl.data.Sample` batches with the joint loss
    of :mod:`arena.core.rl.loss`: one optimizer step per :meth:`step` call."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        config: TrainerConfig | Mapping[str, Any] | None = None,
        *,
        on_weights_changed: Callable[[], None] | None = None,
        on_weights_changing: Callable[[], None] | None = None,
        sharded: bool = False,
    ) -> None:
        if not isinstance(config, TrainerConfig):
            config = TrainerConfig.from_mapping(config or {})
        self.config = config
        self.on_weights_changed = on_weights_changed
        #: Called as a step starts, before any weight changes: the serving side drops what it
        #: cached of the old weights, so the step can use that memory (the transformers
        #: backend's prefix cache). Not ``on_weights_changed``: a vLLM engine would be sent
        #: weights that did not change.
        self.on_weights_changing = on_weights_changing
        self.sharded = sharded
        #: The ranks this trainer's steps are shared by (one without ``sharded``, even under
        #: torchrun).
        self.world = World.current() if sharded else World()
        if sharded and not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            raise ValueError("sharded training needs a torch.distributed process group: launch "
                             "with torchrun (torchrun --nproc-per-node N -m arena.cli run ...)")
        pad = tokenizer.pad_token_id
        self.pad_id: int = pad if pad is not None else tokenizer.eos_token_id
        if sharded and any(p.dtype != torch.float32 for p in model.parameters()):
            model = model.float()  # the float32 shards are the master weights
        self.device = next(model.parameters()).device
        self.autocast_dtype = resolve_autocast(self.config.precision, self.device)
        reference = None
        if not self.config.lora and self.config.kl_coef > 0:
            reference = copy.deepcopy(model).eval().requires_grad_(False)
        #: A transformers model, inside peft's wrapper with LoRA (typed Any: peft's and
        #: transformers' methods are not on torch.nn.Module).
        self.model: Any = with_lora(model, self.config.lora) if self.config.lora else model
        self.is_lora = _is_peft(self.model)
        if self.config.activation_checkpointing:
            self._lm().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.forward = _TrainedLogits(self._lm())
        if self.device.type == "cpu":
            for layer in self._lm().get_decoder().layers:
                if not getattr(layer, "_arena_returns_freed_memory", False):  # once per layer
                    layer.register_forward_hook(_return_freed_memory_in_training)
                    layer._arena_returns_freed_memory = True
        self.reference = None if reference is None else _TrainedLogits(reference)
        if sharded:
            for module in (self.forward, self.reference):
                if module is not None:
                    sharding.shard(module, module.lm.get_decoder().layers, self.autocast_dtype)
        self.trainable = {
            name: param for name, param in self.model.named_parameters() if param.requires_grad
        }
        if not self.trainable:
            raise ValueError("the model has no trainable parameters")
        #: float32 master copies of half-precision trainable weights (see :meth:`_make_masters`).
        self.masters = self._make_masters()
        #: What the optimizer updates: the master copy of a half-precision weight, else the weight.
        self.optimized = {name: self.masters.get(name, p) for name, p in self.trainable.items()}
        self.optimizer = torch.optim.AdamW(
            self._param_groups(),
            lr=self.config.lr,
            betas=self.config.betas,
            eps=self.config.adam_eps,
        )
        self.step_count = 0
        #: False once a checkpoint without its optimizer state is loaded (:func:`drop_optimizer_state`):
        #: its weights serve and evaluate, but another step would start Adam's moments anew.
        self.can_train = True
        #: While merged: the folder holding the base weights the adapters were folded into.
        self._unmerged_weights: tempfile.TemporaryDirectory[str] | None = None
        self.model.eval()

    # ------------------------------------------------------------------------------------------
    # Training
    # ------------------------------------------------------------------------------------------

    def step(
        self, samples: Sequence[Sample], on_micro_batch: Callable[[int, int], object] | None = None
    ) -> dict[str, float]:
        """One optimizer step on all ``samples`` (gradients accumulated over micro-batches);
        ``on_micro_batch(done, total)`` after each micro-batch (a progress bar's ``update``).

        Uses each sample's ``advantage`` as set by the caller. Returns the loss, the gradient
        norm before clipping, and per role ``{role}/loss`` (its share of the loss), ``pg_loss``,
        ``kl``, ``entropy``, ``clip_frac`` (token means) and ``n_tokens``. A step whose gradient
        is not finite is skipped (``skipped`` = 1) and leaves the weights untouched.
        """
        if not self.can_train:
            raise ValueError(
                "This trainer was loaded from a checkpoint kept without its optimizer state (`arena slim`, "
                "for a run whose learning had finished): its weights can be evaluated, not trained further. "
                "Continue from the run's full copy (the one `arena slim` was not run on).")
        started = time.perf_counter()
        if self.merged:
            self.unmerge_adapters()  # tells the serving side, as any change of weights does
        elif self.on_weights_changing is not None:
            # What the serving side cached was computed with weights about to change: dropped
            # now (the prefix cache holds up to the weights' size), so the step can use it.
            self.on_weights_changing()
        return_freed_memory()
        # Cut and weighed over the whole step; each rank then plays its share (see sharding).
        everyone = self._micro_batches(samples)
        batches, n_real = sharding.deal(everyone, self.world, self._idle(everyone[0]))
        references = self._reference_logprobs(batches) if self.config.kl_coef > 0 else None
        stats = {role: RoleStats() for role in self._report_roles(samples)}
        total = 0.0
        self.optimizer.zero_grad(set_to_none=True)
        self.model.train()
        try:
            for index, batch in enumerate(batches):
                with self._autocast():
                    logprobs, entropy = self._policy_outputs(self.forward, batch)
                recompute = self.config.old_logprobs == "recompute"
                out = policy_loss(
                    logprobs,
                    logprobs.detach() if recompute else batch.old_logprobs,
                    batch.advantages,
                    batch.trained,
                    batch.roles,
                    entropy=entropy,
                    ref_logprobs=None if references is None else references[index],
                    eps_low=self.config.eps_low,
                    eps_high=self.config.eps_high,
                    dual_clip=self.config.dual_clip,
                    kl_coef=self.config.kl_coef,
                    entropy_coef=self.config.entropy_coef,
                    token_weights=batch.weights,
                )
                # FSDP averages the ranks' gradients; the step's loss is their sum.
                (out.loss * self.world.size if self.sharded else out.loss).backward()
                if index < n_real:
                    total += float(out.loss.detach())
                    for role, role_stats in out.roles.items():
                        stats[role] += role_stats
                del out, logprobs, entropy
                return_freed_memory()  # this micro-batch's activations, before the next one's
                if on_micro_batch is not None:
                    on_micro_batch(index + 1, len(batches))
            params = list(self.optimized.values())
            clip = self.config.max_grad_norm if self.config.max_grad_norm > 0 else float("inf")
            grad_norm = float(sharding.full(torch.nn.utils.clip_grad_norm_(params, clip)))
            skipped = not math.isfinite(grad_norm)
            if not skipped:
                self.optimizer.step()
                self._copy_masters_to_weights()
                self.step_count += 1
            self.optimizer.zero_grad(set_to_none=True)
        finally:
            self.model.eval()
        if not skipped:
            self._notify()
        if self.sharded:
            total, stats = _summed_over_ranks(total, stats)
        metrics = {
            "loss": total,
            "grad_norm": grad_norm,
            "skipped": float(skipped),
            "step": float(self.step_count),
            "lr": self.config.lr,
            "n_samples": float(len(samples)),
            "n_tokens": float(sum(s.n_tokens for s in stats.values())),
            "step_s": time.perf_counter() - started,
            BF16_AUTOCAST: float(self.autocast_dtype == torch.bfloat16),
        }
        for role, role_stats in sorted(stats.items()):
            metrics.update({f"{role}/{k}": v for k, v in role_stats.metrics().items()})
        return metrics

    @torch.no_grad()
    def logprobs(self, samples: Sequence[Sample], reference: bool = False) -> list[list[float]]:
        """Log-prob of each generated token under the current policy (or the reference),
        aligned with ``input_ids`` and 0.0 elsewhere, like ``Sample.old_logprobs``."""
        self.unmerge_adapters()
        batches = self._micro_batches(samples, ordered=False)
        if reference:
            scores = self._reference_logprobs(batches)
        else:
            with eval_mode(self.model), self._autocast():
                scores = [self._policy_outputs(self.forward, b, entropy=False)[0] for b in batches]
        result: list[list[float]] = []
        for batch, score in zip(batches, scores):
            for row in range(score.shape[0]):
                length = int(batch.attention_mask[row].sum())
                values = torch.where(batch.trained[row], score[row], 0.0)[: length - 1]
                result.append([0.0, *values.tolist()])
        return result

    # ------------------------------------------------------------------------------------------
    # Checkpoints
    # ------------------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write trainable weights (the adapters with LoRA; the float32 masters of bf16
        weights), optimizer state, step counter and each rank's torch RNG state to folder
        ``path``, as a ``torch.distributed.checkpoint`` that any world size reads. Written into
        a hidden sibling, then renamed: ``path`` never holds a half-written checkpoint (a crash
        between the two renames of an overwrite leaves the previous one in a hidden
        ``.NAME.old.*`` sibling). Sharded, every rank calls it; the ranks share one filesystem."""
        import torch.distributed.checkpoint as dcp

        path = Path(path)
        self.unmerge_adapters()
        tmp = None
        if self.world.rank == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        tmp = Path(sharding.broadcast(str(tmp)) if self.sharded else str(tmp))
        try:
            with _single_process_quiet():
                dcp.save(self._checkpoint_state(), checkpoint_id=tmp, no_dist=not self.sharded)
            torch.save(_rng_state(), tmp / f"rng-{self.world.rank}.pt")
            if self.sharded:
                sharding.barrier()  # every rank's shards are written
            if self.world.rank == 0:
                state = {
                    "format": CHECKPOINT_FORMAT,
                    "step": self.step_count,
                    "mode": "lora" if self.is_lora else "full",
                    "world_size": self.world.size,
                    "config": self.config.to_dict(),
                }
                (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
                tmp.chmod(0o755)
                _replace(path, tmp)
        finally:
            if self.world.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            if self.sharded:
                sharding.barrier()  # no rank goes on before the checkpoint is in place
        return path

    def load(self, path: str | os.PathLike[str]) -> None:
        """Restore a :meth:`save` (written by any world size): weights, optimizer state, step
        counter and RNG states. Checkpoints of format 1 (before sharding) load unsharded."""
        path = Path(path)
        self.unmerge_adapters()
        state = json.loads((path / "trainer_state.json").read_text())
        mode = "lora" if self.is_lora else "full"
        if state.get("format") not in _READABLE_FORMATS or state.get("mode") != mode:
            raise ValueError(
                f"{path} is a format {state.get('format')} {state.get('mode')} checkpoint; "
                f"this trainer reads formats {_READABLE_FORMATS} {mode}"
            )
        if state["format"] == 1:
            self._load_format_1(path)
        else:
            import torch.distributed.checkpoint as dcp

            # The optimizer's moments exist once a step was taken, unless they were dropped.
            with_optimizer = bool(state.get("optimizer", True))
            target = self._checkpoint_state(with_optimizer=with_optimizer and int(state["step"]) > 0)
            with _single_process_quiet():
                dcp.load(target, checkpoint_id=path, no_dist=not self.sharded)
            own = path / f"rng-{self.world.rank}.pt"
            _set_rng_state(torch.load(own if own.exists() else path / "rng-0.pt", weights_only=True))
        self.step_count = int(state["step"])
        self.can_train = state["format"] == 1 or bool(state.get("optimizer", True))
        self._copy_masters_to_weights()
        self._notify()

    def full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The trainable weights one at a time, whole (a sharded weight is gathered, a master
        rounded to the served dtype is not: the float32 value), for a serving copy to take in
        tensor by tensor. Sharded, every rank iterates it (each weight is a collective)."""
        for name, param in self.optimized.items():
            yield name, sharding.full(param.detach())

    def _checkpoint_state(self, with_optimizer: bool = True) -> dict[str, torch.Tensor]:
        """What a checkpoint holds, keyed by weight name (the same names in every world size,
        so a checkpoint of sharded DTensors reshards onto plain tensors and back). Loading
        needs destinations for the optimizer's moments before its first step: zeros here."""
        state: dict[str, torch.Tensor] = {}
        for name, param in self.optimized.items():
            state[f"weights/{name}"] = param.detach()
            if not with_optimizer:
                continue
            moments = self.optimizer.state[param]
            if not moments:
                moments.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(param.detach()),
                               exp_avg_sq=torch.zeros_like(param.detach()))
            for key, value in moments.items():
                state[f"optimizer/{name}/{key}"] = value
        return state

    def _load_format_1(self, path: Path) -> None:
        if self.sharded:
            raise ValueError(f"{path} is a format 1 checkpoint (written before sharded training): "
                             "resume it in one process, without torchrun")
        weights = load_file(path / "weights.safetensors")
        if set(weights) != set(self.trainable):
            missing = sorted(set(self.trainable) - set(weights))[:3]
            extra = sorted(set(weights) - set(self.trainable))[:3]
            raise ValueError(f"checkpoint weights do not match: missing {missing}, extra {extra}")
        with torch.no_grad():
            for name, param in self.optimized.items():
                param.copy_(weights[name])
        self.optimizer.load_state_dict(
            torch.load(path / "optimizer.pt", map_location=self.device, weights_only=True)
        )
        _set_rng_state(torch.load(path / "rng.pt", weights_only=True))

    # ------------------------------------------------------------------------------------------
    # Internals
    # ------------------------------------------------------------------------------------------

    @property
    def merged(self) -> bool:
        return self._unmerged_weights is not None

    def merge_adapters(self) -> None:
        """Fold the LoRA adapters into the base weights, for serving once training is over.

        Unmerged adapters cost extra small matmuls in every layer: SmolLM2 with r=16 on all
        linear layers chose 1.39x slower on 2 CPU cores, merged 1.1x. The base weights are kept
        aside on disk (a copy in memory held 0.2 GB of SmolLM2's bf16 weights through the whole
        evaluation), so :meth:`unmerge_adapters` (called by every training operation) restores
        them exactly, not up to bf16 rounding. A no-op without LoRA or when already merged.
        """
        if not self.is_lora or self.merged or self.sharded:
            return
        from safetensors.torch import save_file

        self._unmerged_weights = tempfile.TemporaryDirectory(prefix="arena-unmerged-")
        save_file({name: param.detach().to("cpu").contiguous()
                   for name, param in self.model.named_parameters() if ".base_layer." in name},
                  str(Path(self._unmerged_weights.name) / "base.safetensors"))
        self.model.merge_adapter()
        self._notify()

    def unmerge_adapters(self) -> None:
        """Undo :meth:`merge_adapters` exactly. A no-op when not merged."""
        if self._unmerged_weights is None:
            return
        self.model.unmerge_adapter()
        with torch.no_grad(), safe_open(str(Path(self._unmerged_weights.name) / "base.safetensors"), "pt") as saved:
            params = dict(self.model.named_parameters())
            for name in saved.keys():  # noqa: SIM118 (safe_open is not iterable); one tensor at a time
                params[name].copy_(saved.get_tensor(name))
        self._unmerged_weights.cleanup()
        self._unmerged_weights = None
        self._notify()

    def _make_masters(self) -> dict[str, torch.Tensor]:
        """Float32 master weights for the half-precision trainable weights, as Megatron and
        FSDP's mixed precision keep them: the forward and backward run on the served bf16
        weights, each micro-batch's gradient is added to the master's float32 gradient (a hook
        frees the bf16 one at once), Adam updates the masters, and the served weights are their
        rounding. An lr 1e-6 step is then kept even where it is below bf16's resolution
        (about 4e-3 of a weight) and lands once the steps add up to it."""
        low = [name for name, p in self.trainable.items() if p.dtype != torch.float32]
        if low and self.config.precision == "fp32":
            dtype = self.trainable[low[0]].dtype
            raise ValueError(
                f"trainer.precision is fp32 but the trainable weights are {dtype}: load the model "
                "in float32 (llm.dtype=float32) or train in mixed precision (trainer.precision: auto "
                "or bf16, float32 master weights)."
            )
        masters: dict[str, torch.Tensor] = {}
        for name in low:
            param = self.trainable[name]
            master = param.detach().to(torch.float32).clone()
            masters[name] = master
            param.register_post_accumulate_grad_hook(_accumulate_into(master))
        return masters

    @torch.no_grad()
    def _copy_masters_to_weights(self) -> None:
        for name, master in self.masters.items():
            self.trainable[name].copy_(master)

    def _lm(self) -> Any:
        """The transformers model itself (inside peft's wrapper with LoRA)."""
        return self.model.get_base_model() if self.is_lora else self.model

    def _param_groups(self) -> list[dict[str, Any]]:
        """Weight decay on matrices only; biases and norm gains are exempt, as in Megatron."""
        decay = [p for p in self.optimized.values() if p.dim() >= 2]
        exempt = [p for p in self.optimized.values() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": self.config.weight_decay}]
        if exempt:
            groups.append({"params": exempt, "weight_decay": 0.0})
        return groups

    def _report_roles(self, samples: Sequence[Sample]) -> list[str]:
        """Every configured role and every role present, so absent roles report zeros."""
        configured = [*self.config.entropy_coef, *self.config.advantage_scale]
        return list(dict.fromkeys([*configured, *(s.role for s in samples)]))

    def _autocast(self) -> Any:
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _micro_batches(self, samples: Sequence[Sample], ordered: bool = True) -> list[_MicroBatch]:
        """Split ``samples`` into micro-batches (by length, so padding is small, unless
        ``ordered`` is False) with each token's weight in the whole step's loss."""
        if not samples:
            raise ValueError("no samples to train on")
        counts = [s.n_trained for s in samples]
        if sum(counts) == 0:
            raise ValueError("no sample has a generated token (loss_mask is all 0)")
        token_weight = _token_weights(samples, counts, self.config.aggregation)
        order = list(range(len(samples)))
        if ordered:
            order.sort(key=lambda i: len(samples[i].input_ids))
        size = self.config.micro_batch_size
        return [
            self._collate([samples[i] for i in chunk], [token_weight[i] for i in chunk])
            for chunk in (order[k : k + size] for k in range(0, len(order), size))
        ]

    @staticmethod
    def _idle(batch: _MicroBatch) -> _MicroBatch:
        """A micro-batch that weighs nothing: a rank with fewer micro-batches than another
        plays copies of it, so every rank runs FSDP's collectives the same number of times."""
        return _MicroBatch(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, trained=batch.trained,
            old_logprobs=batch.old_logprobs, weights=torch.zeros_like(batch.weights),
            advantages=torch.zeros_like(batch.advantages), roles=batch.roles,
        )

    def _collate(self, samples: list[Sample], token_weight: list[float]) -> _MicroBatch:
        width = max(len(s.input_ids) for s in samples)
        ids = torch.full((len(samples), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(samples), width), dtype=torch.long)
        mask = torch.zeros((len(samples), width), dtype=torch.bool)
        old = torch.zeros((len(samples), width), dtype=torch.float32)
        for row, sample in enumerate(samples):
            n = len(sample.input_ids)
            ids[row, :n] = torch.tensor(sample.input_ids)
            attention[row, :n] = 1
            mask[row, :n] = torch.tensor(sample.loss_mask, dtype=torch.bool)
            old[row, :n] = torch.tensor(sample.old_logprobs, dtype=torch.float32)
        trained = mask[:, 1:]
        weights = torch.tensor(token_weight, dtype=torch.float32)[:, None] * trained
        return _MicroBatch(
            input_ids=ids.to(self.device),
            attention_mask=attention.to(self.device),
            trained=trained.to(self.device),
            old_logprobs=old[:, 1:].to(self.device),
            weights=weights.to(self.device),
            advantages=torch.tensor([s.advantage for s in samples], device=self.device),
            roles=[s.role for s in samples],
        )

    def _policy_outputs(
        self, forward: torch.nn.Module, batch: _MicroBatch, entropy: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) at trained positions as ``(B, T-1)`` float32 tensors.

        Entropy carries gradient only on rows whose role has a non-zero coefficient: the other
        rows only report it, and skipping their backward saves a vocabulary-wide activation.
        """
        logits = forward(batch.input_ids, batch.attention_mask, batch.trained)
        targets = batch.input_ids[:, 1:][batch.trained]
        logprobs = torch.zeros(batch.trained.shape, device=logits.device)
        logprobs[batch.trained] = token_logprobs(logits, targets)
        if not entropy:
            return logprobs, None
        coef = self.config.entropy_coef
        rows = torch.tensor([coef.get(r, 0.0) != 0 for r in batch.roles], device=logits.device)
        with_grad = rows[:, None].expand_as(batch.trained)[batch.trained]
        selected = torch.zeros(targets.shape, device=logits.device)
        with torch.no_grad():
            selected[~with_grad] = token_entropy(logits[~with_grad])
        if bool(with_grad.any()):
            selected[with_grad] = token_entropy(logits[with_grad])
        entropies = torch.zeros(batch.trained.shape, device=logits.device)
        entropies[batch.trained] = selected
        return logprobs, entropies

    @torch.no_grad()
    def _reference_logprobs(self, batches: list[_MicroBatch]) -> list[torch.Tensor]:
        """Reference log-probs per micro-batch, in eval mode (no dropout)."""
        with eval_mode(self.model), self._reference() as reference, self._autocast():
            return [self._policy_outputs(reference, b, entropy=False)[0] for b in batches]

    @contextmanager
    def _reference(self) -> Iterator[torch.nn.Module]:
        if self.is_lora:
            with self.model.disable_adapter():
                yield self.forward
        elif self.reference is not None:
            yield self.reference
        else:
            raise ValueError("no reference policy: full fine-tuning with kl_coef 0 keeps none")

    def _notify(self) -> None:
        if self.on_weights_changed is not None:
            self.on_weights_changed()


def _return_freed_memory_in_training(module: torch.nn.Module, *_: object) -> None:
    """After each decoder layer of a training pass (its recomputation in the backward too), what
    the layer freed goes back to the system: glibc keeps it otherwise, and a LoRA forward of 1,456
    tokens with activation checkpointing grew 1.23 GB resident over 30 layers, 0.19 GB with this
    (docs/speed.md, "Memory"). Serving (eval mode) skips it."""
    if module.training:
        return_freed_memory()


def _summed_over_ranks(total: float, stats: dict[str, RoleStats]) -> tuple[float, dict[str, RoleStats]]:
    """The step's loss and per-role sums over every rank's share (every rank reports the same
    roles: they come from the config and the samples, which all ranks are given)."""
    names = [f.name for f in fields(RoleStats)]
    flat = [total, *(float(getattr(stats[role], n)) for role in sorted(stats) for n in names)]
    summed = iter(sharding.all_sum(flat))
    total = next(summed)
    out = {}
    for role in sorted(stats):
        out[role] = RoleStats()
        for n in names:
            value = next(summed)
            setattr(out[role], n, int(value) if isinstance(getattr(out[role], n), int) else value)
    return total, out


def _accumulate_into(master: torch.Tensor) -> Callable[[torch.Tensor], None]:
    """A post-accumulate-grad hook moving a half-precision weight's gradient into ``master``'s
    float32 gradient, so micro-batches accumulate in float32 and no bf16 gradient is kept."""

    def hook(param: torch.Tensor) -> None:
        assert param.grad is not None
        grad = param.grad.to(torch.float32)
        if master.grad is None:
            master.grad = grad
        else:
            master.grad.add_(grad)
        param.grad = None

    return hook


@contextmanager
def _single_process_quiet() -> Iterator[None]:
    """torch.distributed.checkpoint warns on every single-process save and load that it
    assumes one process; that is what no_dist asks for."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def drop_optimizer_state(path: str | os.PathLike[str]) -> bool:
    """Rewrite checkpoint ``path`` (format 2) with its weights, step and RNG states only, in
    place and whole (as :meth:`PolicyTrainer.save` writes). With LoRA the optimizer's two Adam
    moments are two thirds of a checkpoint: a run whose learning has finished needs none of it to
    be evaluated or verified, and is small enough to move. A trainer that loads it can no longer
    step (``can_train``). Needs no model: the weights are read by the shapes the checkpoint
    records. False where there was nothing to drop."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = Path(path)
    state = json.loads((path / "trainer_state.json").read_text())
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is a format {state.get('format')} checkpoint; only format "
                         f"{CHECKPOINT_FORMAT} checkpoints can drop their optimizer state")
    if not state.get("optimizer", True):
        return False
    stored = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    weights = {key: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
               for key, meta in stored.items()
               if key.startswith("weights/") and isinstance(meta, TensorStorageMetadata)}
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        with _single_process_quiet():
            dcp.load(weights, checkpoint_id=path, no_dist=True)
            dcp.save(weights, checkpoint_id=tmp, no_dist=True)
        for rng in path.glob("rng*.pt"):
            shutil.copy2(rng, tmp / rng.name)
        (tmp / "trainer_state.json").write_text(json.dumps({**state, "optimizer": False}, indent=2))
        tmp.chmod(0o755)
        _replace(path, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def _token_weights(samples: Sequence[Sample], counts: list[int], aggregation: str) -> list[float]:
    """Each sample's weight per trained token in the step's loss (the weights sum to 1)."""
    if aggregation == "token-mean":
        return [1.0 / sum(counts)] * len(samples)
    # sample-mean: each sample its own unit; episode-mean: each episode
    units = episode_keys(samples) if aggregation == "episode-mean" else list(range(len(samples)))
    unit_tokens: dict[object, int] = {}
    for unit, count in zip(units, counts):
        unit_tokens[unit] = unit_tokens.get(unit, 0) + count
    n_units = sum(1 for tokens in unit_tokens.values() if tokens)
    return [1.0 / (unit_tokens[unit] * n_units) if count else 0.0
            for unit, count in zip(units, counts)]


def _replace(path: Path, new: Path) -> None:
    """Rename ``new`` to ``path``, moving an existing ``path`` aside first (never half of each)."""
    if path.exists():
        stale = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
        os.rename(path, stale / path.name)
        os.rename(new, path)
        shutil.rmtree(stale)
    else:
        os.rename(new, path)


def with_lora(model: torch.nn.Module, lora: LoraSettings) -> Any:
    """``model`` with LoRA adapters injected in place (peft replaces its linear layers), inside
    peft's wrapper; a serving copy given the same settings gets the same weight names."""
    from peft import LoraConfig, get_peft_model

    targets = lora.target_modules
    peft_config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets if isinstance(targets, str) else list(targets),
        task_type="CAUSAL_LM",
    )
    # Adapters of a bf16 model are created in float32 (peft's autocast_adapter_dtype).
    return get_peft_model(model, peft_config)


def _is_peft(model: torch.nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _rng_state() -> dict[str, Any]:
    """torch's RNG states: the only randomness in a step is dropout, drawn from them."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
