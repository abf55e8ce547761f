"""Allow-listed networks on the docker provider: a listed name answers, an unlisted name
and a raw address do not, and a root agent cannot widen the list; phases switch between
an allow-list and the whole network. The servers are containers of the test's own on a
Docker network it creates."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import docker
import pytest

from tests.fixtures import BASE_IMAGE, Dataset, run_harbor

pytestmark = pytest.mark.docker

SERVER_IMAGE = "busybox:musl"


@dataclass
class Servers:
    network: str
    listed_ip: str


@pytest.fixture
def servers(docker_client: docker.DockerClient) -> Iterator[Servers]:
    """Two web servers on a network of the test's own: one answers as `listed.harbor.test`
    and `api.suffix.harbor.test` (body `server-a`), the other as `unlisted.harbor.test`
    (body `server-b`)."""
    mark = {"pytest-harbor.run": f"allowlist-test-{uuid.uuid4().hex[:8]}"}
    network = docker_client.networks.create(
        f"harbor-allow-{uuid.uuid4().hex[:8]}", driver="bridge", labels=mark
    )
    started = []
    try:
        for body, aliases in (
            ("server-a", ["listed.harbor.test", "api.suffix.harbor.test"]),
            ("server-b", ["unlisted.harbor.test"]),
        ):
            container = docker_client.containers.create(
                SERVER_IMAGE,
                [
                    "/bin/busybox",
                    "sh",
                    "-c",
                    f"/bin/busybox mkdir -p /www && echo {body} > /www/index.html "
                    "&& exec /bin/busybox httpd -f -p 80 -h /www",
                ],
                labels=mark,
            )
            started.append(container)
            network.connect(container, aliases=aliases)
            container.start()
        started[0].reload()
        address = started[0].attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
        yield Servers(network.name, address)
    finally:
        for container in started:
            container.remove(force=True)
        network.remove()


#: Probes run by solve.sh as root; each prints one line.
PROBES = r"""
get() {  # name [address to connect to]: the body's last line, or "unreachable"
  body=$(timeout 5 bash -c '
    exec 3<>"/dev/tcp/$2/80" || exit 1
    printf "GET / HTTP/1.0\r\nHost: %s\r\n\r\n" "$1" >&3
    tail -n 1 <&3' _ "$1" "${2:-$1}" 2>/dev/null)
  echo "${body:-unreachable}"
}
{
  echo "listed: $(get listed.harbor.test)"
  echo "suffix: $(get api.suffix.harbor.test)"
  echo "unlisted: $(get unlisted.harbor.test)"
  echo "raw address: $(get listed.harbor.test "$SERVER_IP")"
  echo "unlisted resolves: $(getent hosts unlisted.harbor.test >/dev/null && echo yes || echo no)"
  # A Host header naming another host, on a connection to a listed name.
  echo "smuggled: $(get unlisted.harbor.test listed.harbor.test)"
  # The proxy port, asked for an unlisted host.
  echo "proxy: $(timeout 5 bash -c 'exec 3<>/dev/tcp/$1/3128 || exit 1
    printf "CONNECT unlisted.harbor.test:80 HTTP/1.1\r\n\r\n" >&3; head -n 1 <&3' _ \
    "$(getent hosts listed.harbor.test | cut -d" " -f1)" | tr -d "\r")"
  # Root tries to go around: its own name server, and any route it can make.
  cp /etc/resolv.conf /tmp/resolv.conf
  echo "nameserver $SERVER_IP" > /etc/resolv.conf
  echo "own resolver: $(get unlisted.harbor.test)"
  cp /tmp/resolv.conf /etc/resolv.conf
  # No capability to change routes or firewall rules (CAP_NET_ADMIN, bit 12).
  echo "net admin: $(( (0x$(awk '/^CapEff/ {print $2}' /proc/self/status) >> 12) & 1 ))"
} > /app/probes.txt
"""

EXPECTED = """listed: server-a
suffix: server-a
unlisted: unreachable
raw address: unreachable
unlisted resolves: no
smuggled: unreachable
proxy: HTTP/1.1 403 Forbidden
own resolver: unreachable
net admin: 0
"""


def allowlist_task(
    dataset: Dataset,
    name: str,
    servers: Servers,
    toml: str,
    test_sh: str,
    environment: str = "",
) -> None:
    dataset.task(
        name,
        toml=toml
        + f'[environment]\ndocker_image = "{BASE_IMAGE}"\nworkdir = "/app"\n{environment}'
        + f'[solution]\nenv = {{ SERVER_IP = "{servers.listed_ip}" }}\n',
        solve_sh=PROBES,
        test_sh=test_sh,
    )


def run_on(
    pytester: pytest.Pytester, dataset: Dataset, servers: Servers, *args: str
) -> pytest.RunResult:
    """The run, its sandboxes' outside network being the servers'."""
    return run_harbor(
        pytester, dataset, f"--harbor-set=sandbox_provider_options.network={servers.network}", *args
    )


def test_an_allow_list_lets_listed_names_through_and_nothing_else(
    pytester: pytest.Pytester, harbor_dataset: Dataset, servers: Servers
) -> None:
    check = (
        f'cat /app/probes.txt\n[ "$(cat /app/probes.txt)" = "{EXPECTED.strip()}" ] '
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    )
    # The environment's allow-list holds for every phase.
    allowlist_task(
        harbor_dataset,
        "held",
        servers,
        "[agent]\ntimeout_sec = 120\n[verifier]\ntimeout_sec = 60\n",
        check,
        environment='network_mode = "allowlist"\n'
        'allowed_hosts = ["listed.harbor.test", "*.suffix.harbor.test"]\n',
    )
    result = run_on(pytester, harbor_dataset, servers)
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.assert_outcomes(passed=1)


def test_a_phase_with_the_whole_network_after_an_allow_listed_one(
    pytester: pytest.Pytester, harbor_dataset: Dataset, servers: Servers
) -> None:
    # The agent's phase is an allow-list; the verifier's the whole network again.
    check = (
        "cat /app/probes.txt\n"
        "grep -qx 'unlisted: unreachable' /app/probes.txt || exit 0\n"
        "body=$(timeout 5 bash -c 'exec 3<>/dev/tcp/unlisted.harbor.test/80 && "
        'printf "GET / HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n" >&3 && tail -n 1 <&3\')\n'
        '[ "$body" = server-b ] && echo 1 > /logs/verifier/reward.txt\n'
    )
    toml = (
        '[agent]\ntimeout_sec = 120\nnetwork_mode = "allowlist"\n'
        'allowed_hosts = ["listed.harbor.test"]\n[verifier]\ntimeout_sec = 60\n'
    )
    allowlist_task(harbor_dataset, "switched", servers, toml, check)
    result = run_on(pytester, harbor_dataset, servers)
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.assert_outcomes(passed=1)


def test_a_non_root_agents_leftover_never_has_the_verifiers_wider_network(
    pytester: pytest.Pytester, harbor_dataset: Dataset, servers: Servers
) -> None:
    # The agent (nobody) leaves loops behind that try a server's raw address, which only
    # the whole network reaches; the verifier's phase has it. The agent's processes end
    # before that network is given.
    leftover = (
        # Wait for a new network interface (the whole network given back), then connect.
        "setsid nohup bash -c 'for i in 1 2 3 4; do ( "
        "while [ $(ls /sys/class/net | wc -l) -lt 3 ]; do :; done; "
        "(exec 3<>/dev/tcp/$SERVER_IP/80) 2>/dev/null && touch /tmp/leaked "
        ") & done; wait' > /dev/null 2>&1 &\n"
    )
    check = "sleep 3\n[ -e /tmp/leaked ] && exit 0\necho 1 > /logs/verifier/reward.txt\n"
    harbor_dataset.task(
        "leftover",
        toml=(
            '[agent]\ntimeout_sec = 60\nuser = "nobody"\nnetwork_mode = "allowlist"\n'
            'allowed_hosts = ["listed.harbor.test"]\n[verifier]\ntimeout_sec = 60\n'
            f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'
            f'[solution]\nenv = {{ SERVER_IP = "{servers.listed_ip}" }}\n'
        ),
        solve_sh=leftover,
        test_sh=check,
    )
    result = run_on(pytester, harbor_dataset, servers)
    result.assert_outcomes(passed=1)


def test_a_non_root_agents_leftover_never_has_the_network_after_a_phase_without_it(
    pytester: pytest.Pytester, harbor_dataset: Dataset, servers: Servers
) -> None:
    # The same race after a phase with no network at all: the loops wait for the first
    # interface past the loopback.
    leftover = (
        "setsid nohup bash -c 'for i in 1 2 3 4; do ( "
        "while [ $(ls /sys/class/net | wc -l) -lt 2 ]; do :; done; "
        "(exec 3<>/dev/tcp/$SERVER_IP/80) 2>/dev/null && touch /tmp/leaked "
        ") & done; wait' > /dev/null 2>&1 &\n"
    )
    harbor_dataset.task(
        "offline-leftover",
        toml=(
            '[agent]\ntimeout_sec = 60\nuser = "nobody"\nnetwork_mode = "no-network"\n'
            f'[verifier]\ntimeout_sec = 60\n[environment]\ndocker_image = "{BASE_IMAGE}"\n'
            f'[solution]\nenv = {{ SERVER_IP = "{servers.listed_ip}" }}\n'
        ),
        solve_sh=leftover,
        test_sh="sleep 3\n[ -e /tmp/leaked ] && exit 0\necho 1 > /logs/verifier/reward.txt\n",
    )
    result = run_on(pytester, harbor_dataset, servers)
    result.assert_outcomes(passed=1)


#: A Compose task's sidecar: it answers `/` with `sidecar-up`, and `/cgi-bin/probe` with
#: what it reaches itself, asked when the agent asks (so under the agent's phase).
SIDECAR_PROBE = r"""#!/bin/busybox sh
echo "Content-Type: text/plain"
echo
reach() {  # the last line of the answer (busybox nc, its input held open for it)
  body=$( (printf "GET / HTTP/1.0\r\nHost: $1\r\n\r\n"; /bin/busybox sleep 3) \
    | /bin/busybox nc -w 3 "$1" 80 2>/dev/null | /bin/busybox tail -n 1)
  echo "${body:-unreachable}"
}
echo "listed=$(reach listed.harbor.test) unlisted=$(reach unlisted.harbor.test)"
"""

COMPOSE_PROBES = r"""
{
  echo "sidecar: $(get helper)"
  echo "sidecar probes: $(timeout 10 bash -c 'exec 3<>/dev/tcp/helper/80 || exit 1
    printf "GET /cgi-bin/probe HTTP/1.0\r\nHost: helper\r\n\r\n" >&3; tail -n 1 <&3')"
  # This machine's address on each of main's networks (the bridge's first address):
  # none answers, so no service of this machine is reached around the egress.
  gateways=$(/.pytest-harbor/busybox ip -4 -o addr show scope global \
    | awk '{split($4, a, "[./]"); print a[1] "." a[2] "." a[3] ".1"}' | sort -u)
  answered=none
  for gateway in $gateways; do
    /.pytest-harbor/busybox ping -c 1 -W 2 "$gateway" >/dev/null 2>&1 && answered=$gateway
  done
  echo "networks: $(echo "$gateways" | wc -l), host answers: $answered"
  echo "no proxy: $(echo "$NO_PROXY" | tr ',' '\n' | grep -cx helper)"
} >> /app/probes.txt
"""

SIDECAR_EXPECTED = """sidecar: sidecar-up
sidecar probes: listed=server-a unlisted=unreachable
networks: 2, host answers: none
no proxy: 1
"""


def compose_allowlist_task(
    dataset: Dataset, name: str, servers: Servers, toml: str, test_sh: str
) -> None:
    folder = dataset.task(
        name,
        toml=toml
        + '[environment]\nworkdir = "/app"\nnetwork_mode = "allowlist"\n'
        + 'allowed_hosts = ["listed.harbor.test", "*.suffix.harbor.test"]\n'
        + f'[solution]\nenv = {{ SERVER_IP = "{servers.listed_ip}" }}\n',
        solve_sh=PROBES + COMPOSE_PROBES,
        test_sh=test_sh,
        dockerfile=f"FROM {BASE_IMAGE}\n",
    )
    environment = folder / "environment"
    (environment / "docker-compose.yaml").write_text(
        "services:\n  main:\n    depends_on: [helper]\n  helper:\n    build: ./helper\n"
    )
    helper = environment / "helper"
    helper.mkdir()
    (helper / "probe").write_text(SIDECAR_PROBE)
    (helper / "Dockerfile").write_text(
        f"FROM {SERVER_IMAGE}\n"
        "COPY probe /www/cgi-bin/probe\n"
        'RUN ["/bin/busybox", "sh", "-c", "/bin/busybox chmod 755 /www/cgi-bin/probe '
        '&& echo sidecar-up > /www/index.html"]\n'
        'CMD ["/bin/busybox", "httpd", "-f", "-p", "80", "-h", "/www"]\n'
    )


def test_a_compose_task_behind_an_allow_list(
    pytester: pytest.Pytester, harbor_dataset: Dataset, servers: Servers
) -> None:
    """Every service of the project is behind the allow-list: main reaches its sidecar by
    name and listed names, nothing else, and no address of this machine; the sidecar
    reaches a listed name and not an unlisted one."""
    check = (
        "cat /app/probes.txt\n"
        f'[ "$(cat /app/probes.txt)" = "{(EXPECTED + SIDECAR_EXPECTED).strip()}" ] '
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    )
    compose_allowlist_task(
        harbor_dataset,
        "composed",
        servers,
        "[agent]\ntimeout_sec = 120\n[verifier]\ntimeout_sec = 60\n",
        check,
    )
    result = run_on(pytester, harbor_dataset, servers)
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.assert_outcomes(passed=1)


def test_a_compose_task_with_a_public_phase_beside_an_allow_list_is_refused(
    pytester: pytest.Pytester, harbor_dataset: Dataset, servers: Servers
) -> None:
    compose_allowlist_task(
        harbor_dataset,
        "mixed",
        servers,
        '[agent]\ntimeout_sec = 120\n[verifier]\ntimeout_sec = 60\nnetwork_mode = "public"\n',
        "echo 1 > /logs/verifier/reward.txt\n",
    )
    result = run_on(pytester, harbor_dataset, servers)
    assert result.ret != 0
    output = result.stdout.str()
    assert "task.toml: environment.network_mode: a Compose task with" in output, output[-3000:]
    assert "a phase with the whole network (public)" in output
