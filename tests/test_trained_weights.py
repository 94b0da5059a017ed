"""The weights a checkpoint holds for a plain model with frozen weights (a frozen network
under a trained head): the trained ones alone, and a digest of the others that a load
checks against the model it rebuilds (`sparring.policy.lora`)."""

import hashlib

import numpy as np
import pytest
import torch
from torch import nn

from sparring.policy.heads import freeze_body, untie_output_layer
from sparring.policy.lora import frozen_sha256, load_trainable_state, trainable_state
from sparring.policy.tiny import build_tiny_model

SMALL = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "num_kv_heads": 2,
         "intermediate_size": 32}


def frozen_body(seed: int = 0) -> nn.Module:
    model, _ = build_tiny_model({**SMALL, "seed": seed})
    untie_output_layer(model)
    freeze_body(model)
    return model


def test_the_digest_covers_name_dtype_shape_and_bytes_of_what_is_left_out():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2))
    model[0].requires_grad_(False)
    want = hashlib.sha256()
    for name in ("0.bias", "0.weight"):  # name order; the trained layer 1 is held
        value = model.state_dict()[name]
        want.update(f"{name}|torch.float32|{tuple(value.shape)}\n".encode())
        want.update(np.ascontiguousarray(value.numpy()).tobytes())
    assert frozen_sha256(model, {"1.weight", "1.bias"}) == want.hexdigest()
    with torch.no_grad():
        model[0].bias[0] += 1e-6
    assert frozen_sha256(model, {"1.weight", "1.bias"}) != want.hexdigest()
    assert frozen_sha256(model.to(torch.float64), {"1.weight", "1.bias"}) != want.hexdigest()


def test_a_frozen_body_saves_its_head_alone_and_loads_into_the_same_body():
    trained = frozen_body()
    with torch.no_grad():
        trained.lm_head.weight.mul_(3.0)
    state = trainable_state(trained)
    assert set(state) == {"lm_head.weight"}
    digest = frozen_sha256(trained, state)
    fresh = frozen_body()
    load_trainable_state(fresh, {k: v.clone() for k, v in state.items()}, frozen=digest)
    want, got = trained.state_dict(), fresh.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_trained_weights_refuse_another_body_and_load_nothing():
    trained = frozen_body(seed=0)
    state = {k: v * 3.0 for k, v in trainable_state(trained).items()}
    digest = frozen_sha256(trained, state)
    other = frozen_body(seed=1)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(ValueError, match=r"the trained weights only \(1 of \d+\); the rest "
                       r"must be the frozen weights they trained with"):
        load_trainable_state(other, state, frozen=digest)
    with pytest.raises(ValueError, match=r"hold 1 of the model's \d+ entries and no digest"):
        load_trainable_state(other, state)
    assert all(torch.equal(v, before[k]) for k, v in other.state_dict().items())


def test_a_whole_model_loads_without_a_digest_and_a_stray_key_is_an_error():
    model, fresh = frozen_body(), frozen_body(seed=1)
    whole = {k: v.clone() for k, v in model.state_dict().items()}  # as saved before
    load_trainable_state(fresh, whole)
    assert all(torch.equal(v, whole[k]) for k, v in fresh.state_dict().items())
    with pytest.raises(RuntimeError, match="Unexpected key"):
        load_trainable_state(fresh, {"lm_head.weight": whole["lm_head.weight"],
                                     "not.a.weight": torch.zeros(1)}, frozen="0" * 64)
