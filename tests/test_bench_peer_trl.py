"""bench/peer_trl.py's FLOP counter, checked against products counted by hand."""

import torch
import torch.nn.functional as F

from tests.helpers import load_bench

peer_trl = load_bench("peer_trl")


def test_flop_counter_counts_a_linear_layer_forward_and_backward():
    x = torch.randn(6, 5, requires_grad=True)
    w = torch.randn(7, 5, requires_grad=True)
    with peer_trl.flop_counter() as counter:
        F.linear(x, w).sum().backward()
    # forward x @ w.T: 2*6*5*7; backward: grad_x and grad_w, each one product of that size
    assert counter.get_total_flops() == 3 * 2 * 6 * 5 * 7


def test_flop_counter_counts_attention_on_a_cpu():
    b, h, sq, sk, d = 2, 3, 4, 5, 8
    q = torch.randn(b, h, sq, d, requires_grad=True)
    k = torch.randn(b, h, sk, d, requires_grad=True)
    v = torch.randn(b, h, sk, d, requires_grad=True)
    with peer_trl.flop_counter() as counter:
        F.scaled_dot_product_attention(q, k, v).sum().backward()
    # forward: scores q @ k.T and output p @ v, 2*b*h*sq*sk*d each; backward: the scores
    # again (a flash kernel keeps no attention matrix), grad_p, grad_v, grad_q and grad_k
    assert counter.get_total_flops() == (2 + 5) * 2 * b * h * sq * sk * d
