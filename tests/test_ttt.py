"""TTT=1: score-first test-time training is legal by construction, and exact where it must be."""

import copy
import math

import pytest
import torch

import train_gpt as tg

CHUNK = 512


@pytest.fixture(scope="module")
def ttt_setup(tiny_data):
    """A trained-looking tiny model (random weights, every layer active) and the tiny validation split."""
    run = tg.setup(tiny_data.env(EVAL_STRIDE="32", TTT="1", TTT_CHUNK_TOKENS=str(CHUNK), TTT_LR="0.05",
                                 VAL_BATCH_SIZE="1024"))
    torch.manual_seed(0)
    model = tg.GPT(run.hp)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.05)
    tokens = run.val_tokens[:6 * CHUNK + 100 + 1]  # 7 chunks, the last one short
    return run.hp, run.layout, model, tokens, run.val_bytes[:tokens.numel()]


def ttt(model, tokens, val_bytes, hp, layout):
    model = copy.deepcopy(model)
    return tg.test_time_train(model, tokens, val_bytes, hp, layout), model


def test_a_chunk_score_never_sees_later_tokens(ttt_setup):
    hp, layout, model, tokens, val_bytes = ttt_setup
    sums, _ = ttt(model, tokens, val_bytes, hp, layout)
    assert sums.shape == (7, 3) and sums[:, 1].tolist() == [CHUNK] * 6 + [100]
    for k in (0, 2, 4):  # change every token after chunk k's last target
        changed = tokens.clone()
        changed[(k + 1) * CHUNK + 1:] = torch.randint_like(changed[(k + 1) * CHUNK + 1:], 2, hp.vocab_size)
        other, _ = ttt(model, changed, val_bytes, hp, layout)
        assert torch.equal(other[:k + 1], sums[:k + 1]), f"chunks up to {k} saw later tokens"
        assert not torch.equal(other[k + 1], sums[k + 1])  # the change is visible where it is scored


def test_zero_learning_rate_reproduces_the_sliding_score(ttt_setup):
    hp, layout, model, tokens, val_bytes = ttt_setup
    still = copy.deepcopy(hp)
    still.ttt_lr = 0.0
    sums, after = ttt(model, tokens, val_bytes, still, layout)
    assert all(torch.equal(a, b) for a, b in zip(after.state_dict().values(), model.state_dict().values()))
    sliding = tg.score(model, tokens, val_bytes, hp, layout, sliding=True)
    assert sums.sum(0)[1:].tolist() == sliding[1:].tolist(), "the same tokens and bytes, each scored once"
    assert sums.sum(0)[0].item() == pytest.approx(sliding[0].item(), rel=1e-9)
    plain = copy.deepcopy(still)
    plain.eval_stride = 0
    plain_sums, _ = ttt(model, tokens, val_bytes, plain, layout)
    assert plain_sums.sum(0)[0].item() == pytest.approx(tg.score(model, tokens, val_bytes, hp, layout)[0].item(),
                                                          rel=1e-9)


def test_training_helps_and_the_last_chunk_changes_nothing(ttt_setup):
    hp, layout, model, tokens, val_bytes = ttt_setup
    sums, trained = ttt(model, tokens, val_bytes, hp, layout)
    still = copy.deepcopy(hp)
    still.ttt_lr = 0.0
    frozen, _ = ttt(model, tokens, val_bytes, still, layout)
    assert sums[0].tolist() == frozen[0].tolist(), "the first chunk is scored before any update"
    assert tg.metrics(sums[1:].sum(0))[0] < tg.metrics(frozen[1:].sum(0))[0], "adapting lowers the later chunks' loss"
    changed = tokens.clone()
    changed[6 * CHUNK + 1:] = torch.randint_like(changed[6 * CHUNK + 1:], 2, hp.vocab_size)
    _, other = ttt(model, changed, val_bytes, hp, layout)
    assert all(torch.equal(a, b) for a, b in zip(other.state_dict().values(), trained.state_dict().values())), \
        "the last chunk's tokens reached the weights"
    assert any(not torch.equal(a, b) for a, b in zip(trained.state_dict().values(), model.state_dict().values()))


def test_ttt_is_sgd_with_momentum_clipping_epochs_and_a_cosine_over_the_chunks(ttt_setup):
    """TTT_EPOCHS, TTT_MOMENTUM, TTT_GRAD_CLIP and the cosine decay, against SGD written out by hand: chunk c of n
    trains at TTT_LR * (1 + cos(pi c / (n - 1))) / 2, TTT_EPOCHS steps on the whole chunk, the gradient's global
    norm clipped to TTT_GRAD_CLIP, momentum without dampening; the last chunk is not trained on."""
    hp, layout, model, tokens, val_bytes = ttt_setup
    hp = copy.deepcopy(hp)
    hp.ttt_epochs, hp.ttt_momentum, hp.ttt_grad_clip, hp.ttt_lr = 2, 0.5, 0.05, 0.05
    _, trained = ttt(model, tokens, val_bytes, hp, layout)
    reference = copy.deepcopy(model)
    params = list(reference.parameters())
    momenta, n, clipped = [torch.zeros_like(p) for p in params], tokens.numel() - 1, 0
    bounds = list(range(0, n, CHUNK)) + [n]
    for c, (a, b) in enumerate(zip(bounds[:-2], bounds[1:-1])):
        x, y = tokens[a:b].long().view(-1, hp.train_seq_len), tokens[a + 1:b + 1].long().view(-1, hp.train_seq_len)
        lr = hp.ttt_lr * (1 + math.cos(math.pi * c / (len(bounds) - 2))) / 2
        for _ in range(hp.ttt_epochs):
            grads = torch.autograd.grad(reference(x, y), params)
            norm = torch.sqrt(sum(g.square().sum() for g in grads))
            clipped += bool(norm > hp.ttt_grad_clip)
            with torch.no_grad():
                for p, g, m in zip(params, grads, momenta):
                    m.mul_(hp.ttt_momentum).add_(g * min(1.0, hp.ttt_grad_clip / (norm.item() + 1e-6)))
                    p.sub_(lr * m)
    assert clipped > 0, "the clip must bite in this test"
    for (name, p), q in zip(trained.named_parameters(), params):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=name)


def test_chunks_must_split_evenly_over_ranks(tiny_data):
    for chunk in ("100", "0"):
        with pytest.raises(tg.ConfigError, match=f"TTT_CHUNK_TOKENS={chunk} must split into as many eval windows of 64 "
                                                 "tokens on each of the 1 ranks"):
            tg.setup(tiny_data.env(TTT="1", TTT_CHUNK_TOKENS=chunk))
    with pytest.raises(tg.ConfigError, match="TTT_CHUNK_TOKENS=192 must split into as many eval windows of 64 tokens "
                                             "on each of the 2 ranks"):
        tg.setup(tiny_data.env(TTT="1", TTT_CHUNK_TOKENS="192", WORLD_SIZE="2"))


def test_a_compiled_trainer_trains_the_model_it_wraps(ttt_setup):
    """COMPILE=1 hands test_time_train the compiled wrapper, which raises on bool(); it must train the same weights."""
    hp, layout, model, tokens, val_bytes = ttt_setup
    sums, trained = ttt(model, tokens, val_bytes, hp, layout)
    wrapped = copy.deepcopy(model)
    compiled = torch.compile(wrapped, backend="eager")
    with pytest.raises(TypeError):
        bool(compiled)
    other = tg.test_time_train(wrapped, tokens, val_bytes, hp, layout, compiled)
    assert torch.allclose(other, sums, rtol=1e-6, atol=0)
    for name, p in wrapped.state_dict().items():
        assert torch.allclose(p, trained.state_dict()[name], rtol=1e-5, atol=1e-7), name
