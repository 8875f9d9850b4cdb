"""PPO's advantage normalisation across processes: two real local processes joined by
`jax.distributed` (CPU collectives through gloo), 2 simulated devices each, run one replicated
learner step on a batch split over the 4 devices; the advantage mean and standard deviation
every device used must be those of the whole batch computed in one process on one device."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = textwrap.dedent('''
    """One process of the test: its devices' slices of the batch, one learner step."""
    import json
    import os
    import sys

    import numpy as np


    def make_trajectory(t=8, b=16, seed=0):
        from podracer.types import TimeStep, Trajectory
        rng = np.random.default_rng(seed)
        step_type = rng.choice([0, 1, 1, 1, 2], size=(t + 1, b)).astype(np.int32)
        last = step_type == 2
        discount = np.where(last & (rng.uniform(size=(t + 1, b)) < 0.5), 0.0, 1.0)
        # Each quarter of the environments (one device's share) gets its own reward scale and
        # offset, so per-device statistics differ from the global ones.
        scale = np.repeat(np.array([0.5, 1.0, 2.0, 4.0]), b // 4)
        offset = np.repeat(np.array([-2.0, 0.0, 1.0, 3.0]), b // 4)
        reward = rng.normal(size=(t + 1, b)) * scale + offset
        timestep = TimeStep(step_type=step_type, reward=reward.astype(np.float32),
                            discount=discount.astype(np.float32),
                            observation=rng.normal(size=(t + 1, b, 4)).astype(np.float32))
        return Trajectory(
            timestep=timestep, action=rng.integers(0, 2, (t, b)).astype(np.int32),
            extras={"log_prob": np.log(rng.uniform(0.2, 0.8, (t, b))).astype(np.float32),
                    "value": rng.normal(size=(t, b)).astype(np.float32)})


    def make_agent():
        import agents
        from agents import ppo
        from podracer.types import ArraySpec, DiscreteSpec, EnvSpec
        spec = EnvSpec(observation=ArraySpec((4,), np.float32), action=DiscreteSpec(2))
        config = ppo.default_config()
        config.num_minibatches = 2
        config.advantage_normalization = "batch"
        return agents.make(config, spec)


    def main():
        from podracer import distributed
        assert distributed.initialize_from_env()
        import jax

        from podracer import replication
        from podracer.types import DEVICE_AXIS
        agent = make_agent()
        state = agent.init(jax.random.PRNGKey(0))
        mesh = replication.make_mesh(jax.devices())
        n = mesh.devices.size
        split = jax.tree.map(lambda x: np.stack(np.split(np.asarray(x), n, axis=1)),
                             make_trajectory())
        step = replication.replicate(
            lambda s, tr, k: agent.learner_step(s, tr, k, axis_name=DEVICE_AXIS), mesh)
        _, metrics = step(replication.broadcast(state, mesh),
                          replication.from_global(split, mesh),
                          replication.from_global(jax.random.split(jax.random.PRNGKey(1), n),
                                                  mesh))
        slices = replication.local_slices(
            {k: metrics[k] for k in ("advantage_mean", "advantage_std")})
        out = {"process": jax.process_index(), "processes": jax.process_count(),
               "devices": n, "slices": [{k: float(v) for k, v in s.items()} for s in slices]}
        with open(os.path.join(sys.argv[1], f"process{jax.process_index()}.json"), "w") as f:
            json.dump(out, f)


    if __name__ == "__main__":
        main()
''')


def _load_worker(path):
    spec = importlib.util.spec_from_file_location("ppo_norm_worker", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_advantages_are_normalised_over_the_batch_of_every_process(tmp_path):
    (tmp_path / "ppo_norm_worker.py").write_text(WORKER)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), ROOT,
                                                    env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.launch", "--num_processes=2",
         "--cpu_devices_per_process=2", "--module=ppo_norm_worker", "--", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    # The reference: the whole batch, one process, one device, no collective.
    worker = _load_worker(tmp_path / "ppo_norm_worker.py")
    agent = worker.make_agent()
    state = agent.init(jax.random.PRNGKey(0))
    _, alone = jax.jit(lambda s, tr, k: agent.learner_step(s, tr, k, axis_name=None))(
        state, worker.make_trajectory(), jax.random.PRNGKey(1))
    expected = {k: float(alone[k]) for k in ("advantage_mean", "advantage_std")}
    assert expected["advantage_std"] > 0.1

    slices = []
    for process in (0, 1):
        with open(tmp_path / f"process{process}.json") as f:
            out = json.load(f)
        assert out["process"] == process and out["processes"] == 2 and out["devices"] == 4
        assert len(out["slices"]) == 2  # this process's two devices
        slices += out["slices"]
    for name, value in expected.items():
        np.testing.assert_allclose([s[name] for s in slices], np.full(4, value), rtol=1e-5,
                                   err_msg=name)

    # The check can fail: the metrics are averaged over devices before they are reported, so
    # had each device normalised by its own statistics, the reported standard deviation would
    # be the mean of the four devices' own, which is far from the global one here (every
    # quarter of the batch has its own reward scale and offset).
    quarters = jax.tree.map(lambda x: np.split(np.asarray(x), 4, axis=1),
                            worker.make_trajectory(), is_leaf=lambda x: isinstance(x, np.ndarray))
    step = jax.jit(lambda s, tr, k: agent.learner_step(s, tr, k, axis_name=None))
    own_stds = []
    for shard in range(4):
        trajectory = jax.tree.map(lambda parts, i=shard: parts[i], quarters,
                                  is_leaf=lambda x: isinstance(x, list))
        _, own = step(state, trajectory, jax.random.PRNGKey(1))
        own_stds.append(float(own["advantage_std"]))
    assert abs(np.mean(own_stds) - expected["advantage_std"]) > 0.1 * expected["advantage_std"]
