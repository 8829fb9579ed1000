"""What only a CUDA GPU can show: flash attention takes our shapes, bf16 autocast and
torch.compile agree with the exact CPU path, and the device copies are the same numbers.
Marked `cuda`: skipped without a GPU, run first by `python bench/gpu_check.py` on one."""

import dataclasses

import pytest
import torch

import train_gpt as tg
from conftest import TRAINING_LEVERS

pytestmark = pytest.mark.cuda

# Every lever that shapes training (conftest's TRAINING_LEVERS) at the record's width, where the kernels
# choose as they do in a record
RECORD_LIKE = dict(TRAINING_LEVERS, vocab_size=512, num_layers=4, model_dim=512, num_heads=8, num_kv_heads=4,
                   mlp_mult=4, rope_dims=16, xsa_last_n=4, loop_end=1, num_loops=1, parallel_start_layer=2,
                   train_seq_len=256, qk_gain_init=5.0)


def record_hp(**overrides) -> tg.Hyperparameters:
    return tg.Hyperparameters(**{**RECORD_LIKE, **overrides})


def cuda_layout(**overrides) -> tg.Layout:
    values = dict(device=torch.device("cuda", 0), use_compile=True, use_bf16=True)
    return tg.Layout(**{**values, **overrides})


def test_flash_attention_takes_the_record_shapes_and_matches_math_attention():
    torch.manual_seed(0)
    hp = tg.Hyperparameters(model_dim=512, num_heads=8, num_kv_heads=4, qk_gain_init=5.0,
                            rope_dims=16, xsa_last_n=1, train_seq_len=256,
                            sparse_attn_gate_enabled=True)
    attn = tg.CausalSelfAttention(hp, layer=8).cuda()
    x = torch.randn(4, 256, 512, device="cuda")
    flash_only = torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION)
    with torch.autocast("cuda", torch.bfloat16), flash_only:
        flash = attn(x, {}).float()
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        exact = attn(x, {}).float()
    torch.testing.assert_close(flash, exact, rtol=3e-2, atol=3e-2)


def test_compiled_bf16_forward_matches_the_exact_cpu_forward():
    torch.manual_seed(1)
    model = tg.GPT(record_hp())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    idx = torch.randint(0, 512, (2, 256))
    model.set_looping(True)
    exact = model(idx, idx).item()
    gpu = model.cuda()
    compiled = torch.compile(gpu, dynamic=False, fullgraph=True)
    with torch.autocast("cuda", torch.bfloat16):
        fast = compiled(idx.cuda(), idx.cuda()).item()
    assert fast == pytest.approx(exact, rel=2e-2)


def test_scores_on_the_gpu_equal_the_cpus_within_bf16():
    torch.manual_seed(2)
    hp = record_hp(eval_stride=64, val_batch_size=4 * 256)
    model = tg.GPT(hp)
    tokens = torch.randint(2, 512, (256 * 12 + 1,), dtype=torch.int32)
    tokens[::300] = tg.BOS_ID
    val_bytes = torch.randint(1, 4, tokens.shape, dtype=torch.int16)
    windows = hp.windows(True)
    cpu_val = tg.Validation(tokens, val_bytes, hp.val_batch_size)
    cpu = tg.score(model, cpu_val, tg.Layout(), *windows)
    gpu_val = tg.Validation(tokens.cuda(), val_bytes.cuda(), hp.val_batch_size)
    compiled = torch.compile(model.cuda(), dynamic=False)
    gpu = tg.score(compiled, gpu_val, cuda_layout(), *windows)
    assert gpu[1:].tolist() == cpu[1:].tolist(), "the same tokens and bytes"
    assert gpu[0].item() == pytest.approx(cpu[0].item(), rel=1e-2)


def test_pinned_batches_are_the_cpus(tiny_data):
    pattern = str(tiny_data.data_path / "fineweb_train_*.bin")
    cpu = tg.DistributedTokenLoader(pattern).next_batch(4096, 64, 1)
    gpu_loader = tg.DistributedTokenLoader(pattern, device=torch.device("cuda", 0))
    gpu = gpu_loader.next_batch(4096, 64, 1)
    assert all(torch.equal(a, b.cpu()) for a, b in zip(cpu, gpu))


def test_the_export_of_gpu_weights_is_the_export_of_the_same_cpu_weights():
    torch.manual_seed(3)
    hp = record_hp(matrix_bits=6, mlp_clip_sigmas=11.5)
    model = tg.GPT(hp)
    cpu = tg.quantize_state_dict(model.state_dict(), hp)
    gpu = tg.quantize_state_dict(model.cuda().state_dict(), hp)
    assert all(torch.equal(cpu["ints"][name], gpu["ints"][name]) for name in cpu["ints"])


def test_lora_ttt_compiled_in_bf16_scores_as_on_the_cpu_in_one_graph():
    """Per-document LoRA TTT compiled on CUDA (every row of a group, the window dynamic): at TTT_LORA_LR=0 the
    CPU's eager scores within bf16; adapting changes them; a second pass compiles nothing."""
    torch.manual_seed(4)
    # two layers, the first looped, lanes from the second: the record's paths at a graph that compiles in seconds
    hp = record_hp(num_layers=2, model_dim=128, loop_start=0, loop_end=0, parallel_start_layer=1, xsa_last_n=2,
                   ttt_enabled=True, ttt_lora_rank=8, ttt_chunk_size=32, ttt_batch_size=4, ttt_lora_lr=0.0)
    model = tg.GPT(hp)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.set_looping(True)
    tokens = torch.randint(2, 512, (300 * 6 + 1,), dtype=torch.int32)
    tokens[::300] = tg.BOS_ID  # six documents longer than the window of 256, in two groups
    val_bytes = torch.randint(1, 4, tokens.shape, dtype=torch.int16)
    cpu = tg.lora_ttt(tg.Run(hp, tg.Layout(), tg.Validation(tokens, val_bytes, 1024), b"", model=model,
                             scorer=model, trainer=model))
    gpu_model = model.cuda()
    compiled = torch.compile(gpu_model, dynamic=False, fullgraph=True)
    gpu_val = tg.Validation(tokens.cuda(), val_bytes.cuda(), 1024)
    run = tg.Run(hp, cuda_layout(), gpu_val, b"", model=gpu_model, scorer=compiled, trainer=compiled)
    frozen = tg.lora_ttt(run)
    assert frozen[1:].tolist() == cpu[1:].tolist(), "the same targets and bytes"
    assert frozen[0].item() == pytest.approx(cpu[0].item(), rel=2e-2)
    graphs = tg.compiled_graphs()
    run.hp = dataclasses.replace(hp, ttt_lora_lr=0.001)
    adapted = tg.lora_ttt(run)
    assert tg.compiled_graphs() == graphs, "one graph for every window, primed by the first pass"
    assert adapted[0].item() != frozen[0].item()
