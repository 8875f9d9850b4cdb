"""The machine a process runs on, as the runners' sizing rules read it: the host's CPU cores
this process may use, and its devices. The rules themselves (`sebulba.config.derive_sizes`,
`anakin.config.derive_num_envs`) take a `Machine`, so that a test can hand them any machine."""

from __future__ import annotations

import dataclasses
import os

import jax


@dataclasses.dataclass(frozen=True)
class Machine:
    """What sizes derive from: cores, and the local devices' platform and count."""

    cores: int  # host CPU cores this process may run on
    platform: str  # the local devices' platform: "cpu", "gpu", "tpu", ...
    num_devices: int  # devices local to this process

    @property
    def accelerated(self) -> bool:
        """Whether the devices are accelerators. Simulated CPU devices share the host's cores,
        so on "cpu" every device is the same cores."""
        return self.platform != "cpu"

    def describe(self) -> str:
        """'16 cores, 1 gpu device'."""
        return (f"{self.cores} core{'s' if self.cores != 1 else ''}, {self.num_devices} "
                f"{self.platform} device{'s' if self.num_devices != 1 else ''}")


def host_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity masks on this OS
        return max(1, os.cpu_count() or 1)


def detect() -> Machine:
    """This process's machine."""
    devices = jax.local_devices()
    return Machine(cores=host_cores(), platform=devices[0].platform, num_devices=len(devices))
