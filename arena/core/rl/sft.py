"""Supervised fine-tuning with trl's ``SFTTrainer``: SkillRL's cold start and the shared warm-start base.

Each demonstration step is one prompt-completion example: the prompt is exactly the prompt the
policy sees at that step (SkillRL's skill-augmented one; the standard solver's for the warm start),
the completion is the demonstrated action, and the loss is on the completion only. SkillRL's
authors fine-tune in LLaMA-Factory on teacher-written trajectories (their SFT data were released
only later, SkillRL #4/#18/#58). The trained weights are folded into the served model (LoRA merged), so the
GRPO trainer built afterwards takes that model as its reference (with LoRA: the adapters
disabled; with full fine-tuning: a copy made at construction).

The adapter (or, without LoRA, the full weights) is saved so a resumed run rebuilds the very
same reference weights before anything is digested: a method's fine-tune goes through
``run.fine_tune``, which keeps it in the method's folder and has the harness restore it
(:mod:`arena.core.services.fine_tune`).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from arena.core.contract.llm import Chat

if TYPE_CHECKING:
    import torch

ADAPTER_DIR = "sft-adapter"
FULL_WEIGHTS = "sft-weights.safetensors"


def example(prompt: Chat, action: str) -> dict[str, Any]:
    """One conversational prompt-completion row for trl."""
    return {"prompt": [dict(m) for m in prompt], "completion": [{"role": "assistant", "content": action}]}


def _lora_config(settings: dict[str, Any]) -> Any:
    from peft import LoraConfig

    targets = settings.get("target_modules", "all-linear")
    return LoraConfig(r=int(settings["r"]), lora_alpha=int(settings["alpha"]),
                      lora_dropout=float(settings.get("dropout", 0.0)),
                      target_modules=targets if isinstance(targets, str) else list(targets),
                      task_type="CAUSAL_LM")


def train_sft(model: torch.nn.Module, tokenizer: Any, rows: list[dict[str, Any]], settings: dict[str, Any],
              work_dir: Path, seed: int, on_step: Callable[[int, int], object] | None = None
              ) -> tuple[torch.nn.Module, dict[str, float]]:
    """Fine-tune ``model`` on ``rows`` and return the model with the update folded in (the
    same module object with LoRA, so a backend serving it serves the result) and metrics.
    ``on_step(done, total)`` after each optimizer step (a progress bar's ``update``).

    The adapter (LoRA) or the weights (full) are saved under ``work_dir`` for :func:`restore`.
    """
    import datasets
    from transformers import PrinterCallback, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    if not rows:
        raise ValueError("SFT needs at least one demonstration step")
    logging.getLogger("transformers.trainer").setLevel(logging.WARNING)
    datasets.disable_progress_bars()  # Arena draws its own progress
    work_dir.mkdir(parents=True, exist_ok=True)
    lora = settings.get("lora")
    on_cpu = next(model.parameters()).device.type == "cpu"
    import torch  # here, not at the top: listing the plugin must not import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        raise ValueError(
            "Supervised fine-tuning (SkillRL's cold start, a warm start's build) runs in one process, "
            "not yet under torchrun: build a warm start first with `arena warmstart RECIPE`, and run "
            "SkillRL without torchrun (docs/distributed.md).")
    low_precision = next(model.parameters()).dtype == torch.bfloat16
    if lora is None and low_precision:
        raise ValueError("Full-weight SFT of a bfloat16 model loses the update; set llm.dtype=float32 "
                         "or method.sft.lora (LoRA adapters train in float32).")
    config = SFTConfig(
        output_dir=str(work_dir / "sft-trainer"),
        max_steps=int(settings["steps"]),
        per_device_train_batch_size=int(settings["batch_size"]),
        gradient_accumulation_steps=int(settings.get("gradient_accumulation_steps", 1)),
        learning_rate=float(settings["lr"]),
        lr_scheduler_type=str(settings.get("lr_scheduler", "constant")),
        warmup_steps=0,
        weight_decay=float(settings.get("weight_decay", 0.0)),
        max_length=settings.get("max_length"),
        completion_only_loss=True,
        gradient_checkpointing=False,
        bf16=low_precision,
        use_cpu=on_cpu,
        save_strategy="no",
        report_to=[],
        logging_steps=1,
        disable_tqdm=True,
        seed=seed,
        data_seed=seed,
        dataloader_num_workers=0,
    )
    trainer = SFTTrainer(model=cast(Any, model), args=config, train_dataset=datasets.Dataset.from_list(rows),
                         processing_class=tokenizer,
                         peft_config=_lora_config(dict(lora)) if lora is not None else None)
    trainer.remove_callback(PrinterCallback)  # no loss dicts on stdout
    if on_step is not None:

        class Reported(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                assert on_step is not None
                on_step(int(state.global_step), int(state.max_steps))

        trainer.add_callback(Reported())
    started = time.perf_counter()
    output = trainer.train()
    trained: Any = trainer.model  # a PeftModel with LoRA, else the model itself
    if lora is not None:
        trained.save_pretrained(str(work_dir / ADAPTER_DIR))
        result = trained.merge_and_unload()
    else:
        # save_model, not save_file: it keeps one copy of tensors the model ties together (the
        # input and output embeddings of SmolLM2), which save_file refuses to write.
        from safetensors.torch import save_model

        result = trained
        save_model(result, str(work_dir / FULL_WEIGHTS))
    shutil.rmtree(work_dir / "sft-trainer", ignore_errors=True)  # trl's output_dir: nothing kept there
    result.eval()
    result.config.use_cache = True
    metrics = {"sft/loss": float(output.training_loss), "sft/steps": float(output.global_step),
               "sft/examples": float(len(rows)), "sft/seconds": time.perf_counter() - started}
    return result, metrics


def restore(model: torch.nn.Module, work_dir: Path) -> torch.nn.Module:
    """Re-apply a saved SFT update to freshly loaded base weights (resume)."""
    adapter = work_dir / ADAPTER_DIR
    if adapter.is_dir():
        from peft import PeftModel

        return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().eval()
    weights = work_dir / FULL_WEIGHTS
    if weights.is_file():
        from safetensors.torch import load_model

        load_model(model, str(weights))
        return model.eval()
    raise FileNotFoundError(f"No SFT update in {work_dir} ({ADAPTER_DIR}/ or {FULL_WEIGHTS}); the run "
                            "directory is incomplete. Start a new run.")
