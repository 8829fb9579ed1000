"""AWQ-lite and LQER's groups (stack/awq-lite.diff) against the field's own code (#2014; LQER's packer: #2135 too).

    python bench/awq_conformance.py --field path/to/pr2014 [--field path/to/pr2135]

--field names a record folder of openai/parameter-golf (its train_gpt.py; the field's code is not in this
repository). As in bench/field_conformance.py, the file is not imported: its functions are read out of it by name
and run alone on CPU, with its own settings class made from the same environment as ours.

For each case (seed, width, AWQ_LITE_GROUP_TOP_K, AWQ_LITE_GROUP_SIZE): a state dict of the field's names (the
embedding, an attention query, the MLP's two matrices; each over the field's 65,536 entries), random weights with
columns of unequal size, and random calibration inputs with channels of unequal RMS.

  groups    the field's _awq_lite_group_candidates, sorted and cut as its gptq_mixed_quantize does, against our
            awq_lite_groups, from the same input RMS: the same (matrix, columns), in the same order. Then each side
            from its own statistics (the field's float32 sums of squares; our float64 diag(X^T X) / rows).
  integers  the field's gptq_mixed_quantize against our quantize_state_dict, on the same H: every integer, row
            step (fp16), finer step and group start. The field's GPTQ runs in float32; ours in float64. Run as
            written, some integers differ by rounding; with the field's .float() made float64 (and its new tensors),
            every one must agree.
  lqer      the field's _lqer_pack_asym against our lqer_pack for LQER_ASYM_GROUP 16, 32, 64, 128 on the same
            factors (random, and those of a real quantization error): the same int2 and int4 integers and fp16
            steps. End to end with LQER on: the same matrices corrected (top 3 by error), and how far the two
            corrections are apart (the field's SVD is float32, ours float64).

Exit status 1 on a difference in the groups, in the float64 integers or in the packed factors.
"""

import argparse
import ast
import contextlib
import inspect
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from field_conformance import Field, frontier  # noqa: E402

ROW_STD = "row_std = W_orig.std(dim=1)"  # the field's steps: its rows' std, in float32 as written
FIELD_FUNCTIONS = ("_awq_lite_group_candidates", "gptq_quantize_weight", "_quantize_gate_int8_row", "_lqer_pack",
                   "_lqer_pack_asym", "_lqer_fit_quantized", "gptq_mixed_quantize")
# the field's settings as #2014 runs them (int6 matrices, int7 embedding, σ clips at its defaults)
BASE_ENV = dict(MATRIX_BITS="6", EMBED_BITS="7", MATRIX_CLIP_SIGMAS="12.85", EMBED_CLIP_SIGMAS="20.0",
                MLP_CLIP_SIGMAS="10.0", ATTN_CLIP_SIGMAS="13.0", GATED_ATTN_QUANT_GATE="0", AWQ_LITE_ENABLED="1",
                AWQ_LITE_BITS="8", LQER_ENABLED="0", LQER_RANK="4", LQER_TOP_K="3", LQER_ASYM_ENABLED="1",
                LQER_FACTOR_BITS="4", GPTQ="1", MAX_WALLCLOCK_SECONDS="0")
FIELD_ONLY = ("GATED_ATTN_QUANT_GATE",)  # the field's file reads it; ours refuses it (the gate is none of these)


def our_settings(environ: dict) -> dict:
    return {name: value for name, value in environ.items() if name not in FIELD_ONLY}


# (seed, width, AWQ_LITE_GROUP_TOP_K, AWQ_LITE_GROUP_SIZE); the last: the head's inputs 3x louder, so that the int7
# embedding competes (#2014's logs: its group is in tok_emb)
CASES = [(0, 384, 1, 64), (1, 384, 3, 64), (2, 320, 2, 32), (3, 448, 1, 64), (4, 384, 4, 128), (5, 512, 2, 64)]
LOUDER = {5: "tok_emb.weight"}
VOCAB = 512
LQER_GROUPS = (16, 32, 64, 128)


def field_space(field, wide=False):
    """The field's functions; wide: its GPTQ solve in float64 (with float64()), its row stds still float32."""
    space = field.define(dict(log=lambda *args, **kwargs: None), *FIELD_FUNCTIONS)
    if wide:
        node = field.nodes["gptq_quantize_weight"]
        source = inspect.cleandoc("\n" + ast.get_source_segment(field.text, node, padded=True))
        assert source.count(ROW_STD) == 1, f"{field.path}: no {ROW_STD!r} in gptq_quantize_weight"
        source = source.replace(ROW_STD, "row_std = W_orig.to(torch.float32).std(dim=1)")
        exec(compile(source, str(field.path), "exec"), space)  # gptq_mixed_quantize calls this one
    return space


@contextlib.contextmanager
def float64():
    """The field's code with Tensor.float() giving float64, and new tensors float64."""
    plain = torch.Tensor.float
    torch.Tensor.float = torch.Tensor.double
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.Tensor.float = plain
        torch.set_default_dtype(torch.float32)


def calibration(seed, width):
    """A state dict of the field's names, each matrix's inputs (rows x cols) with channels of unequal RMS."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"tok_emb.weight": (VOCAB, width), "blocks.0.attn.c_q.weight": (width, width),
              "blocks.0.mlp.fc.weight": (4 * width, width), "blocks.0.mlp.proj.weight": (width, 4 * width)}
    state, inputs = {}, {}
    for name, (rows, cols) in shapes.items():
        column_size = torch.exp(0.5 * torch.randn(cols, generator=g))
        state[name] = 0.02 * torch.randn(rows, cols, generator=g) * column_size
        channel_rms = torch.exp(torch.randn(cols, generator=g))
        inputs[name] = torch.randn(4 * cols, cols, generator=g) * channel_rms
    if seed in LOUDER:
        inputs[LOUDER[seed]] *= 3
    return state, inputs


def field_statistics(inputs, batches=4):
    """The field's collect_hessians on these inputs in `batches` forwards: H = sum X^T X / batches, and the
    input RMS from float32 sums of squares over the rows."""
    hessians, act_rms = {}, {}
    for name, x in inputs.items():
        H = torch.zeros(x.size(1), x.size(1))
        sumsq = torch.zeros(x.size(1))
        for part in x.chunk(batches):
            H.addmm_(part.T, part)
            sumsq += part.square().sum(dim=0)
        hessians[name] = H / batches
        act_rms[name] = (sumsq / len(x)).sqrt()
    return hessians, act_rms


def our_statistics(inputs):
    """Our calibrate's: H = X^T X in float64, the RMS from its diagonal over the rows."""
    hessians = {name: x.double().T @ x.double() for name, x in inputs.items()}
    act_rms = {name: (H.diagonal() / len(inputs[name])).sqrt().float() for name, H in hessians.items()}
    return hessians, act_rms


def field_groups(space, state, act_rms, h):
    """The field's choice, as gptq_mixed_quantize makes it (its candidates; sort by score; the first top_k)."""
    found = []
    for name, w in state.items():
        bits = h.embed_bits if "tok_emb" in name else h.matrix_bits
        if w.numel() > 65536 and name in act_rms and bits < h.awq_lite_bits:
            for score, start, end in space["_awq_lite_group_candidates"](w, act_rms[name], h.awq_lite_group_size):
                found.append((score, name, start, end))
    found.sort(key=lambda x: -x[0])
    return [(name, start, end) for _, name, start, end in found[:h.awq_lite_group_top_k]]


def by_matrix(groups):
    """The field's awq_selected: {matrix: [(start, end)]}, matrices and groups in the order of their scores."""
    found = {}
    for name, start, end in groups:
        found.setdefault(name, []).append((start, end))
    return found


def compare_integers(field_out, ours, names):
    """{what: (entries differing, entries)} between the field's result dict and our quantized object."""
    counts = {}
    def count(what, a, b):
        same, total = counts.get(what, (0, 0))
        counts[what] = (same + int((a != b).sum()), total + a.numel())
    for name in names:
        count("integers", field_out[name + ".q"].to(torch.int8), ours["ints"][name])
        count("row steps", field_out[name + ".scale"].half(), ours["scales"][name])
        if name + ".awqg_s_hi" in field_out:
            count("finer steps", field_out[name + ".awqg_s_hi"].half(), ours["scales"][name + ".awq"])
            count("group starts", field_out[name + ".awqg_start"].long(),
                  ours["floats"][name + ".awq_groups"][:, 0].long())
    return counts


def compare_case(field, fr, case) -> int:
    seed, width, top_k, size = case
    environ = dict(BASE_ENV, AWQ_LITE_GROUP_TOP_K=str(top_k), AWQ_LITE_GROUP_SIZE=str(size))
    h = field.settings(environ)
    hp = fr.Hyperparameters.from_env(our_settings(environ))
    state, inputs = calibration(seed, width)
    field_H, field_rms = field_statistics(inputs)
    our_H, our_rms = our_statistics(inputs)
    wrong = 0

    space = field_space(field)
    ranked = field_groups(space, state, field_rms, h)
    theirs = by_matrix(ranked)
    same_input = fr.awq_lite_groups(state, field_rms, hp)
    own_input = fr.awq_lite_groups(state, our_rms, hp)
    rms_apart = max(float(((our_rms[n] - field_rms[n]).abs() / field_rms[n]).max()) for n in state)
    # dicts compare alike in any order: their items, in order, are what the export walks
    wrong += list(same_input.items()) != list(theirs.items())
    shown = " ".join(f"{name.removesuffix('.weight')}[{start}:{end}]" for name, start, end in ranked)
    print(f"seed {seed} width {width} top_k {top_k} size {size}: field {shown}")
    print(f"  groups: same RMS {'same' if same_input == theirs else f'DIFFERENT {same_input}'}; own statistics "
          f"{'same' if own_input == theirs else f'different {own_input}'} (RMS up to {rms_apart:.1e} apart)")

    # the same H (the field's float32 H) and RMS both sides: the integers alone are compared
    ours = fr.quantize_state_dict(state, hp, {n: H.double() for n, H in field_H.items()}, field_rms)
    for mode in ("float32", "float64"):
        t0 = time.perf_counter()
        with float64() if mode == "float64" else contextlib.nullcontext():
            wide = field_space(field, wide=mode == "float64")
            field_out, meta = wide["gptq_mixed_quantize"](state, field_H, field_rms, h)
        counts = compare_integers(field_out, ours, state)
        shown = ", ".join(f"{what} {bad}/{total}" for what, (bad, total) in counts.items())
        print(f"  field GPTQ in {mode} ({time.perf_counter() - t0:.1f}s), differing: {shown}")
        if mode == "float64":
            wrong += sum(bad for bad, _ in counts.values())
    wrong += compare_lqer_end_to_end(fr, state, field_H, field_rms, environ, field)
    return wrong


def compare_lqer_end_to_end(fr, state, field_H, field_rms, environ, field) -> int:
    environ = dict(environ, LQER_ENABLED="1", LQER_ASYM_GROUP="32")
    h = field.settings(environ)
    hp = fr.Hyperparameters.from_env(our_settings(environ))
    with float64():
        field_out, meta = field_space(field, wide=True)["gptq_mixed_quantize"](state, field_H, field_rms, h)
    ours = fr.quantize_state_dict(state, hp, {n: H.double() for n, H in field_H.items()}, field_rms)
    theirs = sorted(name for name, what in meta.items() if "lqer_asym" in what)
    chosen = sorted(name.removesuffix(".lqer_a") for name in ours["ints"] if name.endswith(".lqer_a"))
    restored = fr.dequantize_state_dict(ours)
    apart = []
    for name in theirs:
        A = field_out[name + ".lqA_a"].float() * float(field_out[name + ".lqAs_a"])
        qB, sB = field_out[name + ".lqB_a"], field_out[name + ".lqBs_a"]
        B = (qB.reshape(-1, qB.numel() // sB.numel()).float() * sB.float()[:, None]).reshape(qB.shape)
        base = fr.int_weights(ours["ints"], ours["scales"], ours["floats"])[name]
        field_delta = A @ B
        apart.append(float((restored[name].float() - base - field_delta).norm() / field_delta.norm()))
    print(f"  LQER (rank 4, top 3, group 32): corrected {'the same' if chosen == theirs else 'DIFFERENT'} "
          f"matrices {[n.removesuffix('.weight') for n in theirs]}; corrections apart by "
          f"{', '.join(f'{x:.1e}' for x in apart)} of their norm")
    return chosen != theirs


def compare_lqer_packing(space, fr) -> int:
    """The field's _lqer_pack_asym against our lqer_pack on the same factors, for every group in LQER_GROUPS."""
    wrong = 0
    g = torch.Generator().manual_seed(7)
    factors = [(0.3 * torch.randn(512, 4, generator=g), torch.randn(4, 384, generator=g) / 20)]
    error = torch.randn(1536, 512, generator=g) * 0.01
    U, S, Vh = torch.linalg.svd(error, full_matrices=False)
    factors.append(((U[:, :4] * S[:4]).contiguous(), Vh[:4].contiguous()))
    for group in LQER_GROUPS:
        entries = bad = 0
        for A, B in factors:
            qA, sA, qB, sB = space["_lqer_pack_asym"](A, B, group)
            packed = fr.lqer_pack(A, B, group)
            oA, tA = packed[".lqer_a"]
            oB, tB = packed[".lqer_b"]
            pairs = [(qA.flatten(), oA.flatten().to(torch.int8)), (sA.reshape(1), tA.half()),
                     (qB.flatten(), oB.flatten().to(torch.int8)), (sB, tB.half())]
            bad += sum(int((a != b).sum()) for a, b in pairs)
            entries += sum(a.numel() for a, _ in pairs)
        print(f"LQER packing, group {group}: {bad} of {entries} integers and fp16 steps differ "
              f"(2 factor pairs: random; a real error's rank-4 SVD)")
        wrong += bad
    return wrong


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--field", type=Path, action="append", required=True,
                        help="a record folder of openai/parameter-golf (or its train_gpt.py); repeat for several")
    args = parser.parse_args(argv)
    fr = frontier()
    wrong = 0
    for folder in args.field:
        field = Field(folder)
        print(f"== {field.path}")
        if field.has("_lqer_pack_asym"):
            wrong += compare_lqer_packing(field.define({}, "_lqer_pack_asym"), fr)
        if not field.has(*FIELD_FUNCTIONS):
            print("  no AWQ-lite in this file")
            continue
        for case in CASES:
            wrong += compare_case(field, fr, case)
    print("same as the field" if not wrong else f"{wrong} differences")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
