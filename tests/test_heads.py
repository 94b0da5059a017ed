"""Policy heads (``model.head``, `sparring.policy.heads`): each option checked against the
registry with a one-line error naming its key, a policy's own head, what a head gives the
learner, and the help that lists them."""

import pytest

from sparring.config import ConfigError, commented_yaml, from_dict, policy_config
from sparring.policy.feature_cache import feature_cache_of
from sparring.policy.heads import HEADS, FrozenFeatures, LMHead, build_head
from sparring.train.learner import Learner
from tests import train_helpers as th

ENV = {"envs": [{"name": "tictactoe"}]}


@pytest.mark.parametrize("head, message", [
    ("{name: frozen}", r"model.head: unknown head 'frozen'; known: frozen_features, lm_head"),
    ("{name: frozen_features, cache: -1}",
     r"model.head: head 'frozen_features' option 'cache': -1 is out of range \(must be >= 0\)"),
    ("{name: frozen_features, center: 'yes'}",
     r"model.head: head 'frozen_features' option 'center' takes a bool, got 'yes'"),
    ("{name: frozen_features, cach: 8}",
     r"model.head: head 'frozen_features' has no option 'cach' \(did you mean 'cache'\?\)"),
    ("{name: lm_head, body_lr_scale: 1.5}",
     r"model.head: head 'lm_head' option 'body_lr_scale': 1.5 is out of range"),
    ("{cache: 8}", r"model.head: expected \{name: \.\.\., option: value, \.\.\.\}"),
])
def test_a_bad_head_is_a_one_line_config_error_naming_its_key(head, message):
    with pytest.raises(ConfigError, match=rf"^{message}") as e:
        from_dict(ENV, [f"model.head={head}"])
    assert "\n" not in str(e.value)


def test_a_policys_own_head_replaces_the_top_level_one_of_another_name():
    data = {"model": {"head": {"name": "lm_head", "body_lr_scale": 0.5}},
            "policies": {"a": {"model": {"head": {"name": "frozen_features", "cache": 8}}},
                         "b": {"model": {"head": {"body_lr_scale": 0.25}}}},
            "envs": [{"name": "tictactoe", "seats": ["a", "b"]}]}
    cfg = from_dict(data)
    assert policy_config(cfg, "a").model.head == {"name": "frozen_features", "cache": 8}
    assert policy_config(cfg, "b").model.head == {"name": "lm_head", "body_lr_scale": 0.25}
    bad = {**data, "policies": {**data["policies"],
                                "a": {"model": {"head": {"name": "frozen_features",
                                                         "cache": -1}}}}}
    with pytest.raises(ConfigError, match=r"^policies.a.model.head: head 'frozen_features' "
                                          r"option 'cache': -1 is out of range"):
        from_dict(bad)


def test_what_each_head_gives_the_learner():
    assert build_head({"name": "lm_head"}) == LMHead()
    assert build_head({"name": "lm_head"}).body_lr_scale == 1.0
    frozen = build_head({"name": "frozen_features", "cache": 16, "center": True})
    assert isinstance(frozen, FrozenFeatures) and frozen.body_lr_scale == 0.0
    assert frozen.transforms and not FrozenFeatures().transforms
    model = th.tiny_qwen(3)
    learner = Learner(model, from_dict({"algorithm": {"estimator": "grpo"},
                                        "model": {"head": {"name": "frozen_features",
                                                           "cache": 16, "center": True}}}))
    assert learner.features is feature_cache_of(model) and learner.features.center
    assert learner.params == [model.lm_head.weight]
    assert learner.head_state.state_dict() == {}  # no transform before the first update
    plain = Learner(th.tiny_qwen(3), from_dict({"algorithm": {"estimator": "grpo"}}))
    assert plain.features is None and plain.head_state.state_dict() == {}
    uncached = Learner(th.tiny_qwen(3), from_dict({
        "algorithm": {"estimator": "grpo"},
        "model": {"head": {"name": "frozen_features", "cache": 0}}}))
    assert uncached.features is None and uncached.params == [uncached.model.lm_head.weight]


def test_the_reference_lists_every_head_with_its_options():
    text = commented_yaml()
    for entry in HEADS:
        assert f"#   {entry.name}: " in text
    assert "#     whiten (default 0.0): " in text
