"""ArCHer's utterance-level critic, trained by the learner for ``estimator=archer_targets``.

ArCHer (Zhou et al. 2024, "ArCHer: Training Language Model Agents via Hierarchical
Multi-Turn RL") runs an off-policy value-based critic over whole utterances and a token
policy gradient that gives every token of a turn the critic's utterance advantage
``A = min(Q1, Q2)(s, a) - min(V1, V2)(s)`` (estimator `archer_targets`).

The critic (`UtteranceCritic`): twin Q heads read the last hidden state at the turn's last
action token (the state and the whole utterance), twin V heads at the last prompt token
(the state before the first action token); each head is a `ValueHead` MLP. Its body is the
policy's trunk (``critic.kind=head``) or its own copy of the initial model
(``separate``). A target copy follows the online critic by Polyak averaging after every
critic update: ``target <- (1 - tau) target + tau online``.

Per training step (`Archer.observe`): the step's turns go into a `TurnReplay` buffer of the
last ``buffer_steps`` steps; ``updates`` times, ``batch_turns`` turns are sampled from it and
one optimizer step (its own AdamW) is taken on ``L = L_Q + L_V``:

    y = r + gamma (1 - done) min(V1_tgt, V2_tgt)(s')        (`archer_q_target`)
    z = min(Q1_tgt, Q2_tgt)(s, a)                           (`archer_v_target`)
    L_Q = mean over turns with a target of [ (Q1 - y)^2 + (Q2 - y)^2 ] / 2
    L_V = mean over the newest step's turns of [ (V1 - z)^2 + (V2 - z)^2 ] / 2

s' is the same agent's next turn (none after its last turn: done; the last turn of a
truncated episode has no target). Then `Archer.annotate` writes the per-turn outputs of the
updated critic into ``batch.extras`` (q1, q2, v1, v2 and v_target = min(V1_tgt, V2_tgt)(s))
for the estimator. Shapes: per turn ``[n]``.

Our reading / simplifications of the paper: (1) the V target takes ``a`` as the action the
newest step's policy sampled (V is fitted on the newest step's turns only, so ``a ~ pi``
up to the one update in between), rather than sampling a fresh utterance inside the
learner; Q is fitted off-policy on the whole buffer. (2) With ``critic.kind=head`` the heads
read the policy's hidden state detached: the critic loss trains the heads only, the trunk is
trained by the policy loss (one optimizer per weight). (3) Both twins share one TD target
built from ``min`` of the twin target V's.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from sparring.advantages.gae import archer_q_target, archer_td_targets, archer_v_target
from sparring.critic.replay import TurnReplay
from sparring.critic.value_head import ValueHead, critic_body, last_hidden, output_embedding
from sparring.data import TurnBatch

if TYPE_CHECKING:
    from sparring.config import Config

HEADS = ("q1", "q2", "v1", "v2")
DEFAULT_CHUNK = 64  # rows per critic forward when train.microbatch_size is 0


class UtteranceCritic(nn.Module):
    """Twin Q(s, a) and twin V(s) heads on a body (see the module doc)."""

    def __init__(self, policy: nn.Module, kind: str = "head", width: int = 64):
        super().__init__()
        self.body = critic_body(policy, kind)
        self.kind = kind
        hidden = output_embedding(policy).in_features
        self.heads = nn.ModuleDict({k: ValueHead(hidden, width) for k in HEADS})

    def heads_on(self, h_v: Tensor, h_q: Tensor) -> dict[str, Tensor]:
        """``{q1, q2: Q heads on h_q; v1, v2: V heads on h_v}``, ``h [k, H]`` -> ``[k]``."""
        return {k: head(h_q if k[0] == "q" else h_v) for k, head in self.heads.items()}


Features = tuple[Tensor, Tensor]  # (h_v, h_q) [k, H]: hidden at the last prompt / action token


class Archer:
    """The critic, its target copy, replay buffer and optimizer of one ArCHer run.

    With ``critic.kind=head`` the features of every buffered turn are computed once per
    step (the trunk does not change during the critic updates), so the ``updates`` critic
    steps cost only the heads. With ``separate`` each update runs the online body (with grad) on
    the sampled turns and the target body on them and their next turns. Forwards go in
    chunks of ``train.microbatch_size`` rows (64 when 0), sorted by length and trimmed to
    each chunk's longest row.
    """

    def __init__(self, policy: nn.Module, cfg: Config):
        c, o = cfg.critic, cfg.optim
        self.cfg, self.ac, self.policy = cfg, c.archer, policy
        self.device = next(policy.parameters()).device
        self.online = UtteranceCritic(policy, c.kind, c.hidden).to(self.device)
        self.target = copy.deepcopy(self.online).eval()
        self.target.requires_grad_(False)
        self.replay = TurnReplay(self.ac.buffer_steps)
        self.params = [p for p in self.online.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=self.ac.lr or o.lr,
                                           betas=tuple(o.betas), eps=o.eps,
                                           weight_decay=o.weight_decay)
        self.gen = torch.Generator().manual_seed(cfg.train.seed + 7_777)
        self.steps_seen = 0
        self._cache: Features | None = None  # head kind: features of all buffered turns

    # ------------------------------------------------------------ features

    def _chunks(self, pos: Tensor) -> list[Tensor]:
        """Indices into ``pos`` in chunks of similar length (shortest first)."""
        order = self.replay.rows["length"][pos].argsort(stable=True)
        c = self.cfg.train.microbatch_size or DEFAULT_CHUNK
        return [order[s:s + c] for s in range(0, len(pos), c)]

    def _pool(self, model: nn.Module, pos: Tensor) -> Features:
        """One forward of buffer turns ``pos`` through ``model`` (grad as the caller says)."""
        ids, att, first, last = (t.to(self.device) for t in self.replay.tensors(pos))
        h = last_hidden(model, ids, att).float()
        ar = torch.arange(len(pos), device=self.device)
        return h[ar, first - 1], h[ar, last]

    @torch.no_grad()
    def _pooled(self, model: nn.Module, pos: Tensor) -> Features:
        """`_pool` over all of ``pos`` in sorted chunks, no grad, dropout off."""
        H = output_embedding(self.policy).in_features
        h_v = torch.zeros(len(pos), H, device=self.device)
        h_q = torch.zeros_like(h_v)
        was = model.training
        model.eval()
        try:
            for idx in self._chunks(pos):
                i = idx.to(self.device)
                h_v[i], h_q[i] = self._pool(model, pos[idx])
        finally:
            model.train(was)
        return h_v, h_q

    def _features(self, critic: UtteranceCritic, pos: Tensor) -> Features:
        """No-grad features of buffer turns ``pos`` for ``critic`` (its body or the trunk)."""
        if critic.body is None and self._cache is not None:
            i = pos.to(self.device)
            return self._cache[0][i], self._cache[1][i]
        return self._pooled(self.policy if critic.body is None else critic.body, pos)

    # ------------------------------------------------------------ training

    def targets(self, pos: Tensor) -> tuple[Tensor, Tensor]:
        """TD targets of buffer turns ``pos``: ``(y, z)`` for the Q and V heads, ``[k]`` each."""
        r = self.replay.rows
        nxt = self.replay.next_of(pos)
        has = nxt >= 0
        with torch.no_grad():
            tn = self.target.heads_on(*self._features(self.target, nxt[has]))
            v_next = torch.zeros(len(pos), device=self.device)
            v_next[has.to(self.device)] = torch.minimum(tn["v1"], tn["v2"])
            y = archer_q_target(r["reward"][pos].to(self.device),
                                r["done"][pos].to(self.device), v_next, self.ac.gamma)
            tq = self.target.heads_on(*self._features(self.target, pos))
        return y, archer_v_target(tq["q1"], tq["q2"])

    def _update_once(self, stats: dict[str, float]) -> None:
        r, newest = self.replay.rows, self.replay.newest_step
        k = self.ac.batch_turns or int((r["step"] == newest).sum())
        pos = self.replay.sample(min(k, len(self.replay)), self.gen)
        y, z = self.targets(pos)
        qm = r["valid"][pos].to(self.device)
        vm = (r["step"][pos] == newest).to(self.device)  # V: the newest policy's actions
        nq, nv = max(int(qm.sum()), 1), max(int(vm.sum()), 1)
        self.optimizer.zero_grad(set_to_none=True)
        self.online.train()
        sums = dict.fromkeys(("q_loss", "v_loss", "q_mean", "v_mean"), 0.0)
        finite = True
        shared = self.online.body is None
        for idx in [torch.arange(len(pos))] if shared else self._chunks(pos):
            i = idx.to(self.device)
            feats = self._features(self.online, pos[idx]) if shared else \
                self._pool(self.online.body, pos[idx])
            out = self.online.heads_on(*feats)
            lq = 0.5 * ((out["q1"] - y[i]) ** 2 + (out["q2"] - y[i]) ** 2)
            lv = 0.5 * ((out["v1"] - z[i]) ** 2 + (out["v2"] - z[i]) ** 2)
            lq = torch.where(qm[i], lq, 0.0).sum() / nq
            lv = torch.where(vm[i], lv, 0.0).sum() / nv
            loss = lq + lv
            if not torch.isfinite(loss):
                finite = False
                break
            loss.backward()
            sums["q_loss"] += float(lq.detach())
            sums["v_loss"] += float(lv.detach())
            sums["q_mean"] += float((out["q1"] + out["q2"]).detach().sum()) / 2
            sums["v_mean"] += float((out["v1"] + out["v2"]).detach().sum()) / 2
        gn = float(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.optim.max_grad_norm
                                                   or math.inf)) if finite else math.nan
        if not math.isfinite(gn):
            self.optimizer.zero_grad(set_to_none=True)
            stats["critic/skipped_updates"] += 1
            return
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.polyak()
        stats["critic/q_loss"] += sums["q_loss"]
        stats["critic/v_loss"] += sums["v_loss"]
        stats["critic/q_mean"] += sums["q_mean"] / len(pos)
        stats["critic/v_mean"] += sums["v_mean"] / len(pos)
        stats["critic/td_target_mean"] += float(y[qm].mean()) if bool(qm.any()) else 0.0
        stats["critic/grad_norm"] += gn
        stats["_done"] += 1

    @torch.no_grad()
    def polyak(self) -> None:
        """``target <- (1 - tau) target + tau online`` (every parameter)."""
        for pt, p in zip(self.target.parameters(), self.online.parameters()):
            pt.lerp_(p.detach(), self.ac.tau)

    def observe(self, batch: TurnBatch) -> dict[str, float]:
        """Add ``batch``'s turns to the buffer and take ``updates`` critic updates; metrics."""
        self.replay.add(batch, self.steps_seen)
        self.steps_seen += 1
        self._cache = None
        if self.online.body is None and len(self.replay):
            self._cache = self._pooled(self.policy, torch.arange(len(self.replay)))
        stats: dict[str, float] = {"critic/skipped_updates": 0.0, "_done": 0.0}
        for k in ("q_loss", "v_loss", "q_mean", "v_mean", "td_target_mean", "grad_norm"):
            stats[f"critic/{k}"] = 0.0
        if len(self.replay):
            for _ in range(self.ac.updates):
                self._update_once(stats)
        done = max(stats.pop("_done"), 1.0)
        out = {k: v if k == "critic/skipped_updates" else v / done for k, v in stats.items()}
        out["critic/buffer_turns"] = float(len(self.replay))
        return out

    def annotate(self, batch: TurnBatch) -> tuple[TurnBatch, dict[str, float]]:
        """``batch`` (the one just given to `observe`) with extras q1, q2, v1, v2 (online)
        and v_target (target V at s), and the critic's TD error on it (``|min(Q1, Q2) - y|``
        over turns with a target)."""
        if batch.n_rows == 0:
            return batch, {}
        n, N = batch.n_rows, len(self.replay)
        r = self.replay.rows
        pos = torch.arange(N - n, N)
        if int((r["step"] == self.replay.newest_step).sum()) != n or not torch.equal(
                r["length"][pos], batch.attention_mask.sum(1).cpu()):
            raise ValueError("annotate takes the batch that was just given to observe")
        with torch.no_grad():
            on = self.online.heads_on(*self._features(self.online, pos))
            tg = self.target.heads_on(*self._features(self.target, pos))
        dev = batch.device
        ex = {**batch.extras, **{k: on[k].float().to(dev) for k in HEADS},
              "v_target": torch.minimum(tg["v1"], tg["v2"]).float().to(dev)}
        batch = batch.with_fields(extras=ex)
        y, valid = archer_td_targets(batch, gamma=self.ac.gamma)
        err = (torch.minimum(ex["q1"], ex["q2"]) - y).abs()[valid]
        return batch, {"critic/td_error": float(err.mean()) if err.numel() else 0.0}

    # ------------------------------------------------------------ checkpoint state

    def state_dict(self) -> dict[str, Any]:
        return {"online": self.online.state_dict(), "target": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict(), "replay": self.replay.state_dict(),
                "gen": self.gen.get_state(), "steps_seen": self.steps_seen}

    def load_state_dict(self, st: dict[str, Any]) -> None:
        self.online.load_state_dict(st["online"])
        self.target.load_state_dict(st["target"])
        self.optimizer.load_state_dict(st["optimizer"])
        self.replay.load_state_dict(st["replay"])
        self.gen.set_state(st["gen"])
        self.steps_seen = int(st["steps_seen"])
        self._cache = None
