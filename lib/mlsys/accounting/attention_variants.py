"""Variants of the attention block: grouped-query, the KV cache, sliding-window, sparse, linear.

Grouped-query attention (Ainslie et al. 2023, arXiv:2305.13245) lets each group of
n_heads / n_kv_heads query heads share one key head and one value head; multi-query attention
(Shazeer 2019, arXiv:1911.02150) is n_kv_heads = 1, multi-head attention n_kv_heads = n_heads.
The k and v projections and the KV cache shrink by the group size; the score and value matmuls
do not (every query head still attends every key). A sliding window of w keys (Beltagy et al.
2020, arXiv:2004.05150; Mistral 7B) caps each query's keys at w: pairs grow like w T, not T^2,
and the cache keeps w tokens. The Sparse Transformer's strided pattern (Child et al. 2019,
arXiv:1904.10509) at stride sqrt(T) gives a query at most ~2 sqrt(T) keys. Linear attention
(Katharopoulos et al. 2020, arXiv:2006.16236) replaces softmax(Q K^T) V by phi(Q) (phi(K)^T V):
4 T d_phi (d + 1) FLOPs per head, no T^2 term, and a d_phi x (d + 1) state instead of a cache.

Sizes as in `accounting.attention`. Pure: ints and dtype names in, ints and `Traffic` out.
Used in: the book page "The attention block: one page" (§sec-attention-onepager).
"""

from __future__ import annotations

from mlsys import checks
from mlsys.accounting.bytes import Traffic
from mlsys.dtypes import bytes_per_element


def _kv_heads(n_heads: int, n_kv_heads: object) -> int:
    """n_kv_heads (n_heads when None), checked to divide n_heads."""
    n_heads = checks.positive_int(n_heads, "n_heads")
    if n_kv_heads is None:
        return n_heads
    n_kv = checks.positive_int(n_kv_heads, "n_kv_heads")
    if n_heads % n_kv:
        raise ValueError(f"n_heads ({n_heads}) is not divisible by n_kv_heads ({n_kv}): "
                         f"{n_heads} / {n_kv} = {n_heads / n_kv:g}; each key head serves a whole "
                         "group of query heads")
    return n_kv


def attention_params(d_model: int, n_heads: int, *, n_kv_heads: int | None = None,
                     d_head: int | None = None) -> dict[str, int]:
    """Parameters of the four bias-free projections, by module name: q_proj D x H d, k_proj and
    v_proj D x H_kv d each, o_proj H d x D. d_head defaults to D / H (which must divide), n_kv_heads
    to n_heads: 4 D^2 for multi-head attention (`params.param_counts(cfg).attention_per_layer`),
    2 D^2 + 2 D H_kv d with grouped-query attention."""
    d_model = checks.positive_int(d_model, "d_model")
    n_kv = _kv_heads(n_heads, n_kv_heads)
    if d_head is None:
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) is not divisible by n_heads ({n_heads}): "
                             f"{d_model} / {n_heads} = {d_model / n_heads:g}; pass d_head")
        d_head = d_model // n_heads
    d_head = checks.positive_int(d_head, "d_head")
    q, kv = d_model * n_heads * d_head, d_model * n_kv * d_head
    return {"q_proj": q, "k_proj": kv, "v_proj": kv, "o_proj": q}


def kv_cache_bytes_per_token(n_layers: int, n_kv_heads: int, d_head: int,
                             dtype: object = "bf16") -> int:
    """Bytes one token adds to the KV cache of the whole model: a key and a value of d_head per
    key head per layer, 2 L H_kv d b."""
    checks.positive_ints(n_layers=n_layers, n_kv_heads=n_kv_heads, d_head=d_head)
    return 2 * n_layers * n_kv_heads * d_head * bytes_per_element(dtype)


def kv_cache_bytes(batch: int, tokens: int, n_layers: int, n_kv_heads: int, d_head: int,
                   dtype: object = "bf16", *, window: int | None = None) -> int:
    """The KV cache of `batch` sequences of `tokens` tokens: B T 2 L H_kv d b; with a sliding
    `window` each sequence keeps only its last min(T, window) tokens (a rolling buffer)."""
    checks.positive_ints(batch=batch, tokens=tokens)
    kept = tokens if window is None else min(tokens, checks.positive_int(window, "window"))
    return batch * kept * kv_cache_bytes_per_token(n_layers, n_kv_heads, d_head, dtype)


def decode_attention_traffic(batch: int, heads: int, context: int, d_head: int,
                             dtype: object = "bf16", *, n_kv_heads: int | None = None) -> Traffic:
    """One decoding step of one layer's attention kernel: one new query per sequence attends the
    `context` cached keys (itself included). Reads q (B H d) and the cached K and V
    (2 B H_kv context d), writes O (B H d); appending the new k, v to the cache is the
    projection's write, not counted here. Its FLOPs: `attention_forward_flops(batch, heads, 1,
    context, d_head, causal=True)`, 4 B H context d: intensity about 2 (H / H_kv) / b FLOP/byte."""
    checks.positive_ints(batch=batch, context=context, d_head=d_head)
    n_kv = _kv_heads(heads, n_kv_heads)
    b = bytes_per_element(dtype)
    q = batch * heads * d_head * b
    return Traffic(q + 2 * batch * n_kv * context * d_head * b, q)


def _window_sum(n: int, window: int) -> int:
    """sum of min(t, window) for t = 1 ... n."""
    if n <= window:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def sliding_window_pairs(n_q: int, n_k: int, *, window: int) -> int:
    """(query, key) pairs of causal attention in which each query attends at most its last
    `window` keys, itself included (bottom-right: query i sees keys i + (n_k - n_q) - window + 1
    ... i + (n_k - n_q)); flash-attn's window_size=(window - 1, 0). Row i sees
    min(i + n_k - n_q + 1, window) keys: w T - w (w - 1) / 2 at n_q = n_k = T >= w, linear in T;
    window >= n_k gives `score_pairs(n_q, n_k, causal=True)`."""
    checks.positive_ints(n_q=n_q, n_k=n_k, window=window)
    first = max(1, n_k - n_q + 1)  # keys seen by the first query that sees any
    return _window_sum(n_k, window) - _window_sum(first - 1, window)


def strided_sparse_pairs(seq: int, *, stride: int) -> int:
    """Pairs of the Sparse Transformer's causal strided pattern (Child et al. 2019) with stride l,
    both of its sets in one head: query i attends the keys i - l ... i (local, min(i, l) + 1 of
    them) and every key j < i - l with (i - j) a multiple of l (max(0, floor(i / l) - 1) more).
    About T l + T^2 / (2 l) pairs, 1.5 T sqrt(T) at l = sqrt(T), instead of T (T + 1) / 2."""
    checks.positive_ints(seq=seq, stride=stride)
    local = seq + _window_sum(seq - 1, stride)  # sum over i of min(i, l) + 1
    blocks, rest = divmod(seq, stride)  # sum over i of floor(i / l), then less one per i >= l
    strided = stride * blocks * (blocks - 1) // 2 + rest * blocks - max(0, seq - stride)
    return local + strided


def masked_attention_forward_flops(batch: int, heads: int, d_head: int, pairs: int) -> int:
    """Forward matmul FLOPs of attention restricted to `pairs` (query, key) pairs per head (a
    sliding window's, a sparse pattern's): 4 d per pair, S = Q K^T and O = P V, as
    `attention_forward_flops` counts them."""
    checks.positive_ints(batch=batch, heads=heads, d_head=d_head)
    return 4 * batch * heads * d_head * checks.nonnegative_int(pairs, "pairs")


def linear_attention_flops(batch: int, heads: int, seq: int, d_head: int, *,
                           feature_dim: int | None = None) -> int:
    """Forward matmul FLOPs of linear attention, phi(Q) (phi(K)^T [V 1]) per head, the column of
    ones giving the normalizer phi(q_i) . sum_j phi(k_j): 2 T d_phi (d + 1) to build the state
    and as much to apply it, 4 B H T d_phi (d + 1) in all, causal (running sums) or not;
    d_phi = feature_dim, d_head by default. The feature map and the division are left out."""
    checks.positive_ints(batch=batch, heads=heads, seq=seq, d_head=d_head)
    d_phi = d_head if feature_dim is None else checks.positive_int(feature_dim, "feature_dim")
    return 4 * batch * heads * seq * d_phi * (d_head + 1)


def linear_attention_state_bytes(batch: int, heads: int, d_head: int, dtype: object = "fp32", *,
                                 feature_dim: int | None = None) -> int:
    """What causal linear attention keeps per layer while decoding, instead of a KV cache: the
    running sum of phi(k_j) [v_j 1]^T, a d_phi x (d + 1) matrix per head, whatever the length."""
    checks.positive_ints(batch=batch, heads=heads, d_head=d_head)
    d_phi = d_head if feature_dim is None else checks.positive_int(feature_dim, "feature_dim")
    return batch * heads * d_phi * (d_head + 1) * bytes_per_element(dtype)
