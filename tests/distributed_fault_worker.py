"""One process of a multi-process run that goes wrong (tests/test_distributed_faults.py starts it).

``python distributed_fault_worker.py ADDRESS NUM_PROCESSES PROCESS_ID TIMEOUT_S [steps HEARTBEAT_S]``:
calls ``kn.distributed.initialize`` and prints one JSON line: ``{"joined": true}`` or what it
raised (class and message) with the seconds it took. With ``steps``, after joining it runs a
collective over a mesh of every process's devices once per 0.2 s (printing ``step N``) until
stopped, with the given heartbeat timeout.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    address, count, process_id, timeout_s = (
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        float(sys.argv[4]),
    )
    stepping = len(sys.argv) > 5 and sys.argv[5] == "steps"
    heartbeat = int(sys.argv[6]) if stepping else 100
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    os.environ["KAUN_IR_BACKEND"] = "cpu"
    import numpy as np

    import kaun_ir as kn

    start = time.monotonic()
    try:
        kn.distributed.initialize(
            address, count, process_id, timeout_s=timeout_s, heartbeat_timeout_s=heartbeat
        )
    except Exception as err:
        report = {"raised": type(err).__name__, "kaun": isinstance(err, kn.KaunError), "message": str(err)}
        print(json.dumps({**report, "seconds": time.monotonic() - start}), flush=True)
        return
    print(json.dumps({"joined": True, "seconds": time.monotonic() - start}), flush=True)
    if not stepping:
        kn.distributed.shutdown()
        return
    mesh = kn.sharding.mesh((len(kn.runtime.devices()),), ("data",))
    total = kn.jit(lambda x: kn.sum(x * 2.0), mesh=mesh)
    x = kn.sharding.put_local(np.ones((2, 3), np.float32), mesh)
    for step in range(100000):
        total(x).block_until_ready()
        print(f"step {step}", flush=True)
        time.sleep(0.2)


if __name__ == "__main__":
    main()
