"""Expert parallelism on paper: the expert weights one rank holds, and the all-to-all bytes of a
mixture-of-experts layer.

Experts spread over `ep` ranks (GShard, Lepikhin et al. 2020, https://arxiv.org/abs/2006.16668;
Switch, Fedus et al. 2021, https://arxiv.org/abs/2101.03961); not an axis of the planner's mesh
(`accounting.parallel`). The `ep_*` functions take sizes; `expert_params`, `ep_rank_params` and
`moe_sent_bytes` take a mixture-of-experts config (`TransformerConfig` with `n_experts` >= 1:
its MLP kind, biases, expert width, top-k and layers). Pure: no torch. Used in: the parallelism
one-pager, the planner.
"""

from __future__ import annotations

from mlsys import checks
from mlsys.accounting.comms import collective_cost
from mlsys.accounting.params import architecture, config_sizes, mlp_params
from mlsys.dtypes import bytes_per_element


def ep_expert_params(d_model: int, d_ff: int, n_experts: int, ep: int) -> int:
    """Expert parameters one rank holds when `n_experts` SwiGLU experts of width `d_ff` are spread
    over `ep` ranks: n_experts / ep experts of 3 d_model d_ff each (the router, d_model x
    n_experts, and the rest of the model are not counted: every rank holds them)."""
    checks.positive_ints(d_model=d_model, d_ff=d_ff, n_experts=n_experts, ep=ep)
    if n_experts % ep:
        raise ValueError(f"n_experts ({n_experts}) is not divisible by ep ({ep}): "
                         f"{n_experts} / {ep} = {n_experts / ep:g} experts per rank")
    return n_experts // ep * 3 * d_model * d_ff


def ep_sent_bytes(d_model: int, ep: int, *, tokens: int, top_k: int = 1, n_moe_layers: int = 1,
                  act_dtype: str = "bf16", capacity_factor: float = 1.0,
                  microbatches: int = 1) -> float:
    """Bytes a rank sends per step for expert parallelism (GShard, Lepikhin et al. 2020,
    https://arxiv.org/abs/2006.16668; Switch, Fedus et al. 2021, https://arxiv.org/abs/2101.03961).

    Per MoE layer and micro-batch of `tokens` on this rank, one all-to-all sends each token's
    d_model vector to each of its `top_k` experts (dispatch) and another brings the expert outputs
    back (combine); the backward sends their gradients the same two ways: 4 all-to-alls, each of
    a buffer of capacity_factor x top_k x tokens x d_model elements per rank (slots sized by the
    capacity factor travel whether filled or not), of which (ep - 1) / ep leaves the rank when
    the router spreads the tokens evenly (`comms.collective_cost("all_to_all")`)."""
    checks.positive_ints(d_model=d_model, ep=ep, tokens=tokens, top_k=top_k,
                         microbatches=microbatches)
    layers = checks.nonnegative_int(n_moe_layers, "n_moe_layers")
    cf = checks.positive(capacity_factor, "capacity_factor")
    buffer = cf * top_k * tokens * d_model * bytes_per_element(act_dtype)
    return microbatches * layers * 4 * collective_cost("all_to_all", buffer, ep).sent_bytes


def ep_compute_bound_d_ff(ep: int, *, flop_per_s: float, link_bytes_per_s: float,
                          act_dtype: str = "bf16") -> float:
    """Expert width above which a SwiGLU expert's forward and backward (3 matmuls of 2 d_model d_ff
    FLOPs per routed token, x 3 for the backward: 18 d_model d_ff) take longer than the token's
    4 all-to-all transfers (`ep_sent_bytes`, capacity factor 1) at `link_bytes_per_s`:

        18 D F / C > 4 D b (ep - 1) / ep / W   <=>   F > (2 / 9) b (ep - 1) / ep x C / W

    whatever the batch and top_k (both sides scale with the routed tokens). 0 for ep = 1."""
    e = checks.positive_int(ep, "ep")
    c = checks.positive(flop_per_s, "flop_per_s")
    w = checks.positive(link_bytes_per_s, "link_bytes_per_s")
    return 2 / 9 * bytes_per_element(act_dtype) * (e - 1) / e * c / w


def _moe(cfg) -> tuple[int, int]:
    """(d_model, n_layers) of a mixture-of-experts config; ValueError for a dense one."""
    d, n_layers = config_sizes(cfg, "d_model", "n_layers")
    if not architecture(cfg).is_moe:
        raise ValueError(f"cfg.n_experts must be >= 1 for expert parallelism, got "
                         f"{getattr(cfg, 'n_experts', 0)} (a dense model)")
    return d, n_layers


def expert_params(cfg) -> int:
    """Parameters of one expert of `cfg`: an MLP of width `expert_d_ff` (3 d f for SwiGLU, 2 d f
    for GeLU and ReLU), with its biases when the config has them (`params.mlp_params`)."""
    d, _ = _moe(cfg)
    arch = architecture(cfg)
    return mlp_params(d, arch.expert_d_ff, arch.mlp, arch.bias)


def ep_rank_params(cfg, ep: int) -> int:
    """Routed-expert parameters one rank holds over every layer when `cfg`'s experts are spread
    over `ep` ranks: n_layers x n_experts / ep x `expert_params`. The router and the shared
    experts, like the rest of the model, are on every rank and not counted here."""
    _, n_layers = _moe(cfg)
    arch = architecture(cfg)
    e = checks.positive_int(ep, "ep")
    if arch.n_experts % e:
        raise ValueError(f"cfg.n_experts ({arch.n_experts}) is not divisible by ep ({e}): "
                         f"{arch.n_experts} / {e} = {arch.n_experts / e:g} experts per rank")
    return n_layers * arch.n_experts // e * expert_params(cfg)


def moe_sent_bytes(cfg, ep: int, *, tokens: int, act_dtype: str = "bf16",
                   capacity_factor: float = 1.0, microbatches: int = 1) -> float:
    """Bytes a rank sends per step for expert parallelism of `cfg` (`ep_sent_bytes` with its
    d_model, top-k = experts_per_token and every layer a MoE layer), `tokens` per micro-batch on
    this rank. Shared experts run where the token is and send nothing. `ep` must divide
    n_experts."""
    d, n_layers = _moe(cfg)
    arch = architecture(cfg)
    e = checks.positive_int(ep, "ep")
    if arch.n_experts % e:
        raise ValueError(f"cfg.n_experts ({arch.n_experts}) is not divisible by ep ({e})")
    return ep_sent_bytes(d, e, tokens=tokens, top_k=arch.experts_per_token,
                         n_moe_layers=n_layers, act_dtype=act_dtype,
                         capacity_factor=capacity_factor, microbatches=microbatches)
