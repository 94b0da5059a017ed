"""How a step's rows are cut: train.minibatch_order (the order an epoch visits a batch's
rows before cutting mini-batches) and train.microbatch_tokens (micro-batches by length)."""

from __future__ import annotations

import copy
import itertools
from collections import Counter

import pytest
import torch

from sparring.config import ConfigError
from sparring.train.learner import Learner
from sparring.train.minibatches import by_length, epoch_order, grouped_permutation, prompt_index
from tests import train_helpers as th
from tests.test_train_learner import make_cfg, shared_prompt_batch
from tests.train_helpers import first_step_grads

pytestmark = pytest.mark.usefixtures("train_doubles")


def _runs(perm: list[int], group: list[int]) -> list[int]:
    """The groups of ``perm``'s rows in order, each run of equal groups once."""
    return [g for g, _ in itertools.groupby(group[i] for i in perm)]


def test_grouped_permutation_visits_every_row_once_with_each_group_contiguous():
    gen = torch.Generator().manual_seed(0)
    group = torch.randint(0, 7, (40,), generator=torch.Generator().manual_seed(1))
    for _ in range(50):
        perm = grouped_permutation(group, gen).tolist()
        assert sorted(perm) == list(range(40))
        runs = _runs(perm, group.tolist())
        assert len(runs) == len(set(runs)) == len(set(group.tolist()))  # one run a group


def test_grouped_permutation_draws_every_order_of_groups_and_of_rows_alike():
    """Groups {0}, {1, 2}, {3, 4, 5}: each of the 6 orders of the groups, and each of the 6
    orders of the 3-row group's rows, about 3000 / 6 times (a binomial count of sd 20.4:
    the bounds are 5 sd)."""
    group = torch.tensor([2, 1, 0, 2, 1, 2])  # group 0: row 2; 1: rows 1, 4; 2: rows 0, 3, 5
    gen = torch.Generator().manual_seed(0)
    orders, inner = Counter(), Counter()
    for _ in range(3000):
        perm = grouped_permutation(group, gen).tolist()
        orders[tuple(_runs(perm, group.tolist()))] += 1
        inner[tuple(i for i in perm if group[i] == 2)] += 1
    assert len(orders) == len(inner) == 6
    assert all(398 <= c <= 602 for c in (*orders.values(), *inner.values())), (orders, inner)


def test_prompt_index_is_the_rows_prompt_up_to_the_first_action_token():
    batch, _ = shared_prompt_batch(prompts=3, samples=4, repeat=2)
    index = prompt_index(batch.input_ids, batch.action_mask, batch.attention_mask).tolist()
    first = batch.action_mask.int().argmax(1).tolist()
    prompts = [tuple(batch.input_ids[i, :first[i]].tolist()) for i in range(batch.n_rows)]
    by_hand = {p: k for k, p in enumerate(dict.fromkeys(prompts))}  # first seen, first index
    assert index == [by_hand[p] for p in prompts]
    assert len(set(index)) == 3


def test_rows_order_is_a_plain_permutation_and_prompt_order_needs_the_index():
    a, b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(epoch_order("rows", 9, None, a), torch.randperm(9, generator=b))
    with pytest.raises(ValueError, match="prompt index of each of the 9 rows"):
        epoch_order("prompt", 9, None, a)


def test_prompt_order_gives_each_minibatch_whole_prompts_and_one_prompt_run_each(monkeypatch):
    """4 prompts x 4 samples, mini-batches of 4 rows: with ``prompt`` each mini-batch is one
    prompt's 4 rows, so each forward runs that prompt once (a [1, P] prefill under
    share_prefix); with ``rows`` the mini-batches mix prompts. Every row is trained once
    an epoch either way."""
    batch, adv = shared_prompt_batch(prompts=4, samples=4)
    index = prompt_index(batch.input_ids, batch.action_mask, batch.attention_mask).tolist()
    for order in ("rows", "prompt"):
        learner = Learner(th.tiny_qwen(4), make_cfg(train__minibatch_size=4, train__epochs=2,
                                                    train__minibatch_order=order))
        seen: list[list[int]] = []

        def recording(passes, b, part, *rest, seen=seen, loss=learner._micro_loss):
            seen.append(part.tolist())
            return loss(passes, b, part, *rest)

        monkeypatch.setattr(learner, "_micro_loss", recording)
        with th.forward_shapes(learner.model) as shapes:
            out = learner.update(batch, adv)
        assert out["optimizer_steps"] == 8
        for epoch in (seen[:4], seen[4:]):
            assert sorted(r for part in epoch for r in part) == list(range(16))
        distinct = [len({index[r] for r in part}) for part in seen]
        if order == "prompt":
            assert distinct == [1] * 8
            assert [s[0] for s in shapes] == [1, 4] * 8  # the prompt once, then 4 moves
        else:
            assert max(distinct) > 1


def test_one_minibatch_is_the_same_update_in_either_order():
    """With the whole batch in one mini-batch the order of its rows changes only the
    summation order: the same gradient to float rounding."""
    batch, adv = shared_prompt_batch(prompts=3, samples=4, repeat=3)
    model0 = th.tiny_qwen(6)
    grads = []
    for order in ("rows", "prompt"):
        learner = Learner(copy.deepcopy(model0), make_cfg(train__minibatch_order=order))
        learner.update(batch, adv)
        grads.append(first_step_grads(learner))
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, atol=2e-6, rtol=1e-4)


def test_an_unknown_minibatch_order_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match="minibatch_order"):
        make_cfg(train__minibatch_order="by_prompt")


def test_by_length_cuts_the_rows_longest_first_within_the_token_budget():
    """By hand: lengths 3, 9, 4, 9, 2, 5 of rows 10-15, longest first (equal ones in their
    order): 11 and 13 (2 x 9 <= 18), then 15, 12, 10 (3 x 5 <= 18), then 14; with 8 tokens
    a row of 9 runs alone."""
    rows, lengths = torch.arange(10, 16), torch.tensor([3, 9, 4, 9, 2, 5])
    assert [p.tolist() for p in by_length(rows, lengths, 18)] == [[11, 13], [15, 12, 10], [14]]
    assert [p.tolist() for p in by_length(rows, lengths, 8)] == [[11], [13], [15], [12, 10],
                                                                 [14]]
    assert by_length(rows[:0], lengths[:0], 8) == []


def test_microbatch_tokens_is_refused_beside_microbatch_size_and_with_sharded_weights():
    with pytest.raises(ConfigError, match="set one of them"):
        make_cfg(train__microbatch_size=4, train__microbatch_tokens=512)
    with pytest.raises(ConfigError, match="not with distributed.sharding: full"):
        make_cfg(train__microbatch_tokens=512, distributed__sharding="full")
