"""Helpers for the Python tests: start t torch.distributed ranks (gloo, loopback only)
as processes with torch.multiprocessing, each bounded in time, and collect what each
rank returns."""
import datetime
import gc
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank, world, port, fn, args, out_dir):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", port, world, False, timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        result = fn(rank, world, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        # No rank tears gloo down while a peer may still be sending to it: a rank whose
        # process group was destroyed under a peer's traffic has aborted at exit
        # ("terminate called without an active exception", once in a loaded suite run).
        # Only on success: a rank whose fn raised must not wait for the others here.
        dist.barrier()
    finally:
        dist.destroy_process_group()
        # Nothing may keep the group (gloo's threads) alive into the interpreter's exit,
        # where a gloo thread that takes the GIL aborts the rank.
        gc.collect()


def run_ranks(world: int, fn, *args, timeout_s: float = 240):
    """Runs fn(rank, world, *args) on `world` gloo ranks; returns [result of rank r]."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # The ranks meet at a store served from here, on a port the kernel chose and that stays
    # bound until they are done. A port found free here and bound later by rank 0 (seconds
    # later: the spawned rank imports torch first) can be taken in between by a test running
    # beside this one ("Address already in use" at rendezvous, once in CI).
    store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60),
                          wait_for_workers=False)
    with tempfile.TemporaryDirectory(prefix="spgate-py-") as out_dir:
        ctx = mp.start_processes(_entry, args=(world, store.port, fn, args, out_dir),
                                 nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                raise TimeoutError(f"{world} ranks did not finish in {timeout_s} s")
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(world)]
