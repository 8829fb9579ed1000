"""The built frontier's CUDA branch, traced on fake CUDA tensors (tests/fakecuda): compiled, as rank 3 of 8 under
DDP, every lever and every technique on. It catches what breaks before a number would (dtypes, devices, kernel
choice, compile); tests/fakecuda/README.md says what it cannot see."""

import subprocess
import sys

from conftest import ROOT, EVERY_LEVER, as_env

# every lever at the harness's tiny shape (2 layers: the loop on the first, lanes from the second), and the
# stack's techniques (the schedule's 3 (length, loop) graphs take a warmup step each)
TRACED = as_env(EVERY_LEVER, num_layers=2, loop_start=0, loop_end=0, parallel_start_layer=1, xsa_last_n=1,
                rope_dims=8, bigram_vocab_size=64, train_batch_tokens=4096, val_batch_size=4096,
                phased_ttt_enabled=True, global_ttt_chunk_tokens=4096, doc_mask_enabled=True, fa4_enabled=True,
                eval_seq_len=80, ttt_eval_seq_len=80, eval_include_tail=True,
                train_seq_schedule="32@0.5,64@1.0", seq_change_warmup_steps=4, warmup_steps=3)


def test_the_frontier_traces_on_fake_cuda_as_rank_3_of_8(frontier_script):
    settings = [f"{name}={value}" for name, value in TRACED.items()]
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "fakecuda" / "harness.py"), "--script",
                          str(frontier_script), "--world-size", "8", "--rank", "3", *settings],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "RESULT: all stages passed" in out.stdout, out.stdout[-4000:] + out.stderr[-2000:]
    assert "trainer: DistributedDataParallel" in out.stdout, "DDP wraps the compiled model"
    assert "_flash_attention_forward" in out.stdout, "attention within documents runs varlen flash attention"
    assert "compiled: [('GPT', 'aot_eager'), ('muon_update', 'aot_eager')]" in out.stdout
    # a global phase's chunks, each with its own number of contexts: one graph (the row count is dynamic)
    assert "chunks: 3 (2 trained); graphs compiled for them: 1" in out.stdout, out.stdout[-2000:]
