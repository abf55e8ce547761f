"""The fake OpenSandbox server itself (tests/opensandbox_fake/), driven over HTTP with
httpx: the lifecycle API, execd's stream and files, and pulls from a real registry. What
it must show is what the real server does (the behaviour digest), quirks included."""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import docker
import httpx
import pytest

from tests.fixtures import BASE_IMAGE
from tests.opensandbox_fake import FakeOpenSandbox
from tests.registry import LocalRegistry

pytestmark = pytest.mark.docker

KEY = "test-key"
RUN = f"fake-test-{uuid.uuid4().hex[:8]}"
LIMITS = {"cpu": "500m", "memory": "512Mi"}
TERMINAL = {"execution_complete", "error"}


def create_body(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "image": {"uri": BASE_IMAGE},
        "entrypoint": ["tail", "-f", "/dev/null"],
        "resourceLimits": LIMITS,
        "metadata": {"pytest-harbor.run": RUN},
    }
    body.update(fields)
    return body


@pytest.fixture(scope="module")
def fake(docker_client: docker.DockerClient) -> Iterator[FakeOpenSandbox]:
    server = FakeOpenSandbox(docker_client, api_key=KEY)
    server.start()
    yield server
    server.stop()
    assert server.sandbox_containers() == []


@pytest.fixture(scope="module")
def api(fake: FakeOpenSandbox) -> Iterator[httpx.Client]:
    headers = {"OPEN-SANDBOX-API-KEY": KEY}
    with httpx.Client(base_url=f"http://{fake.domain}/v1", headers=headers, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def sandbox(api: httpx.Client) -> dict[str, Any]:
    metadata = {"pytest-harbor.run": RUN, "project": "fake-tests", "team": "red"}
    created = api.post("/sandboxes", json=create_body(metadata=metadata))
    assert created.status_code == 202, created.text
    answer: dict[str, Any] = created.json()
    return answer


def execd_client(api: httpx.Client, sandbox_id: str, **headers: str) -> httpx.Client:
    endpoint = api.get(f"/sandboxes/{sandbox_id}/endpoints/44772").json()["endpoint"]
    return httpx.Client(base_url=f"http://{endpoint}", headers=headers, timeout=60)


@pytest.fixture(scope="module")
def execd(api: httpx.Client, sandbox: dict[str, Any]) -> Iterator[httpx.Client]:
    with execd_client(api, sandbox["id"]) as client:
        yield client


def run(execd: httpx.Client, **body: Any) -> list[dict[str, Any]]:
    """The events of one /command, up to the terminal one (the stream stays open longer)."""
    events: list[dict[str, Any]] = []
    with execd.stream("POST", "/command", json=body) as answer:
        assert answer.status_code == 200, answer.read()
        for line in answer.iter_lines():
            if not line:
                continue
            events.append(json.loads(line))
            if events[-1]["type"] in TERMINAL:
                break
    return events


def texts(events: list[dict[str, Any]], kind: str) -> list[str]:
    return [event["text"] for event in events if event["type"] == kind]


def processes(execd: httpx.Client) -> list[str]:
    listing = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"
    return [line.strip() for line in texts(run(execd, command=listing), "stdout")]


# -- lifecycle --------------------------------------------------------------------------


def test_create_answers_like_the_docker_runtime(
    api: httpx.Client, sandbox: dict[str, Any], docker_client: docker.DockerClient
) -> None:
    assert sandbox["status"]["state"] == "Running"
    assert sandbox["status"]["reason"] == "CONTAINER_RUNNING"
    assert sandbox["entrypoint"] == ["tail", "-f", "/dev/null"]
    assert "expiresAt" not in sandbox  # no timeout: manual cleanup
    assert str(uuid.UUID(sandbox["id"])) == sandbox["id"]
    got = api.get(f"/sandboxes/{sandbox['id']}").json()
    # The runtime names an image by its first tag; another test may push the base image
    # under a tag of its own while this one runs.
    assert got["image"]["uri"] in {BASE_IMAGE, *docker_client.images.get(BASE_IMAGE).tags}
    assert got["metadata"] == {"pytest-harbor.run": RUN, "project": "fake-tests", "team": "red"}
    # The same routes answer without /v1.
    bare = httpx.get(f"http://{api.base_url.host}:{api.base_url.port}/sandboxes/{sandbox['id']}")
    assert bare.status_code == 401
    container = docker_client.containers.get(f"sandbox-{sandbox['id']}")
    host = container.attrs["HostConfig"]
    assert (host["NanoCpus"], host["Memory"], host["PidsLimit"]) == (5 * 10**8, 512 * 2**20, 4096)
    assert host["SecurityOpt"] == ["no-new-privileges:true"]
    assert {"NET_RAW", "SYS_ADMIN", "SYS_PTRACE"} <= set(host["CapDrop"])
    labels = container.labels
    assert labels["opensandbox.io/id"] == sandbox["id"]
    assert labels["opensandbox.io/manual-cleanup"] == "true"
    assert labels["pytest-harbor.run"] == RUN
    assert container.attrs["Config"]["Cmd"] == ["tail", "-f", "/dev/null"]


def test_create_refuses_what_the_real_server_refuses(api: httpx.Client) -> None:
    no_limits = api.post("/sandboxes", json=create_body(resourceLimits=None))
    assert no_limits.status_code == 422
    assert "resourceLimits is required" in no_limits.json()["detail"][0]["msg"]
    short = api.post("/sandboxes", json=create_body(timeout=59))
    assert short.status_code == 422
    assert short.json()["detail"][0]["loc"] == ["body", "timeout"]
    both = api.post("/sandboxes", json=create_body(snapshotId="s"))
    assert both.status_code == 422
    snapshot = api.post("/sandboxes", json=create_body(image=None, snapshotId="s"))
    assert snapshot.status_code == 400
    reserved = api.post("/sandboxes", json=create_body(metadata={"opensandbox.io/x": "y"}))
    assert (reserved.status_code, reserved.json()["code"]) == (
        400,
        "SANDBOX::INVALID_METADATA_LABEL",
    )
    bad_value = api.post("/sandboxes", json=create_body(metadata={"k": "has space"}))
    assert bad_value.json()["code"] == "SANDBOX::INVALID_METADATA_LABEL"
    policy = api.post("/sandboxes", json=create_body(networkPolicy={"defaultAction": "deny"}))
    assert (policy.status_code, policy.json()) == (
        400,
        {
            "code": "SANDBOX::INVALID_PARAMETER",
            "message": "egress.image must be configured when networkPolicy is provided.",
        },
    )
    # A pool's create needs no image, entrypoint or limits (schema.py), and the Docker
    # runtime refuses it (docker_service.py).
    pooled = api.post(
        "/sandboxes",
        json=create_body(
            image=None, entrypoint=None, resourceLimits=None, extensions={"poolRef": "warm"}
        ),
    )
    assert (pooled.status_code, pooled.json()) == (
        400,
        {
            "code": "SANDBOX::UNSUPPORTED_POOL_REF",
            "message": "poolRef is not supported by the Docker provider. "
            "Use Kubernetes BatchSandbox provider instead.",
        },
    )
    missing = api.post("/sandboxes", json=create_body(image={"uri": "no-such-image:never"}))
    assert (missing.status_code, missing.json()["code"]) == (
        500,
        "DOCKER::SANDBOX_IMAGE_PULL_FAILED",
    )


def test_the_api_key_guards_every_lifecycle_route(fake: FakeOpenSandbox) -> None:
    base = f"http://{fake.domain}"
    assert httpx.get(f"{base}/health").json() == {"status": "healthy"}
    missing = httpx.get(f"{base}/v1/sandboxes")
    assert (missing.status_code, missing.json()["code"]) == (401, "MISSING_API_KEY")
    wrong = httpx.get(f"{base}/v1/sandboxes", headers={"OPEN-SANDBOX-API-KEY": "nope"})
    assert (wrong.status_code, wrong.json()["code"]) == (401, "INVALID_API_KEY")


def test_list_filters_on_metadata_state_and_pages(
    api: httpx.Client, sandbox: dict[str, Any], docker_client: docker.DockerClient
) -> None:
    other = api.post("/sandboxes", json=create_body(metadata={"project": "fake-tests"})).json()
    try:
        # Without a run label in the metadata, the container still gets one of the fake's.
        labels = docker_client.containers.get(f"sandbox-{other['id']}").labels
        assert labels["pytest-harbor.run"].startswith("opensandbox-fake-")
        # The filter is one form-encoded value: project=fake-tests&team=red, encoded again.
        both = api.get("/sandboxes", params={"metadata": "project=fake-tests&team=red"}).json()
        assert [item["id"] for item in both["items"]] == [sandbox["id"]]
        project = api.get("/sandboxes", params={"metadata": "project=fake-tests"}).json()
        assert [item["id"] for item in project["items"]] == [other["id"], sandbox["id"]]
        paged = api.get("/sandboxes", params={"metadata": "project=fake-tests", "pageSize": 1})
        assert paged.json()["pagination"] == {
            "page": 1,
            "pageSize": 1,
            "totalItems": 2,
            "totalPages": 2,
            "hasNextPage": True,
        }
        # The run label the fake adds itself is not metadata.
        assert project["items"][0]["metadata"] == {"project": "fake-tests"}
        running = api.get("/sandboxes", params=[("state", "RUNNING"), ("state", "Paused")])
        assert {item["id"] for item in running.json()["items"]} >= {sandbox["id"], other["id"]}
        none = api.get("/sandboxes", params={"state": "Terminated"}).json()
        assert none["items"] == []
        broken = api.get("/sandboxes", params={"metadata": "project"})
        assert (broken.status_code, broken.json()["code"]) == (400, "INVALID_METADATA_FORMAT")
        assert api.get("/sandboxes", params={"pageSize": 201}).status_code == 422
    finally:
        api.delete(f"/sandboxes/{other['id']}")


def test_delete_removes_the_sandbox_at_once(
    api: httpx.Client, docker_client: docker.DockerClient
) -> None:
    created = api.post("/sandboxes", json=create_body()).json()
    execd = execd_client(api, created["id"])
    deleted = api.delete(f"/sandboxes/{created['id']}")
    assert (deleted.status_code, deleted.content) == (204, b"")
    gone = api.get(f"/sandboxes/{created['id']}")
    assert (gone.status_code, gone.json()["code"]) == (404, "DOCKER::SANDBOX_NOT_FOUND")
    assert api.delete(f"/sandboxes/{created['id']}").status_code == 404
    with execd:
        assert execd.get("/ping").status_code == 404
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(f"sandbox-{created['id']}")


def test_endpoints_lead_only_to_execd(api: httpx.Client, sandbox: dict[str, Any]) -> None:
    endpoint = api.get(f"/sandboxes/{sandbox['id']}/endpoints/44772").json()["endpoint"]
    assert not endpoint.startswith("http")
    assert endpoint.endswith(f"/sandboxes/{sandbox['id']}/proxy/44772")
    other = api.get(f"/sandboxes/{sandbox['id']}/endpoints/8080").json()["endpoint"]
    assert httpx.get(f"http://{other}/").status_code == 502


def test_pause_and_resume(api: httpx.Client, sandbox: dict[str, Any]) -> None:
    path = f"/sandboxes/{sandbox['id']}"
    assert api.post(f"{path}/resume").status_code == 409
    assert api.post(f"{path}/pause").status_code == 202
    try:
        assert api.get(path).json()["status"]["state"] == "Paused"
        assert api.post(f"{path}/pause").json()["code"] == "DOCKER::SANDBOX_NOT_RUNNING"
    finally:
        assert api.post(f"{path}/resume").status_code == 202
    assert api.get(path).json()["status"]["state"] == "Running"


def test_a_sandbox_ends_with_its_entrypoint(api: httpx.Client) -> None:
    ok = api.post("/sandboxes", json=create_body(entrypoint=["true"])).json()
    failing = api.post("/sandboxes", json=create_body(entrypoint=["sh", "-c", "exit 3"])).json()
    try:
        states = {}
        for _ in range(50):
            states = {
                name: api.get(f"/sandboxes/{item['id']}").json()["status"]["state"]
                for name, item in (("ok", ok), ("failing", failing))
            }
            if "Running" not in states.values():
                break
            time.sleep(0.1)
        assert states == {"ok": "Terminated", "failing": "Failed"}
    finally:
        api.delete(f"/sandboxes/{ok['id']}")
        api.delete(f"/sandboxes/{failing['id']}")


def test_renew_and_expiry(
    docker_client: docker.DockerClient, api: httpx.Client, sandbox: dict[str, Any]
) -> None:
    never = datetime.now(UTC) + timedelta(hours=1)
    manual = api.post(
        f"/sandboxes/{sandbox['id']}/renew-expiration", json={"expiresAt": never.isoformat()}
    )
    assert manual.status_code == 409
    # The real minimum timeout is 60 s; this fake lets 1 s through to see expiry happen.
    quick = FakeOpenSandbox(docker_client, api_key=KEY, min_timeout_s=1)
    quick.start()
    try:
        headers = {"OPEN-SANDBOX-API-KEY": KEY}
        with httpx.Client(base_url=f"http://{quick.domain}/v1", headers=headers) as client:
            created = client.post("/sandboxes", json=create_body(timeout=1)).json()
            assert "expiresAt" in created
            renew = f"/sandboxes/{created['id']}/renew-expiration"
            past = datetime.now(UTC) - timedelta(seconds=5)
            assert client.post(renew, json={"expiresAt": past.isoformat()}).status_code == 400
            later = datetime.now(UTC) + timedelta(seconds=2)
            renewed = client.post(renew, json={"expiresAt": later.isoformat()})
            assert renewed.status_code == 200
            assert renewed.json()["expiresAt"] == later.isoformat().replace("+00:00", "Z")
            time.sleep(1.2)  # past the first expiry: the renewal holds it
            assert client.get(f"/sandboxes/{created['id']}").status_code == 200
            for _ in range(40):
                if client.get(f"/sandboxes/{created['id']}").status_code == 404:
                    break
                time.sleep(0.1)
            assert client.get(f"/sandboxes/{created['id']}").status_code == 404
            assert quick.sandbox_containers() == []
    finally:
        quick.stop()


def test_an_image_from_a_registry_is_pulled(
    docker_client: docker.DockerClient,
    api: httpx.Client,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    registry = LocalRegistry()
    registry.start(tmp_path_factory.mktemp("registry"))
    repository = f"{registry.address}/fake-test/debian"
    tag = uuid.uuid4().hex[:8]
    reference = f"{repository}:{tag}"
    sandbox_id = ""
    try:
        docker_client.images.get(BASE_IMAGE).tag(repository, tag)
        for line in docker_client.images.push(repository, tag=tag, stream=True, decode=True):
            assert "error" not in line, line
        docker_client.images.remove(reference)
        created = api.post("/sandboxes", json=create_body(image={"uri": reference}))
        assert created.status_code == 202, created.text
        sandbox_id = created.json()["id"]
        assert reference in docker_client.images.get(reference).tags  # it was pulled
        assert api.get(f"/sandboxes/{sandbox_id}").json()["image"]["uri"] == reference
        unknown = api.post("/sandboxes", json=create_body(image={"uri": f"{repository}:nope"}))
        assert unknown.json()["code"] == "DOCKER::SANDBOX_IMAGE_PULL_FAILED"
    finally:
        if sandbox_id:
            api.delete(f"/sandboxes/{sandbox_id}")
        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_client.images.remove(reference)
        registry.stop()


# -- execd: commands ------------------------------------------------------------------------


def test_the_stream_is_bare_json_lines_split_as_execd_splits_them(
    execd: httpx.Client,
) -> None:
    script = "printf 'a\\nb\\r\\n\\nc'; printf 'caf\\303\\251 \\377\\n' >&2"
    with execd.stream("POST", "/command", json={"command": script}) as answer:
        assert answer.headers["content-type"] == "text/event-stream"
        raw = b""
        for chunk in answer.iter_bytes():
            raw += chunk
            if b"execution_complete" in raw:
                break
    frames = raw.decode().split("\n\n")
    assert frames[-1] == "" and not any(frame.startswith("data:") for frame in frames)
    events = [json.loads(frame) for frame in frames[:-1]]
    assert all(isinstance(event["timestamp"], int) for event in events)
    assert events[0]["type"] == "init" and len(events[0]["text"]) == 32
    int(events[0]["text"], 16)
    assert events[1] == {"type": "ping", "text": "pong", "timestamp": events[1]["timestamp"]}
    assert texts(events, "stdout") == ["a", "b", "\n", "c"]
    assert texts(events, "stderr") == ["caf\u00e9 \ufffd"]
    assert events[-1]["type"] == "execution_complete"
    assert isinstance(events[-1]["execution_time"], int)


def test_exit_codes_come_only_as_errors(execd: httpx.Client) -> None:
    events = run(execd, command="echo out; exit 3")
    assert texts(events, "stdout") == ["out"]
    assert events[-1]["error"] == {
        "ename": "CommandExecError",
        "evalue": "3",
        "traceback": ["exit status 3"],
    }
    assert "execution_complete" not in [event["type"] for event in events]
    # A death by signal is -1 (Go's ExitCode), not the engine's 128+N; exit 137 stays 137.
    killed = run(execd, command="kill -9 $$")[-1]["error"]
    assert (killed["evalue"], killed["traceback"]) == ("-1", ["signal: killed"])
    crashed = run(execd, command="kill -SEGV $$")[-1]["error"]
    assert crashed["traceback"][0].startswith("signal: segmentation fault")
    assert run(execd, command="exit 137")[-1]["error"]["evalue"] == "137"


def test_a_timeout_kills_the_whole_group(execd: httpx.Client) -> None:
    started = time.monotonic()
    events = run(execd, command="sleep 300 & sleep 301; echo never", timeout=1000)
    assert time.monotonic() - started < 10
    assert events[-1]["error"]["evalue"] == "-1"
    assert events[-1]["error"]["traceback"] == ["signal: killed"]
    assert "never" not in texts(events, "stdout")
    assert not [line for line in processes(execd) if line.startswith("sleep 30")]


def test_users_environment_and_working_directory(execd: httpx.Client) -> None:
    probe = 'id -u; id -g; echo "$HOME"; echo "$GREETING"; pwd; echo "$EXECD_ENVS"'
    events = run(
        execd, command=probe, uid=1000, gid=1001, envs={"GREETING": "hi there"}, cwd="/usr"
    )
    assert texts(events, "stdout") == [
        "1000",
        "1001",
        "/root",  # execd's HOME, whatever the uid
        "hi there",
        "/usr",
        "/opt/opensandbox/.env",  # exported by bootstrap.sh to execd
    ]
    nobody = run(execd, command="id -u; id -g", uid=65534)
    assert texts(nobody, "stdout") == ["65534", "65534"]
    for body, fragment in (
        ({"command": "true", "gid": 5}, "uid is required"),
        ({"command": "true", "cwd": "/no/such/dir"}, "does not exist"),
        ({"command": "true", "cwd": "/etc/passwd"}, "not a directory"),
        ({"command": ""}, "required"),
    ):
        refused = execd.post("/command", json=body)
        assert refused.status_code == 400
        assert refused.json()["code"] == "INVALID_REQUEST_BODY"
        assert fragment in refused.json()["message"]


def test_the_stream_outlives_its_last_event_and_a_client_that_leaves(
    execd: httpx.Client,
) -> None:
    with execd.stream("POST", "/command", json={"command": "true"}) as answer:
        lines = answer.iter_lines()
        for line in lines:
            if line and json.loads(line)["type"] == "execution_complete":
                break
        ended = time.monotonic()
        assert all(not line or json.loads(line)["type"] == "ping" for line in lines)
        assert time.monotonic() - ended > 0.7  # the grace second before the close
    marker = f"/tmp/after-{uuid.uuid4().hex[:6]}"
    with execd.stream("POST", "/command", json={"command": f"sleep 1; touch {marker}"}) as left:
        command_id = json.loads(next(left.iter_lines()))["text"]
    for _ in range(50):
        status = execd.get(f"/command/status/{command_id}").json()
        if not status["running"]:
            break
        time.sleep(0.1)
    assert (status["exit_code"], status["content"]) == (0, f"sleep 1; touch {marker}")
    assert "finished_at" in status and "error" not in status
    assert execd.get("/files/info", params={"path": marker}).status_code == 200
    assert execd.get("/command/status/nope").status_code == 404


def test_background_commands_status_logs_and_interrupt(execd: httpx.Client) -> None:
    events = run(execd, command="echo hello; sleep 30", background=True)
    assert [event["type"] for event in events] == ["init", "ping", "execution_complete"]
    command_id = events[0]["text"]
    assert execd.get(f"/command/status/{command_id}").json()["running"] is True
    for _ in range(20):
        logs = execd.get(f"/command/{command_id}/logs")
        if logs.content:
            break
        time.sleep(0.1)
    assert logs.content == b"hello\n"
    assert logs.headers["EXECD-COMMANDS-TAIL-CURSOR"] == "6"
    assert execd.delete("/command", params={"id": command_id}).status_code == 200
    for _ in range(20):
        status = execd.get(f"/command/status/{command_id}").json()
        if not status["running"]:
            break
        time.sleep(0.1)
    assert (status["exit_code"], status["error"]) == (-1, "signal: terminated")
    again = execd.delete("/command", params={"id": command_id})
    assert (again.status_code, again.json()["code"]) == (500, "RUNTIME_ERROR")


def test_an_execd_token_in_the_environment_turns_auth_on(api: httpx.Client) -> None:
    created = api.post("/sandboxes", json=create_body(env={"EXECD_ACCESS_TOKEN": "s3cret"}))
    sandbox_id = created.json()["id"]
    try:
        with execd_client(api, sandbox_id) as stranger:
            refused = stranger.get("/ping")
            assert (refused.status_code, refused.json()) == (
                401,
                {"error": "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"},
            )
            assert stranger.post("/command", json={"command": "id"}).status_code == 401
        with execd_client(api, sandbox_id, **{"X-EXECD-ACCESS-TOKEN": "s3cret"}) as owner:
            assert owner.get("/ping").status_code == 200
            assert texts(run(owner, command="echo ok"), "stdout") == ["ok"]
    finally:
        api.delete(f"/sandboxes/{sandbox_id}")


# -- execd: files ---------------------------------------------------------------------------


def upload(execd: httpx.Client, *pairs: tuple[dict[str, Any], bytes]) -> httpx.Response:
    files = []
    for metadata, content in pairs:
        files.append(("metadata", ("metadata", json.dumps(metadata).encode(), "application/json")))
        files.append(("file", ("file", content, "application/octet-stream")))
    return execd.post("/files/upload", files=files)


def info(execd: httpx.Client, path: str) -> dict[str, Any]:
    answer: dict[str, Any] = execd.get("/files/info", params={"path": path}).json()[path]
    return answer


def test_upload_download_and_info(execd: httpx.Client) -> None:
    folder = f"/tmp/up-{uuid.uuid4().hex[:6]}"
    payload = os.urandom(3 * 10**6)
    sent = upload(
        execd,
        ({"path": f"{folder}/deep/big.bin"}, payload),
        ({"path": f"{folder}/x.sh", "mode": 111, "owner": "nobody", "group": "nogroup"}, b"x"),
    )
    assert (sent.status_code, sent.content) == (200, b"")
    big = info(execd, f"{folder}/deep/big.bin")
    assert (big["type"], big["size"], big["mode"], big["owner"]) == ("file", 3 * 10**6, 755, "root")
    assert big["path"] == f"{folder}/deep/big.bin" and big["modified_at"].endswith("Z")
    small = info(execd, f"{folder}/x.sh")
    assert (small["mode"], small["owner"], small["group"]) == (111, "nobody", "nogroup")
    fetched = execd.get("/files/download", params={"path": f"{folder}/deep/big.bin"})
    assert fetched.headers["content-type"] == "application/octet-stream"
    assert fetched.content == payload
    ranged = execd.get(
        "/files/download",
        params={"path": f"{folder}/deep/big.bin"},
        headers={"Range": "bytes=10-19"},
    )
    assert (ranged.status_code, ranged.content) == (206, payload[10:20])
    run(execd, command=f"ln -s {folder}/deep/big.bin {folder}/link")
    assert info(execd, f"{folder}/link")["type"] == "symlink"
    through = execd.get("/files/download", params={"path": f"{folder}/link"})
    assert through.content == payload  # downloads follow links

    missing = execd.get("/files/download", params={"path": f"{folder}/nope"})
    assert (missing.status_code, missing.json()["code"]) == (404, "FILE_NOT_FOUND")
    assert execd.get("/files/download").json()["code"] == "MISSING_QUERY"
    assert execd.get("/files/info", params={"path": f"{folder}/nope"}).status_code == 404
    numeric = upload(execd, ({"path": f"{folder}/n", "owner": "1000"}, b"n"))
    assert (numeric.status_code, numeric.json()["code"]) == (500, "RUNTIME_ERROR")
    not_octal = upload(execd, ({"path": f"{folder}/m", "mode": 493}, b"m"))
    assert not_octal.status_code == 500
    plain_metadata = execd.post(
        "/files/upload",
        data={"metadata": json.dumps({"path": f"{folder}/p"})},
        files={"file": ("file", b"p")},
    )
    assert (plain_metadata.status_code, plain_metadata.json()["message"]) == (
        400,
        "metadata file is missing",
    )


def test_directories_and_deletes(execd: httpx.Client) -> None:
    folder = f"/tmp/dirs-{uuid.uuid4().hex[:6]}"
    made = execd.post("/directories", json={f"{folder}/a/b": {"mode": 700}, "/tmp": {"mode": 700}})
    assert (made.status_code, made.content) == (200, b"")
    assert info(execd, f"{folder}/a/b")["mode"] == 700
    assert info(execd, f"{folder}/a")["mode"] == 755
    assert info(execd, "/tmp")["mode"] == 777  # it existed: left as it was
    upload(execd, ({"path": f"{folder}/a/f"}, b"f"))
    a_folder = execd.delete("/files", params={"path": f"{folder}/a"})
    assert (a_folder.status_code, a_folder.json()["code"]) == (500, "RUNTIME_ERROR")
    files = execd.delete("/files", params=[("path", f"{folder}/a/f"), ("path", f"{folder}/no")])
    assert files.status_code == 200
    assert execd.get("/files/info", params={"path": f"{folder}/a/f"}).status_code == 404
    assert execd.delete("/directories", params={"path": folder}).status_code == 200
    assert execd.get("/files/info", params={"path": folder}).status_code == 404


def test_leftovers_are_only_what_the_module_still_holds(
    fake: FakeOpenSandbox, sandbox: dict[str, Any]
) -> None:
    names = [container.name for container in fake.sandbox_containers()]
    assert names == [f"sandbox-{sandbox['id']}"]
    assert ("POST", "/v1/sandboxes") in fake.requests
