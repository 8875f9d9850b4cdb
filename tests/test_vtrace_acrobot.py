"""V-trace learns Acrobot-v1 with the defaults (issue 27): the issue's own command,
`vtrace_catch.py` with `--config.env.name=Acrobot-v1`, seeded, shortened to 614K steps.

With the old defaults (no PopArt) the shared torso's features grew to fit values near -100,
the policy became deterministic within 200 updates and every episode ran to the 500-step time
limit: this test's run ended at -500.0 (checked against main's agent code). With PopArt it
first succeeds near 450K steps and is near -100 by 600K (3 seeds: docs/journal/2026-11-26.md,
"V-trace before and after PopArt"), at the runner's default batch of 32 x 16 (with the old
256 x 20, 200 updates by 1M were too few)."""

import anakin
from experiments.configs import vtrace_catch


def test_vtrace_learns_acrobot_with_its_defaults():
    config = vtrace_catch.get_config()
    config.env.name = "Acrobot-v1"
    config.updates_per_chunk = 100
    config.seed = 0
    config.total_env_steps = 614_400  # 12 chunks of 100 updates of 32 envs x T = 16
    config.checkpoint_every_updates = 0
    config.eval_every_updates = 0
    result = anakin.train(config)
    returns = [row["episode_return"] for row in result.history]
    assert returns[0] <= -450.0, returns  # it started at the time limit: it learnt
    assert result.final_metrics["episode_return"] >= -200.0, returns
