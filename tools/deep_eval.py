"""Re-score a record's model file with the record's own train_gpt.py (check_record.py --deep).

The record's script is imported from its bytes (its top level has no side effects), so the model is built,
loaded and evaluated by exactly the code that produced the claim. It needs from that script:
Hyperparameters (a dataclass), GPT(hp), load_artifact(path) -> state dict, Layout(...), metrics(sums) ->
(val_loss, val_bpb) of score(model, val_tokens, luts, hp, layout[, sliding]) (older scripts: evaluate(...) ->
(val_loss, val_bpb)) or of test_time_train(...)'s per-chunk sums or lora_ttt(run)'s sums, and either load_tokenizer(path, vocab_size) and
load_validation(data_path or pattern, seq_len, tokenizer) -> (val_tokens, bytes per position), or (older scripts)
load_tokenizer_luts(path, vocab_size) and load_validation_tokens(pattern, seq_len).
"""

import dataclasses
import inspect
import os
from pathlib import Path

from runlog import RECORDS_DIR, import_source


class DeepCheckUnavailable(RuntimeError):
    """The deep check cannot run here (no data, no torch, an incompatible script); not a problem of the record."""


def resolve_input(value, override, what: str) -> str:
    """The override, or the logged path, tried as given and from the repository root."""
    if override is not None:
        candidates = [Path(override)]
    else:
        candidates = [Path(value)] if Path(value).is_absolute() else [Path(value), RECORDS_DIR.parent / value]
    found = next((p for p in candidates if p.exists()), None)
    if found is None:
        raise DeepCheckUnavailable(f"{what} {candidates[0]} not found; pass --{what.lower().replace('_', '-')}")
    return str(found)


def evaluate_artifact(code: tuple[bytes, str], model_path, hyperparameters: dict, layout_logged: dict,
                      data_path=None, tokenizer_path=None, cpu_threads=None, mode="roundtrip") -> tuple[float, float]:
    """(val_loss, val_bpb) of the model file, evaluated in this process by the record's script, given as
    (source bytes, file name): the folder's train_gpt.py, or for a packed one the logged source it packs;
    on CPU with the run's thread count (more threads than cores crawl on a busy machine).
    mode "sliding" re-scores the sliding-window line, with a script whose evaluate() has that option;
    "ttt" re-runs score-first test-time training, with a script that has test_time_train() or lora_ttt()."""
    try:
        mod = import_source(*code)
    except ImportError as e:
        raise DeepCheckUnavailable(f"cannot import {code[1]}: {e}") from e
    import torch

    threads_before = torch.get_num_threads()
    if cpu_threads:
        torch.set_num_threads(cpu_threads)
    try:
        return _evaluate(mod, torch, model_path, hyperparameters, layout_logged, data_path, tokenizer_path, mode)
    finally:
        torch.set_num_threads(threads_before)


def _evaluate(mod, torch, model_path, hyperparameters, layout_logged, data_path, tokenizer_path, mode):
    evaluate = getattr(mod, "evaluate", None) or (lambda *args, **kw: mod.metrics(mod.score(*args, **kw)))
    new = hasattr(mod, "Validation")  # scripts since 2026-11-25 score sliding windows and run TTT
    if not new and mode == "sliding" and "sliding" not in inspect.signature(getattr(mod, "evaluate", mod.score)).parameters:
        raise DeepCheckUnavailable("the record's evaluate() has no sliding-window option")
    if mode == "ttt" and not (hasattr(mod, "test_time_train") or hasattr(mod, "lora_ttt")):
        raise DeepCheckUnavailable("the record's script has neither test_time_train() nor lora_ttt()")

    names = {f.name for f in dataclasses.fields(mod.Hyperparameters)}
    hp = mod.Hyperparameters(**{k: v for k, v in hyperparameters.items() if k in names})
    hp.data_path = resolve_input(hp.data_path, data_path, "data_path")
    hp.tokenizer_path = resolve_input(hp.tokenizer_path, tokenizer_path, "tokenizer_path")
    # the device the run scored on, where there is one: a CPU run's score is recomputed on the CPU, to 1e-8
    device = torch.device("cuda" if torch.cuda.is_available() and layout_logged.get("device") == "cuda" else "cpu")
    # One process doing the work of world_size x grad_accum_steps: same per-forward batch as the run.
    accum = int(layout_logged.get("world_size", 1)) * int(layout_logged.get("grad_accum_steps", 1))
    same_device = layout_logged.get("device") == device.type
    use_bf16 = same_device and str(layout_logged.get("bf16")) == "True"
    if new:  # the stages of one Run
        world_size = int(layout_logged.get("world_size", 1))
        return evaluate_run(mod, hp, device, accum, use_bf16, model_path, mode, world_size)
    layout = mod.Layout(rank=0, world_size=1, local_rank=0, distributed=False, device=device,
                        grad_accum_steps=accum, use_compile=False, use_bf16=use_bf16)
    pattern = os.path.join(hp.data_path, "fineweb_val_*.bin")
    if hasattr(mod, "load_tokenizer"):  # scripts since 2026-11-23: the bytes behind each position, checked
        # as the script's setup() cut the split: early versions by TRAIN_SEQ_LEN, later ones by the longer window
        longer = "max(hp.train_seq_len, hp.eval_seq_len)" in inspect.getsource(mod.setup)
        seq_len = max(hp.train_seq_len, hp.eval_seq_len) if longer else hp.train_seq_len
        tokenizer = mod.load_tokenizer(hp.tokenizer_path, hp.vocab_size)
        params = inspect.signature(mod.load_validation).parameters
        if "data_path" in params:  # scripts since 2026-11-24 take the folder (and read its byte sidecars)
            sidecar = {"sidecar": hp.sidecar_bytes} if "sidecar" in params and hasattr(hp, "sidecar_bytes") else {}
            val_tokens, luts = mod.load_validation(hp.data_path, seq_len, tokenizer, **sidecar)
        else:
            val_tokens, luts = mod.load_validation(pattern, seq_len, tokenizer)
        val_tokens, luts = val_tokens.to(device), luts.to(device)
    else:  # per-id tables
        luts = mod.load_tokenizer_luts(hp.tokenizer_path, hp.vocab_size).to(device)
        val_tokens = mod.load_validation_tokens(pattern, hp.train_seq_len)
    model = mod.GPT(hp).to(device)
    model.load_state_dict(mod.load_artifact(model_path), strict=True)
    if mode == "ttt":  # trains the model on the chunks it has scored, as the run did
        return mod.metrics(mod.test_time_train(model, val_tokens, luts, hp, layout).sum(0))
    return evaluate(model, val_tokens, luts, hp, layout, **({"sliding": True} if mode == "sliding" else {}))


def evaluate_run(mod, hp, device, accum: int, use_bf16: bool, model_path, mode: str,
                 world_size: int = 1) -> tuple[float, float]:
    """The same passes with a script of 2026-11-25 or later: its setup's checks, its score() and TTT. LoRA TTT
    is rescored as the run's world_size processes ran it: each rank's adapters (A) carry from one of its groups
    to the next, so the score depends on the number of processes."""
    layout = mod.Layout(device=device, grad_accum_steps=accum, use_bf16=use_bf16)
    tokenizer = mod.load_tokenizer(hp.tokenizer_path, hp.vocab_size)
    val = mod.load_validation(hp, tokenizer, device=device)
    model = mod.GPT(hp).to(device)
    state = mod.load_artifact(model_path)
    model.load_state_dict(state, strict=True)
    if "loop_on" in state:  # the phase the weights were trained in (scripts before 2026-11-28 set it on load)
        model.set_looping(bool(state["loop_on"]))
    run = mod.Run(hp, layout, val, b"", model=model, scorer=model, trainer=model)
    if mode == "ttt" and hasattr(mod, "lora_ttt"):  # scripts since 2026-11-26: per-document LoRA TTT
        return mod.metrics(sum(mod.lora_ttt(share) for share in rank_shares(run, world_size)))
    if mode == "ttt":  # trains the model on the chunks it has scored, as the run did
        return mod.metrics(mod.test_time_train(run).sum(0))
    return mod.metrics(mod.score(model, val, layout, *hp.windows(mode == "sliding")))


def rank_shares(run, world_size: int) -> list:
    """The run as each of its world_size ranks scored LoRA TTT, all in this process: a rank takes every
    world_size-th group of documents, and its adapters' A carry from one of its groups to the next, so the score
    depends on the number of processes. Nothing is all-reduced: the caller sums the ranks' sums."""
    class Share(type(run.layout)):
        distributed = False  # one process runs every rank's share
    layout = Share(**vars(run.layout))
    return [dataclasses.replace(run, layout=dataclasses.replace(layout, rank=rank, world_size=world_size))
            for rank in range(world_size)]
