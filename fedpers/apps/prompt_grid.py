"""A Flower ``Grid`` that collects client replies every ``reply_poll_interval`` seconds.

Flower 1.42's deployment Grid (``send_and_receive``) pushes a round's messages and then checks for
replies every 3 s, so every fit and evaluate phase of a deployed round ends on the next 3-s tick after
its last reply: up to 3 s of idle waiting per phase, up to 6 s per round for a round of about ten.
:class:`PromptReplyGrid` wraps the Grid the ServerApp is given (deployment or simulation) and only
replaces that wait: pushing, pulling and everything else are the wrapped Grid's own public methods, and
the reply-collection contract (all replies, or what arrived when ``timeout`` ends) is unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid


class PromptReplyGrid(Grid):
    """``grid`` with replies collected every ``poll_interval`` seconds instead of every 3 s."""

    def __init__(self, grid: Grid, poll_interval: float):
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be positive, got {poll_interval}")
        self._grid = grid
        self.poll_interval = poll_interval

    def set_run(self, run) -> None:
        """Delegated to the wrapped Grid."""
        self._grid.set_run(run)

    @property
    def run(self):
        """The wrapped Grid's run."""
        return self._grid.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        """Delegated to the wrapped Grid."""
        return self._grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        """Delegated to the wrapped Grid."""
        return self._grid.get_node_ids()

    def get_nodes(self):
        """Delegated to the wrapped Grid."""
        return self._grid.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Delegated to the wrapped Grid."""
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Delegated to the wrapped Grid."""
        return self._grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Push ``messages``; return their replies once all arrived or ``timeout`` seconds passed (as
        Flower's Grid does), checking every ``poll_interval`` seconds."""
        pending = set(self.push_messages(messages))
        end = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while pending:
            arrived = list(self.pull_messages(pending))
            replies.extend(arrived)
            pending.difference_update(m.metadata.reply_to_message_id for m in arrived)
            if not pending or (end is not None and time.monotonic() >= end):
                break
            time.sleep(self.poll_interval if end is None else max(0.0, min(self.poll_interval,
                                                                             end - time.monotonic())))
        return replies
