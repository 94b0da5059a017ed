"""One shared policy for every seat vs one policy per role, 3 seeds each.

The question: does giving each role its own weights, optimizer and estimator state help
where the roles differ? AT-GRPO (Zhao et al., Stronger Together: On-Policy Reinforcement
Learning for Collaborative LLMs, 2025, arXiv:2510.11062; "agent- and turn-wise grouped RL")
reports large gains from role-specialised policies on cooperative multi-agent tasks; the
usual default (and Sparring's) is one policy conditioned on its seat's observation.

Arms, the same recipe and budget apart from the `policies` section:

* signalling (a Lewis game, 4 colours, 4 symbols; chance 0.25), configs/signalling_two_policies:
  ``per_role`` as the recipe (a speaker and a listener policy), ``shared`` one policy in
  both seats (``policies={}``, ``envs.0.seats=[]``). Metric: the greedy pair's success rate
  over 100 games, ``eval/signalling/joint/mean_return_seat0`` (with one policy
  ``eval.self_play`` plays it in both seats).
* negotiation (deal-or-no-deal, configs/negotiation_two_policies): an opener and a
  responder, or one shared policy. Metrics: the greedy pair's mean score per seat and their
  sum (the welfare a deal creates; 0 when no deal is made), over 200 games.

Run (about 35 minutes on a 2-core CPU with --jobs 2; signalling 250 steps, negotiation
200 steps):

    .venv/bin/python studies/policies_per_role.py --jobs 2

Results and their reading: docs/studies.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

from runner import Arm, last, main

SHARED = ["policies={}", "envs.0.seats=[]", "eval.self_play=true"]
SIG, NEG = "signalling_two_policies", "negotiation_two_policies"
ARMS = {
    "signalling_shared": Arm(SIG, SHARED, steps=250),
    "signalling_per_role": Arm(SIG, steps=250),
    "negotiation_shared": Arm(NEG, SHARED, steps=200),
    "negotiation_per_role": Arm(NEG, steps=200),
}
JOINT = "eval/{}/joint/mean_return_seat{}"


def welfare(run_dir: Path) -> float | None:
    """Both seats' mean score in the greedy joint games of negotiation."""
    seats = [last(run_dir, JOINT.format("negotiation", s)) for s in (0, 1)]
    return None if None in seats else sum(seats)


METRICS = [JOINT.format("signalling", 0), JOINT.format("negotiation", 0),
           JOINT.format("negotiation", 1), ("negotiation welfare (seat 0 + seat 1)", welfare)]

if __name__ == "__main__":
    sys.exit(main("policies_per_role", ARMS, METRICS, steps=250, doc=__doc__))
