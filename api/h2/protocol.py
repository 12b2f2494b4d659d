"""The asyncio (and uvloop) adapter for a sans-IO `Connection`.

`H2Protocol` feeds what the transport reads into the connection, hands each event to a method
the subclass overrides (`_on_headers`, `_on_data`, `_on_reset`, `_on_goaway`, `_on_settled`,
`_on_flushed`, `_on_protocol_error`), and writes what the connection has to send: once after
each read (whatever the handlers sent on the way goes out in that one write), or at once when
a send comes from elsewhere (a task answering a call). A subclass that writes several
connections at once (the h2 data path's `Flusher`) overrides `flush`; `write_out` is the write.
"""

from __future__ import annotations

import asyncio
from typing import cast

from crihook.api.h2.connection import (
    CANCEL,
    NO_ERROR,
    Connection,
    Data,
    Failed,
    Flushed,
    GoAway,
    Header,
    Headers,
    Reset,
    Settled,
)

__all__ = ["H2Protocol"]


class H2Protocol(asyncio.Protocol):
    """One HTTP/2 connection on an asyncio transport. `auto_consume`: the window of a
    stream's data is given back as soon as the data is handed over (the handler keeps
    what it needs). A relay, which must hold at most one window per stream, passes False and
    gives back each frame's `flow` (`self.h2.consumed`) once its bytes went out."""

    def __init__(self, connection: Connection, *, auto_consume: bool = True) -> None:
        self.h2 = connection
        self._transport: asyncio.Transport | None = None
        self._auto_consume = auto_consume
        self._receiving = False

    # --- the subclass's part ----------------------------------------------------------------
    def _on_settled(self) -> None:
        """The peer's first SETTINGS arrived: it speaks HTTP/2."""

    def _on_headers(self, stream_id: int, headers: list[Header], end_stream: bool) -> None:
        raise NotImplementedError

    def _on_data(self, stream_id: int, payload: bytes, end_stream: bool, flow: int) -> None:
        """DATA from the peer. `flow`: the window the frame took (payload and padding)."""
        raise NotImplementedError

    def _on_reset(self, stream_id: int, error: int) -> None:
        """RST_STREAM from the peer."""

    def _on_goaway(self, last_stream_id: int, error: int) -> None:
        """GOAWAY from the peer."""

    def _on_flushed(self, stream_id: int, sent: int) -> None:
        """Held DATA of a stream went out."""

    def _on_protocol_error(self, details: str) -> None:
        """The connection is being dropped for `details`."""

    # --- life cycle ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's: no subclass
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    def close_transport(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()

    @property
    def alive(self) -> bool:
        return self._transport is not None and not self.h2.failed

    # --- sending ---------------------------------------------------------------------------
    def flush(self) -> None:
        """Write what the connection has to send (deferred while a read is handled)."""
        if not self._receiving:
            self.write_out()

    def write_out(self) -> None:
        """Write what the connection has to send, now."""
        data = self.h2.data_to_send()
        if data and self._transport is not None:
            self._transport.write(data)

    def send_headers(self, stream_id: int, headers: list[Header], end_stream: bool = False) -> None:
        self.h2.send_headers(stream_id, headers, end_stream)
        self.flush()

    def send_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> int:
        sent = self.h2.send_data(stream_id, data, end_stream)
        self.flush()
        return sent

    def send_reset(self, stream_id: int, error: int = CANCEL) -> None:
        self.h2.send_reset(stream_id, error)
        self.flush()

    def send_goaway(self, error: int = NO_ERROR, last_stream_id: int | None = None) -> None:
        self.h2.send_goaway(error, last_stream_id)
        self.flush()

    # --- receiving -------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        self._receiving = True
        try:
            for event in self.h2.receive(data):
                kind = type(event)
                if kind is Data:
                    ev = cast(Data, event)
                    self._on_data(ev.stream_id, ev.data, ev.end_stream, ev.flow_length)
                    if self._auto_consume:
                        self.h2.consumed(ev.stream_id, ev.flow_length)
                elif kind is Headers:
                    hv = cast(Headers, event)
                    self._on_headers(hv.stream_id, hv.headers, hv.end_stream)
                elif kind is Reset:
                    rv = cast(Reset, event)
                    self._on_reset(rv.stream_id, rv.error)
                elif kind is Flushed:
                    fv = cast(Flushed, event)
                    self._on_flushed(fv.stream_id, fv.sent)
                elif kind is Settled:
                    self._on_settled()
                elif kind is GoAway:
                    gv = cast(GoAway, event)
                    self._on_goaway(gv.last_stream_id, gv.error)
                elif kind is Failed:
                    self._receiving = False
                    self._on_protocol_error(cast(Failed, event).details)
                    self.flush()  # the GOAWAY
                    self.close_transport()
                    return
        finally:
            self._receiving = False
        self.flush()
