"""How a run's execution stops early (runs.runner): raised by the step start, the step's
process and the run's own writes, caught by `run_workflow_run`."""


class LeaseLost(Exception):
    """The run is no longer this worker's (cancelled, recovered): stop writing."""


class HandedBack(Exception):
    """The run waits for its step's account in the queue, not in this worker."""


class PoolWaitOver(Exception):
    """Every account of the step's pool stayed rate limited past LOOPSWEB_POOL_WAIT_SECONDS."""
