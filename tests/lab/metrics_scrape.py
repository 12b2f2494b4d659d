"""Scraping a crihook's `/metrics` the way Prometheus does: HTTP/1.1 over its unix socket or
TCP port, the text parsed by prometheus_client's own parser."""

from __future__ import annotations

import re
import socket

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Samples", "bound_address", "http_get", "parse", "scrape", "value"]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
"""(sample name, labels) → value."""


def http_get(address: str, path: str = "/metrics", verb: str = "GET") -> tuple[int, str]:
    """(status code, body) of one request to `unix:///p` or `host:port`."""
    if address.startswith("unix://"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target: object = address.removeprefix("unix://")
    else:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        target = (host, int(port))
    with sock:
        sock.settimeout(10)
        sock.connect(target)
        sock.sendall(f"{verb} {path} HTTP/1.1\r\nHost: crihook\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body.decode()


def scrape(address: str) -> Samples:
    status, text = http_get(address)
    assert status == 200, text
    return parse(text)


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 when the series does not exist (yet)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def bound_address(log: str) -> str | None:
    """Where crihook says it serves metrics (the port the kernel chose for port 0)."""
    found = re.findall(r"metrics served on (\S+) \(GET /metrics\)", log)
    return found[-1] if found else None
