"""What the experiment entry points share: quiet logging, joining a multi-process run, and
turning the ways a run ends into exit statuses and one clear message.

    0    done
    1    failed (a thread or device error; a NaN or inf loss or parameter, named by update)
    2    refused before it started: a bad config field, an unusable --workdir, a workdir
         holding a checkpoint of a different run, or one locked by a run that is still alive
         (nothing in the workdir was changed)
    143  stopped by SIGTERM after saving a checkpoint (128 + SIGTERM): rerun to resume
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

from absl import flags, logging

from podracer import distributed
from podracer.config import ConfigError
from podracer.faults import NonFiniteError
from podracer.workdir import WorkdirError


def _leave(status: int, multiprocess: bool) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    if multiprocess:
        # A process that ends early must not wait in jax.distributed's shutdown barrier for
        # peers that may be blocked in a collective: leave at once.
        os._exit(status)
    sys.exit(status)


def run(train: Callable[..., Any], config: Any, workdir: str | None) -> None:
    """Calls `train(config, workdir)` and exits with the status its ending calls for."""
    if not flags.FLAGS["verbosity"].present:
        # absl logs INFO to stderr by default, and orbax logs every step of every save there:
        # keep the console to progress and warnings unless --verbosity asks for more.
        logging.set_verbosity(logging.WARNING)
    multiprocess = distributed.initialize_from_env()
    try:
        result = train(config, workdir)
    except (ConfigError, WorkdirError) as error:
        print(f"error: {error}", file=sys.stderr)
        _leave(2, multiprocess)
    except NonFiniteError as error:
        print(f"error: {error}", file=sys.stderr)
        _leave(1, multiprocess)
    except BaseException:
        if not multiprocess:
            raise
        traceback.print_exc()
        # A collective that failed because a peer died surfaces here first; give the
        # watchdog the time it needs to confirm the loss and name the lost process.
        distributed.wait_for_watchdog()
        _leave(1, multiprocess)
    if result.interrupted:
        _leave(128 + signal.SIGTERM, multiprocess)
