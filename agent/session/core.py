"""What every part of one session shares: identity, the model, its configuration,
the epoch fence, the model's session state, and the way events go out.

The runner's parts (input pipeline, responses, stage router) each hold this one
object; only the runner's mailbox task changes it.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.session.limits import SessionLimits
from duplex_agent.plugins.contract import (
    DuplexCapabilities,
    DuplexFence,
    DuplexModelPlugin,
    DuplexModelSessionState,
    DuplexSessionConfig,
)
from duplex_agent.plugins.contract.engine import DuplexEngine


class SessionCore:
    def __init__(
        self,
        session_id: str,
        plugin: DuplexModelPlugin,
        engine: DuplexEngine,
        capabilities: DuplexCapabilities,
        limits: SessionLimits,
        emit: Callable[[p.ServerEvent], None],
        spawn: Callable[[Coroutine[Any, Any, Any]], None],
        post: Callable[[Any], None],
    ) -> None:
        self.session_id = session_id
        self.plugin = plugin
        self.engine = engine
        self.capabilities = capabilities
        self.continuous = capabilities.input_mode == "continuous"
        self.limits = limits
        self.emit = emit
        #: Run a coroutine as a task the runner owns (cancelled and awaited at close).
        self.spawn = spawn
        #: Queue an internal command (a stage output, a silence tick) in the session's mailbox.
        self.post = post
        self.config = DuplexSessionConfig(input_sample_rate=capabilities.input_sample_rate)
        self.configured = False
        self.runtime_config: dict[str, object] = {}
        self.sampling: tuple[object, ...] = ()
        self.state: DuplexModelSessionState = plugin.create_session_state()
        #: Whether server VAD creates responses on its own (the data plane's context says so).
        self.auto_responds = False
        self.epoch = 0
        self.turn_id = 0
        #: User turns committed so far.
        self.committed_turns = 0
        #: The stage-0 request taking input now: one per epoch (continuous) or per turn.
        self.input_request_id: str | None = None
        self._serials = itertools.count(1)

    @property
    def fence(self) -> DuplexFence:
        return DuplexFence(self.epoch, self.turn_id)

    def advance_epoch(self, requests: Iterable[str], *, with_input: bool) -> set[str]:
        """The epoch rule, for every cancel and failure: returns the old epoch's requests, to abort.

        The fence moves, so outputs of ``requests`` still on their way are dropped. In the
        continuous lane the input request goes with the old epoch (``with_input``, or when it
        is one of ``requests``): the next input opens a fresh one, and forced listening ends.
        """
        self.epoch += 1
        stale = set(requests)
        input_request_id = self.input_request_id
        if self.continuous and input_request_id is not None and (with_input or input_request_id in stale):
            self.drop_input_request()
            stale.add(input_request_id)
            self.state.audio_buffer.clear_force_listen()
        return stale

    def drop_input_request(self) -> str | None:
        """The input request ends here (sealed, cleared or rolled back); the next input opens a fresh one."""
        request_id, self.input_request_id = self.input_request_id, None
        return request_id

    def next_serial(self) -> int:
        return next(self._serials)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{uuid.uuid4().hex[:16]}"

    def error(self, code: str, message: str, event_id: str | None, *, error_type: str = "invalid_request_error",
              param: str | None = None) -> None:
        self.emit(p.ErrorEvent.of(code, message, event_id=event_id, error_type=error_type, param=param))
