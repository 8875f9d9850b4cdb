"""Benchmark: the convolutions' kernel gradient, XLA's own transpose against `agents.layers`'
im2col matrix product, layer by layer for the IMPALA ResNet on Atari frames, next to each
layer's forward pass (the same multiply-adds in XLA's forward convolution: what a kernel
gradient could cost) and the whole torso's forward and backward pass with each.

    python -m experiments.benchmarks.conv [--batch=640] [--repeats=3]

The batch is the V-trace learner's on Pong: 32 trajectories x T = 20 frames of 84 x 84 x 4.
Each figure is the best of `--repeats` calls of a jitted function after one warm-up call, on
the default device. On CPU the im2col path is what `agents.layers.Conv` runs; elsewhere it is
timed here but not used.
"""

from __future__ import annotations

import os
import platform

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import app, flags

from agents import layers
from agents.vtrace import networks
from experiments import _cli
from experiments.benchmarks._ceiling import best_call_time

_BATCH = flags.DEFINE_integer("batch", 640, "Frames per learner batch.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per figure (the best is kept).")

# (height = width, input channels, output channels, how many of the torso's 15 convolutions)
RESNET_LAYERS = ((84, 4, 16, 1), (42, 16, 16, 4), (42, 16, 32, 1), (21, 32, 32, 5),
                 (11, 32, 32, 4))
_SAME = ((1, 1), (1, 1))


def _seconds(fn, *args) -> float:
    return best_call_time(fn, *args, repeats=_REPEATS.value)


def _torso_seconds(conv) -> float:
    """Forward and backward pass of the IMPALA ResNet torso built on `conv`."""
    saved = networks.Conv
    networks.Conv = conv
    try:
        torso = networks.ResNetTorso()
        x = jnp.zeros((_BATCH.value, 84, 84, 4), jnp.uint8)
        params = torso.init(jax.random.PRNGKey(0), x[:1])
        grad = jax.jit(jax.grad(lambda p, x: jnp.sum(torso.apply(p, x) ** 2)))
        return _seconds(grad, params, x)
    finally:
        networks.Conv = saved


def main(argv):
    del argv
    n = _BATCH.value
    print(f"# Kernel gradients of the IMPALA ResNet's convolutions at batch {n}; "
          f"{jax.devices()[0].platform} ({jax.devices()[0].device_kind}), {os.cpu_count()} CPU "
          f"cores ({platform.processor() or platform.machine()}), load average at start "
          f"{os.getloadavg()[0]:.1f}; jax {jax.__version__}", flush=True)
    print("\n| layer (H×W, C_in → C_out) × count | forward (XLA) | kernel gradient, XLA | "
          "kernel gradient, im2col | XLA / im2col |\n|---|---:|---:|---:|---:|")
    totals = {"forward": 0.0, "xla": 0.0, "im2col": 0.0}
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    for size, cin, cout, count in RESNET_LAYERS:
        x = jax.random.normal(keys[0], (n, size, size, cin))
        w = jax.random.normal(keys[1], (3, 3, cin, cout))
        g = jax.random.normal(keys[2], (n, size, size, cout))
        times = {
            "forward": _seconds(jax.jit(
                lambda x, w: layers.conv2d(x, w, (1, 1), _SAME)), x, w),
            "xla": _seconds(jax.jit(
                lambda x, w, g: layers.kernel_grad_xla(x, w, g, (1, 1), _SAME)), x, w, g),
            "im2col": _seconds(jax.jit(
                lambda x, g: layers.kernel_grad_im2col(x, g, (3, 3), (1, 1), _SAME)), x, g),
        }
        for name, seconds in times.items():
            totals[name] += count * seconds
        print(f"| {size}×{size}, {cin} → {cout} × {count} | {times['forward']:.3f} s | "
              f"{times['xla']:.3f} s | {times['im2col']:.3f} s | "
              f"{times['xla'] / times['im2col']:.2f}× |", flush=True)
    print(f"| all 15 | {totals['forward']:.3f} s | {totals['xla']:.3f} s | "
          f"{totals['im2col']:.3f} s | {totals['xla'] / totals['im2col']:.2f}× |", flush=True)
    flax_torso, our_torso = _torso_seconds(nn.Conv), _torso_seconds(layers.Conv)
    print(f"\nTorso forward and backward at batch {n}: {flax_torso:.3f} s with flax's nn.Conv, "
          f"{our_torso:.3f} s with agents.layers.Conv ({flax_torso / our_torso:.2f}×).",
          flush=True)


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
