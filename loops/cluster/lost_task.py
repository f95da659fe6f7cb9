"""Names the task a multi-process run lost, and its address, from TensorFlow's error text.

TensorFlow reports a lost peer as a raw collective or coordination error:
"... from remote target /job:worker/replica:0/task:1" (its process died and
the connection was reset), "The following tasks are unhealthy (stopped sending
heartbeats): /job:worker/replica:0/task:1" (its host or link went away, seen
by the coordination service), or a heartbeat to the coordination service that
timed out (this task lost the service's host). These become one sentence.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_TASK = r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)"
_UNHEALTHY = re.compile(r"unhealthy \(stopped sending heartbeats\):\s*((?:" + _TASK + r"\s*)+)")
_REMOTE = re.compile(r"remote target " + _TASK)
_COORDINATION_TIMEOUT = re.compile(r"CoordinationService/\w+|coordination service", re.IGNORECASE)
_LOST_WORDS = (
    "Collective ops is aborted",
    "Connection reset",
    "Socket closed",
    "failed to connect",
    "Deadline Exceeded",
    "unhealthy",
)


def lost_tasks(message: str, tf_config: Mapping[str, Any]) -> list[str] | None:
    """The tasks (`worker_1`) whose loss `message` reports, [] when it names none, or
    None when it is not about a lost task at all."""
    if not any(word in message for word in _LOST_WORDS):
        return None
    unhealthy = _UNHEALTHY.search(message)
    if unhealthy:
        return [f"{job}_{index}" for job, index in re.findall(_TASK, unhealthy.group(1))]
    remote = _REMOTE.search(message)
    if remote:
        return [f"{remote.group(1)}_{remote.group(2)}"]
    if _COORDINATION_TIMEOUT.search(message):
        # The service runs on the chief, or on worker 0 where there is none.
        has_chief = "chief" in (tf_config.get("cluster") or {})
        return ["chief_0" if has_chief else "worker_0"]
    return []


def _address(task: str, tf_config: Mapping[str, Any]) -> str | None:
    task_type, _, index = task.rpartition("_")
    members = (tf_config.get("cluster") or {}).get(task_type)
    if isinstance(members, dict):
        return members.get(index) or members.get(int(index))
    if isinstance(members, list) and int(index) < len(members):
        return members[int(index)]
    return None


def lost_task_sentence(message: str, tf_config: Mapping[str, Any]) -> str | None:
    """The sentence a task ends with when `message` (a TensorFlow error's) reports a lost
    task of its cluster `tf_config`; None when it does not."""
    lost = lost_tasks(message, tf_config)
    if lost is None:
        return None
    task = tf_config.get("task") or {}
    this_task = f"{task.get('type', 'this task')}_{task.get('index', 0)}"
    named = [
        f"{name} at {address}" if (address := _address(name, tf_config)) else name for name in lost
    ]
    who = " and ".join(named) if named else "a task of its cluster"
    detail = (
        next((line.strip() for line in message.splitlines() if "aborted by" in line), "")
        or message.strip().splitlines()[0]
    )
    return (
        f"{this_task} lost {who}: it stopped answering (its process died, its host went down, "
        "or the network between them failed), so the run stopped; every step up to the last "
        "checkpoint is saved. Start every task again with the same command once its host is "
        f"reachable, and the run continues from that checkpoint. (TensorFlow: {detail})"
    )
