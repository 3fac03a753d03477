"""A real `localspec serve` in a thread of the test process, on a real model (for module fixtures)."""

import contextlib

from localspec.loader import load
from localspec.server.run import served_for, start_in_thread


@contextlib.contextmanager
def serving(model_path, name: str, n_ctx: int, socket_path=None, slots: int = 1, **options):
    engine = load(str(model_path), n_ctx=n_ctx, calibrate=False, history="memory",  # (no LOCALSPEC_HOME at module scope)
                  slots=slots, **options)
    running = start_in_thread(served_for(engine, name), socket_path=socket_path)
    try:
        yield running
    finally:
        running.stop()
        running.served.scheduler.close()
