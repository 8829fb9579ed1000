"""One GPU lease, one command: what this project has never measured on a GPU, in order of value.

    python bench/gpu_check.py --reference ref/train_gpt.py      # one CUDA GPU: what fits 480 s, in order
    python bench/gpu_check.py --dry-run                           # anywhere: the same parts, tiny, on the CPU
    python bench/gpu_check.py --parts record,tests --budget-s 300

It needs the offline corpus's shards (python data/build_sotu.py --variant sp1024 sp8192), which is all a GPU
machine that reaches nothing needs to have with it. Each row is printed and the JSON (--out) rewritten the
moment it is measured, so a timeout loses nothing already measured. --budget-s runs the parts in the order
below and skips, by name, each part whose estimate would not fit what is left. The parts:

- parity: the challenge's default shape (9x512, sp1024, one GPU, 8 micro-steps of 64x1024) side by side with
  the challenge's own train_gpt.py (--reference: a path; the repository does not copy it), two launches each
  in alternating order. bench/step_probe.py times a window of whole steps between two device syncs from
  outside each script, reads peak memory, and profiles a few more steps (the device's busy time per step,
  kernel launches, host calls that wait for the device). Our two launches must agree bit for bit.
- record: the record track's shape (RECORD below), run by the built frontier trainer (tools/build_trainer.py:
  the core with the technique stack), on one GPU from launch to score, on a slice of the validation set: launch to first timed step, warmup and priming, ms/step before and after the loop switch,
  tokens/s and MFU beside the field's best entry's, peak memory, each final pass extrapolated to 8 GPUs and
  the full validation set, LoRA TTT's time per group, and the graphs compiled inside the timers (must be 0).
- tests: the CUDA-only tests (pytest -m cuda), while artifact's run trains beside them (neither is a timing).
- artifact: a long default run (ARTIFACT_STEPS steps at one micro-step of 64x1024) and its artifact's bytes
  against 16,000,000: ours, and with --reference the challenge's export of the same weights.
- record_warm: the record's launch again, its compile cache warm, to its first timed step.
- attention: one record-shape attention layer, SDPA's flash kernel and FlashAttention 4 where it runs.
- record_train (only when named): record's training alone, ended by the probe at its last step: launch to
  first timed step, ms/step before and after the loop switch, tokens/s, MFU and peak memory, each row as
  the run reaches it; for a lease too short for record.

Put the table in MEASUREMENTS.md with the command and the device.
"""

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from flops import count_flops_per_token, fineweb_ttt_positions, peak_flops, ttt_positions
from run_files import ROOT, challenge_export_bytes, reader_module, tg  # puts the repository's root on sys.path
from data.shards import read_datafile, write_datafile  # noqa: E402

sys.path.insert(0, str(ROOT / "tools"))
import build_trainer  # noqa: E402

PARTS = ("parity", "record", "tests", "artifact", "record_warm", "attention", "record_train")
DEFAULT_PARTS = PARTS[:-1]  # record_train is record's training alone, for a lease too short for record
# Seconds each part takes on one H100/H200, a fresh machine's (the dry run's on 2 CPU cores): parity's as measured
# on an H200, record_train's past the 190 s it ran there before a timeout (MEASUREMENTS.md), the others estimated.
# artifact's run starts beside tests, so it adds what is left of it when they end. parity and record together
# need more than one 600 s call: a lease that has parity's figures runs --parts record,tests,artifact,record_warm.
ESTIMATE_S = dict(parity=290, record=300, tests=110, artifact=30, record_warm=70, attention=20, record_train=200)
DRY_ESTIMATE_S = dict(parity=40, record=60, tests=5, artifact=30, record_warm=25, attention=5, record_train=25)
FULL_VAL_TOKENS = 40_540_160  # sp8192 validation tokens in the field's logs
FIELD_TOKENS_PER_S_PER_GPU = 786_432 / 0.1217 / 8  # the best entry: 786,432 tokens a step in 121.7 ms on 8 GPUs
ARTIFACT_STEPS = 2000
# The record track's shape (docs/GPU.md, "The record track") at 16 micro-steps of 24 x 2048 on one GPU, the
# sequences a GPU holds on 8 at 2. Not the command's: zlib for zpaq (the passes score the same weights,
# sooner), 4 warmup steps for 20 (2 a phase compile it; the command's 16 more take ~1 s each here).
RECORD = dict(
    VOCAB_SIZE=8192, NUM_LAYERS=11, MODEL_DIM=512, NUM_HEADS=8, NUM_KV_HEADS=4, MLP_MULT=4,
    MLP_LEAKY_SLOPE=0.5, QK_GAIN_INIT=5, ROPE_DIMS=16, LN_SCALE=1, XSA_LAST_N=11,
    SMEAR_GATE_ENABLED=1, SKIP_GATES_ENABLED=1, ORTHO_INIT=1, SPARSE_ATTN_GATE_ENABLED=1,
    LOOP_START=3, LOOP_END=5, NUM_LOOPS=2, PARALLEL_START_LAYER=8,
    TRAIN_SEQ_LEN=2048, TRAIN_BATCH_TOKENS=786432, GRAD_ACCUM_STEPS=16, WARMUP_STEPS=4,
    MATRIX_BITS=6, EMBED_BITS=7, ATTN_CLIP_SIGMAS=13, MLP_CLIP_SIGMAS=11.5, EMBED_CLIP_SIGMAS=14,
    GPTQ=1, GPTQ_CALIB_SEQS=64, COMPRESSOR="zlib", EMA_DECAY=0.9965, OPTIMIZE_DDP=0,
    EVAL_STRIDE=64, TTT_ENABLED=1, TTT_LORA_RANK=80, TTT_CHUNK_SIZE=48, TTT_BETA2=0.99, TTT_WEIGHT_DECAY=0.5,
    SLIDING_WINDOW_ENABLED=0, ITERATIONS=10, ENABLE_LOOPING_AT=0.5, TRAIN_LOG_EVERY=1,
    # the stack's: the best entry's three global phases over 2,500 documents, attention within documents
    PHASED_TTT_ENABLED=1, PHASED_TTT_PREFIX_DOCS=2500, PHASED_TTT_NUM_PHASES=3, DOC_MASK_ENABLED=1,
)
# the built trainer's folder holds these beside it, as the repository does
BESIDE = ("settings.py", "checkpoints.py", "tools/__init__.py", "tools/packing.py")
# The dry run's shapes: the same settings and passes, small enough for seconds on a CPU.
TINY = dict(
    VOCAB_SIZE=1024, NUM_LAYERS=5, MODEL_DIM=128, NUM_HEADS=4, NUM_KV_HEADS=2, MLP_MULT=2,
    LOOP_START=1, LOOP_END=2, NUM_LOOPS=1, PARALLEL_START_LAYER=3, XSA_LAST_N=5, WARMUP_STEPS=2,
    TRAIN_SEQ_LEN=64, TRAIN_BATCH_TOKENS=2048, GRAD_ACCUM_STEPS=4, GPTQ_CALIB_SEQS=4, ITERATIONS=6,
    TTT_LORA_RANK=4, TTT_CHUNK_SIZE=32, TTT_BATCH_SIZE=4, VAL_BATCH_SIZE=2048, EVAL_STRIDE=16,
    GLOBAL_TTT_CHUNK_TOKENS=1024,
)
# The default shape, shared by parity and artifact; the dry run's is tiny.
DEFAULT = dict(VAL_LOSS_EVERY=0, MAX_WALLCLOCK_SECONDS=0, SEED=1337)
RUN_OUTPUTS = []  # --logs: every run's output goes there too
TINY_DEFAULT = dict(NUM_LAYERS=2, MODEL_DIM=64, TRAIN_SEQ_LEN=64, TRAIN_BATCH_TOKENS=2048, VAL_BATCH_SIZE=2048)
# On the CPU, torch.compile takes the eager backend: dynamo's guards (what decides recompiles) are the same.
EAGER = "import functools, torch; torch.compile = functools.partial(torch.compile, backend='eager'); "

STEP = re.compile(r"^step:(\d+)/\d+ train_loss:(\S+) train_time:(\d+)ms", re.M)
FINAL = re.compile(r"^final_\w+?_(roundtrip|sliding_window|ttt) val_loss:\S+ val_bpb:\S+ eval_time:(\d+)ms", re.M)


class Report:
    """The rows measured so far, printed and written to the JSON as each comes."""

    def __init__(self, out: Path, device: str):
        self.out = out
        self.t0 = time.time()
        self.data = {"device": device, "rows": [], "skipped": {}}

    def row(self, check: str, measured, expected: str = "", **data) -> None:
        elapsed = time.time() - self.t0
        self.data["rows"].append([check, str(measured), expected, round(elapsed, 1)])
        self.data.update(data)
        print(f"[{elapsed:6.1f} s] {check}: {measured}" + (f"  ({expected})" if expected else ""), flush=True)
        self.save()

    def save(self) -> None:
        self.data["wall_s"] = round(time.time() - self.t0, 1)
        self.out.write_text(json.dumps(self.data, indent=1, default=str))


class Context:
    """What every part reads: the arguments, the data, the device, a folder of its own."""

    def __init__(self, args):
        self.args = args
        self.dry = args.dry_run
        self.work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
        self.tok = {v: args.data_dir / f"tokenizers/sotu_{v}_bpe.model" for v in (1024, 8192)}
        self.base = dict(DEVICE="cpu", COMPILE=1, BF16=0) if self.dry else dict(DEVICE="cuda")
        self.device = "cpu (dry run)" if self.dry else torch.cuda.get_device_name(0)
        self.peak = None if self.dry else peak_flops(self.device)

    def frontier(self) -> Path:
        """The frontier stack built on the core (once), in a folder of its own with BESIDE: its train_gpt.py."""
        script = self.work / "frontier" / "train_gpt.py"
        if not script.exists():
            for name in BESIDE:
                (script.parent / name).parent.mkdir(parents=True, exist_ok=True)
                (script.parent / name).write_bytes((ROOT / name).read_bytes())
            script.write_bytes(build_trainer.build(build_trainer.Tree(ROOT), stack=build_trainer.FRONTIER))
        return script

    def default_env(self, **overrides) -> dict:
        env = dict(DEFAULT, DATA_PATH=self.args.sp1024, TOKENIZER_PATH=self.tok[1024], **overrides)
        return dict(env, **TINY_DEFAULT) if self.dry else env


def launch(env: dict, cwd: Path, code: str, timeout: float, until: str | None = None,
           on_line=None) -> tuple[str, list]:
    """A python -c process with env added: its output, and [(seconds from launch, line)]; with until, it is
    ended once a line matches; on_line(seconds, line) sees each line as it comes."""
    cwd.mkdir(parents=True, exist_ok=True)
    environ = {**os.environ, **{k: str(v) for k, v in env.items()}, "PYTHONUNBUFFERED": "1",
               "PROBE_LAUNCHED": str(time.time())}
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-c", code], env=environ, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines, seen = [], []
    keep_output(f"{cwd.name} {env.get('RUN_ID', '')}", "")
    try:
        for line in proc.stdout:
            lines.append(line)
            seen.append((time.time() - t0, line))
            keep_output(None, line)
            if on_line:
                on_line(*seen[-1])
            if until and re.match(until, line):
                proc.terminate()
                break
            if time.time() - t0 > timeout:
                raise TimeoutError(f"no end after {timeout:.0f} s")
        proc.wait(timeout=max(1.0, timeout - (time.time() - t0)))
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines)
    if proc.returncode not in (0, -15) and not until:
        raise RuntimeError(f"exit {proc.returncode}:\n{text[-3000:]}")
    return text, seen


def keep_output(name: str | None, text: str) -> None:
    """Append to --logs: a run's header (name), or its text as it comes."""
    for path in RUN_OUTPUTS:
        with open(path, "a") as f:
            f.write(f"==== {name} ====\n{text}" if name else text)


def seconds_to(seen: list, pattern: str) -> float | None:
    """Seconds from launch to the first line matching pattern."""
    return next((t for t, line in seen if re.match(pattern, line)), None)


def trainer_code(script: Path, dry: bool, probe: bool = False) -> str:
    """python -c code that runs a train_gpt.py as `python train_gpt.py` would, with bench/step_probe.py's hook."""
    head = EAGER if dry else ""
    path = str(ROOT / "bench")
    if probe:
        return f"{head}import sys; sys.path.insert(0, {path!r}); import step_probe; step_probe.run_script({str(script)!r})"
    return (f"{head}import runpy, sys; sys.argv = [{str(script)!r}]; sys.path[0] = {str(script.parent)!r}; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")


def core_settings(env: dict) -> dict:
    """The core's settings of a launch's environment, by their field names (the stack's left out)."""
    names = {f.name for f in dataclasses.fields(tg.Hyperparameters)}
    return {k.lower(): v for k, v in env.items() if k.lower() in names}


def ms_per_step(text: str, first: int, last: int) -> float | None:
    times = {int(step): int(ms) for step, _, ms in STEP.findall(text)}
    steps = [s for s in times if first <= s <= last]
    if len(steps) < 2:
        return None
    return (times[max(steps)] - times[min(steps)]) / (max(steps) - min(steps))


def flops_per_token(env: dict, looping: bool) -> float:
    hp = tg.Hyperparameters(**core_settings(env))
    model = tg.GPT(hp)
    model.set_looping(looping and bool(hp.num_loops))
    return count_flops_per_token(model, hp)


def number(pattern: str, text: str) -> float | None:
    found = re.findall(pattern, text, flags=re.M)
    return float(found[-1]) if found else None


# ---- the parts ----

def parity(report: Report, ctx: Context, budget_s: float) -> None:
    """Ours and the challenge's script at the default shape, alternating launches, timed from outside."""
    reference = ROOT / "train_gpt.py" if ctx.dry else ctx.args.reference  # the challenge's needs CUDA
    warmup = 3
    window = 4 if ctx.dry else 20
    scripts = {"ours": ROOT / "train_gpt.py", "challenge": reference}
    results = {"ours": [], "challenge": []}
    deadline = time.time() + budget_s
    for launch_no, name in enumerate(["ours", "challenge", "ours", "challenge"]):
        cwd = ctx.work / f"parity_{name}"
        profile = 2 if launch_no >= 2 else 0  # the warm launches
        probe_out = cwd / f"probe{launch_no}.json"
        env = ctx.default_env(RUN_ID=f"parity{launch_no}", ITERATIONS=1000, WARMUP_STEPS=warmup,
                              TRAIN_LOG_EVERY=1000, PROBE_OUT=probe_out, PROBE_START=warmup + 10,
                              PROBE_STEPS=window, PROBE_PROFILE=profile, PROBE_FIRST_TIMED=warmup + 1,
                              PROBE_TRACE=cwd / f"trace{launch_no}.json")
        if name == "ours" or ctx.dry:
            env.update(ctx.base)
        text, _ = launch(env, cwd, trainer_code(scripts[name], ctx.dry, probe=True), deadline - time.time())
        probe = json.loads(probe_out.read_text())
        probe["losses"] = [loss for step, loss, _ in STEP.findall(text) if int(step) <= 10]
        results[name].append(probe)
        peak = probe.get("peak_mib_in_window")
        report.row(f"parity: {name} launch {launch_no // 2 + 1} ({'warm' if launch_no >= 2 else 'cold'}): ms/step, "
                   "peak MiB (window / before), launch to first step s",
                   f"{probe['ms_per_step']:.1f}, {peak and round(peak)} / "
                   f"{probe.get('peak_mib_before_window') and round(probe['peak_mib_before_window'])}, "
                   f"{probe['launch_to_first_timed_step_s']:.0f}", parity=results)
        if "profile" in probe:
            p = probe["profile"]
            syncs = sum(p["sync_calls_per_step"].values())
            report.row(f"parity: {name} profiled: wall / device busy ms per step, kernels, host waits per step",
                       f"{p['wall_ms_per_step']:.1f} / {p['device_busy_ms_per_step']:.1f}, "
                       f"{p['kernels_per_step']:.0f}, {syncs:g} {p['sync_calls_per_step']}")
    mean = {name: sum(r["ms_per_step"] for r in runs) / len(runs) for name, runs in results.items()}
    report.row("parity: ours / the challenge's ms per step (mean of two launches each)",
               f"{mean['ours'] / mean['challenge']:.4f} ({mean['ours']:.1f} / {mean['challenge']:.1f})", "<= 1")
    peaks = [max(r.get("peak_mib_in_window") or 0, r.get("peak_mib_before_window") or 0) for r in
             (results["ours"][0], results["challenge"][0])]
    if peaks[1]:
        report.row("parity: ours / the challenge's peak memory", f"{peaks[0] / peaks[1]:.4f}", "<= 1.01")
    same = results["ours"][0]["losses"] == results["ours"][1]["losses"] and bool(results["ours"][0]["losses"])
    report.row("parity: our two launches' train_loss, steps 1-10, bit for bit", same, "True", bitwise=same)


def record_env(ctx: Context, run_id: str) -> dict:
    """RECORD's settings on this machine, scoring a slice of the validation set (the dry run's: tiny)."""
    env = dict(ctx.base, **RECORD, VAL_LOSS_EVERY=0, MAX_WALLCLOCK_SECONDS=0, SEED=1, RUN_ID=run_id)
    if ctx.dry:
        env.update(TINY, DATA_PATH=tiny_slice(ctx.args.sp1024, ctx.work / "sp1024_slice", 2048),
                   TOKENIZER_PATH=ctx.tok[1024])
    else:
        slice_path = tiny_slice(ctx.args.sp8192, ctx.work / "sp8192_slice", ctx.args.val_tokens)
        env.update(DATA_PATH=slice_path, TOKENIZER_PATH=ctx.tok[8192])
    return env


def training_rows(report: Report, ctx: Context, env: dict, text: str) -> None:
    """ms/step before and after the loop switch, tokens/s per GPU and MFU, from a record run's step lines."""
    switch = int(re.search(r"^phase: from step:(\d+) depth_recurrence:on", text, re.M).group(1))
    before = ms_per_step(text, 2, switch)
    after = ms_per_step(text, switch + 2, 10**9)
    batch = int(env["TRAIN_BATCH_TOKENS"])
    rates = [batch / (ms / 1000) if ms else 0 for ms in (before, after)]
    mfu = [100 * flops_per_token(env, looping) * rate / ctx.peak if ctx.peak else None
           for looping, rate in zip((False, True), rates)]
    report.data["record"].update(ms_before=before, ms_after=after, tokens_per_s=rates, mfu_pct=mfu,
                                 loop_switch_step=switch)
    shown_mfu = " / ".join(f"{m:.1f}%" for m in mfu) if ctx.peak else "-"
    report.row("record: ms/step before / after the loop switch; tokens/s per GPU; MFU",
               f"{before or 0:.0f} / {after or 0:.0f}; {rates[0]:,.0f} / {rates[1]:,.0f}; {shown_mfu}",
               f"the field's best: {FIELD_TOKENS_PER_S_PER_GPU:,.0f} tokens/s per GPU")


def record_rows(report: Report, ctx: Context, env: dict):
    """on_line for a record run: each row the moment its line comes, so that a timeout loses nothing measured."""
    lines = []
    found = report.data["record"]
    hp = tg.Hyperparameters(**core_settings(env))

    def on_line(seconds: float, line: str) -> None:
        lines.append(line)
        if m := re.match(r"warmup: steps:(\d+) phases:(\d+) graphs:(\d+) time:(\d+)ms", line):
            found.update(warmup_s=int(m[4]) / 1000, warmup_graphs=int(m[3]))
            report.row("record: warmup's compile and steps (s), graphs", f"{int(m[4]) / 1000:.0f}, {m[3]}")
        elif line.startswith("step:1/"):
            found["first_step_s"] = seconds
            report.row("record: launch to first timed step (s)", f"{seconds:.0f}", "<= 150 cold")
        elif re.match(r"step:\d+/\d+ val_loss", line):  # the last validation: training is over
            training_rows(report, ctx, env, "".join(lines))
        elif m := re.match(r"peak memory allocated: (\d+) MiB", line):
            found["peak_mib"] = int(m[1])
            report.row("record: peak memory allocated (MiB)", m[1], "the field: ~41 GiB at 48 sequences a GPU; 24 here")
        elif m := re.match(r"val_tokens:(\d+)", line):
            found["val_tokens"] = int(m[1])
        elif m := re.match(r"priming: passes:(\S+) graphs:(\d+) time:(\d+)ms", line):
            found.update(priming_s=int(m[3]) / 1000, priming_graphs=int(m[2]))
            report.row("record: priming of the final passes before their timers (s), graphs", f"{int(m[3]) / 1000:.0f}, {m[2]}")
        elif m := re.match(r"ttt: groups:(\d+)", line):
            found["ttt_groups"] = int(m[1])
        elif m := FINAL.match(line):
            name, ms = m[1], int(m[2])
            # TTT's cost follows the documents' lengths: FineWeb's token positions at this slice's rate
            full_s = ms * FULL_VAL_TOKENS / found["val_tokens"] / 8 / 1000
            if name == "ttt":
                rate = slice_ttt_positions(Path(env["DATA_PATH"]), hp) / (ms / 1000)
                full_s = fineweb_ttt_positions(hp) / rate / 8
                groups = found.get("ttt_groups", 1)
                report.row(f"record: LoRA TTT ms per group of {hp.ttt_batch_size} documents (this slice)",
                           f"{ms / groups:.0f} ({groups} groups)")
            found.setdefault("passes_ms", {})[name] = ms
            found.setdefault("extrapolated_8gpu_s", {})[name] = full_s
            report.row(f"record: final pass {name} on {found['val_tokens']:,} tokens (ms); on 8 GPUs and 40.5M (s)",
                       f"{ms}; {full_s:.0f}", "all passes under 600 s")
        elif m := re.search(r"^final_eval_total .*graphs_compiled_inside:(\d+)", line):
            report.row("record: graphs compiled inside the final passes' timers", m[1], "0",
                       graphs_compiled_inside=int(m[1]))
    return on_line


def record_train(report: Report, ctx: Context, budget_s: float) -> None:
    """RECORD's training alone: bench/step_probe.py reads its peak memory over the timed steps and ends it at
    its last, before the final validation and the export."""
    env = record_env(ctx, "record_train")
    warmup, steps = int(env["WARMUP_STEPS"]), 10
    probe_out = ctx.work / "record_train.json"  # the window: training steps 2 to 10, which ends the run
    env.update(ITERATIONS=steps, PROBE_OUT=probe_out, PROBE_START=warmup + 1, PROBE_STEPS=steps - 1,
               PROBE_FIRST_TIMED=warmup + 1)
    text, _ = launch(env, ctx.work / "record", trainer_code(ctx.frontier(), ctx.dry, probe=True),
                     budget_s, on_line=record_rows(report, ctx, env))
    training_rows(report, ctx, env, text)
    peak = json.loads(probe_out.read_text()).get("peak_mib_in_window")
    report.data["record"]["peak_mib"] = peak
    report.row("record: peak memory allocated over the timed steps (MiB)", peak and round(peak),
               "the field: ~41 GiB at 48 sequences a GPU; 24 here")


def record(report: Report, ctx: Context, budget_s: float, warm: bool = False) -> None:
    """The record shape from launch to score on a validation slice (warm: to its first timed step only)."""
    env = record_env(ctx, "record")
    if warm:
        env["RUN_ID"] = "record_warm"
        _, seen = launch(env, ctx.work / "record", trainer_code(ctx.frontier(), ctx.dry), budget_s,
                         until=r"^step:1/")
        first = seconds_to(seen, r"step:1/")
        report.row("record_warm: launch to first timed step, compile cache warm (s)", f"{first:.0f}", "<= 60",
                   record_warm_first_step_s=first)
        return
    launch(env, ctx.work / "record", trainer_code(ctx.frontier(), ctx.dry), budget_s,
           on_line=record_rows(report, ctx, env))


def tiny_slice(data: Path, out: Path, tokens: int) -> Path:
    """data's training shards and its first `tokens` validation tokens, cut at a document start: a folder."""
    out.mkdir(parents=True, exist_ok=True)
    for shard in sorted(data.glob("fineweb_train_*.bin")):
        (out / shard.name).unlink(missing_ok=True)
        (out / shard.name).symlink_to(shard.resolve())
    val = read_datafile(sorted(data.glob("fineweb_val_0*.bin"))[0])
    starts = [i for i, t in enumerate(val[:tokens]) if t == tg.BOS_ID]
    end = starts[-1] if len(starts) > 1 else tokens
    write_datafile(out / "fineweb_val_000000.bin", val[:end])
    return out


def slice_ttt_positions(folder: Path, hp) -> int:
    """Token positions lora_ttt() runs on a folder's validation split, compiled (bench/flops.py)."""
    tokens = torch.from_numpy(read_datafile(folder / "fineweb_val_000000.bin").astype("int64"))
    lengths = sorted((b - a for a, b in tg.document_spans(tokens)), reverse=True)
    return sum(ttt_positions(lengths[i], hp) for i in range(0, len(lengths), hp.ttt_batch_size))


def tests(report: Report, ctx: Context, budget_s: float) -> None:
    pytest = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "tests", "-p", "no:cacheprovider"]
    try:
        out = subprocess.run(pytest, cwd=ROOT, capture_output=True, text=True, timeout=budget_s)
        summary = (out.stdout.strip().splitlines() or ["no output"])[-1]
        keep_output("pytest -m cuda", out.stdout[-20000:] + out.stderr[-5000:] + "\n")
    except subprocess.TimeoutExpired:
        summary = f"timed out after {budget_s:.0f} s"
    report.row("tests: the CUDA-only tests (pytest -m cuda)", summary, "all pass; skipped without a GPU",
               cuda_tests=summary)


def artifact_start(ctx: Context) -> subprocess.Popen:
    """The long default run, started in the background: one micro-step of 64 x 1024 a step, checkpointed at
    its end so that the challenge's export can read the same weights."""
    steps = 10 if ctx.dry else ARTIFACT_STEPS
    env = ctx.default_env(RUN_ID="artifact", ITERATIONS=steps, GRAD_ACCUM_STEPS=1, TRAIN_LOG_EVERY=500,
                          **dict(WARMUP_STEPS=2) if ctx.dry else {},
                          TRAIN_BATCH_TOKENS=TINY_DEFAULT["TRAIN_BATCH_TOKENS"] if ctx.dry else 65_536,
                          SAVE_EVERY=steps, KEEP_CHECKPOINTS=1, CHECKPOINT_DIR=ctx.work / "checkpoints")
    env = {k: str(v) for k, v in dict(env, **ctx.base).items()}
    cwd = ctx.work / "artifact"
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-c", trainer_code(ROOT / "train_gpt.py", ctx.dry)],
                            env={**os.environ, **env}, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def artifact_finish(report: Report, ctx: Context, proc: subprocess.Popen, budget_s: float) -> None:
    try:
        text, _ = proc.communicate(timeout=budget_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        report.row("artifact: the long default run", f"timed out after {budget_s:.0f} s")
        return
    keep_output("artifact", text + "\n")
    ours = number(r"^Serialized model int8\+zlib: (\d+) bytes", text)
    total = number(r"^Total submission size int8\+zlib: (\d+) bytes", text)
    steps = number(r"^step:(\d+)/\d+ val_loss", text)
    if ours is None:
        report.row("artifact: the long default run", f"failed:\n{text[-2000:]}")
        return
    found = {"steps": steps, "ours_bytes": ours, "ours_total": total}
    line = f"{ours:,.0f} model + code = {total:,.0f}"
    if ctx.args.reference and not ctx.dry:
        state = torch.load(next((ctx.work / "checkpoints").glob("artifact/step_*/state.pt")), map_location="cpu")
        found["challenge_bytes"] = challenge_export_bytes(reader_module(ctx.args.reference), state["model"])
        line += f"; the challenge's export of the same weights: {found['challenge_bytes']:,} model"
    report.row(f"artifact: after {steps:.0f} default steps (one micro-step each), bytes", line,
               "under 16,000,000", artifact=found)


def attention(report: Report, ctx: Context, budget_s: float) -> None:
    """SDPA's flash kernel, then FlashAttention 4 behind it where it runs, at a GPU's micro-step of the record."""
    cuda = not ctx.dry
    layout = tg.Layout(device=torch.device("cuda" if cuda else "cpu"), use_bf16=cuda)
    seqs, seq_len = (24, 2048) if cuda else (2, 64)
    timings = {}
    if not cuda:
        timings["sdpa (cpu)"] = attention_ms(layout, seqs, seq_len)
    else:
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            timings["sdpa flash"] = attention_ms(layout, seqs, seq_len)
            try:  # needs pip's flash-attn-4, an SM 9.0/10.0 GPU and a torch with the switch
                torch.nn.attention.activate_flash_attention_impl("FA4")
                timings["FA4"] = attention_ms(layout, seqs, seq_len)
                torch.nn.attention.restore_flash_attention_impl()
            except (AttributeError, ImportError, RuntimeError) as e:
                timings[f"FA4 ({type(e).__name__}: {str(e)[:60]})"] = None
    shown = ", ".join(f"{name}: {ms:.2f}" if ms else f"{name}: -" for name, ms in timings.items())
    report.row(f"attention: {seqs}x{seq_len} tokens, one layer fwd+bwd (ms)", shown, "FA4 below flash",
               attention_ms=timings)


def attention_ms(layout, seqs: int, seq_len: int, reps: int = 10) -> float:
    hp = tg.Hyperparameters(**dict(core_settings(RECORD), train_seq_len=seq_len))
    attn = tg.CausalSelfAttention(hp, layer=hp.num_layers - 1).to(layout.device)
    x = torch.randn(seqs, seq_len, hp.model_dim, device=layout.device, requires_grad=True)
    for rep in range(reps + 2):  # two untimed
        if rep == 2:
            tg.synchronize(layout.device)
            t0 = time.perf_counter()
        with tg.autocast(layout):
            attn(x, {}).float().square().mean().backward()
    tg.synchronize(layout.device)
    return tg.ms_since(t0) / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU: the same parts and rows")
    parser.add_argument("--reference", type=Path,
                        help="the challenge's train_gpt.py, for parity and artifact (dry run: ours stands in)")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="seconds for all the parts: each that would not fit what is left is skipped")
    parser.add_argument("--parts", default=",".join(DEFAULT_PARTS), help=f"which, of {','.join(PARTS)}")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--logs", type=Path, help="also append every run's output to this file")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data", help="holds datasets/ and tokenizers/")
    parser.add_argument("--sp1024", type=Path, help="default: DATA_DIR/datasets/sotu_sp1024")
    parser.add_argument("--sp8192", type=Path, help="default: DATA_DIR/datasets/sotu_sp8192")
    parser.add_argument("--val-tokens", type=int, default=131_072,
                        help="the validation slice the record's final passes score")
    args = parser.parse_args()
    chosen = args.parts.split(",")
    if set(chosen) - set(PARTS):
        sys.exit(f"gpu_check: --parts {args.parts}: choose from {','.join(PARTS)}")
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA GPU is visible; run with --dry-run for the CPU rehearsal")
    args.sp1024 = args.sp1024 or args.data_dir / "datasets/sotu_sp1024"
    args.sp8192 = args.sp8192 or args.data_dir / "datasets/sotu_sp8192"
    ctx = Context(args)
    needed = [args.sp1024, ctx.tok[1024]] + ([] if args.dry_run else [args.sp8192, ctx.tok[8192]])
    for path in needed:
        if not path.exists():
            sys.exit(f"gpu_check: {path} is missing: python data/build_sotu.py --variant sp1024 sp8192")
    if args.reference and not args.reference.is_file():
        sys.exit(f"gpu_check: --reference {args.reference} is not a file")
    args.reference = args.reference and args.reference.resolve()  # the runs start in folders of their own
    report = Report(args.out, ctx.device)
    if args.logs:
        RUN_OUTPUTS.append(args.logs)
    report.data["record"] = {}
    estimates = DRY_ESTIMATE_S if args.dry_run else ESTIMATE_S
    runs = {"parity": parity, "record": record, "record_warm": lambda r, c, b: record(r, c, b, warm=True),
            "tests": tests, "attention": attention, "record_train": record_train}
    background = None
    print(f"gpu_check on {ctx.device}, budget {args.budget_s:.0f} s: {', '.join(chosen)}", flush=True)
    for name in [p for p in PARTS if p in chosen]:
        left = args.budget_s - (time.time() - report.t0)
        if name == "parity" and not (args.reference or args.dry_run):
            report.data["skipped"][name] = "no --reference: the challenge's train_gpt.py is needed beside ours"
        elif estimates[name] > left and not (name == "artifact" and background):
            report.data["skipped"][name] = f"~{estimates[name]} s would not fit the {left:.0f} s left"
        if name in report.data["skipped"]:
            print(f"[skipped] {name}: {report.data['skipped'][name]}", flush=True)
            report.save()
            continue
        try:
            if name == "tests" and "artifact" in chosen and estimates["artifact"] <= left:
                background = artifact_start(ctx)  # trains beside the tests: neither is a timing
            if name == "artifact":
                background = background or artifact_start(ctx)
                artifact_finish(report, ctx, background, left)
            else:
                runs[name](report, ctx, left)
        except Exception as e:  # one part's failure is a row; the others still run
            report.row(f"{name}: failed", f"{type(e).__name__}: {str(e)[-1500:]}")
    report.save()
    print(f"written: {args.out} ({report.data['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
