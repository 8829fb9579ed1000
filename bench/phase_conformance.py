"""The stack's global phase (stack/global-phases.diff) against the field's own code, on CPU, at world size 1.

    python bench/phase_conformance.py --field path/to/pr2014     # a copy of a PR's record folder (its train_gpt.py)

The field's file is imported whole (its Triton kernels stubbed and kept off, FlashAttention 3 by SDPA, as
bench/asym_logit_check.py does) and its eval_val_ttt_phased runs on a tiny model of its own over a tiny stream of
BOS-led documents, with a spy on its global SGD (train_val_ttt_global_sgd_distributed), on the batches it claims
and on its log. The built frontier's lora_ttt runs on the same stream with a spy on global_ttt. Printed:
- the boundary: the documents each scores before the phase, in scoring order (the field's batches as it claims
  them), and its prefix counter (the log's pd:);
- the documents the phase trains on, in their order, and its token stream (the BOS at each junction);
- the SGD's chunks, rows and untrained rest, and the LR of each chunk (the field's log, ours from train_step);
- the parameter updates of the two SGDs on one model (the frontier's) from the field's stream: the field's
  function (each cu_seqlens segment of its rows end to end run as a row of its own, what varlen attention
  computes) and ours; max |difference| and max |update|, with GLOBAL_TTT_RESPECT_DOC_BOUNDARIES 1 (the field's
  runs) and 0 (its rows, dense: our model without DOC_MASK_ENABLED).
Documents are numbered in the split's order. Exit status 1 if the groups scored before the phase, the documents
trained, their order or the stream differ, an LR differs, or the updates differ by more than float rounding (1e-5
of the largest update).
"""

import argparse
import copy
import glob
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "bench"))
from asym_logit_check import import_field  # noqa: E402
from field_conformance import frontier  # noqa: E402

SEQ_LEN = 32  # the scoring window: the field's EVAL_SEQ_LEN and TTT_EVAL_SEQ_LEN, our TRAIN_SEQ_LEN
CHUNK = 72  # GLOBAL_TTT_CHUNK_TOKENS: 2 rows of 32 and a rest of 8 (32,768 at 3,072: 10 rows, a rest of 2,048)
BATCH = 4  # TTT_BATCH_SIZE: 30 documents, so the longest group holds 2
PREFIX = 9  # PHASED_TTT_PREFIX_DOCS: reached inside the third group (2 + 4 + 4 = 10)
# the documents' tokens after their BOS: 30, some longer than a row
LENGTHS = [7, 40, 3, 25, 61, 12, 9, 33, 18, 75, 5, 22, 48, 14, 30, 9, 55, 2, 27, 38, 16, 70, 11, 6, 44, 20, 36,
           8, 52, 29]
PHASE = dict(PHASED_TTT_ENABLED="1", PHASED_TTT_NUM_PHASES="1", PHASED_TTT_PREFIX_DOCS=str(PREFIX),
             GLOBAL_TTT_CHUNK_TOKENS=str(CHUNK), GLOBAL_TTT_LR="0.05", GLOBAL_TTT_MOMENTUM="0.9",
             GLOBAL_TTT_EPOCHS="1", GLOBAL_TTT_GRAD_CLIP="1.0", TTT_BATCH_SIZE=str(BATCH), TTT_CHUNK_SIZE="8",
             TTT_LORA_RANK="4")
FIELD = dict(VOCAB_SIZE=64, NUM_LAYERS=4, MODEL_DIM=64, NUM_HEADS=4, NUM_KV_HEADS=2, MLP_MULT=2, ROPE_DIMS=8,
             NUM_LOOPS=1, LOOP_START=1, LOOP_END=2, PARALLEL_START_LAYER=3, XSA_LAST_N=4, FUSED_CE_ENABLED=0,
             EVAL_SEQ_LEN=str(SEQ_LEN), TTT_EVAL_SEQ_LEN=str(SEQ_LEN), NGRAM_TILT_ENABLED="0",
             RUN_ID=f"phase_conformance_{os.getpid()}")  # names the field's counter files in /tmp
OURS = dict(vocab_size=64, num_layers=2, model_dim=32, num_heads=4, num_kv_heads=2, mlp_mult=2,
            train_seq_len=SEQ_LEN, doc_mask_enabled=True, ttt_enabled=True, ttt_lora_rank=4, ttt_chunk_size=8,
            ttt_batch_size=BATCH, phased_ttt_enabled=True, phased_ttt_prefix_docs=PREFIX, global_ttt_lr=0.05,
            global_ttt_chunk_tokens=CHUNK)


def stream():
    """BOS-led documents of LENGTHS, random tokens 2..63 (BOS is 1); and the start of each."""
    g = torch.Generator().manual_seed(1)
    docs = [torch.cat([torch.ones(1, dtype=torch.int64), torch.randint(2, 64, (n,), generator=g)]) for n in LENGTHS]
    starts = torch.tensor([0] + LENGTHS).add(1).cumsum(0)[:-1].sub(1).tolist()
    return torch.cat(docs), starts


def documents_of(trained, tokens, starts):
    """The documents of a phase's stream, in order: each from its BOS to the next document's (the last: the end)."""
    found, at = [], 0
    while at < trained.numel():
        for d, start in enumerate(starts):
            piece = tokens[start:start + LENGTHS[d] + 2]
            if torch.equal(trained[at:at + piece.numel()], piece):
                found.append(d)
                at += piece.numel()
                break
        else:
            return found + ["?"]
    return found


class Segments(torch.nn.Module):
    """Our model under the field's SGD: base_model(x, y, cu_seqlens) with each cu_seqlens segment a row of its
    own (what varlen attention computes), the mean loss over the rank's targets; records the rows it sees."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.seen = []

    def forward(self, x, y, cu_seqlens=None, max_seqlen=0):
        if cu_seqlens is None:  # GLOBAL_TTT_RESPECT_DOC_BOUNDARIES=0: its rows, dense
            self.seen.append((x.numel(), list(range(0, x.numel() + 1, x.size(1)))))
            return self.model(x, y)
        bounds = sorted(set(cu_seqlens.tolist()))
        self.seen.append((x.numel(), bounds))
        losses = [self.model(x[:, a:b], y[:, a:b], reduction="none") for a, b in zip(bounds, bounds[1:])]
        return torch.cat(losses).mean()


def field_run(field, tokens, starts):
    """The field's eval_val_ttt_phased on its tiny model: what its global SGD got, the batches claimed before
    it, its log."""
    h = field.Hyperparameters()
    torch.manual_seed(0)
    model = field.GPT(h)
    for block in model.blocks:
        block.mlp.use_fused = False
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name not in ("softcap_pos", "softcap_neg"):
                p.add_(0.05 * torch.randn_like(p))
    model.looping_active = True
    seen, claimed, lines = {}, [], []
    sgd, claim = field.train_val_ttt_global_sgd_distributed, field._claim_next_batch

    def spy_sgd(hh, device, val_data, base_model, val_tokens, batch_seqs=None):
        seen["tokens"], seen["claimed"] = val_tokens.clone(), list(claimed)
        return sgd(hh, device, val_data, base_model, val_tokens, batch_seqs)

    def spy_claim(path, queue_len):
        claimed.append(claim(path, queue_len))
        return claimed[-1]
    field.train_val_ttt_global_sgd_distributed, field._claim_next_batch = spy_sgd, spy_claim
    field.log = lambda message, *args, **kwargs: lines.append(str(message))
    val = SimpleNamespace(val_tokens=tokens, val_bytes=torch.ones_like(tokens), caseops_enabled=True,
                          base_bytes_lut=None, has_leading_space_lut=None, is_boundary_token_lut=None)
    try:
        field.eval_val_ttt_phased(h, model, torch.device("cpu"), val, lambda x, y, lora: model.forward_ttt(
            x, y, lora=lora))
    finally:
        field.train_val_ttt_global_sgd_distributed, field._claim_next_batch = sgd, claim
        for path in glob.glob(f"/tmp/ttt_*_{h.run_id}"):  # the field's counters
            os.remove(path)
    batches = field._build_ttt_global_batches(field._select_ttt_doc_entries(field._find_docs(tokens), h), h)
    scored = [[starts.index(start) for _, (start, _) in batches[i][1]] for i in seen["claimed"] if i < len(batches)]
    pd = re.search(r"ttpp: phase:1/1 pd:(\d+) gd:(\d+)", "\n".join(lines))
    return h, seen["tokens"], scored, (int(pd[1]), int(pd[2])), lines


def ours_run(fr, tokens, starts):
    """The frontier's lora_ttt on a tiny model of its own: the groups scored before the phase, its stream."""
    hp = fr.Hyperparameters(**OURS)
    torch.manual_seed(0)
    model = fr.GPT(hp)
    val = fr.Validation(tokens.int(), torch.ones_like(tokens, dtype=torch.int16), 0)
    run = fr.Run(hp, fr.Layout(), val, b"")
    run.model = run.scorer = run.trainer = model
    streams = []
    real = fr.global_ttt
    fr.global_ttt = lambda run, tokens: streams.append(tokens.clone()) or 0
    try:
        fr.lora_ttt(run)
    finally:
        fr.global_ttt = real
    groups, phases = fr.global_phases(fr.document_spans(val.tokens), hp, 1)
    end = phases[0][0]
    scored = [[starts.index(a - 1) for a, _ in group] for group in groups[:end]]
    trained = [starts.index(a - 1) for a, _ in phases[0][1]]
    return streams[0].long(), scored, trained


def updates(fr, field, h, tokens, respect):
    """(ours, the field's) parameter updates of one SGD from one model (the frontier's) on tokens, contexts by
    documents (respect) or by rows (then without DOC_MASK_ENABLED, as the field's dense rows); the LR of each
    chunk (ours from train_step, the field's from its log), our rows per step, the field's steps' segments."""
    hp = fr.Hyperparameters(**{**OURS, "global_ttt_respect_doc_boundaries": respect, "doc_mask_enabled": respect})
    torch.manual_seed(0)
    model = fr.GPT(hp)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    ours, theirs = copy.deepcopy(model), Segments(copy.deepcopy(model))
    run = fr.Run(hp, fr.Layout(), None, b"")
    run.model = run.trainer = ours
    lrs, rows, lines = [], [], []
    step = fr.train_step

    def spy_step(trainer, batches, optimizers, lr_scale, grad_clip, layout):
        lrs.append(optimizers[0].param_groups[0]["base_lr"] * lr_scale)
        rows.append(tuple(batches[0][0].shape))
        return step(trainer, batches, optimizers, lr_scale, grad_clip, layout)
    fr.train_step = spy_step
    try:
        fr.global_ttt(run, tokens)
    finally:
        fr.train_step = step
    h.global_ttt_respect_doc_boundaries = respect
    field.log = lambda message, *args, **kwargs: lines.append(str(message))
    field.train_val_ttt_global_sgd_distributed(h, torch.device("cpu"), None, theirs, tokens)
    field_lrs = [float(m[1]) for m in re.finditer(r"tttg: c\d+/\d+ lr:(\S+)", "\n".join(lines))]
    base = dict(model.named_parameters())
    delta_ours = {n: p.detach() - base[n].detach() for n, p in ours.named_parameters()}
    delta_field = {n: p.detach() - base[n].detach() for n, p in theirs.model.named_parameters()}
    return delta_ours, delta_field, lrs, field_lrs, rows, theirs.seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--field", type=Path, required=True, help="a folder holding a field record's train_gpt.py")
    args = parser.parse_args()
    torch.set_num_threads(1)
    field = import_field(args.field / "train_gpt.py", {**FIELD, **PHASE})
    fr = frontier()
    tokens, starts = stream()
    print(f"stream: {len(LENGTHS)} documents, {tokens.numel()} tokens; TTT_BATCH_SIZE={BATCH} "
          f"PHASED_TTT_PREFIX_DOCS={PREFIX} GLOBAL_TTT_CHUNK_TOKENS={CHUNK} rows of {SEQ_LEN}; world size 1")
    h, field_tokens, field_scored, (pd, gd), lines = field_run(field, tokens, starts)
    our_tokens, our_scored, our_trained = ours_run(fr, tokens, starts)
    junctions = [(t == 1).nonzero().flatten().tolist() for t in (field_tokens, our_tokens)]
    field_trained = documents_of(field_tokens, tokens, starts)
    print(f"boundary, field: pd:{pd} gd:{gd}; the groups scored before the phase, in order: {field_scored}")
    print(f"boundary, ours:  {sum(map(len, our_scored))} documents; the groups, in order: {our_scored}")
    same_groups = [sorted(g) for g in field_scored] == [sorted(g) for g in our_scored]
    print(f"the same groups in the same order: {same_groups} (within a group the documents score side by side)")
    print(f"trained, ours, in order: {our_trained} (lengths {[LENGTHS[d] for d in our_trained]})")
    same_stream = torch.equal(field_tokens, our_tokens)
    print(f"stream: field {field_tokens.numel()} tokens, ours {our_tokens.numel()}; identical: {same_stream}; "
          f"each document from its BOS to the next one's")
    print(f"trained, field, in order: {field_trained}; the same as ours: {field_trained == our_trained}")
    twice = [i for i in junctions[0] if i and field_tokens[i - 1] == 1]
    print(f"BOS in the field's stream: {junctions[0]}; a BOS after a BOS (a junction) at {twice}")
    ok = same_groups and same_stream and field_trained == our_trained and len(our_trained) == gd

    targets = field_tokens.numel() - 1
    chunks = -(-targets // CHUNK)
    print(f"SGD: {targets} targets, {chunks} chunks of {CHUNK} (the last untrained), each {CHUNK // SEQ_LEN} rows "
          f"of {SEQ_LEN} and a rest of {CHUNK % SEQ_LEN} untrained")
    for respect in (True, False):
        ours, theirs, lrs, field_lrs, rows, segments = updates(fr, field, h, field_tokens, respect)
        print(f"-- GLOBAL_TTT_RESPECT_DOC_BOUNDARIES={int(respect)} (contexts: "
              f"{'documents, cut every row length from a start' if respect else 'rows, dense'})")
        print(f"   LR per chunk, ours:  {[round(lr, 6) for lr in lrs]}")
        print(f"   LR per chunk, field: {field_lrs}")
        trained = sorted({n for n, _ in segments})
        print(f"   field: {len(segments)} steps, of {trained} tokens; its first step's contexts: {segments[0][1]}")
        print(f"   ours: {len(rows)} steps, rows (contexts) x length: {rows}")
        diff = max((ours[n] - theirs[n]).abs().max().item() for n in ours)
        size = max(theirs[n].abs().max().item() for n in theirs)
        worst = max(ours, key=lambda n: (ours[n] - theirs[n]).abs().max().item())
        print(f"   parameter updates: max |ours - field's| {diff:.3e} (at {worst}), max |field's| {size:.3e}, "
              f"ratio {diff / size:.2e}")
        ok &= diff <= 1e-5 * size and [round(lr, 6) for lr in lrs] == field_lrs
    print("conforms" if ok else "DIFFERS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
