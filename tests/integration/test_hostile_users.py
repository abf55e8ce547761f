"""Attacks on who an agent runs as, from the task's own image: a passwd file that one
reader of it reads one way and another reads another, a `getent` that lies, a user that is
the keep-alive's own id, a user the image lacks. The engine reads the users once, from
the image's files with its own tools at the seed, and runs agents as those numbers: the
uid whose processes end before the verifier is the uid the agent ran as.

The oracle plays the agent: each solve.sh says who it runs as, and leaves behind a
process that writes the answer back after the verifier resets it; test.sh keeps who the
agent was and scores 1 only if the answer came back.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.fixtures import BASE_IMAGE, Dataset, run_harbor

pytestmark = pytest.mark.docker

#: Says who it runs as, then leaves a process behind that writes the answer back.
LEAVES_A_WRITER = textwrap.dedent(
    """\
    id -u > /tmp/who
    nohup sh -c 'while :; do [ -e /tmp/reset ] && echo 1 > /tmp/answer; sleep 0.1; done' \\
      > /dev/null 2>&1 &
    sleep 0.3
    """
)
#: Resets the answer, waits, and scores 1 only if it came back; keeps who the agent was.
RESETTING = textwrap.dedent(
    """\
    cp /tmp/who /logs/verifier/who.txt
    rm -f /tmp/answer; touch /tmp/reset
    sleep 1.5
    if [ -e /tmp/answer ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
    """
)


def toml(user: str | None) -> str:
    agent = f'[agent]\ntimeout_sec = 60\nuser = "{user}"\n' if user else ""
    return agent + '[verifier]\ntimeout_sec = 30\nuser = "root"\n[environment]\n'


#: Task name: (the agent's user, the Dockerfile's steps after FROM).
HOSTILE = {
    # busybox's `id` skips a line of four fields; the engine's exec takes it.
    "malformed-passwd": ("nobody", "RUN sed -i '1i nobody:x:4242:4242' /etc/passwd\n"),
    # The image's USER, read the same two ways.
    "malformed-image-user": (
        None,
        "RUN sed -i '1i nobody:x:4242:4242' /etc/passwd\nUSER nobody\n",
    ),
    # A getent that says every uid is root.
    "lying-getent": (
        "1000",
        "RUN printf '#!/bin/sh\\necho root:x:0:0:root:/root:/bin/bash\\n' "
        "> /usr/local/bin/getent && chmod 755 /usr/local/bin/getent\n",
    ),
    # A line named like a uid, with uid 0, before that uid's own line.
    "named-like-a-uid": (
        "1500",
        "RUN useradd -u 1500 -M alice && sed -i '1i 1500:x:0:0::/root:/bin/sh' /etc/passwd\n",
    ),
    # A name that is the keep-alive's uid in this image.
    "keepalive-uid": ("keeper", "RUN useradd -u 65533 -M keeper\n"),
    # A name that is not in the image.
    "ghost": ("ghost", ""),
}
#: The uid each attack's agent must have run as.
RAN_AS = {
    "malformed-passwd": "4242",
    "malformed-image-user": "4242",
    "lying-getent": "1000",
    "named-like-a-uid": "1500",
}
#: What the refusal of each other attack names.
REFUSED = {
    "keepalive-uid": ["'keeper'", "65533", "keep-alive"],
    "ghost": ["'ghost'", "/etc/passwd"],
}


def test_agents_run_as_the_uid_the_engine_read_and_end_with_it(
    pytester: pytest.Pytester, dataset: Dataset, built_images: list[Path]
) -> None:
    """One run over every attack (each builds its own image). The agent ran as the uid
    the engine read, and what it left behind was ended before the verifier: the answer did
    not come back. A user the engine cannot run as is refused, by name."""
    for name, (user, steps) in HOSTILE.items():
        task = dataset.task(
            name,
            toml=toml(user),
            dockerfile=f"FROM {BASE_IMAGE}\n{steps}",
            solve_sh=LEAVES_A_WRITER,
            test_sh=RESETTING,
        )
        built_images.append(task / "environment")
    run_harbor(pytester, dataset, "-n", "2")
    results = pytester.path / "out"
    rows = {str(row["task_id"]): row for row in dataset.rows(results)}
    for name, uid in RAN_AS.items():
        row = rows[name]
        assert row["failure_kind"] is None, row
        kept = Path(str(row["verifier_logs_dir"])) / "who.txt"
        assert (name, kept.read_text().strip()) == (name, uid)
        assert (name, row["reward"], row["mask_sample"]) == (name, 0.0, False), row
    failures = {str(row["task_id"]): row for row in dataset.failures(results)}
    assert set(failures) == set(REFUSED)
    for name, words in REFUSED.items():
        failure = failures[name]
        assert failure["failure_kind"] == "harbor:task_refused", failure
        for word in words:
            assert word in str(failure["failure_reason"]), failure
