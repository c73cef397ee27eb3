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
