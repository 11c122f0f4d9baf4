"""A gRPC client for spgated that knows nothing in advance: no generated stubs.

It learns the API the way grpcurl does: server reflection (grpc.reflection.v1alpha,
whose few messages are hand-encoded here) lists the services and returns their
FileDescriptorProtos; those go into a fresh descriptor pool, and request and response
classes are built from it at run time. So whatever this client can call, a new user
with only the daemon's address can call too. The health check is hand-encoded as well
(gRPC's built-in health service has no descriptor to reflect).

Also here, because the integration test and the demo both need them: starting the real
`spgated` binary on loopback with port 0 and reading the ports it bound from stderr,
and scraping /metrics.

Uses only Debian's python3-grpcio and python3-protobuf (run with /usr/bin/python3).

Usage:
    with SpgatedProcess(binary, workdir, state_dir=...) as daemon:
        admin = connect(daemon.admin_address, "spgate.v1.AdminService")
        cfg = admin.call("GetGateConfig", job_id="")
        req = admin.new("UpdateGateConfigRequest")    # spgate.v1.<name>
"""
import ctypes
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.request

import grpc
from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import message_factory

REFLECTION_METHOD = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
HEALTH_CHECK_METHOD = "/grpc.health.v1.Health/Check"
HEALTH_SERVING = 1  # grpc.health.v1.HealthCheckResponse.ServingStatus.SERVING


# --- protobuf wire format, just enough for reflection and health ----------------------

def _varint(value):
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _len_field(number, payload):
    """A length-delimited field (wire type 2): strings, bytes, messages."""
    if isinstance(payload, str):
        payload = payload.encode()
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _read_varint(data, pos):
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def decode_fields(data):
    """Field number -> list of values (ints for varints and fixed, bytes otherwise)."""
    fields = {}
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _read_varint(data, pos)
        elif wire_type == 1:
            value, pos = int.from_bytes(data[pos:pos + 8], "little"), pos + 8
        elif wire_type == 2:
            length, pos = _read_varint(data, pos)
            value, pos = bytes(data[pos:pos + length]), pos + length
        elif wire_type == 5:
            value, pos = int.from_bytes(data[pos:pos + 4], "little"), pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
        fields.setdefault(number, []).append(value)
    return fields


def _identity(b):
    return b


# --- health -------------------------------------------------------------------------

def health_check(channel, service="", timeout=5.0):
    """grpc.health.v1.Health/Check by hand; returns the ServingStatus number."""
    request = _len_field(1, service) if service else b""
    check = channel.unary_unary(HEALTH_CHECK_METHOD, request_serializer=_identity,
                                response_deserializer=_identity)
    response = decode_fields(check(request, timeout=timeout))
    return response.get(1, [0])[0]


# --- reflection ---------------------------------------------------------------------

class ReflectionError(RuntimeError):
    pass


class Reflection:
    """grpc.reflection.v1alpha over one channel, feeding a private descriptor pool."""

    def __init__(self, channel, timeout=5.0):
        self._channel = channel
        self._timeout = timeout
        self.pool = descriptor_pool.DescriptorPool()
        self._files = {}      # name -> FileDescriptorProto, received but maybe not added
        self._added = set()   # names added to the pool
        # One factory for the client's lifetime: classes must be shared so that a
        # nested message built by new() can be assigned into another one.
        self._factory = None if hasattr(message_factory, "GetMessageClass") else \
            message_factory.MessageFactory(self.pool)

    def _exchange(self, requests):
        """Sends ServerReflectionRequests (already encoded) on one stream; returns replies."""
        info = self._channel.stream_stream(REFLECTION_METHOD, request_serializer=_identity,
                                           response_deserializer=_identity)
        replies = []
        for raw in info(iter(requests), timeout=self._timeout):
            fields = decode_fields(raw)
            if 7 in fields:  # error_response
                err = decode_fields(fields[7][0])
                code = err.get(1, [0])[0]
                message = err.get(2, [b""])[0].decode(errors="replace")
                replies.append(ReflectionError(f"reflection error {code}: {message}"))
            else:
                replies.append(fields)
        return replies

    def list_services(self):
        (reply,) = self._exchange([_len_field(7, "*")])  # list_services
        if isinstance(reply, Exception):
            raise reply
        listing = decode_fields(reply[6][0])  # list_services_response
        return sorted(decode_fields(s)[1][0].decode() for s in listing.get(1, []))

    def _take_files(self, reply):
        if isinstance(reply, Exception):
            raise reply
        for blob in decode_fields(reply[4][0]).get(1, []):  # file_descriptor_response
            fdp = descriptor_pb2.FileDescriptorProto.FromString(blob)
            self._files.setdefault(fdp.name, fdp)

    def load_symbol(self, symbol):
        """Fetches the file defining `symbol` and everything it imports into the pool."""
        for reply in self._exchange([_len_field(4, symbol)]):  # file_containing_symbol
            self._take_files(reply)
        # The server may leave out files it believes we hold; ask for those by name.
        for _ in range(16):
            missing = sorted({dep for f in self._files.values() for dep in f.dependency}
                             - set(self._files))
            if not missing:
                break
            for reply in self._exchange([_len_field(3, name) for name in missing]):
                self._take_files(reply)
        self._add_ready_files()

    def _add_ready_files(self):
        progress = True
        while progress:
            progress = False
            for name, fdp in self._files.items():
                if name not in self._added and all(d in self._added for d in fdp.dependency):
                    self.pool.AddSerializedFile(fdp.SerializeToString())
                    self._added.add(name)
                    progress = True

    def message_class(self, full_name):
        desc = self.pool.FindMessageTypeByName(full_name)
        if self._factory is None:
            return message_factory.GetMessageClass(desc)
        return self._factory.GetPrototype(desc)


# --- dynamic service stubs ----------------------------------------------------------

class BidiStream:
    """A bidirectional stream driven step by step: send(), then recv(timeout)."""

    _END = object()

    def __init__(self, multicallable, timeout, metadata=None):
        self._outbox = queue.Queue()
        self._inbox = queue.Queue()
        self._call = multicallable(self._requests(), timeout=timeout, metadata=metadata)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _requests(self):
        while True:
            msg = self._outbox.get()
            if msg is self._END:
                return
            yield msg

    def _read(self):
        try:
            for msg in self._call:
                self._inbox.put(msg)
            self._inbox.put(self._END)
        except grpc.RpcError as e:  # the stream ended with a non-OK status
            self._inbox.put(e)

    def send(self, msg):
        self._outbox.put(msg)

    def recv(self, timeout):
        """The next message; None once the server ended the stream with OK."""
        try:
            item = self._inbox.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no message on the stream within {timeout} s") from None
        if item is self._END:
            self._inbox.put(item)
            return None
        if isinstance(item, grpc.RpcError):
            raise item
        return item

    def close(self, timeout):
        """Half-closes our side and waits for the server to finish; returns its code."""
        self._outbox.put(self._END)
        self._reader.join(timeout)
        if self._reader.is_alive():
            self._call.cancel()
            raise TimeoutError(f"stream did not finish within {timeout} s of half-close")
        return self._call.code()


class DynamicService:
    """Calls the methods of one reflected service: call() unary, stream() bidi/server."""

    def __init__(self, channel, reflection, service_name, timeout=5.0):
        self.channel = channel
        self.reflection = reflection
        self.timeout = timeout
        self.descriptor = reflection.pool.FindServiceByName(service_name)
        self.package = self.descriptor.file.package
        self._methods = {m.name: m for m in self.descriptor.methods}

    def new(self, type_name, **fields):
        """A message of spgate.v1.<type_name> (or a full name) with `fields` set."""
        full = type_name if "." in type_name else f"{self.package}.{type_name}"
        return self.reflection.message_class(full)(**fields)

    def enum_name(self, enum_type, number):
        """The name of value `number` of enum spgate.v1.<enum_type> (or a full name)."""
        full = enum_type if "." in enum_type else f"{self.package}.{enum_type}"
        return self.reflection.pool.FindEnumTypeByName(full).values_by_number[number].name

    def _callable(self, method_name, kind):
        method = self._methods[method_name]
        request_cls = self.reflection.message_class(method.input_type.full_name)
        response_cls = self.reflection.message_class(method.output_type.full_name)
        path = f"/{self.descriptor.full_name}/{method.name}"
        factory = getattr(self.channel, kind)
        return request_cls, factory(path, request_serializer=request_cls.SerializeToString,
                                    response_deserializer=response_cls.FromString)

    def call(self, method_name, request=None, timeout=None, metadata=None, **fields):
        """Unary call; raises grpc.RpcError on a non-OK status."""
        request_cls, stub = self._callable(method_name, "unary_unary")
        if request is None:
            request = request_cls(**fields)
        return stub(request, timeout=timeout or self.timeout, metadata=metadata)

    def bidi(self, method_name, timeout=30.0, metadata=None):
        _, stub = self._callable(method_name, "stream_stream")
        return BidiStream(stub, timeout, metadata)


def connect(address, service_name, timeout=5.0):
    """Channel + reflection + stub for `service_name` at `address` (insecure, loopback)."""
    channel = grpc.insecure_channel(address)
    grpc.channel_ready_future(channel).result(timeout=timeout)
    reflection = Reflection(channel, timeout)
    reflection.load_symbol(service_name)
    return DynamicService(channel, reflection, service_name, timeout)


# --- the daemon process -------------------------------------------------------------

# Metrics and the health-only port are each optional (an empty flag turns one off, and the
# line then names it after "; off:").
SERVING_LINE = re.compile(r"spgated: serving: worker API on port (\d+), admin API on port "
                          r"(\d+)(?:, metrics on port (\d+))?(?:, health on port (\d+))?")


def _die_with_parent():
    # PR_SET_PDEATHSIG: the daemon is killed if this Python process dies, even by SIGKILL
    # (a ctest timeout), so no test or demo leaves a daemon behind.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)


class SpgatedProcess:
    """The real spgated on 127.0.0.1 with port 0 everywhere; ports parsed from stderr."""

    def __init__(self, binary, state_dir=None, config=None, extra_args=(), start_timeout=15.0):
        self.args = [binary, "--listen=127.0.0.1:0", "--admin_listen=127.0.0.1:0",
                     "--metrics_listen=127.0.0.1:0"]
        if state_dir:
            self.args.append(f"--state_dir={state_dir}")
        if config:
            self.args.append(f"--config={config}")
        self.args += list(extra_args)
        self.start_timeout = start_timeout
        self.proc = None
        self.worker_port = self.admin_port = self.metrics_port = self.health_port = None
        self._lines = []
        self._lines_lock = threading.Lock()
        self._serving = threading.Event()
        self._reader = None

    @property
    def worker_address(self):
        return f"127.0.0.1:{self.worker_port}"

    @property
    def admin_address(self):
        return f"127.0.0.1:{self.admin_port}"

    @property
    def stderr_text(self):
        with self._lines_lock:
            return "".join(self._lines)

    def _read_stderr(self):
        for line in iter(self.proc.stderr.readline, ""):
            with self._lines_lock:
                self._lines.append(line)
            m = SERVING_LINE.search(line)
            if m:
                self.worker_port, self.admin_port = int(m.group(1)), int(m.group(2))
                self.metrics_port = int(m.group(3)) if m.group(3) else None
                self.health_port = int(m.group(4)) if m.group(4) else None
                self._serving.set()

    def launch(self):
        """Starts the process; returns without waiting for SERVING."""
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, preexec_fn=_die_with_parent)
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        return self

    def start(self):
        """Starts the process and waits until it logs the ports it serves on."""
        self.launch()
        deadline = time.monotonic() + self.start_timeout
        while not self._serving.wait(0.05):
            if self.proc.poll() is not None:
                self._reader.join(2)
                raise RuntimeError(f"spgated exited with {self.proc.returncode} before serving:\n"
                                   f"{self.stderr_text}")
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"spgated did not report its ports within "
                                   f"{self.start_timeout} s:\n{self.stderr_text}")
        return self

    def _reap(self, timeout):
        self._reader.join(timeout)
        if not self._reader.is_alive():
            self.proc.stderr.close()

    def wait_exit(self, timeout):
        """Waits for the process to end; returns (exit code, stderr)."""
        rc = self.proc.wait(timeout=timeout)
        self._reap(timeout)
        return rc, self.stderr_text

    def terminate(self, timeout=10.0):
        """SIGTERM (graceful drain) and wait; returns the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        rc, _ = self.wait_exit(timeout)
        return rc

    def kill(self):
        """SIGKILL, like `kill -9`: no flush, no goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self._reader is not None and not self.proc.stderr.closed:
            self._reap(2)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.kill()


# --- metrics ------------------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(metrics_port, timeout=5.0):
    """GET /metrics; returns [(name, {label: value}, float value)]."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            labels = dict(_LABEL.findall(m.group(2) or ""))
            samples.append((m.group(1), labels, float(m.group(3))))
    return samples
