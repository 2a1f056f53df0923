"""A launching process for tests/distributed/test_launch_*.py, killed or timed from outside.

    python tests/launch_victim.py LAUNCHER [SLEEP_S] [--other-children]
    python tests/launch_victim.py cold-start TIMEOUT_S

LAUNCHER is "mlsys" or "mlsys-spawn" (mlsys.distributed.launch with its fork server, or with
start_method="spawn"), "elastic-fork" or "elastic-spawn"
(torch.distributed.launcher.api.elastic_launch), or "torch-mp-spawn"
(torch.multiprocessing.start_processes): 2 ranks that sleep SLEEP_S seconds (600 by default).
This process prints "launcher <pid>" first, each rank "rank <pid>" once it is inside the function.
With --other-children ("mlsys" only) the launching process, once its ranks are up, starts children
of its own that outlive it, a forked one and a subprocess, and prints "other <pid> <pid>".

"cold-start" starts 2 ranks with `launch.start(2, timeout_s=TIMEOUT_S)` in this fresh process (so
its fork server has yet to import torch), prints "raised <seconds> <first line of the error>" or
"started", then "starter done" once the thread that starts the ranks has finished, and sleeps.
"""

import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ranks import this file by name


def sleeper(rank, seconds):
    """The rank function: say where it runs, then sleep."""
    os.write(1, f"rank {os.getpid()}\n".encode())  # one write: lines of two ranks never mix
    time.sleep(seconds)
    return 0


def _torch_sleeper(local_rank, seconds):
    return sleeper(local_rank, seconds)


def other_children(seconds):
    """Children of the launching process that outlive it: a forked one (it inherits every file
    descriptor the launcher held at the fork) and a subprocess."""
    pid = os.fork()
    if pid == 0:
        time.sleep(seconds)
        os._exit(0)
    proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
    print(f"other {pid} {proc.pid}", flush=True)


def cold_start(timeout_s):
    import torch.distributed  # noqa: F401  (the launching process's own import is not timed)

    from mlsys.distributed import launch
    from mlsys.distributed.launch_job import RankFailed

    start = time.monotonic()
    try:
        launch.start(2, timeout_s=timeout_s).close()
        print("started", flush=True)
    except RankFailed as error:
        print(f"raised {time.monotonic() - start:.3f} {str(error).splitlines()[0]}", flush=True)
    for thread in threading.enumerate():
        if thread.name == "mlsys-launch-start":
            thread.join(timeout=60)
    print("starter done", flush=True)
    time.sleep(600)


def main(argv):
    launcher = argv[0]
    print(f"launcher {os.getpid()}", flush=True)
    if launcher == "cold-start":
        cold_start(float(argv[1]))
        return
    seconds = float(argv[1]) if len(argv) > 1 and not argv[1].startswith("--") else 600.0
    if launcher in ("mlsys", "mlsys-spawn"):
        from mlsys.distributed import launch

        method = "spawn" if launcher == "mlsys-spawn" else "forkserver"
        with launch.start(2, timeout_s=120, start_method=method) as job:
            if "--other-children" in argv:
                other_children(seconds)
            job.run(sleeper, args=(seconds,), timeout_s=seconds + 60)
    elif launcher.startswith("elastic-"):
        from torch.distributed.launcher.api import LaunchConfig, elastic_launch

        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_backend="c10d",
                              rdzv_endpoint="localhost:0", run_id="victim", max_restarts=0,
                              start_method=launcher.removeprefix("elastic-"))
        elastic_launch(config, _torch_sleeper)(0, seconds)
    elif launcher == "torch-mp-spawn":
        import torch.multiprocessing as torch_mp

        torch_mp.start_processes(_torch_sleeper, args=(seconds,), nprocs=2, start_method="spawn")
    else:
        raise SystemExit(f"unknown launcher {launcher!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
