"""Tool chains and tasks in Redis, so every gateway replica sees the same chain and the same task.

A chain is one hash per (tenant, caller, chain id): a field per (tool, arguments hash) holding that step
as JSON; the hash expires a TTL after its last step. A step running now is one more key (SET NX with
the call id, expiring after the call's longest run), deleted by that call when it ends. A task is one JSON
string per (tenant, task id) with its own TTL, listed in its caller's sorted set of tasks. Every key is built
by `KeyedStore.tenant_key` (a separator no tenant id holds).
"""

from __future__ import annotations

import json
from typing import Any

from services.tool_gateway.adapters.redis_state import RedisFactory, KeyedStore
from services.tool_gateway.domain.chains import Chain, ChainStep, chain_full, step_key

__all__ = ["RedisChainStore", "RedisTaskStore"]

LIST_CHUNK = 200  # members of a caller's task set read per round trip
LIST_SCAN = 2_000  # members one listing reads at most

# KEYS[1]: the chain; ARGV: field, step JSON, whether the step ran anew and answered ('1': ok or fallback), TTL
# ms. Only a step that ran anew replaces a done one (it carries a newer result): a replayed step or a failure
# never does, so a chain resumes as often as it is called again, each done step keeping its first call.
# ARGV[5]: the steps a chain may hold: a new field past them is not kept (-1, the chain's expiry renewed).
_RECORD_STEP = """
local held = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[3] ~= '1' and held and string.find(held, '"done":true', 1, true) then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return 0
end
if not held and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[5]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return -1
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""

# KEYS[1]: a running step's hold; ARGV[1]: its owner (call id). Deleted only by its owner.
_RELEASE_STEP = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# A caller's working tasks: a sorted set per (tenant, subject) of task ids scored by their lease's end (ms,
# the server's clock), so that a task whose replica was lost leaves it when its lease lapses.
_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function live_at_least(key, ms)
  if redis.call('PTTL', key) < tonumber(ms) then redis.call('PEXPIRE', key, ms) end
end
"""
# A caller's tasks, for listing: a sorted set per (tenant, subject) whose members, all of score 0, are
# "<creation ms, 13 digits>:<sequence, 12 digits>:<task id>" (the sequence a counter of the caller's, so two tasks
# begun in one millisecond keep their order), read by ZRANGEBYLEX: oldest first, and a member is a stable cursor.
# A member whose task expired is removed when a listing meets it; members older than two TTLs (a task key lives
# at most that long: begun, then ended or answered lost just before its TTL) are trimmed when the caller begins
# another. KEYS: the task, its lease, the caller's working set, the caller's tasks, the caller's sequence; ARGV:
# state JSON, TTL ms, lease ms, most working, task id.
_BEGIN_TASK = _NOW_MS + """
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local working = redis.call('ZCARD', KEYS[3])
if working >= tonumber(ARGV[4]) then return -working end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[5])
live_at_least(KEYS[3], ARGV[3])
local kept = 2 * tonumber(ARGV[2])
redis.call('ZREMRANGEBYLEX', KEYS[4], '-', '(' .. string.format('%013d', math.max(0, now - kept)))
local seq = redis.call('INCR', KEYS[5]) % 1000000000000
redis.call('ZADD', KEYS[4], 0, string.format('%013d:%012d:%s', now, seq, ARGV[5]))
redis.call('PEXPIRE', KEYS[4], kept)
redis.call('PEXPIRE', KEYS[5], kept)
return working + 1
"""
# KEYS: the lease, the caller's working set; ARGV: lease ms, task id.
_HOLD_TASK = _NOW_MS + """
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
redis.call('ZADD', KEYS[2], 'XX', now + tonumber(ARGV[1]), ARGV[2])  -- an ended task is not added back
live_at_least(KEYS[2], ARGV[1])
return 1
"""
# KEYS: the task, the caller's working set; ARGV: its final state (JSON), TTL ms, task id. Saved only while the
# stored task is working (a final state is final).
_END_TASK = """
local held = redis.call('GET', KEYS[1])
if not held or cjson.decode(held)['state'] ~= 'working' then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[3])
return 1
"""


class RedisChainStore(KeyedStore):
    def __init__(self, redis: RedisFactory, namespace: str = "", ttl_seconds: float = 3600.0,
                 max_steps: int = 256) -> None:
        super().__init__(redis, namespace, "chain")
        self.ttl_ms = max(1, int(ttl_seconds * 1000))
        self.max_steps = max_steps

    async def load(self, tenant_id: str, subject: str, chain_id: str) -> Chain | None:
        client = await self._redis()
        fields = await client.hgetall(self.tenant_key(tenant_id, subject, chain_id))
        if not fields:
            return None
        steps = sorted((ChainStep.from_json(_step_json(v)) for v in fields.values()), key=lambda s: s.at)
        return Chain(chain_id, tuple(steps))

    async def record(self, tenant_id: str, subject: str, chain_id: str, step: ChainStep) -> None:
        # The stored JSON carries `done` beside the step so the script can tell a success without parsing.
        stored = json.dumps({"step": json.loads(step.to_json()), "done": step.done}, separators=(",", ":"))
        kept = await self.run_script(_RECORD_STEP, [self.tenant_key(tenant_id, subject, chain_id)],
                                     [step_key(step.tool, step.args_sha256), stored, "1" if step.fresh else "0",
                                      self.ttl_ms, self.max_steps])
        if int(kept) == -1:  # another replica filled the chain since this call read it
            raise chain_full(chain_id, self.max_steps)

    def _hold(self, tenant_id: str, subject: str, chain_id: str, key: str) -> str:
        return self.tenant_key(tenant_id, subject, chain_id, "running", key)

    async def claim(self, tenant_id: str, subject: str, chain_id: str, key: str, owner: str, seconds: float) -> bool:
        client = await self._redis()
        return bool(await client.set(self._hold(tenant_id, subject, chain_id, key), owner, nx=True,
                                     px=max(1, int(seconds * 1000))))

    async def release(self, tenant_id: str, subject: str, chain_id: str, key: str, owner: str) -> None:
        await self.run_script(_RELEASE_STEP, [self._hold(tenant_id, subject, chain_id, key)], [owner])


def _step_json(value: bytes | str) -> str:
    return json.dumps(json.loads(value)["step"])


class RedisTaskStore(KeyedStore):
    def __init__(self, redis: RedisFactory, namespace: str = "", ttl_seconds: float = 86_400.0) -> None:
        super().__init__(redis, namespace, "task")
        self.ttl_ms = max(1, int(ttl_seconds * 1000))

    async def save(self, tenant_id: str, task_id: str, state: dict[str, Any]) -> None:
        client = await self._redis()
        await client.set(self.tenant_key(tenant_id, task_id), json.dumps(state, separators=(",", ":")).encode(),
                         px=self.ttl_ms)

    async def load(self, tenant_id: str, task_id: str) -> dict[str, Any] | None:
        client = await self._redis()
        value = await client.get(self.tenant_key(tenant_id, task_id))
        return None if value is None else json.loads(value)

    def _working(self, tenant_id: str, subject: str) -> str:
        return self.tenant_key(tenant_id, "working", subject)

    def _listed(self, tenant_id: str, subject: str, *part: str) -> str:
        return self.tenant_key(tenant_id, "listed", subject, *part)

    async def begin(self, tenant_id: str, task_id: str, state: dict[str, Any], lease_seconds: float,
                    max_working: int) -> int:
        kept = int(await self.run_script(
            _BEGIN_TASK, [self.tenant_key(tenant_id, task_id), self.tenant_key(tenant_id, task_id, "lease"),
                          self._working(tenant_id, state["caller"]), self._listed(tenant_id, state["caller"]),
                          self._listed(tenant_id, state["caller"], "sequence")],
            [json.dumps(state, separators=(",", ":")), self.ttl_ms, max(1, int(lease_seconds * 1000)), max_working,
             task_id]))
        return kept

    async def end(self, tenant_id: str, task_id: str, state: dict[str, Any]) -> bool:
        return bool(await self.run_script(
            _END_TASK, [self.tenant_key(tenant_id, task_id), self._working(tenant_id, state["caller"])],
            [json.dumps(state, separators=(",", ":")), self.ttl_ms, task_id]))

    async def hold(self, tenant_id: str, subject: str, task_id: str, seconds: float) -> None:
        await self.run_script(_HOLD_TASK, [self.tenant_key(tenant_id, task_id, "lease"),
                                           self._working(tenant_id, subject)],
                              [max(1, int(seconds * 1000)), task_id])

    async def held(self, tenant_id: str, task_id: str) -> bool:
        client = await self._redis()
        return bool(await client.exists(self.tenant_key(tenant_id, task_id, "lease")))

    async def list(self, tenant_id: str, subject: str, after: str, limit: int) -> tuple[list[dict[str, Any]], str]:
        """Reads LIST_CHUNK members a round trip, and at most LIST_SCAN of them a listing (expired ones are removed
        as met): past that it answers the page it has with a cursor, so no listing takes long however many
        expired tasks precede the live ones."""
        client = await self._redis()
        listed = self._listed(tenant_id, subject)
        found: list[tuple[str, dict[str, Any]]] = []
        scanned = 0
        while len(found) <= limit:  # one more than the page: is there a next one?
            if scanned >= LIST_SCAN:
                return [state for _, state in found], after
            members = await client.zrangebylex(listed, f"({after}" if after else "-", "+", start=0, num=LIST_CHUNK)
            if not members:
                return [state for _, state in found], ""
            names = [m.decode() if isinstance(m, bytes) else m for m in members]
            values = await client.mget([self.tenant_key(tenant_id, name.rpartition(":")[2]) for name in names])
            gone = [name for name, value in zip(names, values, strict=True) if value is None]
            if gone:
                await client.zrem(listed, *gone)
            found += [(name, json.loads(value)) for name, value in zip(names, values, strict=True) if value is not None]
            after, scanned = names[-1], scanned + len(names)
        return [state for _, state in found[:limit]], found[limit - 1][0]
