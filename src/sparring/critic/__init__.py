"""Critics the learner trains beside the policy: the value function of gae / turn_gae
(`value_head`), ArCHer's utterance-level twin Q/V critic (`archer`) and its replay buffer
of recent turns (`replay`)."""
