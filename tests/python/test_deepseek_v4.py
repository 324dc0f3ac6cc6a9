"""latentq.deepseek_v4 against transformers 5.24's own DeepseekV4ForCausalLM (random init, offline, CPU): the
float64 recomputation from the captured tensors alone equals the attention output the model feeds its grouped
output projection on sliding, CSA and HCA layers (with index_topk smaller than the number of CSA entries, random
sinks and position biases); the recomputed CSA top-k is the indexer's own choice; the captured window entries are
the ones the model's cache keeps; and the compression spans / visibility on a hand-made case, checked against the
model's compressors (which entries move when one token moves, which entries the HCA block bias lets through)."""

import dataclasses

import pytest
import torch
import transformers

from latentq.deepseek_v4 import (
    CSA,
    HCA,
    LAYER_TYPES,
    V4Capture,
    compressed_spans,
    compressed_visible,
    indexer_selection,
    recompute_attention,
    rel_error,
    window_visible,
)

T, WINDOW, TOPK, CSA_RATE, HCA_RATE = 40, 8, 3, 4, 8
CONFIG = dict(
    vocab_size=128,
    hidden_size=64,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=32,
    q_lora_rank=32,
    partial_rotary_factor=0.25,  # rope_dim 8: the last 8 of 32 columns
    num_experts_per_tok=2,
    n_routed_experts=4,
    layer_types=list(LAYER_TYPES),
    mlp_layer_types=["moe"] * 3,
    compress_rates={CSA: CSA_RATE, HCA: HCA_RATE},
    hc_mult=2,
    sliding_window=WINDOW,
    o_groups=2,
    o_lora_rank=16,
    index_n_heads=4,
    index_head_dim=16,
    index_topk=TOPK,
    max_position_embeddings=256,
    attn_implementation="eager",
)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = transformers.DeepseekV4ForCausalLM(transformers.DeepseekV4Config(**CONFIG)).eval()
    with torch.no_grad():  # the init zeroes these; random values make them matter
        for name, p in m.named_parameters():
            if name.endswith(("sinks", "position_bias")):
                p.copy_(torch.randn_like(p))
    return m


@pytest.fixture(scope="module")
def captured(model):
    ids = torch.randint(0, CONFIG["vocab_size"], (1, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), V4Capture(model) as cap:
        out = model(ids, use_cache=True)
    return cap.records, out.cache


def test_recomputation_equals_model(captured):
    records, _ = captured
    assert [r.layer_type for r in records] == list(LAYER_TYPES)
    for r in records:
        err = rel_error(recompute_attention(r), r.attn_out)
        print(f"layer {r.layer} {r.layer_type}: {r.compressed_kv.shape[0]} compressed entries, rel. error {err:.3e}")
        assert err <= 1e-5, (r.layer_type, err)
        assert r.compressed_span.dtype == torch.long and r.compressed_span.shape == (r.compressed_kv.shape[0], 2)
    csa, hca = records[1], records[2]
    assert csa.compressed_kv.shape == (T // CSA_RATE, 32) and hca.compressed_kv.shape == (T // HCA_RATE, 32)
    assert csa.index_k.shape == (T // CSA_RATE, 16) and csa.index_q.shape == (T, 4, 16)
    assert torch.equal(csa.compressed_rope_position, torch.arange(T // CSA_RATE) * CSA_RATE)


YARN = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 16}


@pytest.mark.parametrize("n_tok, rope", [(43, None), (5, None), (43, YARN)])
def test_recomputation_other_lengths(n_tok, rope):
    """Tokens after the last complete window (43 = 10·4 + 3), fewer tokens than the window or an HCA window
    (5: one CSA entry, none in HCA), and the YaRN "compress" rope of CSA / HCA layers."""
    torch.manual_seed(0)
    extra = {"rope_parameters": dict(rope)} if rope else {}
    m = transformers.DeepseekV4ForCausalLM(transformers.DeepseekV4Config(**CONFIG, **extra)).eval()
    ids = torch.randint(0, CONFIG["vocab_size"], (1, n_tok), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(("sinks", "position_bias")):
                p.copy_(torch.randn_like(p))
        with V4Capture(m) as cap:
            m(ids)
    for r in cap.records:
        err = rel_error(recompute_attention(r), r.attn_out)
        kind = "yarn" if rope else "default"
        print(f"T={n_tok} rope={kind} {r.layer_type}: {r.compressed_kv.shape[0]} entries, rel. error {err:.3e}")
        assert r.compressed_kv.shape[0] == (n_tok // r.compress_rate if r.compress_rate else 0)
        assert err <= 1e-5, (r.layer_type, err)


def test_recomputation_discriminates(captured):
    """The figures above are not met by a near miss: a window one entry wider, an HCA layer without its
    compressed entries, or a CSA layer reading every visible entry instead of its indexer's top-k all move the
    output far beyond the tolerance."""
    records, _ = captured
    csa, hca = records[1], records[2]
    assert int(csa.compressed_kv.shape[0]) > TOPK
    wide = dataclasses.replace(csa, sliding_window=WINDOW + 1)
    no_entries = dataclasses.replace(hca, compressed_kv=hca.compressed_kv[:0])
    csa_all = dataclasses.replace(csa, layer_type=HCA)  # HCA visibility: every visible entry
    for name, rec, ref in (("wide", wide, csa), ("no_entries", no_entries, hca), ("csa_all", csa_all, csa)):
        err = rel_error(recompute_attention(rec), ref.attn_out)
        print(f"{name}: rel. error {err:.3e}")
        assert err > 1e-3, name


def test_indexer_topk_is_the_models(captured):
    records, _ = captured
    csa = records[1]
    mine = indexer_selection(csa)
    theirs = torch.zeros_like(mine)
    for t, picks in enumerate(csa.index_selected.tolist()):
        for w in picks:
            if w >= 0:
                theirs[t, w] = True
    assert torch.equal(mine, theirs)
    visible = compressed_visible(csa.positions, csa.compressed_kv.shape[0], CSA_RATE)
    assert torch.equal(mine.sum(1), visible.sum(1).clamp(max=TOPK))
    assert int(visible.sum(1).max()) == T // CSA_RATE > TOPK  # the top-k does drop visible entries


def test_window_entries_are_the_cached_ones(captured):
    """The model's cache keeps the last sliding_window - 1 window entries: the captured ones, bit for bit."""
    records, cache = captured
    for r in records:
        kept = cache.layers[r.layer].keys[0, 0]
        assert kept.shape[0] == WINDOW - 1
        assert torch.equal(kept, r.window_kv[-(WINDOW - 1) :])


def test_hand_made_spans_and_visibility():
    # rate 4, 13 tokens: windows [0,4) [4,8) [8,12) complete, token 12 in none yet
    assert compressed_spans(3, 4, overlap=True).tolist() == [[0, 4], [0, 8], [4, 12]]
    assert compressed_spans(3, 4, overlap=False).tolist() == [[0, 4], [4, 8], [8, 12]]
    assert compressed_spans(2, 4, overlap=True, first_entry=5).tolist() == [[16, 24], [20, 28]]
    vis = compressed_visible(torch.arange(13), 3, 4)
    expected = [[]] * 3 + [[0]] * 4 + [[0, 1]] * 4 + [[0, 1, 2]] * 2  # entry w once token 4w+3 is in
    assert [torch.nonzero(row).flatten().tolist() for row in vis] == expected
    win = window_visible(torch.arange(6), 3)
    assert [torch.nonzero(row).flatten().tolist() for row in win] == [
        [0],
        [0, 1],
        [0, 1, 2],
        [1, 2, 3],
        [2, 3, 4],
        [3, 4, 5],
    ]


@pytest.mark.parametrize("layer, rate, overlap, n_tok", [(1, CSA_RATE, True, 13), (2, HCA_RATE, False, 19)])
def test_spans_against_the_compressor(model, layer, rate, overlap, n_tok):
    """Which compressed entries change when one token's hidden state changes is compressed_spans' claim."""
    comp = model.model.layers[layer].self_attn.compressor
    g = torch.Generator().manual_seed(2)
    h = torch.randn(1, n_tok, CONFIG["hidden_size"], generator=g)
    qr = torch.randn(1, n_tok, CONFIG["q_lora_rank"], generator=g)
    pid = torch.arange(n_tok)[None]
    with torch.no_grad():
        base, bias = comp(h, qr, pid, None, layer)
        n = base.shape[2]
        assert n == n_tok // rate
        spans = compressed_spans(n, rate, overlap)
        for j in range(n_tok):
            h2 = h.clone()
            h2[0, j] += 1.0
            moved = (comp(h2, qr, pid, None, layer)[0] - base).abs().amax(-1)[0, 0] > 0
            claim = (spans[:, 0] <= j) & (j < spans[:, 1])
            assert torch.equal(moved, claim), (j, moved.tolist(), claim.tolist())
        if overlap:  # CSA: with index_topk >= the number of entries, its block bias is the visibility itself
            k = comp.indexer.index_topk
            comp.indexer.index_topk = n
            try:
                bias = comp(h, qr, pid, None, layer)[1]
            finally:
                comp.indexer.index_topk = k
    assert torch.equal(bias[0, 0] == 0, compressed_visible(pid[0], n, rate))


def test_capture_leaves_the_model_unchanged(model):
    ids = torch.randint(0, CONFIG["vocab_size"], (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        plain = model(ids).logits
        with V4Capture(model) as cap:
            hooked = model(ids).logits
    assert torch.equal(plain, hooked) and len(cap.records) == 3


def test_refuses_a_batch(model):
    with torch.no_grad(), V4Capture(model), pytest.raises(ValueError, match="batch size 1"):
        model(torch.zeros(2, 8, dtype=torch.long))
