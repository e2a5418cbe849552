"""Design-space sweeps on Dask: each point (a compile, a simulation, a place and route) is one task.

A place and route of the bundled model takes a quarter to half an hour on one core, so a sweep of
shapes x clocks x seeds fans out over Dask's distributed scheduler instead of running one point
after the other: by default a LocalCluster with one single-threaded worker process per core (a
place and route is one process busy on one core), or the cluster at `--scheduler ADDRESS`
(`tcp://host:8786`, started with `dask scheduler` and `dask worker` on each machine, every one
with this checkout and its tools at the same path). Results come back in the order of the points.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any


def fan_out(task: Callable[..., Any], points: Sequence[Any], *, scheduler: str | None = None,
            workers: int | None = None, log: Callable[[str], None] = print) -> list[Any]:
    """task(point) for every point on a Dask cluster, in the points' order; the first failure is raised here."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError as err:  # the dev extra installs it
        raise RuntimeError("design-space sweeps run on Dask: pip install 'dask[distributed]' "
                           "(in the project's dev extra)") from err
    if scheduler is not None:
        try:
            client = Client(scheduler, timeout="10s")
        except OSError as err:
            raise RuntimeError(f"no Dask scheduler answers at {scheduler!r} ({err}); start one with `dask scheduler` "
                               f"and workers with `dask worker {scheduler}`, or leave --scheduler out for a local "
                               f"cluster") from err
        cluster = None
    else:
        count = workers or os.cpu_count() or 1
        cluster = LocalCluster(n_workers=count, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    try:
        where = scheduler or f"a local cluster of {len(client.scheduler_info()['workers'])} worker processes"
        log(f"{len(points)} sweep points on {where}")
        futures = client.map(task, list(points), pure=False)
        return client.gather(futures)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
