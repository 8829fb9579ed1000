"""short-doc-chunks (stack/short-doc-chunks.diff), on the built frontier: a TTT group of short documents scores and
trains in shorter chunks, chosen by its longest document with its BOS (the field's TTT_SHORT_SCORE_FIRST_*).
Each target is still scored once, and before the adapters train on it. Off, the build computes what the core
computes (tests/test_stack.py)."""

import copy

import pytest
import torch

from conftest import CHUNK, Recorder, document_stream, random_model
from stack.conftest import frontier_all_on

# the six documents' groups of 2, longest first (targets): [70, 69], [42, 17], [1, 1]; with their BOS the longest
# are 71, 43 and 2 tokens: chunks of CHUNK (5), 3 and 2
SHORT = dict(ttt_short_score_first_enabled=True, ttt_short_score_first_steps="20:2,50:3", ttt_batch_size=2)
GROUPS = [((5, 4), 70, CHUNK), ((2, 0), 42, 3), ((1, 3), 1, 2)]


@pytest.fixture(scope="module")
def lora_model(fr):
    return random_model(frontier_all_on(fr, train_seq_len=16), fr)


def lora_run(fr, model, val=None, **settings):
    values = dict(train_seq_len=16, ttt_lora_rank=4, ttt_lora_lr=0.01, ttt_chunk_size=CHUNK, ttt_batch_size=8)
    run = fr.Run(frontier_all_on(fr, **{**values, **settings}), fr.Layout(), val or document_stream(fr), b"")
    run.model = copy.deepcopy(model)
    run.scorer = Recorder(run.model)
    return run


def chunk_losses(fr, run) -> dict:
    """{(document, chunk): its scored targets' losses}, each group in its own chunks (GROUPS)."""
    fr.lora_ttt(run)
    spans = fr.document_spans(run.val.tokens)
    calls = iter(run.scorer.calls)
    found = {}
    for group, longest, chunk in GROUPS:
        for c in range(-(-longest // chunk)):
            losses = next(calls)
            for row, d in enumerate(group[:len(losses)]):
                a, b = spans[d]
                lo, hi = a + c * chunk, min(a + (c + 1) * chunk, b)
                if lo < b:
                    start = max(a - 1, hi - 1 - 16)
                    found[d, c] = losses[row, lo - 1 - start:hi - 1 - start]
    return found


def test_a_group_takes_the_chunk_of_its_longest_document_with_its_bos(fr):
    steps = frontier_all_on(fr, ttt_short_score_first_enabled=True, ttt_short_score_first_steps="2000:24, 256=8")
    assert [steps.ttt_chunk(n) for n in (2, 256, 257, 2000, 2001)] == [8, 8, 24, 24, 48]
    # no steps: TTT_SHORT_DOC_LEN and TTT_SHORT_CHUNK_SIZE are the one step; a chunk of 0 is TTT_CHUNK_SIZE's
    one = frontier_all_on(fr, ttt_short_score_first_enabled=True, ttt_short_doc_len=2000, ttt_short_chunk_size=24)
    assert [one.ttt_chunk(n) for n in (2000, 2001)] == [24, 48]
    assert frontier_all_on(fr, ttt_short_score_first_enabled=True).ttt_chunk(10) == 48
    assert frontier_all_on(fr, ttt_short_score_first_steps="256:8").ttt_chunk(10) == 48, "off unless enabled"
    # a limit given twice: its first step wins, as the field's stable sort by limit has it
    twice = frontier_all_on(fr, ttt_short_score_first_enabled=True, ttt_short_score_first_steps="100:6,100:4,50:2")
    assert [twice.ttt_chunk(n) for n in (50, 51, 100)] == [2, 6, 6]


def test_each_group_is_scored_in_its_chunks_and_every_target_once_with_its_bytes(fr, lora_model):
    run = lora_run(fr, lora_model, **SHORT)
    sums = fr.lora_ttt(run)
    assert sums[1] == 200 and sums[2] == run.val.bytes[1:].sum()
    widths = [call.size(1) for call in run.scorer.calls]
    assert widths == [min(lo + chunk, 16) for _, longest, chunk in GROUPS for lo in range(0, longest, chunk)]


def test_a_change_reaches_no_chunk_scored_before_it(fr, lora_model):
    """Change document 2 (targets 19..60, chunks of 3) from its 5th chunk on: its chunks 0..3, and the group scored
    before it, score bit for bit as before; the change is seen where it is scored."""
    before = chunk_losses(fr, lora_run(fr, lora_model, **SHORT))
    val = document_stream(fr)
    changed = val.tokens.clone()
    changed[19 + 4 * 3:60] = torch.randint_like(changed[19 + 4 * 3:60], 2, 64)  # position 60: the next BOS
    after = chunk_losses(fr, lora_run(fr, lora_model, val._replace(tokens=changed), **SHORT))
    assert before.keys() == after.keys()
    same = [key for key in before if key[0] in (4, 5) or (key[0] == 2 and key[1] < 4)]
    for key in same:
        assert torch.equal(before[key], after[key]), key
    assert not torch.equal(before[2, 4], after[2, 4])


@pytest.mark.parametrize("steps", ["256", "0:8", "256:0", "256:32", "a:b", "256:8:9"])
def test_steps_that_cannot_be_read_or_scored_are_refused(fr, steps):
    with pytest.raises(fr.ConfigError, match=r"write LIMIT:CHUNK,\.\.\. of positive integers, each CHUNK at most "
                                             r"TRAIN_SEQ_LEN=16"):
        frontier_all_on(fr, train_seq_len=16, ttt_short_score_first_steps=steps).validate()
