"""The opensandbox provider against the docker provider on the same engine: a sandbox's
start, one command (`echo ok`), a joined command (`cat`: its opening, a line there and
back, its closing), the claim of a sandbox started ahead to its first
command, and the wall time per episode over trivial tasks through the oracle at -n 2
and -n 8, the two providers' runs taken in turns (so that the machine's load falls on
both alike), with the median of the seed (the claim of the sandbox started ahead to the
agent's start) from each run's rows. The opensandbox side runs against the fake server
of the test suite (tests/opensandbox_fake/: the lifecycle API and execd's, over this
machine's Docker engine, on 127.0.0.1), or a real server when OPENSANDBOX_DOMAIN is set;
with the fake, the CPU it spent serving each episode is printed too.

    .venv/bin/python bench/opensandbox.py [--starts 10] [--commands 200] [--tasks 24]
        [--workers 2 8] [--rounds 3]
    .venv/bin/python bench/opensandbox.py --storm 64 [--server-limit 16]

`--storm N` (against the fake only) starts N sandboxes at once, each from a provider of
its own sharing one run's scratch folder (as N workers' providers do), against a fake
that refuses creates past `--server-limit` at once (as a hosted server's limit does),
first with the provider's default turns to start, then with no cap (max_starting = N,
no pace): the time until all are up, the slowest start, the most creates the server saw
at once, and how many it refused.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import docker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from episode_overhead import IMAGE, make_dataset, pytest_run

from pytest_harbor.sandboxes import SandboxSpec
from pytest_harbor.sandboxes.base import ProviderContext, SandboxProvider, TellsLiveness
from pytest_harbor.sandboxes.docker import DockerProvider
from pytest_harbor.sandboxes.opensandbox import opensandbox_provider
from pytest_harbor.sandboxes.pipes import OpensPipes
from tests.opensandbox_fake import FakeOpenSandbox

LABELS = {"pytest-harbor.run": "bench-opensandbox"}


def median_ms(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return f"median {statistics.median(ordered) * 1000:8.1f} ms   p90 {p90 * 1000:8.1f} ms"


def timed(run: Callable[[], object], count: int) -> list[float]:
    seconds = []
    for _ in range(count):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return seconds


def sandboxes(name: str, provider: SandboxProvider, starts: int, commands: int) -> None:
    def start_and_stop() -> None:
        provider.start(SandboxSpec(image=IMAGE, labels=LABELS, ttl_s=600)).stop()

    start_and_stop()  # warm-up: images, tools
    print(f"{name:12s} start + stop   {median_ms(timed(start_and_stop, starts))}")
    claims = []
    for _ in range(starts):
        # Started ahead, then claimed: asked how it is (as the seed asks), then its first
        # command.
        ahead = provider.start(SandboxSpec(image=IMAGE, labels=LABELS, ttl_s=600))
        started = time.perf_counter()
        if isinstance(ahead, TellsLiveness):
            ahead.alive()
        else:
            ahead.status()
        ahead.exec(["echo", "ok"], timeout=30)
        claims.append(time.perf_counter() - started)
        ahead.stop()
    print(f"{name:12s} claim to first command {median_ms(claims)}")
    sandbox = provider.start(SandboxSpec(image=IMAGE, labels=LABELS, ttl_s=600))
    try:
        sandbox.exec(["echo", "ok"], timeout=30)
        run = lambda: sandbox.exec(["echo", "ok"], timeout=30)  # noqa: E731
        print(f"{name:12s} one command    {median_ms(timed(run, commands))}")
        assert isinstance(sandbox, OpensPipes)
        opened, echoed, closed = [], [], []
        for _ in range(max(3, starts)):
            began = time.perf_counter()
            pipe = sandbox.open_pipe(["cat"])
            opened.append(time.perf_counter() - began)
            began = time.perf_counter()
            pipe.send(b"x\n")
            pipe.receive(timeout=30)
            echoed.append(time.perf_counter() - began)
            began = time.perf_counter()
            pipe.close()
            closed.append(time.perf_counter() - began)
        print(f"{name:12s} pipe: open     {median_ms(opened)}")
        print(f"{name:12s} pipe: echo     {median_ms(echoed)}")
        print(f"{name:12s} pipe: close    {median_ms(closed)}")
    finally:
        sandbox.stop()


def storm(fake: FakeOpenSandbox, count: int, **options: object) -> str:
    """`count` starts at once from `count` providers sharing a scratch folder."""
    fake.most_creating = fake.refused_creates = 0
    took: list[float] = []
    failed: list[str] = []
    lock = threading.Lock()
    with tempfile.TemporaryDirectory(prefix="bench-storm-") as scratch:
        context = ProviderContext(run_id="bench-storm", scratch_dir=Path(scratch))

        def start() -> None:
            provider = opensandbox_provider(options=options, context=context)
            began = time.perf_counter()
            try:
                sandbox = provider.start(SandboxSpec(image=IMAGE, labels=LABELS, ttl_s=600))
            except Exception as error:  # every failure is counted and shown
                with lock:
                    failed.append(str(error)[:200])
                return
            with lock:
                took.append(time.perf_counter() - began)
            sandbox.stop()

        began = time.perf_counter()
        threads = [threading.Thread(target=start) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - began
    slowest = max(took) if took else float("nan")
    return (
        f"{len(took)}/{count} up in {wall:5.1f} s; slowest start {slowest:5.1f} s; "
        f"at most {fake.most_creating} creates at once; {fake.refused_creates} refused (429); "
        f"{len(failed)} failed" + (f": {failed[0]}" if failed else "")
    )


SIDES = {"docker": [], "opensandbox": ["--harbor-sandbox=opensandbox"]}


def fake_cpu(per_episode: list[float]) -> str:
    return f"; the fake server's CPU {statistics.median(per_episode) * 1000:4.0f} ms per episode"


def episodes(
    tasks: int, workers: list[int], rounds: int, *, fake_here: bool
) -> dict[tuple[str, int], float]:
    """Per provider and worker count: the median over `rounds` of the wall time per
    episode, once pytest's own start-up (the same run with every item deselected) is
    taken off; the two providers' runs alternate."""
    costs: dict[tuple[str, int], list[float]] = {}
    seeds: dict[tuple[str, int], list[float]] = {}
    served: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-opensandbox-") as scratch:
        dataset = make_dataset(Path(scratch), tasks)
        for count in workers:
            for round_ in range(rounds):
                order = list(SIDES) if round_ % 2 == 0 else list(reversed(SIDES))
                for name in order:
                    extra = SIDES[name]
                    out = Path(scratch) / f"out-{name}-{count}-{round_}"
                    fixed, _, _ = pytest_run(dataset, count, out, *extra, "-k", "no-such-task")
                    # This process's CPU while the run goes: the fake server's alone (the
                    # benchmark itself only waits), when it serves the run.
                    cpu = time.process_time()
                    elapsed, code, output = pytest_run(dataset, count, out, *extra)
                    served.setdefault((name, count), []).append((time.process_time() - cpu) / tasks)
                    if code != 0:
                        sys.exit(f"the {name} run at -n {count} failed ({code}):\n{output[-3000:]}")
                    costs.setdefault((name, count), []).append((elapsed - fixed) / tasks)
                    rows = next(out.rglob("rollouts.jsonl")).read_text().splitlines()
                    seeds.setdefault((name, count), []).extend(
                        json.loads(row)["timings"]["seed_s"] for row in rows
                    )
            for name in SIDES:
                spent = costs[name, count]
                print(
                    f"{name:12s} -n {count}: {statistics.median(spent) * 1000:6.0f} ms per "
                    f"episode (rounds: {', '.join(f'{cost * 1000:.0f}' for cost in spent)}); "
                    f"seed median {statistics.median(seeds[name, count]) * 1000:5.0f} ms"
                    + (fake_cpu(served[name, count]) if name == "opensandbox" and fake_here else "")
                )
    return {key: statistics.median(spent) for key, spent in costs.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--commands", type=int, default=200)
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--storm", type=int, default=0)
    parser.add_argument("--server-limit", type=int, default=16)
    arguments = parser.parse_args()
    if arguments.storm:
        limited = FakeOpenSandbox(
            docker.from_env(), api_key="bench-key", max_creating=arguments.server_limit
        )
        limited.start()
        os.environ["OPENSANDBOX_DOMAIN"] = limited.domain
        os.environ["OPENSANDBOX_API_KEY"] = "bench-key"
        try:
            count = arguments.storm
            print(f"machine: {os.cpu_count()} CPUs; server limit {arguments.server_limit}")
            print(f"turns (defaults):  {storm(limited, count)}")
            print(
                "no cap:            "
                + storm(limited, count, max_starting=count, starts_per_second=100_000)
            )
        finally:
            limited.stop()
        return
    fake = None
    if not os.environ.get("OPENSANDBOX_DOMAIN"):
        fake = FakeOpenSandbox(docker.from_env(), api_key="bench-key", grace_s=1.0)
        fake.start()
        os.environ["OPENSANDBOX_DOMAIN"] = fake.domain
        os.environ["OPENSANDBOX_API_KEY"] = "bench-key"
    try:
        print(f"machine: {os.cpu_count()} CPUs; server: {os.environ['OPENSANDBOX_DOMAIN']}")
        sandboxes("docker", DockerProvider(), arguments.starts, arguments.commands)
        sandboxes(
            "opensandbox",
            opensandbox_provider(options={}, context=ProviderContext()),
            arguments.starts,
            arguments.commands,
        )
        costs = episodes(
            arguments.tasks, arguments.workers, arguments.rounds, fake_here=fake is not None
        )
        for count in arguments.workers:
            ratio = costs["opensandbox", count] / costs["docker", count]
            print(f"-n {count}: an episode on opensandbox costs {ratio:4.2f}x the docker one's")
    finally:
        if fake is not None:
            fake.stop()


if __name__ == "__main__":
    main()
