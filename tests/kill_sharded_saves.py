"""SIGKILL ``kn.checkpoint.save_sharded`` at random moments and check what is left at the path.

Each round starts a process that saves two contents in turn at one path, as fast as it can, and
kills it at a random moment. Then: the path must load (``load_sharded``) as exactly one of the
two contents, and after the next save no staging directory or link of a killed save may remain
beside it. ``tests/test_checkpoint_files.py`` runs a few rounds; the long run is

    python tests/kill_sharded_saves.py --kills 50

which prints one line of figures (kills, how many landed while a save was under way, how many
left the old or the new content, staging directories removed by the next save).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np

ROWS = 256  # two f32[256, 512] arrays: about 1 MiB written per save


def contents() -> list[dict]:
    """The two trees the saver alternates between; ``step`` tells them apart."""
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((ROWS, 512)).astype(np.float32) for _ in range(2)]
    return [{"w": w, "b": np.full(512, i, np.float32), "step": i} for i, w in zip((1, 2), weights)]


def like() -> dict:
    return {"w": np.zeros((ROWS, 512), np.float32), "b": np.zeros(512, np.float32), "step": 0}


def _child(path: str) -> None:
    """Save the two contents in turn until killed; a line on stdout after each save."""
    import kaun_ir as kn

    trees = contents()
    i = 0
    while True:
        kn.checkpoint.save_sharded(path, trees[i % 2])
        i += 1
        print(i, flush=True)


def leftovers(path: str) -> list[str]:
    """Everything beside ``path`` in its (otherwise empty) directory but the directory ``path``
    names now: staging directories, links and set-aside directories of saves."""
    parent, base = os.path.split(os.path.abspath(path))
    current = os.readlink(path) if os.path.islink(path) else None
    return sorted(n for n in os.listdir(parent) if n not in (base, current))


def campaign(directory: str, kills: int, seed: int = 0, max_delay: float = 0.25) -> dict:
    """Run ``kills`` rounds in ``directory``; raises ``AssertionError`` on the first round that
    leaves the path unloadable, loading as neither content, or stale siblings after a save."""
    import kaun_ir as kn

    path = os.path.join(directory, "ckpt")
    trees = contents()
    kn.checkpoint.save_sharded(path, trees[0])
    chooser = random.Random(seed)
    figures = {"kills": 0, "mid_save": 0, "old_or_first": 0, "second": 0, "removed_by_next_save": 0}
    for round_ in range(kills):
        child = subprocess.Popen(
            [sys.executable, __file__, "--child", path],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert child.stdout.readline().strip() == "1", "the saver did not start"  # past imports
        time.sleep(chooser.uniform(0.0, max_delay))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        figures["kills"] += 1
        figures["mid_save"] += bool(leftovers(path))
        back = kn.checkpoint.load_sharded(path, like())
        assert back["step"] in (1, 2), (round_, back["step"])
        expected = trees[back["step"] - 1]
        np.testing.assert_array_equal(back["w"], expected["w"])
        np.testing.assert_array_equal(back["b"], expected["b"])
        figures["old_or_first" if back["step"] == 1 else "second"] += 1
        stale = leftovers(path)
        kn.checkpoint.save_sharded(path, trees[round_ % 2])  # the next save
        assert leftovers(path) == [], (round_, leftovers(path))
        figures["removed_by_next_save"] += len(stale)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child)
        return 0
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        start = time.perf_counter()
        figures = campaign(directory, args.kills, args.seed)
        seconds = time.perf_counter() - start
    print(" ".join(f"{k}={v}" for k, v in figures.items()), f"seconds={seconds:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
