"""Test setup: 8 simulated CPU devices, configured before JAX initialises."""

import os

# Must happen before `jax` is imported anywhere: XLA reads the flag once, at backend start.
_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
