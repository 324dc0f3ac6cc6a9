"""latentq.sparse_mla against transformers 5.24's own DSA indexers (DeepseekV32Indexer, GlmMoeDsaIndexer) with random
init, offline: from the indexer's own tensors (its query, key and head weights after its RoPE, read with hooks
here, independently of latentq's capture), index_scores + select_topk choose exactly the tokens the module's
top-k mask lets each query read (causal ∩ top-k), for every query row, with index_topk smaller than the window;
and topk_recall on a hand-computed case."""

import sys

import pytest
import torch
import transformers

from latentq.sparse_mla import causal_window, index_scores, same_up_to_ties, select_topk, topk_recall

T, TOPK = 40, 6
COMMON = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=48,
    kv_lora_rank=64,
    qk_rope_head_dim=16,
    qk_nope_head_dim=32,
    v_head_dim=32,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    index_topk=TOPK,
    index_head_dim=32,
    index_n_heads=4,
    max_position_embeddings=256,
    attn_implementation="eager",
)
FAMILIES = {"deepseek_v32": ("DeepseekV32", "apply_rotary_pos_emb"), "glm_moe_dsa": ("GlmMoeDsa", None)}


def _model(family: str, seed: int):
    cls, _ = FAMILIES[family]
    torch.manual_seed(seed)
    cfg = getattr(transformers, cls + "Config")(**COMMON)
    m = getattr(transformers, cls + "ForCausalLM")(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() >= 2:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return m


def _indexer_tensors(m, ids):
    """Per layer: index_q [T, n_h, d] and index_k [T, d] after the indexer's RoPE, index_w [T, n_h] with
    n_h^-0.5 applied, the module's softmax scale and its top-k indices [T, k]."""
    pymod = sys.modules[type(m.model.layers[0].self_attn.indexer).__module__]
    rope_names = [n for n in ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave") if hasattr(pymod, n)]
    got, cur, handles, orig = {}, [None], [], {n: getattr(pymod, n) for n in rope_names}

    def rope(name):
        def wrapped(q, k, *a, **kw):
            qo, ko = orig[name](q, k, *a, **kw)
            if cur[0] is not None:
                got[cur[0]]["rope"] = (qo.detach(), ko.detach())
            return qo, ko

        return wrapped

    for i, layer in enumerate(m.model.layers):
        ix = layer.self_attn.indexer
        got[i] = {"scale": ix.softmax_scale, "n_h": ix.n_heads, "d": ix.head_dim, "rope_dim": ix.qk_rope_head_dim}

        def pre(mod, args, i=i):
            cur[0] = i

        def post(mod, args, out, i=i):
            cur[0] = None
            got[i]["topk"] = out[0].long()

        handles += [ix.register_forward_pre_hook(pre), ix.register_forward_hook(post)]
        handles.append(ix.wq_b.register_forward_hook(lambda mod, a, o, i=i: got[i].__setitem__("q", o.detach()[0])))
        handles.append(ix.k_norm.register_forward_hook(lambda mod, a, o, i=i: got[i].__setitem__("k", o.detach()[0])))
        handles.append(
            ix.weights_proj.register_forward_hook(lambda mod, a, o, i=i: got[i].__setitem__("w", o.detach()[0]))
        )
    for n in rope_names:
        setattr(pymod, n, rope(n))
    try:
        with torch.no_grad():
            m(ids)
    finally:
        for n in rope_names:
            setattr(pymod, n, orig[n])
        for h in handles:
            h.remove()
    out = {}
    for i, g in got.items():
        r, n_h, d = g["rope_dim"], g["n_h"], g["d"]
        q_rot, k_rot = g["rope"]  # [1, T, n_h, r], [1, T, 1, r]
        q = torch.cat([q_rot[0], g["q"].view(-1, n_h, d)[..., r:]], dim=-1)
        k = torch.cat([k_rot[0, :, 0], g["k"][..., r:]], dim=-1)
        out[i] = dict(index_q=q, index_k=k, index_w=g["w"] * n_h**-0.5, scale=g["scale"], topk=g["topk"])
    return out


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_selection_equals_the_modules(family):
    seed = 11
    m = _model(family, seed)
    ids = torch.randint(0, COMMON["vocab_size"], (1, T), generator=torch.Generator().manual_seed(seed + 2))
    rows, off = torch.arange(T), [0, T]
    for i, x in _indexer_tensors(m, ids).items():
        window = causal_window(rows, off, T)
        theirs = torch.zeros(T, T, dtype=torch.bool).scatter_(-1, x["topk"], True) & window
        scores = index_scores(x["index_q"], x["index_w"], x["index_k"], rows, off, x["scale"])
        mine = select_topk(scores, TOPK)
        # equal up to exact ties (relu zeros), which torch.topk and the stable order break differently
        assert same_up_to_ties(scores, theirs, mine, rtol=0.0), (
            family,
            seed,
            i,
            (mine != theirs).nonzero()[:5].tolist(),
        )
        # the early rows read their whole window, the later ones exactly TOPK of it
        assert mine.sum(-1).tolist() == [min(q + 1, TOPK) for q in range(T)], (family, i)


def test_scores_by_hand_and_the_window():
    """Two sequences of 2 and 3 tokens, one head, d = 2, scale 1: s = w · relu(q · k), -inf outside the window."""
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0], [2.0, 0.0]])
    q = torch.tensor([[[1.0, 2.0]], [[3.0, -1.0]]])  # rows 1 and 4
    w = torch.tensor([[2.0], [0.5]])
    s = index_scores(q, w, k, [1, 4], [0, 2, 5], 1.0)
    inf = float("-inf")
    assert s.tolist() == [[2.0, 4.0, inf, inf, inf], [inf, inf, 1.0, 0.0, 3.0]]
    sel = select_topk(s, 2)
    assert sel.tolist() == [[True, True, False, False, False], [False, False, True, False, True]]


def test_topk_recall_by_hand():
    ref = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1]], dtype=torch.bool)
    other = torch.tensor([[1, 0, 1, 0], [0, 1, 1, 1]], dtype=torch.bool)
    assert topk_recall(ref, other) == pytest.approx((1 / 2 + 3 / 3) / 2)
    assert topk_recall(ref, ref) == 1.0
    with pytest.raises(ValueError, match="index_topk must be >= 1"):
        select_topk(torch.zeros(1, 3), 0)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_capture_records_the_indexer_tensors(family):
    """LatentCapture's index_k / index_q / index_w (all query rows) equal this file's own hooks' tensors bit for
    bit, and its visible keys equal the selection latentq.sparse_mla recomputes from them."""
    from latentq.capture import LatentCapture

    m = _model(family, 13)
    ids = torch.randint(0, COMMON["vocab_size"], (1, T), generator=torch.Generator().manual_seed(15))
    ref = _indexer_tensors(m, ids)
    with torch.no_grad(), LatentCapture(m) as cap:
        m(ids, use_cache=False)
    rows, off = torch.arange(T), [0, T]
    for i, rec in cap.layers.items():
        assert torch.equal(rec["index_k"][0], ref[i]["index_k"]), (family, i)
        assert torch.equal(rec["index_q"][0], ref[i]["index_q"]), (family, i)
        assert torch.equal(rec["index_w"][0], ref[i]["index_w"].float()), (family, i)
        assert rec["index_rope_function"] == FAMILIES[family][1] or family == "glm_moe_dsa"
        sc = index_scores(rec["index_q"][0], rec["index_w"][0], rec["index_k"][0], rows, off, ref[i]["scale"])
        assert same_up_to_ties(sc, rec["visible"][0], select_topk(sc, TOPK), rtol=0.0), (family, i)


def test_ties_go_to_the_lower_key_and_are_recognised():
    """Scores 3, 0, 0, 0, 2 with k = 3: keys 0 and 4, then key 1 (the lowest of the tied zeros); another choice
    among the zeros is the same selection up to ties, a choice of a lower score is not."""
    s = torch.tensor([[3.0, 0.0, 0.0, 0.0, 2.0]])
    sel = select_topk(s, 3)
    assert sel.tolist() == [[True, True, False, False, True]]
    other = torch.tensor([[True, False, False, True, True]])
    assert same_up_to_ties(s, sel, other, rtol=0.0)
    assert not same_up_to_ties(s, sel, torch.tensor([[False, True, True, False, True]]), rtol=0.0)
