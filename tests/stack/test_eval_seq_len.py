"""eval-seq-len (stack/eval-seq-len.diff), on the built frontier: windows that score longer (or shorter) than
training (EVAL_SEQ_LEN, and LoRA TTT's TTT_EVAL_SEQ_LEN, apart as in the field), RoPE's tables to match, the
validation split cut at EVAL_SEQ_LEN or, with EVAL_INCLUDE_TAIL=1, not cut. Every target is scored once, a change
to a token moves no score before it, and a table long enough for scoring leaves training's numbers as they were.
Off, the build computes what the core computes (tests/test_stack.py)."""

import copy

import pytest
import torch

from conftest import CHUNK, VAL_BATCH, Recorder, document_stream, random_model
from data.shards import write_datafile
from stack.conftest import frontier_all_on

TRAIN = 16
LONG = dict(eval_seq_len=24, ttt_eval_seq_len=24)  # half as long again as training, as #2135's 2560 after 2048


def toy_split(folder, length, seed=0):
    """A validation shard of `length` tokens (BOS-led documents) and its byte sidecar, in folder."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(2, 64, (length,), generator=g)
    tokens[torch.randperm(length, generator=g)[:length // 20]] = 1
    tokens[0] = 1
    counted = torch.randint(0, 5, (length,), generator=g)
    write_datafile(folder / "fineweb_val_000000.bin", tokens.tolist())
    write_datafile(folder / "fineweb_val_bytes_000000.bin", counted.tolist())
    return tokens, counted


def split_hp(fr, folder, **settings):
    return frontier_all_on(fr, data_path=str(folder), sidecar_bytes="trust", val_batch_size=VAL_BATCH, **settings)


class TargetModel(torch.nn.Module):
    """A stand-in scorer whose loss for each target is the target itself: on a stream of indices, its index."""

    def forward(self, x, y, reduction="none"):
        return y.double().flatten()


def sliding_losses(fr, monkeypatch, model, val, length, stride):
    """score()'s sums on val, and {target index: its loss, as score_sums got it} in the order scored, with the
    windows' widths. The indices: the same score() on the stream of indices, scored by TargetModel."""
    calls = []
    widths = []
    real = fr.score_sums

    def record(losses, where, num_bytes):
        calls.append(losses[where])
        widths.append(where.size(1))
        return real(losses, where, num_bytes)
    monkeypatch.setattr(fr, "score_sums", record)
    indices = val._replace(tokens=torch.arange(val.tokens.numel()))
    fr.score(TargetModel(), indices, fr.Layout(), length, stride)
    targets = torch.cat(calls).long().tolist()
    calls.clear()
    sums = fr.score(model, val, fr.Layout(), length, stride)
    losses = torch.cat(calls).tolist()
    assert len(losses) == len(targets)
    return sums, dict(zip(targets, losses)), targets, widths


# ---- the validation split ----


@pytest.mark.parametrize("length", [24 * 5 + 1, 24 * 5 + 11, 24 * 5 + 23])
def test_the_split_is_cut_at_the_scoring_length_or_kept_whole(fr, tmp_path, length):
    """Cut: (N - 1) // L * L targets, L the scoring length (TRAIN_SEQ_LEN by default, as the core cuts), the bytes
    sliced to the same tokens; EVAL_INCLUDE_TAIL=1: every token, every byte count."""
    tokens, counted = toy_split(tmp_path, length)
    piece_bytes = torch.ones(64, dtype=torch.int64)
    for settings, kept in [({}, (length - 1) // TRAIN * TRAIN + 1), (LONG, (length - 1) // 24 * 24 + 1),
                           (dict(LONG, eval_include_tail=True), length),
                           (dict(eval_include_tail=True), length)]:
        val = fr.load_validation(split_hp(fr, tmp_path, **settings), piece_bytes)
        assert torch.equal(val.tokens, tokens[:kept].int()), settings
        assert torch.equal(val.bytes, counted[:kept].to(torch.int16)), settings


def test_a_split_shorter_than_one_scoring_window_is_refused(fr, tmp_path):
    toy_split(tmp_path, 24)
    with pytest.raises(fr.ConfigError, match=r"holds 24 tokens, not one window of EVAL_SEQ_LEN=24 \+ 1: lower "
                                             r"EVAL_SEQ_LEN or build more validation data"):
        hp = split_hp(fr, tmp_path, **LONG, eval_include_tail=True)
        fr.load_validation(hp, torch.ones(64, dtype=torch.int64))


# ---- sliding and plain windows ----


@pytest.fixture(scope="module")
def long_model(fr):
    """A random model of the tests' tiny shape, trained length 16, its RoPE tables to 24 (as build_model makes)."""
    hp = frontier_all_on(fr, train_seq_len=TRAIN, **LONG)
    model = random_model(hp, fr)
    fr.rope_positions(model, hp)
    return model


@pytest.mark.parametrize("tail", [False, True], ids=["cut", "tail"])
@pytest.mark.parametrize("stride", [24, 8, 5], ids=["plain", "sliding", "sliding-5"])
def test_every_target_is_scored_once_with_its_bytes_in_windows_of_eval_seq_len(fr, tmp_path, monkeypatch, tail,
                                                                             stride):
    """Windows of EVAL_SEQ_LEN (24, training's 16) side by side or sliding: the targets scored are 1 .. N - 1 of
    the split as loaded, each once, in the stream's order; the bytes counted are theirs."""
    toy_split(tmp_path, 24 * 5 + 13)
    hp = split_hp(fr, tmp_path, **LONG, eval_include_tail=tail, eval_stride=stride)
    val = fr.load_validation(hp, torch.ones(64, dtype=torch.int64))
    stop = val.tokens.numel() - 1
    assert stop == (24 * 5 + 12 if tail else 24 * 5)
    sums, _, targets, widths = sliding_losses(fr, monkeypatch, TargetModel(), val, *hp.windows(stride != 24))
    assert targets == list(range(1, stop + 1))
    assert set(widths) == {24}
    assert sums[1] == stop and sums[2] == val.bytes[1:].sum()


@pytest.mark.parametrize("tail", [False, True], ids=["cut", "tail"])
@pytest.mark.parametrize("stride", [24, 7], ids=["plain", "sliding"])
def test_a_changed_token_moves_no_score_before_it(fr, tmp_path, monkeypatch, long_model, tail, stride):
    """Change token k: every target before it (the stream's order is the scoring order) scores the same, bit
    for bit, in windows half as long again as training's; target k, or one after it, moves. k in the first window,
    across windows, and in the last (with the tail: its partial window)."""
    toy_split(tmp_path, 24 * 5 + 13)
    hp = split_hp(fr, tmp_path, **LONG, eval_include_tail=tail, eval_stride=stride)
    val = fr.load_validation(hp, torch.ones(64, dtype=torch.int64))
    _, before, _, _ = sliding_losses(fr, monkeypatch, long_model, val, *hp.windows(stride != 24))
    stop = val.tokens.numel() - 1
    for k in (5, 23, 24, 60, stop - 4, stop):
        changed = val.tokens.clone()
        changed[k] = 63 if changed[k] != 63 else 62
        _, after, _, _ = sliding_losses(fr, monkeypatch, long_model, val._replace(tokens=changed),
                                        *hp.windows(stride != 24))
        assert all(after[t] == before[t] for t in range(1, k)), k
        assert any(after[t] != before[t] for t in range(k, stop + 1)), k


def test_tables_long_enough_to_score_leave_trainings_numbers_as_they_were(fr, long_model):
    """RoPE's tables to 24 positions: their first 16 rows are the training length's, bit for bit, so a sequence of
    16 scores the same; build_model makes them as long as the longest window, TTT's included."""
    short = frontier_all_on(fr, train_seq_len=TRAIN)
    model = random_model(short, fr)
    tokens = torch.randint(2, 64, (2, TRAIN + 1), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(model(tokens[:, :-1], tokens[:, 1:], "none"),
                           long_model(tokens[:, :-1], tokens[:, 1:], "none"))
    for attn in (block.attn for block in long_model.blocks):
        assert attn.rope_cos.size(2) == 24
        assert torch.equal(attn.rope_cos[:, :, :TRAIN], model.blocks[0].attn.rope_cos)
        assert torch.equal(attn.rope_sin[:, :, :TRAIN], model.blocks[0].attn.rope_sin)
    for settings, positions in [({}, TRAIN), (dict(eval_seq_len=20), 20), (dict(ttt_eval_seq_len=40), 40),
                                (dict(eval_seq_len=8), TRAIN)]:
        hp = frontier_all_on(fr, train_seq_len=TRAIN, **settings)
        built, _, _ = fr.build_model(hp, fr.Layout())
        assert {block.attn.rope_cos.size(2) for block in built.blocks} == {positions}, settings


# ---- LoRA TTT ----


def lora_run(fr, model, val, **settings):
    values = dict(train_seq_len=TRAIN, ttt_lora_rank=4, ttt_lora_lr=0.01, ttt_chunk_size=CHUNK, ttt_batch_size=2,
                  ttt_enabled=True, **LONG)
    run = fr.Run(frontier_all_on(fr, **{**values, **settings}), fr.Layout(), val, b"")
    run.model = copy.deepcopy(model)
    run.scorer = Recorder(run.model)
    run.log = lambda line: None
    return run


def ttt_losses(fr, run) -> dict:
    """{target index: (the scorer call that scored it, its loss)} of run's lora_ttt: each call's window positions
    named by chunk_windows on the stream of indices, groups and chunks as lora_ttt takes them."""
    sums = fr.lora_ttt(run)
    hp, val = run.hp, run.val
    indices = fr.Validation(torch.arange(val.tokens.numel()), torch.arange(val.tokens.numel()), 0)
    spans = sorted(fr.document_spans(val.tokens), key=lambda span: span[0] - span[1])
    positions = []
    for group in (spans[i:i + hp.ttt_batch_size] for i in range(0, len(spans), hp.ttt_batch_size)):
        longest = max(b - a for a, b in group)
        chunk = hp.ttt_chunk(longest + 1)
        for lo in range(0, longest, chunk):
            rows = sum(lo < b - a for a, b in group)
            positions.append(fr.chunk_windows(indices, group, lo, chunk, hp.ttt_window, rows)[1])
    assert len(positions) == len(run.scorer.calls)
    found = {}
    for call, (targets, losses) in enumerate(zip(positions, run.scorer.calls)):
        for t, loss in zip(targets[targets >= 0].tolist(), losses[targets >= 0].tolist()):
            assert t not in found, f"target {t} scored twice"
            found[t] = (call, loss)
    return sums, found


@pytest.mark.parametrize("split", ["documents", "cut", "tail"])
def test_ttt_scores_every_target_once_in_windows_of_ttt_eval_seq_len(fr, tmp_path, long_model, split):
    """Chunks of 5 in windows up to 24 (training's 16): every target of the split as loaded once (cut at 24, or
    whole), its bytes counted; on the six documents, widths min(lo + 5, 24)."""
    val = document_stream(fr)
    if split != "documents":
        toy_split(tmp_path, 24 * 5 + 13, seed=1)
        hp = split_hp(fr, tmp_path, **LONG, eval_include_tail=split == "tail")
        val = fr.load_validation(hp, torch.ones(64, dtype=torch.int64))._replace(batch_tokens=VAL_BATCH)
    stop = val.tokens.numel() - 1
    assert stop == {"documents": 200, "cut": 120, "tail": 132}[split]
    run = lora_run(fr, long_model, val)
    sums, found = ttt_losses(fr, run)
    assert sorted(found) == list(range(1, stop + 1))
    assert sums[1] == stop and sums[2] == val.bytes[1:].sum()
    widths = [call.size(1) for call in run.scorer.calls]
    assert max(widths) == 24
    if split == "documents":
        assert widths[:6] == [5, 10, 15, 20, 24, 24]


def test_ttt_a_changed_token_moves_no_score_before_it(fr, long_model):
    """Change stream token 49 (document 2, targets 19..60, scored in the second group with document 0): every
    target scored in an earlier call (the first group, document 2's first chunks, the same bit for bit), and
    document 2's targets before it in the same call, score as before; the change is seen where it is scored."""
    val = document_stream(fr)
    _, before = ttt_losses(fr, lora_run(fr, long_model, val))
    k = 49
    changed = val.tokens.clone()
    changed[k] = 63 if changed[k] != 63 else 62
    _, after = ttt_losses(fr, lora_run(fr, long_model, val._replace(tokens=changed)))
    call = before[k][0]
    earlier = [t for t in before if before[t][0] < call or (before[t][0] == call and 19 <= t < k)]
    assert len(earlier) > 150 and any(t > k for t in earlier), "the first group: documents after it in the stream"
    assert all(after[t] == before[t] for t in earlier)
    assert any(after[t] != before[t] for t in range(k, 61))


# ---- settings ----


def test_the_fields_commands_set_the_lengths_as_written(fr):
    """#2135: EVAL_SEQ_LEN=2560 TTT_EVAL_SEQ_LEN=2560 after training at 2048; the two apart, as in the field (each
    defaults to the training length); #2014's EVAL_INCLUDE_TAIL=1."""
    field = dict(TRAIN_SEQ_LEN="2048", EVAL_SEQ_LEN="2560", TTT_EVAL_SEQ_LEN="2560", EVAL_STRIDE="1536",
                 EVAL_INCLUDE_TAIL="1", TRAIN_BATCH_TOKENS="16384", VAL_BATCH_SIZE="16384")
    hp = fr.Hyperparameters.from_env(field)
    assert (hp.windows(False), hp.windows(True), hp.ttt_window, hp.eval_include_tail) == \
        ((2560, 2560), (2560, 1536), 2560, True)
    alone = fr.Hyperparameters.from_env(dict(field, TTT_EVAL_SEQ_LEN="0"))
    assert (alone.eval_len, alone.ttt_window) == (2560, 2048)
    default = fr.Hyperparameters()
    assert (default.windows(False), default.ttt_window, default.eval_include_tail) == ((1024, 1024), 1024, False)


@pytest.mark.parametrize("settings, message", [
    (dict(EVAL_SEQ_LEN="8", EVAL_STRIDE="12"), r"EVAL_STRIDE=12: at most the scoring window, EVAL_SEQ_LEN=8"),
    (dict(TTT_ENABLED="1", TTT_EVAL_SEQ_LEN="4", TTT_CHUNK_SIZE="5"),
     r"TTT_EVAL_SEQ_LEN=4: LoRA TTT's windows of 4 tokens are shorter than its chunk of 5: set it to at least 5"),
    (dict(TTT_ENABLED="1", TTT_EVAL_SEQ_LEN="6", TTT_CHUNK_SIZE="5", TTT_SHORT_SCORE_FIRST_ENABLED="1",
          TTT_SHORT_SCORE_FIRST_STEPS="10:2,30:8"), r"TTT_EVAL_SEQ_LEN=6: .* shorter than its chunk of 8"),
])
def test_windows_too_short_for_what_they_score_are_refused(fr, settings, message):
    base = dict(TRAIN_SEQ_LEN="16", TRAIN_BATCH_TOKENS="128", VAL_BATCH_SIZE="128")
    with pytest.raises(fr.ConfigError, match=message):
        fr.Hyperparameters.from_env(dict(base, **settings))


def test_a_global_phase_trains_rows_of_eval_seq_len(fr):
    """The field's global SGD cuts its chunks into rows of EVAL_SEQ_LEN (global-phases' score_seq_len): trained at
    16 and scored at 32, a chunk of 72 targets is 2 rows of 32 and a rest of 8; at 4 ranks a chunk must hold 4 rows
    of that length."""
    hp = frontier_all_on(fr, train_seq_len=16, eval_seq_len=32, phased_ttt_enabled=True, global_ttt_chunk_tokens=72,
                         global_ttt_respect_doc_boundaries=False)
    torch.manual_seed(0)
    model = fr.GPT(hp)
    fr.rope_positions(model, hp)
    run = fr.Run(hp, fr.Layout(), None, b"")
    run.model = model
    shapes = []
    run.trainer = lambda x, y: shapes.append(tuple(x.shape)) or model(x, y)
    tokens = torch.randint(2, 64, (3 * 72 + 1,))
    assert fr.global_ttt(run, tokens) == 3 and shapes == [(2, 32), (2, 32)]
    with pytest.raises(fr.ConfigError, match=r"GLOBAL_TTT_CHUNK_TOKENS=72: under 4 x 32"):
        hp.validate(world_size=4)
