"""TAG's heterogeneous GNN prior (policies/tag.py) on synthetic observations of the TAG layout."""

from __future__ import annotations

from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.nn import functional as F

from placement_rl.envs.observation import COL_CURRENT, NODE_DIM, NUM_TAG_OPTIONS, Layout
from placement_rl.errors import SchemaError
from placement_rl.policies.tag import (
    DST_RELATIONS,
    MASK_LOGIT,
    OP_IN,
    PRESETS,
    RELATIONS,
    TagGNN,
    TagGNNConfig,
    TagRLModule,
    build_graph,
    count_parameters,
    cross_entropy,
    prior_probs,
    stack_observations,
    synthetic_observation,
)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """One torch thread: small graphs run faster, and steadier on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SMALL = {"groups": 7, "edges": 9, "device_groups": 3, "subsets": 5, "decided": 2}


def _obs(seed: int = 0, **kwargs: object) -> dict[str, np.ndarray]:
    return synthetic_observation(np.random.default_rng(seed), **{**SMALL, **kwargs})  # type: ignore[arg-type]


def _gnn(seed: int = 0, num_options: int = NUM_TAG_OPTIONS, **config: object) -> TagGNN:
    torch.manual_seed(seed)
    sizes = TagGNNConfig(**{"hidden": 16, "heads": 2, "layers": 2, "edge_hidden": 8, **config})  # type: ignore[arg-type]
    return TagGNN(sizes, num_options=num_options).eval()


def _real_actions(subsets: int) -> slice:
    return slice(0, subsets * NUM_TAG_OPTIONS)


def test_shapes_and_finite_values() -> None:
    gnn = _gnn()
    obs = stack_observations([_obs(0), _obs(1)])
    logits, values = gnn(obs)
    assert logits.shape == (2, SMALL["subsets"] * NUM_TAG_OPTIONS)
    assert values.shape == (2,)
    assert torch.isfinite(logits).all() and torch.isfinite(values).all()
    probs = prior_probs(gnn, [_obs(0), _obs(1)])
    assert probs.shape == (2, SMALL["subsets"] * NUM_TAG_OPTIONS) and probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-5)


def test_masked_actions_get_zero_probability() -> None:
    obs = _obs(0)
    obs["action_mask"][[0, 5, 6, 13]] = 0
    probs = prior_probs(_gnn(), [obs])[0]
    assert (probs[obs["action_mask"] == 0] == 0.0).all()
    assert (probs[obs["action_mask"] == 1] > 0.0).all()
    logits, _ = _gnn()(stack_observations([obs]))
    assert (logits[0, torch.from_numpy(obs["action_mask"] == 0)] == MASK_LOGIT).all()


def test_padding_does_not_change_the_real_actions() -> None:
    gnn = _gnn()
    tight = prior_probs(gnn, [_obs(3)])[0]
    padded = prior_probs(gnn, [_obs(3, pad=(5, 11, 4, 6))])[0]
    real = _real_actions(SMALL["subsets"])
    np.testing.assert_allclose(padded[real], tight[real], rtol=1e-5, atol=1e-7)
    assert (padded[real.stop :] == 0.0).all()


def test_op_node_order_does_not_matter() -> None:
    obs = _obs(4)
    n = SMALL["groups"]
    perm = np.random.default_rng(0).permutation(n)  # new row i holds old group perm[i]
    inverse = np.argsort(perm)
    shuffled = dict(obs)
    for key in ("node_features", "node_option", "node_placement"):
        shuffled[key] = obs[key].copy()
        shuffled[key][:n] = obs[key][perm]
    edges = obs["edge_index"].copy()
    real = obs["edge_mask"] == 1
    edges[:, real] = inverse[obs["edge_index"][:, real]]
    shuffled["edge_index"] = edges
    assert shuffled["node_features"][:, COL_CURRENT].argmax() == inverse[obs["node_features"][:, COL_CURRENT].argmax()]
    gnn = _gnn()
    np.testing.assert_allclose(prior_probs(gnn, [shuffled]), prior_probs(gnn, [obs]), rtol=1e-5, atol=1e-7)


def test_a_batch_equals_each_sample_alone() -> None:
    gnn = _gnn()
    a, b = _obs(5), _obs(6, groups=5, edges=4, device_groups=2, decided=0, pad=(2, 5, 1, 0))
    together = prior_probs(gnn, [a, b])
    np.testing.assert_allclose(together[0], prior_probs(gnn, [a])[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(together[1], prior_probs(gnn, [b])[0], rtol=1e-5, atol=1e-7)
    obs = stack_observations([a, b])
    values = gnn(obs)[1]
    assert torch.allclose(values[1], gnn(stack_observations([b]))[1][0], atol=1e-6)


@pytest.mark.parametrize("relation_aggr", ["gamma", "mean"])
def test_relation_aggregations_run(relation_aggr: str) -> None:
    gnn = _gnn(relation_aggr=relation_aggr)
    probs = prior_probs(gnn, [_obs(0)])
    assert np.isfinite(probs).all() and abs(probs.sum() - 1.0) < 1e-5
    expected = [
        (gnn.config.gamma_same if s == d else gnn.config.gamma_cross)
        if relation_aggr == "gamma"
        else 1.0 / len(DST_RELATIONS[d])
        for _, s, d in RELATIONS
    ]
    assert gnn.relation_scale.tolist() == pytest.approx(expected)  # type: ignore[operator]


def _reference_layer(gnn: TagGNN, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The first layer, one relation and one destination at a time (the fused layer must agree)."""
    g = build_graph(obs)
    layer = gnn.layers[0]
    h = {"op": gnn.op_encoder(g.x_op), "dev": gnn.dev_encoder(g.x_dev)}
    H, heads = layer.hidden, layer.heads
    kinds = {"op_fwd": "tensor", "op_bwd": "tensor", "dev_dev": "link", "op_dev": "placement", "dev_op": "placement"}
    start = 0
    out = {t: torch.zeros_like(x) for t, x in h.items()}
    n_op = h["op"].shape[0]
    for r, (name, s, d) in enumerate(RELATIONS):
        size = g.sizes[r]
        rows = slice(start, start + size)
        start += size
        src_pos = [i for i, (_, s2, _) in enumerate(RELATIONS) if s2 == s].index(r)
        dst_pos = [i for i, (_, _, d2) in enumerate(RELATIONS) if d2 == d].index(r)
        w_src = layer.src_lin[s].weight[src_pos * H : (src_pos + 1) * H]
        b_src = layer.src_lin[s].bias[src_pos * H : (src_pos + 1) * H]
        w_dst = layer.dst_lin[d].weight[dst_pos * H : (dst_pos + 1) * H]
        n_src_rel = len([1 for _, s2, _ in RELATIONS if s2 == s])
        n_dst_rel = len(DST_RELATIONS[d])
        src = (g.src_row[rows] - (0 if s == "op" else n_op * 3)) // n_src_rel
        dst = (g.dst_row[rows] - (0 if d == "op" else n_op * 3)) // n_dst_rel
        e = gnn.edge_encoders[kinds[name]](g.edge_attr[kinds[name]])
        scale = gnn.relation_scale[r]  # type: ignore[index]
        for u in range(h[d].shape[0]):
            mine = (dst == u).nonzero().squeeze(1)
            if len(mine) == 0:
                continue
            m = (h[s][src[mine]] @ w_src.T + b_src + e[mine] @ layer.edge_weight[r]).view(-1, heads, H // heads)
            q = (h[d][u] @ w_dst.T).view(heads, H // heads)
            alpha = torch.softmax((F.leaky_relu(m + q, 0.2) * layer.att[r]).sum(-1), dim=0)  # (edges, heads)
            out[d][u] += scale * (alpha.unsqueeze(-1) * F.leaky_relu(m, 0.2)).sum(0).reshape(H)
    return {t: layer.norm[t](h[t] + out[t]) for t in h}


def test_fused_layer_matches_a_per_relation_loop() -> None:
    gnn = _gnn(layers=1)
    obs = stack_observations([_obs(7), _obs(8)])
    h_op, h_dev, _ = gnn.embed(obs)
    expected = _reference_layer(gnn, obs)
    torch.testing.assert_close(h_op, expected["op"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(h_dev, expected["dev"], rtol=1e-4, atol=1e-5)


def test_adam_on_cross_entropy_lowers_it() -> None:
    torch.manual_seed(0)
    gnn = _gnn().train()
    observations = [_obs(0), _obs(1), _obs(2)]
    batch = stack_observations(observations)
    rng = np.random.default_rng(0)
    pi = rng.random(batch["action_mask"].shape).astype(np.float32) ** 4 * batch["action_mask"].numpy()
    pi = torch.from_numpy(pi / pi.sum(1, keepdims=True))
    optimizer = torch.optim.Adam(gnn.parameters(), lr=3e-3)
    losses = []
    for step in range(30):
        loss = cross_entropy(gnn, batch, pi)
        optimizer.zero_grad()
        loss.backward()
        if step == 0:  # every weight but the value head's gets a gradient (all relations are used)
            missing = [n for n, p in gnn.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
            assert all(n.startswith("value_mlp.") for n in missing), missing
        optimizer.step()
        losses.append(loss.item())
    assert np.isfinite(losses).all()
    assert losses[-1] < losses[0] - 0.1
    entropy = float(-(pi * torch.log(pi.clamp(min=1e-30))).sum(1).mean())
    assert losses[-1] >= entropy - 1e-4  # cross-entropy is bounded by the target's entropy


def test_an_empty_observation_gives_finite_uniform_logits() -> None:
    """RLlib builds dummy batches of zeros: no nodes, no groups, no valid action."""
    empty = {k: np.zeros_like(v) for k, v in _obs(0).items()}
    logits, values = _gnn()(stack_observations([empty, _obs(1)]))
    assert (logits[0] == MASK_LOGIT).all() and torch.isfinite(values).all()
    torch.testing.assert_close(logits[1], _gnn()(stack_observations([_obs(1)]))[0][0])


def test_state_dict_round_trip_gives_identical_outputs() -> None:
    gnn = _gnn(seed=1)
    other = _gnn(seed=2)
    obs = stack_observations([_obs(0), _obs(1)])
    assert not torch.equal(gnn(obs)[0], other(obs)[0])
    other.load_state_dict(gnn.state_dict())
    assert torch.equal(gnn(obs)[0], other(obs)[0]) and torch.equal(gnn(obs)[1], other(obs)[1])


def _spaces(
    n: int = 9, e: int = 12, k: int = 4, s: int = 6, options: int = NUM_TAG_OPTIONS
) -> tuple[gym.spaces.Dict, gym.spaces.Discrete]:
    layout = Layout(
        max_nodes=n,
        max_edges=e,
        max_devices=8,
        num_actions=s * options,
        max_device_groups=k,
        max_subsets=s,
        num_options=options,
    )
    return layout.space(), gym.spaces.Discrete(s * options)


@pytest.mark.parametrize("options", [NUM_TAG_OPTIONS, 7])
def test_rl_module_builds_from_a_spec_and_acts(options: int) -> None:
    from ray.rllib.core import Columns
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    obs_space, action_space = _spaces(options=options)
    spec = RLModuleSpec(
        module_class=TagRLModule,
        observation_space=obs_space,
        action_space=action_space,
        model_config={"hidden": 16, "heads": 2, "layers": 1, "vf_share_layers": False},
    )
    module = spec.build()
    assert isinstance(module, TagRLModule) and module.gnn.config.hidden == 16
    assert module.gnn.num_options == options and module.gnn.option_embedding.shape[0] == options
    # A real observation padded to the space, and the space's own random sample (RLlib's dummy batches).
    real = _obs(0, pad=(2, 3, 1, 1), num_options=options)
    full = {k: v for k, v in obs_space.sample().items()}
    full.update(real)
    sample = obs_space.sample()
    batch = {Columns.OBS: {k: torch.as_tensor(np.stack([full[k], sample[k]])) for k in obs_space.spaces}}
    out = module.forward_inference(batch)
    logits = out[Columns.ACTION_DIST_INPUTS]
    assert logits.shape == (2, action_space.n) and torch.isfinite(logits).all()
    dist = module.get_inference_action_dist_cls().from_logits(logits)
    actions = dist.sample()
    assert bool(batch[Columns.OBS]["action_mask"][0, actions[0]]) and torch.isfinite(dist.entropy()).all()
    train = module.forward_train(batch)
    values = module.compute_values(batch, embeddings=train.get(Columns.EMBEDDINGS))
    assert values.shape == (2,) and torch.allclose(values, module.compute_values(batch))
    probs = prior_probs(module, [full])
    np.testing.assert_allclose(probs[0], torch.softmax(logits[0], -1).detach().numpy(), rtol=1e-5, atol=1e-7)


def test_model_config_presets_and_errors() -> None:
    assert TagGNNConfig.from_model_config(None) == PRESETS["default"]
    paper = TagGNNConfig.from_model_config({"preset": "paper", "relation_aggr": "mean", "fcnet_hiddens": [8]})
    assert (paper.hidden, paper.heads, paper.layers, paper.relation_aggr) == (256, 4, 4, "mean")
    with pytest.raises(SchemaError, match="hiden"):
        TagGNNConfig.from_model_config({"hiden": 8})
    with pytest.raises(SchemaError, match="multiple"):
        TagGNNConfig.from_model_config({"hidden": 10, "heads": 4})
    obs_space, _ = _spaces()
    with pytest.raises(ValueError, match="Discrete"):
        from ray.rllib.core.rl_module.rl_module import RLModuleSpec

        RLModuleSpec(module_class=TagRLModule, observation_space=obs_space, action_space=gym.spaces.Discrete(5)).build()
    # The option count comes from the observation (node_option's columns): 7 options x 6 subsets, not 4 x 6.
    extended, _ = _spaces(options=7)
    with pytest.raises(ValueError, match=r"Discrete\(7 \* 6\) actions"):
        RLModuleSpec(module_class=TagRLModule, observation_space=extended, action_space=gym.spaces.Discrete(24)).build()


def test_default_is_smaller_than_paper() -> None:
    assert count_parameters(TagGNN(PRESETS["default"])) < count_parameters(TagGNN(PRESETS["paper"]))


# ------------------------------------------------------------------ the option count (env tag_options)
def test_extended_options_give_seven_logits_per_subset() -> None:
    """``tag_options: extended``: 7 options per subset, ``a = s * 7 + o``, masked as the observation says."""
    gnn = _gnn(num_options=7)
    observations = [_obs(0, num_options=7), _obs(1, num_options=7, pad=(1, 2, 1, 3))]
    assert observations[0]["node_option"].shape == (SMALL["groups"], 7)
    assert observations[0]["action_mask"].shape == (SMALL["subsets"] * 7,)
    logits, values = gnn(stack_observations(observations[:1]))
    assert logits.shape == (1, SMALL["subsets"] * 7) and values.shape == (1,)
    mask = torch.from_numpy(observations[0]["action_mask"] > 0)
    assert torch.isfinite(logits).all() and (logits[0, ~mask] == MASK_LOGIT).all() and mask.any()
    probs = prior_probs(gnn, observations[1:])[0]
    assert probs.shape == ((SMALL["subsets"] + 3) * 7,) and (probs[SMALL["subsets"] * 7 :] == 0.0).all()
    assert probs.sum() == pytest.approx(1.0, rel=1e-5) and (probs[observations[1]["action_mask"] == 0] == 0).all()
    assert gnn.option_embedding.shape[0] == 7 and gnn.edge_encoders["placement"].weight.shape[1] == 7
    assert gnn.op_encoder[0].weight.shape[1] == OP_IN + 3


def test_four_options_keep_the_parameter_shapes_and_outputs() -> None:
    """The default (TAG's 4 options) is the prior as it was: the same parameter shapes (its
    checkpoints load) and, from one seed, the same weights and outputs as ``num_options=4``."""
    default, four = _gnn(seed=3), _gnn(seed=3, num_options=4)
    shapes = {k: tuple(v.shape) for k, v in default.state_dict().items()}
    assert shapes == {k: tuple(v.shape) for k, v in four.state_dict().items()}
    assert OP_IN == NODE_DIM + 2 + 4 + 1 and shapes["op_encoder.0.weight"] == (16, OP_IN)
    assert shapes["option_embedding"] == (4, 16) and shapes["edge_encoders.placement.weight"] == (8, 4)
    obs = stack_observations([_obs(0), _obs(1)])
    assert all(torch.equal(default(obs)[i], four(obs)[i]) for i in range(2))
    extended = _gnn(seed=3, num_options=7)
    with pytest.raises(RuntimeError, match="size mismatch"):  # a 4-option checkpoint is not a 7-option one
        extended.load_state_dict(default.state_dict())
    with pytest.raises(ValueError, match=r"TagGNN built for 4 TAG options got observations with 7"):
        default(stack_observations([_obs(0, num_options=7)]))
    with pytest.raises(ValueError, match=r"num_options = 0; expected an integer >= 1"):
        TagGNN(num_options=0)
