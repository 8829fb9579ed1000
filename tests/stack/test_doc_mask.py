"""doc-mask (stack/doc-mask.diff), on the built frontier: attention within documents (DOC_MASK_ENABLED) and
FlashAttention 4 where it runs (FA4_ENABLED). A document never sees the one before it and scores as if alone,
the masked model compiles as one graph, the kernel chosen for each GPU, dtype and failure is the one the log
names, and a resume refuses a checkpoint of the other attention. With both off the build computes what the
core computes (tests/test_stack.py)."""

import dataclasses

import pytest
import torch

from conftest import Reads, random_model
from stack.conftest import built_env, frontier_all_on


def bump(idx: torch.Tensor, t: int) -> torch.Tensor:
    """idx with the token at position t changed."""
    changed = idx.clone()
    changed[:, t] = (idx[:, t] + 1) % 64
    return changed


def packed_documents(fr, *lengths: int, seed: int = 0) -> list:
    """Documents of the given lengths, each opening with BOS, as rows (1, n)."""
    g = torch.Generator().manual_seed(seed)
    docs = [torch.randint(2, 64, (1, n), generator=g) for n in lengths]
    for doc in docs:
        doc[0, 0] = fr.BOS_ID
    return docs


@pytest.mark.parametrize("looping", [False, True])
def test_causal_with_every_technique_on_and_a_second_document(fr, looping):
    model = random_model(frontier_all_on(fr), fr)
    model.set_looping(looping)
    idx = torch.randint(2, 64, (2, 16))
    # a second document from position 4
    idx[:, 4] = fr.BOS_ID
    changed = bump(idx, 9)
    with torch.no_grad():
        a = model.logits(idx)
        b = model.logits(changed)
    assert torch.equal(a[:, :9], b[:, :9]), "an earlier position saw a later token"
    assert not torch.allclose(a[:, 9:], b[:, 9:])


@pytest.mark.parametrize("looping", [False, True])
def test_with_the_mask_a_document_never_sees_the_one_before_it(fr, looping):
    masked = random_model(frontier_all_on(fr), fr)
    dense = random_model(frontier_all_on(fr, doc_mask_enabled=False), fr)
    for model in (masked, dense):
        model.set_looping(looping)
    first, other, second = packed_documents(fr, 6, 6, 10)
    with torch.no_grad():
        after = masked.logits(torch.cat([first, second], 1))[:, 6:]
        assert torch.equal(after, masked.logits(torch.cat([other, second], 1))[:, 6:])
        # alone, the same but for RoPE's rounding at other positions
        torch.testing.assert_close(after, masked.logits(second), rtol=0, atol=1e-5)
        dense_after = dense.logits(torch.cat([first, second], 1))[:, 6:]
        assert not torch.allclose(dense_after, dense.logits(torch.cat([other, second], 1))[:, 6:])


def test_the_masked_path_scores_each_document_as_if_alone(fr):
    """A row of three documents (the first cut, as a training row starts) against each scored alone."""
    model = random_model(frontier_all_on(fr, train_seq_len=24), fr)
    docs = packed_documents(fr, 5, 11, 8, seed=1)
    # text before the row's first BOS is a document too
    docs[0] = docs[0][:, 1:]
    row = torch.cat(docs, 1)
    with torch.no_grad():
        together = model.logits(row)
        alone = torch.cat([model.logits(doc) for doc in docs], 1)
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-5)
    assert torch.equal(fr.documents(row)[0, [0, 3, 4, 14, 15]], torch.tensor([0, 0, 1, 1, 2]))


def test_the_masked_model_compiles_as_one_graph_with_the_same_logits(fr):
    model = random_model(frontier_all_on(fr), fr)
    idx = torch.cat(packed_documents(fr, 7, 9), 1).repeat(2, 1)
    compiled = torch.compile(model.logits, fullgraph=True, backend="eager")
    with torch.no_grad():
        assert torch.equal(compiled(idx), model.logits(idx))


@pytest.mark.parametrize("bf16, fa4, major, failure, expected", [
    (False, True, 9, None, "math"),  # flash is 16-bit only
    (True, False, 9, None, "flash"),  # FA4_ENABLED=0
    (True, True, 8, None, "flash"),  # an A100: FA4 runs on SM 9.0 and 10.0
    (True, True, 9, None, "FA4"),
    (True, True, 10, ImportError, "flash(FA4:ImportError)"),  # flash-attn-4 not installed
    (True, True, 9, AttributeError, "flash(FA4:AttributeError)"),  # a torch without the switch
])
def test_fa4_runs_attention_where_it_can_and_the_log_says_which_kernel(fr, monkeypatch, bf16, fa4, major, failure,
                                                                        expected):
    activated = []

    def activate(impl):
        if failure:
            raise failure(impl)
        activated.append(impl)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (major, 0))
    monkeypatch.setattr(torch.nn.attention, "activate_flash_attention_impl", activate, raising=False)
    enabled = {}
    for kernel in ("flash", "cudnn", "mem_efficient", "math"):
        monkeypatch.setattr(torch.backends.cuda, f"enable_{kernel}_sdp", lambda on, k=kernel: enabled.update({k: on}))
    layout = fr.Layout(device=torch.device("cuda", 0), use_bf16=bf16)
    assert fr.attention_kernel(fr.Hyperparameters(fa4_enabled=fa4), layout) == expected
    assert activated == (["FA4"] if expected == "FA4" else [])
    # flash stays on, as torch starts
    assert enabled == dict(cudnn=False, mem_efficient=False, math=not bf16)
    if not bf16:
        with pytest.raises(fr.ConfigError, match="DOC_MASK_ENABLED=1 on CUDA: .*set BF16=1"):
            fr.attention_kernel(fr.Hyperparameters(doc_mask_enabled=True), layout)


def test_the_log_names_the_attention_kernel(fr, tmp_path):
    val = fr.Validation(torch.tensor([1, 5, 6]), torch.tensor([0, 1, 1]), 0)
    run = fr.Run(fr.Hyperparameters(data_path=str(tmp_path)), fr.Layout(), val, b"source")
    log = fr.RunLog(tmp_path / "run.txt")
    log.write_header(run)
    assert "device:cpu compile:False bf16:False attention:sdpa\n" in (tmp_path / "run.txt").read_text()


def test_doc_mask_enabled_is_of_the_models_config_which_a_resume_compares(fr):
    """The model reads DOC_MASK_ENABLED from its config (GPTConfig), as every model setting: checkpoints.py
    compares that config on a resume (next test), and the frontier's model reads nothing else."""
    assert "doc_mask_enabled" in {f.name for f in dataclasses.fields(fr.GPTConfig)}
    hp = Reads(frontier_all_on(fr).model_config)
    model = fr.GPT(hp)
    for looping in (False, True):
        model.set_looping(looping)
        x = torch.randint(0, 64, (2, 16))
        model(x, x)
    assert hp.names == {f.name for f in dataclasses.fields(fr.GPTConfig)}


def test_a_resume_refuses_a_checkpoint_of_the_other_attention(fr, frontier_script, tiny_data, tmp_path):
    env = built_env(tiny_data, frontier_script, RUN_ID="masked", SAVE_EVERY="5", DOC_MASK_ENABLED="1",
                    CHECKPOINT_DIR=str(tmp_path / "ckpt"), ARTIFACT_DIR=str(tmp_path / "logs"))
    run = fr.setup(env)
    run.model = fr.GPT(run.hp)
    loader = fr.DistributedTokenLoader(fr.train_pattern(run.hp.data_path))
    optimizers = fr.build_optimizers(run.model, run.hp, run.layout)
    run.keeper.save(run, optimizers, fr.EMA(run.model, 0.0), loader, fr.LoopState(step=5), 0)
    folder = tmp_path / "ckpt" / "masked" / "step_000005"
    resume = dict(RUN_ID="resumed", RESUME=str(folder), ARTIFACT_DIR=str(tmp_path / "logs"))
    with pytest.raises(fr.ConfigError, match=r"the checkpoint has DOC_MASK_ENABLED=True but this run has "
                                             r"DOC_MASK_ENABLED=False; set it to match"):
        fr.setup(built_env(tiny_data, frontier_script, **resume))
    resumed = fr.setup(built_env(tiny_data, frontier_script, DOC_MASK_ENABLED="1", **resume))
    assert resumed.keeper.meta["step"] == 5


@pytest.mark.cuda
def test_varlen_attention_within_documents_matches_the_cpus_masked_attention(fr):
    """DOC_MASK_ENABLED on CUDA: varlen flash attention over the rows end to end, compiled as one graph, gives
    the logits of the CPU's block-diagonal mask (tests/test_cuda.py's record-like shape, the mask on)."""
    from test_cuda import RECORD_LIKE
    torch.manual_seed(3)
    hp = fr.Hyperparameters(**dict(RECORD_LIKE, doc_mask_enabled=True))
    model = fr.GPT(hp)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    idx = torch.randint(2, 512, (2, 256))
    # a one-token document, and a row that starts mid-document
    idx[0, [0, 40, 41, 200]] = fr.BOS_ID
    idx[1, 128] = fr.BOS_ID
    with torch.no_grad():
        exact = model.logits(idx)
        fr.attention_kernel(hp, fr.Layout(device=torch.device("cuda", 0), use_compile=True, use_bf16=True))
        with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
            compiled = torch.compile(model.cuda().logits, dynamic=False, fullgraph=True)
            with torch.autocast("cuda", torch.bfloat16):
                fast = compiled(idx.cuda()).float().cpu()
    torch.testing.assert_close(fast, exact, rtol=5e-2, atol=5e-2)
