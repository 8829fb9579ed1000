"""global-phases (stack/global-phases.diff), on the built frontier: the global phases of per-document LoRA TTT.
A phase trains the base weights only on documents already scored, by SGD as written out here by hand; priming
it leaves the weights; its settings are checked before any work. With phases off the build computes what the
core computes (tests/test_stack.py)."""

import copy
import math
import re

import pytest
import torch

from conftest import CHUNK, Recorder, document_stream, random_model
from stack.conftest import built_env, frontier_all_on, launch

PHASED = dict(phased_ttt_enabled=True, phased_ttt_num_phases=1)


@pytest.fixture(scope="module")
def lora_model(fr):
    return random_model(frontier_all_on(fr, train_seq_len=16), fr)


def lora_run(fr, model, val=None, layout=None, **settings):
    """A run of the frontier's lora_ttt on the six documents: the model's copy scores through a Recorder."""
    values = dict(train_seq_len=16, ttt_lora_rank=4, ttt_lora_lr=0.01, ttt_chunk_size=CHUNK, ttt_batch_size=8,
                  global_ttt_chunk_tokens=32, global_ttt_lr=0.01)
    values.update(settings)
    run = fr.Run(frontier_all_on(fr, **values), layout or fr.Layout(), val or document_stream(fr), b"")
    run.model = copy.deepcopy(model)
    run.scorer = Recorder(run.model)
    run.trainer = run.model
    return run


def chunk_losses(fr, run) -> dict:
    """{(document, chunk): its scored targets' losses} from the recorder of a run of lora_ttt."""
    fr.lora_ttt(run)
    spans = fr.document_spans(run.val.tokens)
    order = sorted(range(len(spans)), key=lambda d: spans[d][0] - spans[d][1])
    groups = [order[i:i + run.hp.ttt_batch_size] for i in range(0, len(order), run.hp.ttt_batch_size)]
    calls = iter(run.scorer.calls)
    found = {}
    for group in groups:
        for c in range(-(-max(spans[d][1] - spans[d][0] for d in group) // CHUNK)):
            losses = next(calls)
            for row, d in enumerate(group[:len(losses)]):
                a, b = spans[d]
                lo, hi = a + c * CHUNK, min(a + (c + 1) * CHUNK, b)
                if lo < b:
                    start = max(a - 1, hi - 1 - 16)
                    found[d, c] = losses[row, lo - 1 - start:hi - 1 - start]
    return found


def test_with_phases_every_target_is_scored_once_with_its_bytes(fr, lora_model):
    val = document_stream(fr)
    phased = dict(PHASED, phased_ttt_prefix_docs=4, phased_ttt_num_phases=2)
    run = lora_run(fr, lora_model, ttt_batch_size=2, **phased)
    sums = fr.lora_ttt(run)
    assert sums[1] == 200 and sums[2] == val.bytes[1:].sum()


def test_a_global_phase_trains_only_on_documents_already_scored(fr, lora_model):
    """Groups of 2, a phase once 2 documents are scored: the first group scores as without phases; the phase trains
    the base weights on documents 4 and 5 (the longest), so a change to any other document leaves the phase's
    weights as they were, and the later groups score with them."""
    phased = dict(PHASED, ttt_batch_size=2, phased_ttt_prefix_docs=2)
    plain = chunk_losses(fr, lora_run(fr, lora_model, ttt_batch_size=2))
    run = lora_run(fr, lora_model, **phased)
    with_phase = chunk_losses(fr, run)
    assert all(torch.equal(plain[k], with_phase[k]) for k in plain if k[0] in (4, 5))
    assert not torch.equal(plain[2, 0], with_phase[2, 0]), "the later groups score with the trained weights"
    changed = document_stream(fr)
    # document 2
    changed.tokens[19:61] = torch.randint_like(changed.tokens[19:61], 2, 64)
    other = lora_run(fr, lora_model, changed, **phased)
    fr.lora_ttt(other)
    trained = list(run.model.parameters())
    assert all(torch.equal(p, q) for p, q in zip(other.model.parameters(), trained))
    assert not all(torch.equal(p, q) for p, q in zip(trained, lora_model.parameters()))


def test_global_ttt_is_sgd_with_momentum_clipping_epochs_and_a_cosine_over_the_chunks(fr, lora_model):
    """GLOBAL_TTT_EPOCHS, _MOMENTUM, _GRAD_CLIP and the cosine decay, against SGD written out by hand: chunk c of n
    trains at GLOBAL_TTT_LR * (1 + cos(pi c / (n - 1))) / 2, EPOCHS steps on the whole chunk, the gradient's global
    norm clipped, momentum without dampening; the last chunk is not trained on."""
    settings = dict(global_ttt_epochs=2, global_ttt_momentum=0.5, global_ttt_grad_clip=0.05, global_ttt_lr=0.05)
    run = lora_run(fr, lora_model, **settings)
    hp = run.hp
    tokens = document_stream(fr).tokens[:5 * 32 + 20 + 1]
    fr.global_ttt(run, tokens)
    reference = copy.deepcopy(lora_model)
    params = list(reference.parameters())
    momenta = [torch.zeros_like(p) for p in params]
    clipped = 0
    # 6 chunks, the last (20 targets) untrained
    for c in range(5):
        x = tokens[c * 32:(c + 1) * 32].long().view(-1, 16)
        y = tokens[c * 32 + 1:(c + 1) * 32 + 1].long().view(-1, 16)
        lr = hp.global_ttt_lr * (1 + math.cos(math.pi * c / 5)) / 2
        for _ in range(hp.global_ttt_epochs):
            grads = torch.autograd.grad(reference(x, y), params)
            norm = torch.sqrt(sum(g.square().sum() for g in grads))
            clipped += bool(norm > hp.global_ttt_grad_clip)
            factor = min(1.0, hp.global_ttt_grad_clip / (norm.item() + 1e-6))
            with torch.no_grad():
                for p, g, m in zip(params, grads, momenta):
                    m.mul_(hp.global_ttt_momentum).add_(g * factor)
                    p.sub_(lr * m)
    assert clipped > 0, "the clip must bite in this test"
    for (name, p), q in zip(run.model.named_parameters(), params):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=name)


def test_priming_a_global_phase_runs_one_step_and_leaves_the_weights(fr, lora_model):
    """Compiled, the final passes' priming runs a global phase's step (its rows of eval windows: a graph of its
    own) on noise, then puts back the weights the TTT pass will score with."""
    run = lora_run(fr, lora_model, layout=fr.Layout(use_compile=True), ttt_enabled=True, phased_ttt_enabled=True)
    shapes = []

    def trainer(x, y):
        shapes.append(tuple(x.shape))
        return run.model(x, y)
    run.trainer = trainer
    fr.prime_ttt(run)
    assert shapes == [(2, 16)], "one step on the first of two chunks of 32 tokens"
    assert all(torch.equal(p, q) for p, q in zip(run.model.parameters(), lora_model.parameters()))
    assert all(p.grad is None and p.requires_grad for p in run.model.parameters())


@pytest.mark.parametrize("settings, message", [
    (dict(GLOBAL_TTT_CHUNK_TOKENS="100"), r"GLOBAL_TTT_CHUNK_TOKENS=100: use a multiple of 64"),
    (dict(GLOBAL_TTT_CHUNK_TOKENS="192", WORLD_SIZE="2"), r"GLOBAL_TTT_CHUNK_TOKENS=192: use a multiple of 128"),
    (dict(GLOBAL_TTT_CHUNK_TOKENS="0"), r"GLOBAL_TTT_CHUNK_TOKENS=0 must be positive"),
    (dict(PHASED_TTT_NUM_PHASES="0"), r"PHASED_TTT_NUM_PHASES=0 must be positive"),
    # settings.py's INSTEAD is the core's: the field's full-parameter TTT names stay retired, not renamed
    (dict(TTT_LR="0.01"), r"TTT_LR=0.01: retired"),
])
def test_a_phases_chunks_split_evenly_over_the_ranks_before_any_work(fr, frontier_script, tiny_data, settings,
                                                                      message):
    env = built_env(tiny_data, frontier_script, TTT_ENABLED="1", PHASED_TTT_ENABLED="1", **settings)
    with pytest.raises(fr.ConfigError, match=message):
        fr.setup(env)


def test_the_best_entrys_phases_are_settings_here(fr):
    """The field's best entry's command (tests/test_settings.py): with the stack, its global phases are no longer
    among the names refused, and they set what they mean."""
    from test_settings import TOP_ENV, TOP_LACKS, refused_names
    phases = {"PHASED_TTT_ENABLED", "PHASED_TTT_PREFIX_DOCS", "PHASED_TTT_NUM_PHASES", "GLOBAL_TTT_MOMENTUM"}
    assert phases <= TOP_LACKS, "the core refuses them: the stack is what brings them"
    with pytest.raises(fr.ConfigError) as refusal:
        fr.Hyperparameters.from_env(TOP_ENV)
    assert refused_names(refusal) == TOP_LACKS - phases
    hp = fr.Hyperparameters.from_env({name: TOP_ENV[name] for name in phases})
    assert (hp.phased_ttt_enabled, hp.phased_ttt_prefix_docs, hp.phased_ttt_num_phases, hp.global_ttt_momentum) == (
        True, 2500, 3, 0.9)


def test_two_ranks_pause_at_the_same_phases_and_the_run_scores(frontier_script, short_val_data, tmp_path):
    """torchrun, 2 processes (gloo): three documents in groups of one, phases after 1 and 2 of the first 2 are
    scored. Every rank reaches each phase (a rank that did not would hang the all-reduce of its SGD), each trains
    on its half of every chunk's rows, and the run ends with its TTT score."""
    env = built_env(short_val_data, frontier_script, RUN_ID="phased", ITERATIONS="4", WARMDOWN_ITERS="2",
                    TTT_ENABLED="1", TTT_BATCH_SIZE="1", TTT_LORA_RANK="4", TTT_CHUNK_SIZE="64",
                    PHASED_TTT_ENABLED="1", PHASED_TTT_PREFIX_DOCS="2", PHASED_TTT_NUM_PHASES="2",
                    GLOBAL_TTT_CHUNK_TOKENS="128")
    proc = launch(frontier_script, env, tmp_path, nproc=2)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert re.search(r"^ttt: groups:3 world_size:2 ", out, re.M), out[-2000:]
    phases = re.findall(r"^ttt_phase:(\d+) docs:(\d+) tokens:(\d+)", out, re.M)
    assert [phase[:2] for phase in phases] == [("1", "1"), ("2", "2")], phases
    assert int(phases[0][2]) < int(phases[1][2]), "the second phase trains on the first one's document and more"
    assert re.search(r"^final_int8_zlib_ttt_exact val_loss:\S+ val_bpb:\S+$", out, re.M), out[-2000:]
