"""Consumer names are stable per replica, so a restarted process finds the entries it held."""

from __future__ import annotations

import socket

from libs.events.bus import stable_consumer_name


def test_a_consumer_is_named_after_its_service_and_host_without_the_pid() -> None:
    assert stable_consumer_name("retriever") == f"retriever-{socket.gethostname()}"
    assert stable_consumer_name("retriever") == stable_consumer_name("retriever")


def test_a_replica_name_is_used_as_given_with_unsafe_characters_replaced() -> None:
    assert stable_consumer_name("memory-writer", "pod-7b9f") == "memory-writer-pod-7b9f"
    assert stable_consumer_name("retriever", "a b/c") == "retriever-a_b_c"


def test_extra_memory_writers_are_replicas_of_their_own_on_ports_chosen_at_each_start(tmp_path) -> None:
    from libs.config import load_settings
    from mnemesh.supervisor import Supervisor

    sup = Supervisor(load_settings(data_dir=tmp_path, memory_writer_workers=3, replica="node-1"), {})
    workers = [c for c in sup.children.values() if c.service == "memory-writer" and c.name != "memory-writer"]
    assert [c.name for c in workers] == ["memory-writer.2", "memory-writer.3"]
    assert [c.env["MNEMESH_REPLICA"] for c in workers] == ["node-1.2", "node-1.3"]
    names = {stable_consumer_name("memory-writer", c.env["MNEMESH_REPLICA"]) for c in workers}
    assert len(names | {stable_consumer_name("memory-writer", "node-1")}) == 3  # three consumers in the group
    sup._worker_ports(workers[0])
    first = workers[0].address
    assert first.endswith(workers[0].env["MNEMESH_MEMORY_WRITER_GRPC_PORT"]) and workers[0].metrics.endswith("/metrics")
    assert first != sup.children["memory-writer"].address


def test_an_extra_memory_writer_keeps_metrics_off_when_they_are_off(tmp_path) -> None:
    from libs.config import load_settings
    from mnemesh.supervisor import Supervisor

    sup = Supervisor(load_settings(data_dir=tmp_path, memory_writer_workers=2, memory_writer_metrics_port=0), {})
    worker = sup.children["memory-writer.2"]
    sup._worker_ports(worker)
    assert worker.env["MNEMESH_MEMORY_WRITER_METRICS_PORT"] == "0" and worker.metrics == ""
