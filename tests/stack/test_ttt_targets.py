"""ttt-targets (stack/ttt-targets.diff), on the built frontier: which projections per-document LoRA TTT adapts
(the switches and the field's TTT_MASK), and the adapters' LR multiplier. With every switch on and a multiplier
of 1 the build computes what the core computes (tests/test_stack.py)."""

import copy

import pytest
import torch

from conftest import CHUNK, Recorder, document_stream, random_model
from stack.conftest import frontier_all_on

EVERY = ("q", "k", "v", "attn_out", "mlp_out")


@pytest.fixture(scope="module")
def lora_model(fr):
    return random_model(frontier_all_on(fr, train_seq_len=16), fr)


def scored(fr, model, **settings) -> list:
    """Each chunk's per-target losses as lora_ttt scores the six documents, in groups of 8."""
    values = dict(train_seq_len=16, ttt_lora_rank=4, ttt_lora_lr=0.01, ttt_chunk_size=CHUNK, ttt_batch_size=8)
    run = fr.Run(frontier_all_on(fr, **{**values, **settings}), fr.Layout(), document_stream(fr), b"")
    run.model = copy.deepcopy(model)
    run.scorer = Recorder(run.model)
    fr.lora_ttt(run)
    return run.scorer.calls


@pytest.mark.parametrize("settings, adapted", [
    (dict(), EVERY),
    (dict(ttt_mask="all"), EVERY),
    (dict(ttt_mask="no_q"), ("k", "v", "attn_out", "mlp_out")),
    (dict(ttt_mask="no_qv"), ("k", "attn_out", "mlp_out")),  # #2014's
    (dict(ttt_k_lora=False), ("q", "v", "attn_out", "mlp_out")),  # #2135's
    (dict(ttt_mask="no_v", ttt_mlp_lora=False, ttt_o_lora=False), ("q", "k")),
])
def test_each_layer_as_run_has_the_adapters_switched_on_and_the_head_always(fr, lora_model, settings, adapted):
    hp = frontier_all_on(fr, **settings)
    assert hp.lora_targets == adapted
    lora = fr.new_adapters(lora_model, 4, 2, torch.device("cpu"), hp.lora_targets)
    assert len(lora.layers) == len(lora_model.layer_order())
    assert all(tuple(layer) == adapted for layer in lora.layers)
    assert lora.head is not None


def test_the_mask_and_the_switches_that_say_the_same_score_alike_and_a_left_out_adapter_changes_the_score(
        fr, lora_model):
    masked = scored(fr, lora_model, ttt_mask="no_qv")
    switched = scored(fr, lora_model, ttt_q_lora=False, ttt_v_lora=False)
    every = scored(fr, lora_model)
    assert all(torch.equal(a, b) for a, b in zip(masked, switched)), "TTT_MASK=no_qv is TTT_Q_LORA=0 TTT_V_LORA=0"
    assert torch.equal(masked[0], every[0]), "the first chunk is scored before any adapter has moved"
    assert not all(torch.equal(a, b) for a, b in zip(masked, every)), "without q and v adapters TTT adapts less"


def test_the_lr_multiplier_scales_the_adapters_lr(fr, lora_model):
    halved = scored(fr, lora_model, ttt_lora_lr=0.01, ttt_local_lr_mult=0.5)
    assert all(torch.equal(a, b) for a, b in zip(halved, scored(fr, lora_model, ttt_lora_lr=0.005)))


def test_a_mask_the_field_does_not_name_is_refused(fr):
    with pytest.raises(fr.ConfigError, match=r"TTT_MASK='no_k': use one of \['', 'all', 'baseline_all', 'no_q'"):
        frontier_all_on(fr, ttt_mask="no_k").validate()
