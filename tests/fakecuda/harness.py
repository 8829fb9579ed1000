"""Run train_gpt.py's CUDA code path on this CPU-only machine, on fake CUDA tensors (see fakecuda.py).

    python harness.py [--script PATH] [--eager] [--keep-going] [SETTING=VALUE ...]

Stages, each the script's own functions, in main()'s order, on a tiny byte-level dataset written here:
  setup        setup(): settings (DEVICE=cuda), tokenizer, shards, validation tokens moved to the device, CUDA
               backends, SDPA switches (flash only under bf16), the process group
  start        the log's header (RunLog.write_header)
  build_model  build_model() and build_optimizers(): GPT on the host, .to(cuda), torch.compile, DDP,
               AdamW(fused=True) + Muon
  warmup       warmup() with WARMUP_STEPS=1: one compiled training step per loop phase, the final passes'
               scoring graphs, the state restored
  train_step   one step of train(): loader (pin_memory, non_blocking), 8 micro-steps fwd+bwd under bf16
               autocast, Muon (compiled Newton-Schulz) and fused AdamW
  eval         score() on the validation split (the plain pass; EVAL_STRIDE adds a sliding pass)
  ttt_phase    with TTT_ENABLED=1 PHASED_TTT_ENABLED=1 (the stack's global-phases): global_ttt() on 3 chunks of
               random documents, its 2 trained chunks with different numbers of contexts (one compiled graph)
The first failure is printed with its traceback (exit status 1); --keep-going runs the stages after it.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.dont_write_bytecode = True  # nothing written beside the script under test
sys.path.insert(0, str(Path(__file__).resolve().parent))
import fakecuda  # noqa: E402  (first: re-executes with the CUDA shim preloaded)

import argparse  # noqa: E402
import contextlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from collections import Counter  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily  # noqa: E402

# tiny, but the CUDA-relevant constraints of the record hold: head dim 16 (flash: % 8, <= 256), GQA 4:2
TINY = dict(NUM_LAYERS="2", MODEL_DIM="64", NUM_HEADS="4", NUM_KV_HEADS="2", MLP_MULT="2", VOCAB_SIZE="260",
            TRAIN_SEQ_LEN="64", TRAIN_BATCH_TOKENS="1024", VAL_BATCH_SIZE="1024", WARMUP_STEPS="1",
            ITERATIONS="2", VAL_LOSS_EVERY="0", MAX_WALLCLOCK_SECONDS="0", SEED="1337")
# --record: the script's own defaults (9 x 512, seq 1024, 524,288 tokens a step: 64 sequences a micro-step);
# fake tensors hold no memory, so the record shape costs only tracing time
RECORD = dict(VOCAB_SIZE="1024", WARMUP_STEPS="1", ITERATIONS="2", VAL_LOSS_EVERY="0", MAX_WALLCLOCK_SECONDS="0")
BYTE_OFFSET = 4  # ids 0..3 are control (BOS_ID = 1), 4..259 the bytes


def write_data(root: Path, vocab_size: int, val_tokens: int = 2_500):
    """A byte tokenizer (.json) and train/val shards of ASCII documents, each starting with BOS."""
    rng = np.random.default_rng(0)
    words = [bytes(rng.integers(97, 123, size=int(rng.integers(1, 9)))) for _ in range(300)]

    def stream(n_tokens):
        out = []
        while len(out) < n_tokens:
            doc = b" ".join(words[i] for i in rng.integers(0, len(words), size=int(rng.integers(5, 120))))
            out += [1] + [b + BYTE_OFFSET for b in doc]
        return np.array(out[:n_tokens], dtype="<u2")

    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    for name, n in (("fineweb_train_000000.bin", 200_000), ("fineweb_val_000000.bin", val_tokens)):
        tokens = stream(n)
        header = np.zeros(256, dtype="<i4")
        header[:3] = (20240520, 1, len(tokens))
        (data / name).write_bytes(header.tobytes() + tokens.tobytes())
    tok = root / "bytes.json"
    tok.write_text(json.dumps(dict(tokenizer_type="pure_byte", vocab_size=vocab_size,
                                   config=dict(byte_offset=BYTE_OFFSET))))
    return data, tok


def fake_process_group(rank, world):
    """init_process_group(backend='nccl' or 'gloo') -> torch's FakeProcessGroup: every collective returns at once,
    touching nothing (so one process can stand for rank r of N). Only the rank's own code path is exercised."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    original = dist.init_process_group

    def init_process_group(backend=None, *args, device_id=None, **kwargs):
        FAKE_PG.append(backend)
        return original("fake", store=FakeStore(), rank=rank, world_size=world)
    dist.init_process_group = init_process_group
    # object collectives carry values a fake group cannot deliver: every rank keeps its own objects (rank 0's)
    dist.broadcast_object_list = lambda object_list, src=None, group=None, device=None, group_src=None: None
    import torch.nn.parallel.distributed as ddp  # DDP's cross-rank shape check compares gathered values
    ddp._verify_param_shape_across_processes = lambda process_group, tensors, logger=None: None


FAKE_PG = []


def load_script(path: Path):
    spec = importlib.util.spec_from_file_location("train_gpt", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_gpt"] = module  # checkpoints.py and friends import it by this name
    sys.path.insert(0, str(path.parent))
    spec.loader.exec_module(module)
    return module


def construct_on_host(cls):
    """The script builds its modules on the CPU, then moves them (GPT(hp).to(device)): build them outside the
    fake mode, as real CPU tensors, so that .to('cuda') makes fresh fake parameters (swapping fake
    parameters in place is refused by swap_tensors: FakeTensorMode holds weak references to them)."""
    class OnHost(cls):
        def __new__(klass, *args, **kwargs):
            return super().__new__(klass)

        def __init__(self, *args, **kwargs):
            with unset_fake_temporarily():
                super().__init__(*args, **kwargs)
    OnHost.__name__ = OnHost.__qualname__ = cls.__name__
    return OnHost


def headline(error):
    """The error in one line; Dynamo's wrapper quotes the op's own error, which is the one a GPU would raise."""
    import re
    text = str(error)
    inner = re.search(r"(?:got|raised exception) (\w+)\((['\"])(.*?)\2\)", text, re.S)
    first = text.splitlines()[0] if text else ""
    if inner:
        return f"{inner[1]}: {inner[3]}  (inside torch.compile: {type(error).__name__}: {first})"
    return f"{type(error).__name__}: {first}"


def describe(t):
    if isinstance(t, torch.Tensor):
        kind = "fake" if isinstance(t, FakeTensor) else "REAL"
        return f"{kind} {str(t.dtype).removeprefix('torch.')} {t.device} {tuple(t.shape)}"
    return repr(t)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--script", default="train_gpt.py", type=Path)
    parser.add_argument("--eager", action="store_true", help="COMPILE=0 (the eager CUDA path)")
    parser.add_argument("--cpu", action="store_true", help="for contrast: the real CPU path (DEVICE=cpu, fp32, "
                        "eager, real numbers), as the test suite runs it; no fake tensors")
    parser.add_argument("--world-size", type=int, default=1, help="run as rank --rank of N processes: NCCL is "
                        "replaced by torch's FakeProcessGroup (collectives do nothing), DDP wraps the model")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--record", action="store_true", help="the script's default (record) shape, not tiny")
    parser.add_argument("--keep-going", action="store_true", help="run the later stages after a failure")
    parser.add_argument("--verbose", action="store_true", help="show the warnings torch raises")
    parser.add_argument("settings", nargs="*", help="SETTING=VALUE, e.g. DOC_MASK_ENABLED=1 NUM_LOOPS=1")
    args = parser.parse_args(argv)
    if not args.verbose:
        warnings.filterwarnings("ignore")
    torch.set_num_threads(1)

    mode = contextlib.nullcontext() if args.cpu else fakecuda.install(device_count=min(8, args.world_size))
    work = Path(tempfile.mkdtemp(prefix="fakecuda_run_"))
    settings = dict(RECORD if args.record else TINY)
    settings.update(s.split("=", 1) for s in args.settings)
    # --record: validation for a few windows of the longest scoring length a record runs (3,072)
    data, tok = write_data(work, int(settings["VOCAB_SIZE"]), 20_000 if args.record else 2_500)
    settings.update(DATA_PATH=str(data), TOKENIZER_PATH=str(tok), ARTIFACT_DIR=str(work / "logs"),
                    CHECKPOINT_DIR=str(work / "ckpt"), RUN_ID="fakecuda", DEVICE="cuda",
                    COMPILE="0" if args.eager else settings.get("COMPILE", "auto"))
    if args.world_size > 1:
        settings.update(WORLD_SIZE=str(args.world_size), RANK=str(args.rank), LOCAL_RANK=str(args.rank))
        fake_process_group(args.rank, args.world_size)
    if args.cpu:  # the test suite's CPU path: fp32 unless BF16=1 is asked for
        settings.update(DEVICE="cpu", COMPILE="0", BF16=dict(s.split("=", 1) for s in args.settings).get("BF16", "0"))
    print(f"fakecuda harness: {args.script}  torch {torch.__version__}  "
          f"{'REAL CPU PATH (no fakes)' if args.cpu else 'compile backend: ' + fakecuda.COMPILE_BACKEND}\nsettings: {' '.join(f'{k}={v}' for k, v in settings.items())}\n")

    tg = load_script(args.script)
    if not args.cpu:
        tg.GPT = construct_on_host(tg.GPT)
    ctx = {}

    def setup():
        ctx["run"] = tg.setup(settings)
        run = ctx["run"]
        return f"layout: {run.layout}\n    val tokens: {describe(run.val.tokens)}"

    def start():
        ctx["run"].log.write_header(ctx["run"])
        b = torch.backends.cuda
        pg = f" process group: {FAKE_PG[0]} -> FakeProcessGroup" if FAKE_PG else ""
        return (f"sdp switches: flash={b.flash_sdp_enabled()} mem_efficient={b.mem_efficient_sdp_enabled()} "
                f"math={b.math_sdp_enabled()} cudnn={b.cudnn_sdp_enabled()}"
                + (f" attention:{ctx['run'].layout.attention}" if hasattr(ctx["run"].layout, "attention") else "")
                + pg)

    def build_model():
        run = ctx["run"]
        run.model, run.scorer, run.trainer = tg.build_model(run.hp, run.layout)
        ctx["optimizers"] = opts = tg.build_optimizers(run.model, run.hp, run.layout)
        if FAKE_PG and isinstance(run.trainer, torch.nn.parallel.DistributedDataParallel):
            # the fake group's all-reduce future has no value; DDP's reducer needs the bucket back
            def local_allreduce(state, bucket):
                fut = torch.futures.Future()
                fut.set_result(bucket.buffer())
                return fut
            run.trainer.register_comm_hook(None, local_allreduce)

            class QuietLogger:  # DDP's runtime stats need a CUDA timer, which a CPU build lacks
                def __init__(self, inner):
                    self.inner = inner

                def set_runtime_stats_and_log(self):
                    pass

                def __getattr__(self, name):
                    return getattr(self.inner, name)
            run.trainer.logger = QuietLogger(run.trainer.logger)
        p = next(run.model.parameters())
        ddp = f"; trainer: {type(run.trainer).__name__}" if run.trainer is not run.scorer else ""
        return (f"params: {describe(p)} ...{ddp}; AdamW fused={opts[0].defaults.get('fused')}; "
                f"Muon update dtype {opts[1].update_dtype}; compiled: {fakecuda.COMPILED}")

    def warmup():
        tg.warmup(ctx["run"], ctx["optimizers"])
        return f"graphs compiled: {tg.compiled_graphs()}"

    def train_step():
        run, hp, layout = ctx["run"], ctx["run"].hp, ctx["run"].layout
        loader = tg.DistributedTokenLoader(tg.train_pattern(hp.data_path), layout.rank, layout.world_size,
                                           layout.device)
        batches = tg.next_batches(loader, hp, layout)
        before = len(fakecuda.SDPA_CHOICES)
        kernels = fakecuda.KERNELS.copy()
        loss = tg.train_step(run.trainer, batches, ctx["optimizers"], 1.0, hp.grad_clip_norm, layout)
        grads = Counter(str(p.grad.dtype) if p.grad is not None else "None" for p in run.model.parameters())
        adam_state = next(iter(ctx["optimizers"][0].state.values()), {})
        return (f"batch x: {describe(batches[0][0])}; loss: {describe(loss)}; grads after zero_grad: {dict(grads)}"
                f"\n    adam state: {{{', '.join(f'{k}: {describe(v)}' for k, v in adam_state.items())}}}"
                f"\n    CUDA kernels checked this step: {dict(fakecuda.KERNELS - kernels)}")

    def evaluate():
        run, hp = ctx["run"], ctx["run"].hp
        out = []
        for sliding in sorted({False, hp.eval_stride > 0}):
            sums = tg.score(run.scorer, run.val, run.layout, *hp.windows(sliding))
            out.append(f"{'sliding' if sliding else 'plain'}: sums {describe(sums)}")
        return "; ".join(out)

    def ttt_phase():
        run, hp = ctx["run"], ctx["run"].hp
        if not (getattr(hp, "phased_ttt_enabled", False) and hp.ttt_enabled):
            return "off (TTT_ENABLED=1 PHASED_TTT_ENABLED=1 with the stack's global-phases run it)"
        g = torch.Generator().manual_seed(0)
        chunk = hp.global_ttt_chunk_tokens
        tokens = torch.randint(2, hp.vocab_size, (3 * chunk + 1,), generator=g)
        # documents of random lengths: each chunk its own number of contexts
        tokens[torch.randint(0, 3 * chunk, (3 * chunk // 200,), generator=g)] = tg.BOS_ID
        graphs, kernels = tg.compiled_graphs(), fakecuda.KERNELS.copy()
        chunks = tg.global_ttt(run, tokens)
        return (f"chunks: {chunks} ({chunks - 1} trained); graphs compiled for them: {tg.compiled_graphs() - graphs}"
                f"\n    CUDA kernels checked: {dict(fakecuda.KERNELS - kernels)}")

    stages = [("setup", setup), ("start", start), ("build_model", build_model), ("warmup", warmup),
              ("train_step", train_step), ("eval", evaluate), ("ttt_phase", ttt_phase)]
    failed = []
    with mode:
        for name, stage in stages:
            if failed and not args.keep_going:
                print(f"[skip] {name}")
                continue
            t0 = time.perf_counter()
            try:
                detail = stage()
                print(f"[ ok ] {name} ({time.perf_counter() - t0:.1f}s)\n    {detail}")
            except BaseException as error:  # noqa: BLE001  (SystemExit, ConfigError: all reported)
                failed.append(name)
                print(f"[FAIL] {name} ({time.perf_counter() - t0:.1f}s): {headline(error)}")
                print("".join(traceback.format_exception(error)).rstrip())
                if name in ("setup", "start", "build_model"):
                    args.keep_going = False  # nothing after these can run without them
    picked = Counter(c[:2] for c in fakecuda.SDPA_CHOICES)
    print(f"\nsdpa backends chosen (backend, q dtype): {dict(picked)}")
    print(f"CUDA kernels checked (calls): {dict(fakecuda.KERNELS)}")
    if fakecuda.HOST_READS:
        print(f"device values read on the host (answered 0/False, unknowable here): {dict(fakecuda.HOST_READS)}")
    if failed and fakecuda.LAST_FLASH:
        print(f"last FlashAttention call checked: {fakecuda.LAST_FLASH}")
    print("RESULT: " + (f"FAILED at {', '.join(failed)}" if failed else "all stages passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
