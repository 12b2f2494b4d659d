"""crictl, the CLI node operators debug with (a grpc-go CRI client), driven from tests.

:class:`Crictl` runs the cached crictl (:func:`tests.lab.peers.crictl`) against one CRI
endpoint with a config file of its own (never the host's /etc/crictl.yaml) that turns image
pulls off: the lab's images are imported, and nothing is fetched.

:func:`scrub` and :func:`scrub_json` take out of crictl's output what differs between two
runs of the same commands (object ids, times, pids, addresses, random interface and netns
names), so two transcripts can be compared for equality.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.lab import peers

__all__ = ["Crictl", "Result", "json_stream", "scrub", "scrub_json", "shape"]


@dataclass(frozen=True)
class Result:
    """One crictl command: what it was asked and everything it answered."""

    args: tuple[str, ...]
    code: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        return (
            f"crictl {' '.join(self.args)} exited {self.code}\n"
            f"--- stdout:\n{self.stdout}\n--- stderr:\n{self.stderr}"
        )


class Crictl:
    """crictl for ``endpoint`` (``unix:///...``); its config file is written to ``workdir``."""

    def __init__(
        self, endpoint: str, workdir: Path, *, binary: Path | None = None, timeout: int = 60
    ) -> None:
        self.endpoint = endpoint
        self.binary = binary or peers.crictl()
        self.timeout = timeout
        tag = hashlib.sha256(endpoint.encode()).hexdigest()[:8]
        self.config_path = workdir / f"crictl-{tag}.yaml"
        self.config_path.write_text(
            f"runtime-endpoint: {endpoint}\n"
            f"image-endpoint: {endpoint}\n"
            f"timeout: {timeout}\n"
            "pull-image-on-create: false\n"
            "disable-pull-on-run: true\n"
        )

    def command(self, *args: str) -> list[str]:
        return [str(self.binary), "--config", str(self.config_path), *args]

    def run(self, *args: str, stdin: str | None = None) -> Result:
        """Run ``crictl args...`` to its end (bounded by twice the CRI timeout)."""
        proc = subprocess.run(
            self.command(*args),
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=2 * self.timeout,
            check=False,
        )
        return Result(tuple(args), proc.returncode, proc.stdout, proc.stderr)

    def ok(self, *args: str, stdin: str | None = None) -> Result:
        """``run``, and raise AssertionError with the whole output unless it exited 0."""
        result = self.run(*args, stdin=stdin)
        if result.code != 0:
            raise AssertionError(result.describe())
        return result

    def popen(self, *args: str) -> subprocess.Popen[str]:
        """Start a long-running command (``events``); the caller stops and waits for it."""
        return subprocess.Popen(
            self.command(*args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


# --- what differs between two runs of the same commands -----------------------------------------

_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z")
_ZERO_TIME = "0001-01-01T00:00:00Z"
_MAC = re.compile(r"\b(?:[0-9a-f]{2}:){5}[0-9a-f]{2}\b")
_VETH = re.compile(r"\bveth[0-9a-f]{8}\b")
_PROC_PID = re.compile(r"/proc/\d+/")
# klog's line header (severity, date, time, thread id) on crictl's error lines.
_KLOG = re.compile(r"^([EWIF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ ", re.MULTILINE)
_NETNS = re.compile(r"\bcni-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
# CRI-O: each pod's namespaces pinned under <namespaces_dir>/<kind>ns/<uuid>, and its storage
# layers named by a random id (overlay/<id>/merged).
_NS_PIN = re.compile(r"(ns/)[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
_LAYER = re.compile(r"(/overlay/)[0-9a-f]{64}\b")
# JSON keys whose values are times or process ids: kept only as "set" or zero.
_VOLATILE_KEYS = frozenset({"createdAt", "startedAt", "finishedAt", "timestamp", "pid"})
_ZEROS = (0, "0", "", None, _ZERO_TIME)


def scrub(text: str, names: Mapping[str, str], subnet_prefix: str) -> str:
    """``text`` with each id in ``names`` (full, or cut to crictl's 13 characters) replaced by
    its name, and times, pids in /proc paths, klog headers, MAC addresses, veth and netns
    names and pod addresses (starting with ``subnet_prefix``, e.g. ``10.88.7.``) by
    placeholders."""
    for ident, name in sorted(names.items(), key=lambda item: -len(item[0])):
        text = text.replace(ident, f"<{name}>").replace(ident[:13], f"<{name}>")
        # CRI-O's pod hostname: the sandbox id's first 12 characters.
        text = re.sub(rf"\b{re.escape(ident[:12])}\b", f"<{name}>", text)
    text = _RFC3339.sub(lambda m: m.group(0) if m.group(0) == _ZERO_TIME else "<time>", text)
    text = _KLOG.sub(r"\1<klog> ", text)
    text = _PROC_PID.sub("/proc/<pid>/", text)
    text = _MAC.sub("<mac>", text)
    text = _VETH.sub("<veth>", text)
    text = _NETNS.sub("<netns>", text)
    text = _NS_PIN.sub(r"\1<netns>", text)
    text = _LAYER.sub(r"\1<layer>", text)
    return re.sub(re.escape(subnet_prefix) + r"\d+\b", "<pod-ip>", text)


def scrub_json(doc: object) -> object:
    """A JSON document with the values of time and pid keys replaced by ``"<set>"`` (a zero
    stays as it is: "not started" and "started" still differ), and JSON objects inside
    strings (CRI-O's annotations: Go writes a map's keys in random order) with their keys
    sorted."""
    if isinstance(doc, str) and doc.startswith("{"):
        try:
            inner = json.loads(doc)
        except ValueError:
            return doc
        return json.dumps(scrub_json(inner), sort_keys=True)
    if isinstance(doc, dict):
        return {
            k: ("<set>" if k in _VOLATILE_KEYS and v not in _ZEROS else scrub_json(v))
            for k, v in doc.items()
        }
    if isinstance(doc, list):
        return [scrub_json(v) for v in doc]
    return doc


def shape(doc: object) -> object:
    """Keys kept, every leaf value replaced by ``"<n>"``: usage counters move between runs.
    A counter is a wrapper, ``{"value": n}``, printed as ``{}`` when n is 0 (protobuf's JSON
    leaves zeros out): either is ``"<n>"``, or an idle container's zero would differ."""
    if isinstance(doc, dict) and set(doc) <= {"value"}:
        return "<n>"
    if isinstance(doc, dict):
        return {k: shape(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [shape(v) for v in doc]
    return "<n>"


def json_stream(text: str, *, complete: bool = True) -> Sequence[object]:
    """The JSON documents of a stream of pretty-printed ones (``crictl events -o json``).
    ``complete=False``: the stream is still being written; a partial last one is left out."""
    decoder = json.JSONDecoder()
    docs: list[object] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return docs
        try:
            doc, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            if complete:
                raise
            return docs
        docs.append(doc)
