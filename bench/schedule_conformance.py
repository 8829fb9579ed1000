"""The stack's progressive context (stack/progressive-context.diff) against the field's own training loop (#2014):
each step's row length, LR multiplier and loop phase, and the (length, loop) graphs primed before the clock.

    python bench/schedule_conformance.py --field path/to/pr2014

--field names #2014's record folder of openai/parameter-golf (its train_gpt.py and, for the as-run paces, its
train_seed*.log); the field's code is not in this repository. Both loops run on a fake clock, no model: the field's
train_model from its schedule's set-up to the end of its `while True:` loop, statement for statement (its warmup
block and step_fn left out: step_fn is a stub that records the step and moves the clock), and the built frontier's
own train() with train_step, next_batches and the validation scorer stubbed the same way. Each configuration's
steps take the same times on both sides, so both read the same elapsed time, and are compared step by step.

As run: each log's hyperparameters (the names below), and a pace (ms per step) that puts the log's length and loop
switches and its last step where the log has them. Others: the same with +-10% noise a step, progress landing
exactly on each fraction, a step-capped run, an unsorted schedule, ties and a last fraction below 1, the
WARMDOWN_ITERS warmdown under a cap and without, no schedule, and a run that ITERATIONS ends before the cap
(where the two progresses differ: expected, and counted apart). Exit status 1 on any other difference.
"""

import argparse
import ast
import random
import re
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import torch

from field_conformance import Field, frontier

# the settings both loops read, as the logs name them
SHARED = ("train_seq_len", "train_seq_schedule", "train_seq_schedule_mode", "seq_change_warmup_steps",
          "iterations", "max_wallclock_seconds", "gptq_reserve_seconds", "warmdown_frac", "warmdown_iters",
          "min_lr", "enable_looping_at", "num_loops", "loop_start", "loop_end", "train_batch_tokens",
          "val_loss_every", "warmup_steps", "world_size")
AS_RUN = dict(TRAIN_SEQ_LEN="3072", TRAIN_SEQ_SCHEDULE="1024@0.100,2048@0.700,3072@1.000",
              SEQ_CHANGE_WARMUP_STEPS="32", ITERATIONS="20000", MAX_WALLCLOCK_SECONDS="600",
              GPTQ_RESERVE_SECONDS="4.0", WARMDOWN_FRAC="0.85", WARMDOWN_ITERS="0", MIN_LR="0.1",
              ENABLE_LOOPING_AT="0.35", NUM_LOOPS="2", LOOP_START="3", LOOP_END="5", TRAIN_BATCH_TOKENS="786432",
              VAL_LOSS_EVERY="0", WARMUP_STEPS="20", WORLD_SIZE="8")


class Clock:
    """time for both loops: perf_counter() reads seconds the stubbed steps add."""

    def __init__(self):
        self.seconds = 0.0

    def perf_counter(self):
        return self.seconds


def field_loop(field: Field, environ: dict, pace_ms) -> tuple[list, list]:
    """[(length, lr multiplier, looping, elapsed ms)] of each step of the field's loop, and its priming list."""
    h = field.settings(environ)
    clock = Clock()
    steps = []
    fake_torch = ModuleType("torch")
    fake_torch.__dict__.update(vars(torch))
    fake_torch.cuda = SimpleNamespace(synchronize=lambda: None)
    base_model = SimpleNamespace(looping_active=False, encoder_indices=[], decoder_indices=[],
                                 parameters=lambda: [], state_dict=lambda keep_vars=False: {})
    helpers = ("parse_train_seq_schedule", "parse_scalar_schedule", "schedule_value",
               "max_train_seq_len_from_schedule", "validate_train_seq_plan_compatibility", "training_progress",
               "current_train_seq_len")
    ns = field.define(dict(h=h, time=clock, torch=fake_torch, log=lambda *a, **k: None, base_model=base_model,
                           model=None, val_data=None, device=None, compiled_forward_logits=None,
                           eval_val=lambda *args: (0.0, 0.0)), *helpers)

    def step_fn(step, lr_scale):
        steps.append((ns["active_train_seq_len"], lr_scale, base_model.looping_active, ns["elapsed_ms"]))
        clock.seconds += pace_ms(step) / 1000.0
        return torch.zeros(())
    ns["step_fn"] = step_fn
    body = field.nodes["train_model"].body
    start = next(i for i, node in enumerate(body) if ast.unparse(node).startswith("train_seq_plan ="))
    run = []
    for node in body[start:]:
        left_out = isinstance(node, ast.FunctionDef) and node.name == "step_fn"
        left_out |= isinstance(node, ast.If) and ast.unparse(node.test) == "h.warmup_steps > 0"
        if not left_out:
            run.append(node)
        if isinstance(node, ast.While):
            break
    assert isinstance(run[-1], ast.While), "the field's train_model has no training loop where this bench looks"
    exec(compile(ast.Module(run, []), str(field.path), "exec"), ns)
    priming = dict(ns, h=SimpleNamespace(**{**vars(type(h)), **vars(h), "compile_shape_warmup": True}))
    items = field.define(priming, "_compile_warmup_work_items")["_compile_warmup_work_items"]()
    return steps, items


def our_loop(module, environ: dict, pace_ms) -> tuple[list, list, list]:
    """The same for the built frontier's train(): its steps, its log lines and training_shapes()."""
    # the field always quantizes by GPTQ, keeping GPTQ_RESERVE_SECONDS of a cap; ours keeps it only with GPTQ=1
    reserve = environ.get("GPTQ_RESERVE_SECONDS", "0") if float(environ["MAX_WALLCLOCK_SECONDS"]) else "0"
    gptq = dict(GPTQ="1" if float(reserve) else "0", GPTQ_RESERVE_SECONDS=reserve)
    hp = module.Hyperparameters.from_env({**environ, **gptq}, int(environ.get("WORLD_SIZE", 1)))
    clock = Clock()
    steps = []
    lines = []
    model = SimpleNamespace(looping=module.looping_at(0.0, hp))  # where warmup leaves it
    model.set_looping = lambda on: setattr(model, "looping", on)

    def train_step(trainer, batches, optimizers, lr_scale, grad_clip, layout):
        steps.append((batches[0], lr_scale, model.looping, 1000.0 * clock.seconds))
        clock.seconds += pace_ms(len(steps) - 1) / 1000.0
        return torch.zeros(())
    stubs = dict(time=clock, train_step=train_step, next_batches=lambda loader, hp, layout, seq_len: [seq_len],
                 score=lambda *args: None, metrics=lambda sums: (0.0, 0.0))
    saved = {name: getattr(module, name) for name in stubs}
    vars(module).update(stubs)
    try:
        run = module.Run(hp, module.Layout(), None, b"", log=lines.append)
        run.model = model
        optimizers = SimpleNamespace(muon=SimpleNamespace(param_groups=[]))
        module.train(run, optimizers, module.EMA(model, 0.0), None)
    finally:
        vars(module).update(saved)
    return steps, lines, module.training_shapes(hp)


def log_pace(log: Path, environ: dict):
    """ms per step that puts the log's switches where it logged them: elapsed at each switch step less half a
    step is its fraction of the budget, at the last step the logged train_time, or the budget where rank 0 logged
    less (another rank reached the cap first); linear in between. Also the logged switch steps and last step."""
    text = log.read_text(errors="replace")
    budget = 1000.0 * (float(environ["MAX_WALLCLOCK_SECONDS"]) - float(environ["GPTQ_RESERVE_SECONDS"]))
    fractions = dict(sorted((int(length), float(f)) for f, length in
                            (stage.split("@")[::-1] for stage in environ["TRAIN_SEQ_SCHEDULE"].split(","))))
    points = [(0.0, 0.0)]
    for length, step in re.findall(r"^growth_stage:seq_len:(\d+) progress:\S+ step:(\d+)$", text, re.M):
        before = max(f for f in fractions.values() if f < fractions[int(length)])
        points.append((int(step) - 0.5, before * budget))
    for step in re.findall(r"^layer_loop:enabled step:(\d+)", text, re.M):
        points.append((int(step) - 0.5, float(environ["ENABLE_LOOPING_AT"]) * budget))
    end = re.search(r"^stopping_early: wallclock_cap train_time: (\d+)ms step: (\d+)/", text, re.M)
    last = int(end.group(2))
    points.append((last, max(float(end.group(1)), budget + 0.5)))
    points.sort()

    def elapsed(step):
        for (s0, t0), (s1, t1) in zip(points, points[1:]):
            if step <= s1:
                break
        return t0 + (t1 - t0) * (step - s0) / (s1 - s0)  # past the last step: the last stretch's pace

    switches = [round(s + 0.5) for s, _ in points[1:-1]]
    return (lambda step: elapsed(step + 1) - elapsed(step)), last, switches


def from_log(log: Path) -> dict:
    """The SHARED settings as the log's Hyperparameters block has them."""
    text = log.read_text(errors="replace")
    environ = {}
    for name in SHARED:
        found = re.search(rf"^  {name}: (.*)$", text, re.M)
        value = found.group(1).strip()
        environ[name.upper()] = {"True": "1", "False": "0"}.get(value, value)
    return environ


def noisy(pace_ms, seed):
    rng = random.Random(seed)
    factors = [rng.uniform(0.9, 1.1) for _ in range(30_000)]
    return lambda step: pace_ms(step) * factors[step]


def configurations(folder: Path) -> list:
    """(name, environ, pace, expected) of each run compared; expected: exact, rounding or progress."""
    found = []
    for log in sorted(folder.glob("train_seed*.log")):
        environ = from_log(log)
        pace, last, switches = log_pace(log, environ)
        name = f"{log.stem} as run (the log: length and loop switches at {switches}, {last} steps)"
        found.append((name, environ, pace, "exact"))
        found.append((f"{log.stem}, its pace +-10% a step", environ, noisy(pace, len(found)), "exact"))
    def uniform(ms):
        return lambda step: ms
    found += [
        ("progress lands on 0.1, 0.35, 0.7 exactly (125 ms of a 100 s cap)",
         dict(AS_RUN, MAX_WALLCLOCK_SECONDS="100", GPTQ_RESERVE_SECONDS="0"), uniform(125.0), "exact"),
        ("step-capped: ITERATIONS=3000, no cap, an unsorted schedule",
         dict(AS_RUN, MAX_WALLCLOCK_SECONDS="0", ITERATIONS="3000", TRAIN_SEQ_SCHEDULE="2048@0.6,1024@0.3,3072@1.0",
              SEQ_CHANGE_WARMUP_STEPS="16", WARMDOWN_FRAC="0.5", ENABLE_LOOPING_AT="0.5"), uniform(50.0), "exact"),
        ("ties, lengths down and up, the last fraction below 1",
         dict(AS_RUN, TRAIN_SEQ_LEN="2048", TRAIN_SEQ_SCHEDULE="2048@0.25,1024@0.25,2048@0.5,1024@0.75",
              MAX_WALLCLOCK_SECONDS="300", GPTQ_RESERVE_SECONDS="0", SEQ_CHANGE_WARMUP_STEPS="8"),
         uniform(97.0), "exact"),
        ("a re-warm longer than a stage: 300 steps",
         dict(AS_RUN, SEQ_CHANGE_WARMUP_STEPS="300", MAX_WALLCLOCK_SECONDS="60", GPTQ_RESERVE_SECONDS="0"),
         uniform(61.0), "exact"),
        ("WARMDOWN_ITERS=1200 under the cap", dict(AS_RUN, WARMDOWN_FRAC="0", WARMDOWN_ITERS="1200"),
         uniform(122.0), "rounding"),
        ("WARMDOWN_ITERS=500, step-capped: ITERATIONS=2000, no cap",
         dict(AS_RUN, WARMDOWN_FRAC="0", WARMDOWN_ITERS="500", MIN_LR="0.05", MAX_WALLCLOCK_SECONDS="0",
              ITERATIONS="2000"), uniform(122.0), "exact"),
        ("no schedule", dict(AS_RUN, TRAIN_SEQ_SCHEDULE="", SEQ_CHANGE_WARMUP_STEPS="0"), uniform(122.0), "exact"),
        ("ITERATIONS=1000 ends the run before the cap",
         dict(AS_RUN, ITERATIONS="1000"), uniform(122.0), "progress"),
    ]
    return found


def switch_steps(steps) -> list:
    return [i for i in range(1, len(steps)) if steps[i][0] != steps[i - 1][0]]


def compare(name, field_steps, field_items, ours, expected) -> bool:
    """Print the run's agreement; True where it is as expected."""
    our_steps, _, primed = ours
    n = min(len(field_steps), len(our_steps))
    lengths = sum(field_steps[i][0] == our_steps[i][0] for i in range(n))
    loops = sum(field_steps[i][2] == our_steps[i][2] for i in range(n))
    clocks = sum(field_steps[i][3] == our_steps[i][3] for i in range(n))
    exact = sum(field_steps[i][1] == our_steps[i][1] for i in range(n))
    worst = max((abs(f[1] - o[1]) / max(abs(f[1]), 1e-300) for f, o in zip(field_steps, our_steps)), default=0.0)
    met = sorted({(o[0], o[2]) for o in our_steps})
    unprimed = [shape for shape in met if shape not in primed]
    print(f"{name}:")
    print(f"  steps: field {len(field_steps)}, ours {len(our_steps)}; length switches: field "
          f"{switch_steps(field_steps)}, ours {switch_steps(our_steps)}")
    loop_from = [next((i for i, step in enumerate(steps) if step[2]), None) for steps in (field_steps, our_steps)]
    print(f"  loop on from step: field {loop_from[0]}, ours {loop_from[1]}; our LR multiplier at steps s - 1, s, s + 1 "
          f"and s + 31 of each switch s: " + "; ".join(
              f"{s}: " + ", ".join(f"{our_steps[i][1]:.5f}" for i in (s - 1, s, s + 1, s + 31) if i < len(our_steps))
              for s in switch_steps(our_steps)))
    print(f"  per step: length {lengths}/{n}, loop phase {loops}/{n}, elapsed ms {clocks}/{n}, LR multiplier "
          f"exact {exact}/{n} (largest relative difference {worst:.2e})")
    print(f"  primed: field (COMPILE_SHAPE_WARMUP=1) {[(l, bool(p)) for l, p in field_items]}, ours {primed}; "
          f"met by our steps and not primed: {unprimed}")
    same_steps = len(field_steps) == len(our_steps) and lengths == loops == clocks == n
    if expected == "progress":
        print("  expected to differ: the field's progress under a cap is time alone, ours (the core's "
              "training_progress, which the LR and the loop read too) the larger of time and steps/ITERATIONS")
        return not unprimed
    ok = same_steps and not unprimed and (exact == n if expected == "exact" else worst < 1e-14)
    if expected == "rounding" and ok:
        print("  rounding: the field's warmdown time is WARMDOWN_ITERS x (elapsed / step), ours (WARMDOWN_ITERS x "
              "elapsed) / step")
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--field", type=Path, required=True, help="#2014's record folder of openai/parameter-golf")
    args = parser.parse_args(argv)
    field = Field(args.field)
    if not field.has("train_model", "parse_train_seq_schedule", "current_train_seq_len"):
        sys.exit(f"--field {args.field}: its train_gpt.py has no progressive schedule (#2014's has)")
    module = frontier()
    folder = args.field if args.field.is_dir() else args.field.parent
    wrong = 0
    for name, environ, pace, expected in configurations(folder):
        field_steps, field_items = field_loop(field, environ, pace)
        wrong += not compare(name, field_steps, field_items, our_loop(module, environ, pace), expected)
    print(f"{wrong} configuration(s) differ beyond what is expected")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
