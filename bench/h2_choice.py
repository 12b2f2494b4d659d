"""python-hyper's `h2` against crihook's own HTTP/2 layer, on crihook's hop: one unary call relayed.

    python -m bench.h2_choice [--calls 20000] [--reps 5]

Everything runs in one process, with no sockets: the bytes a kubelet-like client sends
(HEADERS, then a DATA frame with END_STREAM) go into the proxy's server-side connection; the
proxy opens a stream on its runtime-side connection and sends the same headers and message;
the runtime's answer (HEADERS, DATA, trailers) comes back through the runtime-side connection
and goes out on the server-side one. Only the proxy's part is timed (`time.process_time` around
it): what the HTTP/2 layer costs per relayed call, with no event loop and no kernel. The peers
are played by `h2` in every variant, so the bytes fed to each variant are the same kind.

Variants: `h2` (python-hyper h2 4.x, both proxy connections), `own` (crihook's layer,
`crihook.api.h2.Connection`). The report is one line per variant: µs of CPU per relayed call,
the median over repetitions, and the ratio to `h2`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import h2.config
import h2.connection
import h2.events
import h2.settings

from bench.payloads import LIST_CONTAINERS, canned_responses, list_containers_request

REQUEST_HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", LIST_CONTAINERS),
    (":authority", "localhost"),
    ("content-type", "application/grpc"),
    ("user-agent", "grpc-go/1.59.0"),
    ("te", "trailers"),
]
RESPONSE_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]
TRAILERS = [("grpc-status", "0"), ("grpc-message", "")]


def _prefixed(message: bytes) -> bytes:
    return b"\0" + len(message).to_bytes(4, "big") + message


class Peers:
    """The kubelet-like client and the runtime-like server, both h2, untimed."""

    def __init__(self) -> None:
        self.kubelet = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.runtime = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        self.kubelet.initiate_connection()
        self.runtime.initiate_connection()
        self.request = _prefixed(list_containers_request())
        self.response = _prefixed(canned_responses()[LIST_CONTAINERS])

    def kubelet_call(self) -> bytes:
        stream = self.kubelet.get_next_available_stream_id()
        # grpc-go sends the time left, different on every call (so never one cached block).
        timeout = ("grpc-timeout", f"{1_999_000 + stream % 997}u")
        self.kubelet.send_headers(stream, [*REQUEST_HEADERS, timeout])
        self.kubelet.send_data(stream, self.request, end_stream=True)
        return self.kubelet.data_to_send()

    def runtime_receives(self, data: bytes) -> bytes:
        """What the runtime answers to `data` (its request, with SETTINGS etc.)."""
        for event in self.runtime.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                stream = event.stream_id
                self.runtime.send_headers(stream, RESPONSE_HEADERS)
                self.runtime.send_data(stream, self.response)
                self.runtime.send_headers(stream, TRAILERS, end_stream=True)
            elif isinstance(event, h2.events.DataReceived):
                self.runtime.acknowledge_received_data(
                    event.flow_controlled_length, event.stream_id
                )
        return self.runtime.data_to_send()

    def kubelet_receives(self, data: bytes) -> None:
        for event in self.kubelet.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                self.kubelet.acknowledge_received_data(
                    event.flow_controlled_length, event.stream_id
                )


class H2Relay:
    """The proxy's part with python-hyper h2: as a relay would do it, acknowledging data as
    soon as it is forwarded."""

    def __init__(self) -> None:
        self.down = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        self.up = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.down.initiate_connection()
        self.up.initiate_connection()
        self.up_stream = 0
        self.down_stream = 0

    def start(self) -> tuple[bytes, bytes]:
        return self.down.data_to_send(), self.up.data_to_send()

    def from_kubelet(self, data: bytes) -> tuple[bytes, bytes]:
        up, down = self.up, self.down
        for event in down.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                self.down_stream = event.stream_id
                self.up_stream = up.get_next_available_stream_id()
                up.send_headers(self.up_stream, event.headers)
            elif isinstance(event, h2.events.DataReceived):
                up.send_data(self.up_stream, event.data, end_stream=event.stream_ended is not None)
                down.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        return down.data_to_send(), up.data_to_send()

    def from_runtime(self, data: bytes) -> tuple[bytes, bytes]:
        up, down = self.up, self.down
        for event in up.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                down.send_headers(self.down_stream, event.headers)
            elif isinstance(event, h2.events.DataReceived):
                down.send_data(self.down_stream, event.data)
                up.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.TrailersReceived):
                down.send_headers(self.down_stream, event.headers, end_stream=True)
        return down.data_to_send(), up.data_to_send()


class OwnRelay:
    """The same with crihook's sans-IO layer."""

    def __init__(self) -> None:
        from crihook.api.h2 import Connection, Data, Headers

        self._data, self._headers = Data, Headers
        self.down = Connection(client=False)
        self.up = Connection(client=True)
        self.up_stream = 0
        self.down_stream = 0

    def start(self) -> tuple[bytes, bytes]:
        return self.down.data_to_send(), self.up.data_to_send()

    def from_kubelet(self, data: bytes) -> tuple[bytes, bytes]:
        up, down, data_event = self.up, self.down, self._data
        for event in down.receive(data):
            if type(event) is data_event:
                up.send_data(self.up_stream, event.data, event.end_stream)
                down.consumed(event.stream_id, event.flow_length)
            elif type(event) is self._headers:
                self.down_stream = event.stream_id
                self.up_stream = up.open_stream()
                up.send_headers(self.up_stream, event.headers)
        return down.data_to_send(), up.data_to_send()

    def from_runtime(self, data: bytes) -> tuple[bytes, bytes]:
        up, down, data_event = self.up, self.down, self._data
        for event in up.receive(data):
            if type(event) is data_event:
                down.send_data(self.down_stream, event.data, event.end_stream)
                up.consumed(event.stream_id, event.flow_length)
            elif type(event) is self._headers:
                down.send_headers(self.down_stream, event.headers, event.end_stream)
        return down.data_to_send(), up.data_to_send()


def measure(make: Callable[[], H2Relay | OwnRelay], calls: int) -> float:
    """µs of CPU the proxy's part takes per relayed call."""
    peers = Peers()
    relay = make()
    to_kubelet, to_runtime = relay.start()
    peers.kubelet_receives(to_kubelet)
    to_relay_down = peers.kubelet.data_to_send()
    to_relay_up = peers.runtime_receives(to_runtime)
    spent = 0.0
    for i in range(calls + 200):
        request = to_relay_down + peers.kubelet_call()
        t0 = time.process_time()
        to_kubelet, to_runtime = relay.from_kubelet(request)
        spent_call = time.process_time() - t0
        answer = to_relay_up + peers.runtime_receives(to_runtime)
        peers.kubelet_receives(to_kubelet)
        t0 = time.process_time()
        to_kubelet, to_runtime = relay.from_runtime(answer)
        spent_call += time.process_time() - t0
        peers.kubelet_receives(to_kubelet)
        to_relay_down = peers.kubelet.data_to_send()
        to_relay_up = peers.runtime_receives(to_runtime)
        if i >= 200:  # the first calls warm up (HPACK tables, caches)
            spent += spent_call
    return spent / calls * 1e6


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.h2_choice")
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    variants: dict[str, Callable[[], H2Relay | OwnRelay]] = {"h2": H2Relay, "own": OwnRelay}
    results: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.reps):
        for name, make in variants.items():
            results[name].append(measure(make, args.calls))
    base = statistics.median(results["h2"])
    print(f"relay of one unary call (ListContainers), {args.calls} calls x {args.reps} reps")
    for name, values in results.items():
        median = statistics.median(values)
        spread = f"{min(values):.1f}-{max(values):.1f}"
        print(f"{name:4} {median:6.1f} µs CPU/call (reps {spread}), {median / base:.2f}x h2")


if __name__ == "__main__":
    main()
