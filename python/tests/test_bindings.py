"""The native module seen from Python: exception mapping, coordinator server and client.

No Spark here: clients run on threads of the test process.
"""
from __future__ import annotations

import os
import secrets
import socket
import threading
import time

import pytest

import ember
from ember import _ember, errors

pytestmark = pytest.mark.timeout(60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def secret() -> bytes:
    return secrets.token_bytes(32)


def test_exception_hierarchy():
    assert issubclass(errors.EmberError, RuntimeError)
    expected = {
        errors.InvalidArgument: ValueError,
        errors.DeadlineExceeded: TimeoutError,
        errors.Unavailable: ConnectionError,
        errors.EmberIOError: OSError,
    }
    for cls, builtin in expected.items():
        assert issubclass(cls, errors.EmberError) and issubclass(cls, builtin), cls
    for cls in (errors.NotFound, errors.AlreadyExists, errors.Unauthenticated, errors.Aborted,
                errors.Corruption, errors.OutOfRange, errors.Cancelled, errors.Internal,
                errors.ClusterError, errors.NodeError):
        assert issubclass(cls, errors.EmberError), cls
    assert errors.DeadlineExceeded.__module__ == "ember.errors"
    assert ember.NodeError is errors.NodeError and ember.ClusterError is errors.ClusterError


def test_node_error_carries_the_node():
    e = errors.NodeError("worker", 1, 1, "10.0.0.7", "Traceback...\nValueError: boom\n")
    assert (e.job_name, e.task_index, e.executor_id, e.host) == ("worker", 1, 1, "10.0.0.7")
    assert "worker:1" in str(e) and "10.0.0.7" in str(e) and "ValueError: boom" in str(e)
    import pickle

    again = pickle.loads(pickle.dumps(e))
    assert str(again) == str(e) and again.remote_traceback == e.remote_traceback


def test_assign_role_layouts():
    layout = _ember.ClusterLayout(num_nodes=5, num_ps=2, master_node="chief", eval_node=True)
    roles = [(r.job_name, r.task_index) for r in (_ember.assign_role(layout, i) for i in range(5))]
    assert roles == [("ps", 0), ("ps", 1), ("chief", 0), ("evaluator", 0), ("worker", 0)]
    with pytest.raises(errors.InvalidArgument, match="num_ps"):
        _ember.assign_role(_ember.ClusterLayout(num_nodes=2, num_ps=3), 0)
    with pytest.raises(ValueError, match="master_node"):
        _ember.assign_role(_ember.ClusterLayout(num_nodes=2, master_node="boss"), 0)


def test_short_secret_is_refused():
    with pytest.raises(errors.InvalidArgument):
        _ember.CoordinatorServer.start(b"short", _ember.ClusterLayout(num_nodes=1))


def test_registration_deadline_names_the_missing_node(secret):
    server = _ember.CoordinatorServer.start(secret, _ember.ClusterLayout(num_nodes=2),
                                            bind_host="127.0.0.1")
    client = _ember.CoordinatorClient.connect("127.0.0.1", server.port, secret)
    outcome = {}

    def register():
        try:
            outcome["reg"] = client.register(0, "127.0.0.1", 1234, os.getpid(), 30.0)
        except errors.EmberError as e:
            outcome["error"] = e

    t = threading.Thread(target=register)
    t.start()
    try:
        start = time.monotonic()
        with pytest.raises(errors.DeadlineExceeded) as info:
            server.wait_for_registration(1.0)
        assert time.monotonic() - start < 5
        assert "executor 1" in str(info.value)
        assert "worker" in str(info.value)
    finally:
        server.close()
        t.join(timeout=15)
        client.close()
    assert not t.is_alive(), "register() did not return after the server closed"
    assert "error" in outcome


def test_register_cluster_spec_kv_and_events(secret):
    layout = _ember.ClusterLayout(num_nodes=2, num_ps=1)
    server = _ember.CoordinatorServer.start(secret, layout, bind_host="127.0.0.1")
    clients = [_ember.CoordinatorClient.connect("127.0.0.1", server.port, secret) for _ in range(2)]
    regs = [None, None]

    def register(i):
        regs[i] = clients[i].register(i, "127.0.0.1", 5000 + i, os.getpid(), 10.0)

    threads = [threading.Thread(target=register, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=15)
    try:
        server.wait_for_registration(5.0)
        assert [r.role.job_name for r in regs] == ["ps", "worker"]
        import json

        spec = json.loads(server.cluster_spec_json())
        assert spec == {"ps": ["127.0.0.1:5000"], "worker": ["127.0.0.1:5001"]}
        assert json.loads(regs[1].cluster_spec_json) == spec

        clients[0].kv_set("k", b"\x00\xffvalue")
        assert clients[1].kv_get("k", 1.0) == b"\x00\xffvalue"
        with pytest.raises(errors.DeadlineExceeded, match="nope"):
            clients[1].kv_get("nope", 0.2)

        clients[1].log("stdout", "hello")
        clients[1].report({"step": 3, "loss": 0.5})
        clients[1].done()
        server.stop_nodes(["ps"])
        push = clients[0].next_push(5.0)
        assert push is not None and push.kind == _ember.Push.Kind.STOP
        clients[0].done()
        server.wait_for_nodes([], 5.0)

        events = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(
                e.kind == _ember.Event.Kind.NODE_DONE and e.job_name == "ps" for e in events):
            events += server.poll_events(0.2)
        kinds = {e.kind for e in events}
        assert {_ember.Event.Kind.REGISTERED, _ember.Event.Kind.LOG, _ember.Event.Kind.PROGRESS,
                _ember.Event.Kind.NODE_DONE} <= kinds
        log = next(e for e in events if e.kind == _ember.Event.Kind.LOG)
        assert (log.job_name, log.task_index, log.stream, log.text) == ("worker", 0, "stdout", "hello")
        progress = next(e for e in events if e.kind == _ember.Event.Kind.PROGRESS)
        assert progress.metrics == {"step": 3.0, "loss": 0.5}
        states = {n.role.job_name: n.state for n in server.nodes()}
        assert states == {"ps": _ember.NodeInfo.State.DONE, "worker": _ember.NodeInfo.State.DONE}
    finally:
        for c in clients:
            c.close()
        server.close()


def test_failure_aborts_the_other_nodes(secret):
    server = _ember.CoordinatorServer.start(secret, _ember.ClusterLayout(num_nodes=2),
                                            bind_host="127.0.0.1")
    clients = [_ember.CoordinatorClient.connect("127.0.0.1", server.port, secret) for _ in range(2)]
    threads = [threading.Thread(target=c.register, args=(i, "127.0.0.1", 1, 1, 10.0))
               for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=15)
    try:
        clients[1].fail("Traceback ...\nValueError: boom")
        push = clients[0].next_push(5.0)
        assert push is not None and push.kind == _ember.Push.Kind.ABORT
        with pytest.raises(errors.Aborted, match="boom"):
            server.wait_for_nodes([], 5.0)
        failed = [n for n in server.nodes() if n.state == _ember.NodeInfo.State.FAILED]
        assert [(n.role.job_name, n.role.task_index) for n in failed] == [("worker", 1)]
        assert "boom" in failed[0].error
    finally:
        for c in clients:
            c.close()
        server.close()


def test_unreachable_coordinator_is_unavailable_naming_the_address(secret):
    port = _free_port()  # nothing listens there
    start = time.monotonic()
    with pytest.raises(errors.Unavailable) as info:
        _ember.CoordinatorClient.connect("127.0.0.1", port, secret, connect_timeout=2.0)
    assert time.monotonic() - start < 5
    assert f"127.0.0.1:{port}" in str(info.value)


def test_wrong_secret_is_unauthenticated(secret):
    server = _ember.CoordinatorServer.start(secret, _ember.ClusterLayout(num_nodes=1),
                                            bind_host="127.0.0.1", handshake_timeout=2.0)
    try:
        with pytest.raises(errors.Unauthenticated):
            _ember.CoordinatorClient.connect("127.0.0.1", server.port, secrets.token_bytes(32),
                                             connect_timeout=5.0)
        # The server still serves the real secret afterwards.
        client = _ember.CoordinatorClient.connect("127.0.0.1", server.port, secret)
        client.register(0, "127.0.0.1", 1, 1, 5.0)
        server.wait_for_registration(5.0)
        client.close()
    finally:
        server.close()


def test_gil_is_released_while_waiting(secret):
    server = _ember.CoordinatorServer.start(secret, _ember.ClusterLayout(num_nodes=1),
                                            bind_host="127.0.0.1")
    ticks = []

    def tick():
        for _ in range(10):
            ticks.append(time.monotonic())
            time.sleep(0.05)

    t = threading.Thread(target=tick)
    t.start()
    try:
        with pytest.raises(errors.DeadlineExceeded):
            server.wait_for_registration(1.0)
        t.join()
        assert len(ticks) == 10 and ticks[-1] - ticks[0] < 0.9
    finally:
        server.close()
