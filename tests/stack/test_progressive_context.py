"""progressive-context (stack/progressive-context.diff), on the built frontier: each step's row length from
TRAIN_SEQ_SCHEDULE at its progress, the LR re-warm after a change of length (SEQ_CHANGE_WARMUP_STEPS), the loader's
rows at each length from the same tokens a step, the refusals, and warmup compiling every (length, loop) graph
before the clock. The steps run the frontier's own train() on a fake clock, its train_step stubbed (drive()).
bench/schedule_conformance.py sets the same loop beside the field's own (#2014)."""

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from stack.conftest import frontier_hp

# #2014's settings that the schedule reads, on the tests' tiny model
AS_RUN = dict(train_seq_len=3072, train_seq_schedule="1024@0.100,2048@0.700,3072@1.000", seq_change_warmup_steps=32,
              iterations=20_000, max_wallclock_seconds=600.0, gptq_reserve_seconds=4.0, warmdown_frac=0.85,
              min_lr=0.1, num_loops=1, loop_start=0, loop_end=0, enable_looping_at=0.35,
              train_batch_tokens=786_432, val_loss_every=0, train_log_every=0)


def drive(fr, monkeypatch, hp, pace_ms):
    """fr.train() on stubs, each step taking pace_ms(step) of a fake clock: [(length, LR multiplier, looping,
    elapsed ms)] of each step, and the log's lines."""
    clock = SimpleNamespace(seconds=0.0)
    clock.perf_counter = lambda: clock.seconds
    steps, lines = [], []
    model = SimpleNamespace(looping=fr.looping_at(0.0, hp))
    model.set_looping = lambda on: setattr(model, "looping", on)

    def train_step(trainer, batches, optimizers, lr_scale, grad_clip, layout):
        steps.append((batches[0], lr_scale, model.looping, 1000.0 * clock.seconds))
        clock.seconds += pace_ms(len(steps) - 1) / 1000.0
        return torch.zeros(())
    monkeypatch.setattr(fr, "time", clock)
    monkeypatch.setattr(fr, "train_step", train_step)
    monkeypatch.setattr(fr, "next_batches", lambda loader, hp, layout, seq_len: [seq_len])
    monkeypatch.setattr(fr, "score", lambda *args: None)
    monkeypatch.setattr(fr, "metrics", lambda sums: (0.0, 0.0))
    run = fr.Run(hp, fr.Layout(), None, b"", log=lines.append)
    run.model = model
    fr.train(run, SimpleNamespace(muon=SimpleNamespace(param_groups=[])), fr.EMA(model, 0.0), None)
    return steps, lines


def changes(steps) -> list:
    return [i for i in range(1, len(steps)) if steps[i][0] != steps[i - 1][0]]


@pytest.fixture(scope="module")
def as_run(fr):
    return frontier_hp(fr, **AS_RUN)


def test_each_step_trains_at_the_length_of_its_progress_and_logs_each_change(fr, monkeypatch, as_run):
    steps, lines = drive(fr, monkeypatch, as_run, lambda step: 122.0)  # #2014's mean pace
    budget = 596_000.0
    for length, _, _, elapsed in steps:
        progress = elapsed / budget
        assert length == (1024 if progress <= 0.1 else 2048 if progress <= 0.7 else 3072), progress
    assert len(steps) == 4886 and changes(steps) == [489, 3420]
    assert [line for line in lines if line.startswith("seq_len:")] == [
        "seq_len: from step:489 2048 progress:0.100", "seq_len: from step:3420 3072 progress:0.700"]


def test_the_lr_re_warms_over_n_steps_from_each_change_then_is_the_schedule_s_again(fr, monkeypatch, as_run):
    steps, _ = drive(fr, monkeypatch, as_run, lambda step: 122.0)
    starts = changes(steps)
    for step, (_, lr, _, elapsed) in enumerate(steps):
        since = [step - s for s in starts if 0 <= step - s < 32]
        factor = (since[0] + 1) / 32 if since else 1.0
        assert lr == fr.lr_schedule(step, elapsed, as_run) * factor, step
    for s in starts:  # 1/32 of the schedule at the change, all of it 31 steps on
        assert steps[s][1] == fr.lr_schedule(s, steps[s][3], as_run) / 32
        assert steps[s + 31][1] == fr.lr_schedule(s + 31, steps[s + 31][3], as_run)
    assert round(steps[3420][1], 5) == 0.01103 and round(steps[3451][1], 5) == 0.34540  # the field's, at 122 ms


def test_a_change_within_a_re_warm_restarts_it(fr, monkeypatch):
    hp = frontier_hp(fr, **dict(AS_RUN, train_seq_schedule="1024@0.1,2048@0.15,3072@1.0", seq_change_warmup_steps=300,
                                warmdown_frac=0.0, warmdown_iters=0))
    steps, _ = drive(fr, monkeypatch, hp, lambda step: 122.0)
    first, second = changes(steps)
    assert second - first < 300
    assert steps[second - 1][1] == (second - first) / 300 and steps[second][1] == 1 / 300
    assert steps[second + 299][1] == 1.0


def test_a_resume_continues_the_length_and_the_re_warm(fr, as_run):
    state = fr.LoopState(step=500, elapsed_ms=0.15 * 596_000, seq_len=2048, rewarm_from=489)
    lines = []
    assert fr.seq_schedule(state, as_run, lines.append) == (2048, 12 / 32)
    assert (state.seq_len, state.rewarm_from, lines) == (2048, 489, [])
    state = fr.LoopState(step=520, elapsed_ms=0.15 * 596_000, seq_len=2048, rewarm_from=489)
    assert fr.seq_schedule(state, as_run, lines.append) == (2048, 1.0) and state.rewarm_from == -1
    state = fr.LoopState(step=500, elapsed_ms=0.15 * 596_000, seq_len=2048, rewarm_from=489)
    unwarmed = frontier_hp(fr, **dict(AS_RUN, seq_change_warmup_steps=0))
    assert fr.seq_schedule(state, unwarmed, lines.append) == (2048, 1.0), "resumed with the re-warm off"


def stream_loader(fr, world_size=1, rank=0, tokens=50_000, vocab=64):
    """A DistributedTokenLoader over one in-memory shard whose token i is i % vocab."""
    loader = object.__new__(fr.DistributedTokenLoader)
    loader.shards = [np.arange(tokens, dtype=np.uint16) % vocab]
    loader.rank, loader.world_size, loader.device = rank, world_size, torch.device("cpu")
    loader.position = [0, 0]
    return loader


def test_the_loader_cuts_the_same_tokens_a_step_into_rows_of_each_length(fr):
    hp = frontier_hp(fr, train_batch_tokens=768, train_seq_len=48)
    layout = fr.Layout(rank=1, world_size=2, grad_accum_steps=2)
    loader = stream_loader(fr, world_size=2, rank=1, vocab=60_000)
    span = 768 // 4 + 1  # a micro-step's tokens on a rank, with its last target
    micro = 0
    for seq_len in (16, 16, 48, 8, 24, 48):
        for x, y in fr.next_batches(loader, hp, layout, seq_len):
            assert x.shape == (192 // seq_len, seq_len) and y.shape == x.shape
            first = (2 * micro + 1) * span  # rank 1's share of this micro-step: nothing skipped at a change
            assert torch.equal(x.flatten(), torch.arange(first, first + 192)), seq_len
            assert torch.equal(y.flatten(), x.flatten() + 1)
            micro += 1


@pytest.mark.parametrize("settings, refusal", [
    (dict(train_seq_schedule="8@0.5,16"), r"TRAIN_SEQ_SCHEDULE='8@0.5,16': write LEN@FRACTION,\.\.\. with lengths "
                                          r"above 0 and fractions in \(0, 1\], e\.g\. 1024@0\.1"),
    (dict(train_seq_schedule="8@0,16@1"), r"TRAIN_SEQ_SCHEDULE='8@0,16@1': write LEN@FRACTION"),
    (dict(train_seq_schedule="0@0.5,16@1"), r"TRAIN_SEQ_SCHEDULE='0@0.5,16@1': write LEN@FRACTION"),
    (dict(train_seq_schedule="8@0.5,32@1.0"), r"TRAIN_SEQ_SCHEDULE='8@0.5,32@1.0': its longest length 32 must be "
                                              r"TRAIN_SEQ_LEN=16 \(the RoPE tables and the scoring windows\): set "
                                              r"TRAIN_SEQ_LEN=32"),
    (dict(train_seq_schedule="8@0.5"), r"its longest length 8 must be TRAIN_SEQ_LEN=16"),
    (dict(train_seq_schedule="6@0.5,16@1"), r"TRAIN_SEQ_SCHEDULE='6@0.5,16@1': \[6\] do not divide a micro-step's "
                                            r"64 tokens \(TRAIN_BATCH_TOKENS=512 over 1 ranks x 8 micro-steps\): use "
                                            r"lengths that do"),
    (dict(seq_change_warmup_steps=8), r"SEQ_CHANGE_WARMUP_STEPS=8 re-warms the LR where TRAIN_SEQ_SCHEDULE changes "
                                      r"the length: set a schedule, or 0"),
    (dict(train_seq_schedule_mode="step"), r"TRAIN_SEQ_SCHEDULE_MODE='step': the schedule follows training_progress"
                                           r".*: use wallclock"),
    (dict(train_seq_schedule="8@0.25,16@1", num_loops=1, enable_looping_at=0.5, warmup_steps=2),
     r"WARMUP_STEPS=2 cannot prime the 3 \(length, loop\) graphs of TRAIN_SEQ_SCHEDULE='8@0.25,16@1', a step each: "
     r"set WARMUP_STEPS=3 or more, or 0 \(no priming\)"),
])
def test_a_schedule_that_cannot_run_is_refused_naming_the_setting_its_value_and_the_fix(fr, settings, refusal):
    hp = frontier_hp(fr, train_batch_tokens=512, **settings)
    with pytest.raises(fr.ConfigError, match=refusal):
        hp.validate()


def test_warmup_primes_every_length_and_loop_phase_that_training_meets(fr, monkeypatch, as_run):
    assert fr.training_shapes(as_run) == [(1024, False), (2048, False), (2048, True), (3072, True)]  # #2014's logs
    rng = random.Random(0)
    noise = [rng.uniform(0.5, 1.5) for _ in range(3000)]
    for schedule, looping_at in [("256@0.3,512@0.6,1024@1.0", 0.5), ("1024@0.3,512@0.3,256@0.6", 0.3),
                                 ("512@0.5,1024@1.0", 0.0), ("256@0.2,1024@0.9", 0.9)]:
        hp = frontier_hp(fr, **dict(AS_RUN, train_seq_len=1024, train_seq_schedule=schedule,
                                    enable_looping_at=looping_at, max_wallclock_seconds=100.0, gptq_reserve_seconds=0))
        shapes = fr.training_shapes(hp)
        steps, _ = drive(fr, monkeypatch, hp, lambda step: 50.0 * noise[step])
        met = {(length, looping) for length, _, looping, _ in steps}
        assert met <= set(shapes) and len(shapes) == len(set(shapes)), (schedule, met, shapes)
        hp.validate()  # 20 warmup steps prime them all


def test_a_compiled_run_compiles_each_graph_in_warmup_and_none_in_its_steps(fr, monkeypatch):
    """Dynamo's guards decide recompiles whatever the backend: "eager" stands in for inductor."""
    hp = frontier_hp(fr, train_seq_len=16, train_seq_schedule="8@0.25,16@1.0", seq_change_warmup_steps=2,
                     num_loops=1, loop_start=0, loop_end=0, enable_looping_at=0.5, iterations=8,
                     max_wallclock_seconds=0, warmup_steps=3, train_batch_tokens=64, val_loss_every=0)
    layout = fr.Layout()
    lines = []
    run = fr.Run(hp, layout, None, b"", log=lines.append)
    run.model = fr.GPT(hp.model_config)
    run.trainer = torch.compile(run.model, backend="eager", dynamic=False, fullgraph=True)
    optimizers = fr.build_optimizers(run.model, hp, layout)
    real_step = fr.train_step
    timed = []

    def train_step(model, batches, *args):
        before = fr.compiled_graphs()
        loss = real_step(model, batches, *args)
        timed.append((batches[0][0].shape[1], run.model.looping, fr.compiled_graphs() - before))
        return loss
    warmup_loader, loader = stream_loader(fr), stream_loader(fr)
    monkeypatch.setattr(fr, "train_step", train_step)
    monkeypatch.setattr(fr, "DistributedTokenLoader", lambda *args: warmup_loader)
    monkeypatch.setattr(fr, "score", lambda *args: None)
    monkeypatch.setattr(fr, "metrics", lambda sums: (0.0, 0.0))
    fr.warmup(run, optimizers)
    warm, timed[:] = timed[:], []
    fr.train(run, optimizers, fr.EMA(run.model, 0.0), loader)
    assert [(length, looping) for length, looping, _ in timed] == [(8, False)] * 3 + [(16, False)] + [(16, True)] * 4
    assert sum(graphs for _, _, graphs in timed) == 0, timed
    assert [(length, looping) for length, looping, _ in warm] == [(8, False), (16, False), (16, True)]
    assert all(graphs > 0 for _, _, graphs in warm), "each warmup step compiles its pair's graph"
    assert "train_seq_schedule: 8@0.25,16@1.0 primed:8/plain,16/plain,16/loop" in lines
