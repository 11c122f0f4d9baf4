#!/usr/bin/python3
"""spgated tried as a new user would: the real binary, and a client that knows nothing.

The client has no spgate-generated code. It finds the services through server
reflection and builds every message from the descriptors the daemon returns
(tools/demo/spgate_reflect.py), so each check here is something anyone with grpcurl
and the daemon's address can reproduce. It checks what a new user meets first:
reflection lists both services, invalid thresholds are refused naming the field, a
threshold set over the API survives `kill -9` and a restart, a corrupt state file stops
startup naming the file; and the basics a client relies on: health SERVING on every
port, invalid plans refused naming the field, NOT_FOUND for an unknown job, ABORTED on
a version conflict, the same (job, group, step) answered with the same decision,
SIGTERM ending open streams with UNAVAILABLE and exiting 0, the admin roles (no
credential, a wrong token, a reader's token on a change) and the audit trail's principal,
and the plaintext --health_listen port serving Health and nothing else (no reflection, no
API).

Run: /usr/bin/python3 independent_client_test.py PATH/TO/spgated   (ctest does this)
Loopback only; every daemon is killed on exit, also when the test fails or is killed.
"""
import faulthandler
import math
import os
import shutil
import socket
import sys
import tempfile
import time
import unittest

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tools", "demo"))
import spgate_reflect as sr  # noqa: E402

SPGATED = None     # set from argv in main
CALL_TIMEOUT = 5.0
WHOLE_TEST_TIMEOUT = 55.0


def wire(message):
    return message.SerializeToString(deterministic=True)


def _daemon(state_dir, extra_args=()):
    return sr.SpgatedProcess(SPGATED, state_dir=state_dir, extra_args=extra_args)


INCARNATION = "independent-client-1"
# The launch's secret (docs/security.md): every Register of the launch presents it.
LAUNCH_CREDENTIAL = "independent-client-launch-secret-1"


def leader_session(gate, job_id, group):
    """Register as rank 0 of a one-rank group: Decide needs the leader's session."""
    return gate.call("Register", job_id=job_id, incarnation=INCARNATION, launch_credential=LAUNCH_CREDENTIAL, group=group,
                     rank_in_group=0, group_size=1, global_rank=0, host="test").session_id


class IndependentClientTest(unittest.TestCase):
    """One daemon for the read-mostly checks."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="spgate-integ-")
        cls.daemon = _daemon(os.path.join(cls.tmp, "state")).start()
        try:
            cls.admin = sr.connect(cls.daemon.admin_address, "spgate.v1.AdminService",
                                   CALL_TIMEOUT)
            cls.gate = sr.connect(cls.daemon.worker_address, "spgate.v1.GateService",
                                  CALL_TIMEOUT)
        except Exception:
            cls.daemon.kill()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.daemon.kill()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def assertRpcError(self, code, fn, *args, **kwargs):
        with self.assertRaises(grpc.RpcError) as caught:
            fn(*args, **kwargs)
        self.assertEqual(caught.exception.code(), code, caught.exception.details())
        return caught.exception.details()

    def test_reflection_lists_the_services_on_both_ports(self):
        expected = {
            self.daemon.worker_address: "spgate.v1.GateService",
            self.daemon.admin_address: "spgate.v1.AdminService",
        }
        for address, service in expected.items():
            with grpc.insecure_channel(address) as channel:
                listed = sr.Reflection(channel, CALL_TIMEOUT).list_services()
            with self.subTest(address=address):
                self.assertIn(service, listed)
                self.assertIn("grpc.reflection.v1alpha.ServerReflection", listed)
                # gRPC's built-in health service is listed, though it has no descriptor
                # to reflect (it is not generated from a .proto); Check is tested below.
                self.assertIn("grpc.health.v1.Health", listed)
        # Each port serves only its own API: the admin service is not on the worker port.
        with grpc.insecure_channel(self.daemon.worker_address) as channel:
            self.assertNotIn("spgate.v1.AdminService",
                             sr.Reflection(channel, CALL_TIMEOUT).list_services())

    def test_reflected_descriptors_describe_the_api(self):
        methods = {m.name for m in self.admin.descriptor.methods}
        self.assertTrue({"GetGateConfig", "UpdateGateConfig", "ListJobs", "GetJob", "PinMode",
                         "Unpin", "WatchDecisions", "EvaluateGates"} <= methods, methods)
        connect = self.gate.descriptor.methods_by_name["Connect"]
        self.assertTrue(connect.client_streaming and connect.server_streaming)
        self.assertEqual({m.name for m in self.gate.descriptor.methods},
                         {"Register", "Connect", "Decide"})

    def test_health_is_serving_on_both_ports(self):
        for address, service in ((self.daemon.worker_address, "spgate.v1.GateService"),
                                 (self.daemon.admin_address, "spgate.v1.AdminService")):
            with grpc.insecure_channel(address) as channel:
                self.assertEqual(sr.health_check(channel, timeout=CALL_TIMEOUT),
                                 sr.HEALTH_SERVING, address)
                # By service name too, as a health checker configured per service asks.
                self.assertEqual(sr.health_check(channel, service, timeout=CALL_TIMEOUT),
                                 sr.HEALTH_SERVING, f"{address} {service}")
                with self.assertRaises(grpc.RpcError) as unknown:
                    sr.health_check(channel, "spgate.v1.NoSuchService", timeout=CALL_TIMEOUT)
                self.assertEqual(unknown.exception.code(), grpc.StatusCode.NOT_FOUND, address)

    def test_invalid_thresholds_are_refused_naming_the_field(self):
        before = self.admin.call("GetGateConfig")
        cases = [
            # (scope job_id, fields to set, words the message must contain)
            ("", {"max_length_cv": math.nan}, ["max_length_cv"]),
            ("", {"max_length_cv": math.inf}, ["max_length_cv"]),
            ("", {"max_rs_wait_share": -0.1}, ["max_rs_wait_share"]),
            ("", {"max_length_cv": 10.5}, ["max_length_cv"]),          # CV bound is 10
            ("", {"max_rs_wait_share": 1.5}, ["max_rs_wait_share"]),   # shares are <= 1
            ("", {"bucket_target_cv": 0.0}, ["bucket_target_cv"]),
            ("", {"memory_headroom": 1.01}, ["memory_headroom"]),
            ("", {"window_steps": 0}, ["window_steps"]),
            ("", {"probe_interval_steps": 1_000_001}, ["probe_interval_steps"]),
            ("", {"min_dwell_steps": -5}, ["min_dwell_steps"]),
            # The re-enable margin must stay below the threshold it is subtracted from.
            ("", {"rs_wait_reenable_margin": 0.22}, ["rs_wait_reenable_margin"]),
            ("", {"max_rs_wait_share": 0.1, "rs_wait_reenable_margin": 0.5},
             ["rs_wait_reenable_margin", "max_rs_wait_share"]),
            ("", {"max_rs_wait_share": 0.02}, ["rs_wait_reenable_margin", "max_rs_wait_share"]),
            # A per-job override is checked the same way.
            ("invalid-job", {"window_steps": 0}, ["window_steps"]),
        ]
        for job_id, fields, words in cases:
            with self.subTest(job_id=job_id, fields=fields):
                request = self.admin.new("UpdateGateConfigRequest", job_id=job_id,
                                         config=self.admin.new("GateConfig", **fields))
                request.update_mask.paths.extend(sorted(fields))
                details = self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT,
                                              self.admin.call, "UpdateGateConfig", request)
                for word in words:
                    self.assertIn(word, details)
        after = self.admin.call("GetGateConfig")
        self.assertEqual(after.config, before.config, "a refused update changed the config")
        self.assertEqual(after.version, before.version)
        self.assertRpcError(grpc.StatusCode.NOT_FOUND, self.admin.call, "GetGateConfig",
                            job_id="invalid-job")

    def test_invalid_plans_are_refused_naming_the_field(self):
        cases = [
            ({"job_id": "plan-job", "step": 0, "lengths": []}, "lengths"),
            ({"job_id": "plan-job", "step": 0, "lengths": [4096, 0]}, "lengths"),
            ({"job_id": "plan-job", "step": -1, "lengths": [4096]}, "step"),
            ({"job_id": "", "step": 0, "lengths": [4096]}, "job_id"),
            ({"job_id": "no spaces!", "step": 0, "lengths": [4096]}, "job_id"),
        ]
        session = leader_session(self.gate, "plan-job", 0)
        for fields, word in cases:
            with self.subTest(**fields):
                request = self.gate.new("DecideRequest", plan=self.gate.new("BatchPlan", **fields),
                                        session_id=session)
                details = self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT,
                                              self.gate.call, "Decide", request)
                self.assertIn(word, details)

    def test_version_conflict_is_aborted(self):
        current = self.admin.call("GetGateConfig")
        request = self.admin.new("UpdateGateConfigRequest",
                                 config=self.admin.new("GateConfig", bucket_target_cv=0.14),
                                 expected_version=current.version + 100)
        request.update_mask.paths.append("bucket_target_cv")
        details = self.assertRpcError(grpc.StatusCode.ABORTED, self.admin.call,
                                      "UpdateGateConfig", request)
        self.assertIn("version", details)

    def test_unknown_job_is_not_found(self):
        details = self.assertRpcError(grpc.StatusCode.NOT_FOUND, self.admin.call, "GetJob",
                                      job_id="no-such-job")
        self.assertIn("no-such-job", details)

    def test_same_job_group_step_gets_the_same_decision(self):
        session = leader_session(self.gate, "idempotent-job", 3)

        def decide(step, lengths):
            plan = self.gate.new("BatchPlan", job_id="idempotent-job", group=3, step=step,
                                 lengths=lengths)
            return self.gate.call("Decide", self.gate.new("DecideRequest", plan=plan,
                                                          session_id=session))

        uniform, mixed = [4096, 4096, 4000, 4200], [512, 16384, 1024, 8192]
        first = decide(5, uniform)
        retry = decide(5, uniform)
        self.assertEqual(first, retry)  # every field, decide_time included
        self.assertEqual(first.SerializeToString(deterministic=True),
                         retry.SerializeToString(deterministic=True))
        self.assertEqual(self.gate.enum_name("Reason", first.reason), "GATES_PASSED")
        # A retry is answered from the record only for the plan it was made for: another
        # plan for a decided step is refused, naming the step (docs/security.md).
        details = self.assertRpcError(grpc.StatusCode.ALREADY_EXISTS, decide, 5, mixed)
        self.assertIn("different plan", details)
        # ...while the next step with those lengths is decided on its own merits.
        self.assertEqual(self.gate.enum_name("Reason", decide(6, mixed).reason), "LENGTH_CV")
        self.assertEqual(decide(5, uniform), first)


class StateDirTest(unittest.TestCase):
    """Daemons that are killed and restarted over one --state_dir."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spgate-integ-state-")
        self.state_dir = os.path.join(self.tmp, "state")
        self.daemons = []

    def tearDown(self):
        for d in self.daemons:
            d.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start(self, extra_args=()):
        d = _daemon(self.state_dir, extra_args)
        self.daemons.append(d)
        return d.start()

    def update(self, admin, job_id="", expected_version=None, **fields):
        request = admin.new("UpdateGateConfigRequest", job_id=job_id,
                            config=admin.new("GateConfig", **fields))
        request.update_mask.paths.extend(sorted(fields))
        if expected_version is not None:
            request.expected_version = expected_version
        return admin.call("UpdateGateConfig", request)

    def test_threshold_set_over_the_api_survives_kill_9_and_restart(self):
        daemon = self.start()
        admin = sr.connect(daemon.admin_address, "spgate.v1.AdminService", CALL_TIMEOUT)
        initial = admin.call("GetGateConfig")
        set_global = self.update(admin, expected_version=initial.version,
                                 max_length_cv=0.42, window_steps=7)
        self.assertAlmostEqual(set_global.config.max_length_cv, 0.42)
        self.assertGreater(set_global.version, initial.version)
        set_job = self.update(admin, job_id="persist-job", max_rs_wait_share=0.3)
        before_global = admin.call("GetGateConfig")
        before_job = admin.call("GetGateConfig", job_id="persist-job")
        admin.channel.close()

        daemon.kill()  # SIGKILL: nothing is flushed at exit
        self.assertEqual(daemon.proc.returncode, -9)

        daemon = self.start()
        admin = sr.connect(daemon.admin_address, "spgate.v1.AdminService", CALL_TIMEOUT)
        after_global = admin.call("GetGateConfig")
        after_job = admin.call("GetGateConfig", job_id="persist-job")
        self.assertAlmostEqual(after_global.config.max_length_cv, 0.42)
        self.assertEqual(after_global.config.window_steps, 7)
        for before, after in ((before_global, after_global), (before_job, after_job)):
            # Two connections, two descriptor pools: compare the wire bytes.
            self.assertEqual(wire(after.config), wire(before.config), after)
            self.assertEqual(wire(after.overrides), wire(before.overrides), after)
            self.assertEqual(after.version, before.version)
            self.assertEqual(after.effective_version, before.effective_version)
        self.assertEqual(after_global.version, set_global.version)
        self.assertEqual(after_job.version, set_job.version)
        self.assertAlmostEqual(after_job.config.max_rs_wait_share, 0.3)
        self.assertAlmostEqual(after_job.config.max_length_cv, 0.42)  # inherited
        # The version counter survived too: the next change gets a newer version, and
        # optimistic concurrency keeps working against the restored version.
        newer = self.update(admin, expected_version=after_global.version, max_length_cv=0.4)
        self.assertGreater(newer.version, set_job.version)
        admin.channel.close()

    def test_sockets_that_never_speak_http2_are_closed_at_the_handshake_timeout(self):
        daemon = self.start(["--handshake_timeout=1s", "--health_listen=127.0.0.1:0"])
        for port in (daemon.worker_port, daemon.admin_port, daemon.health_port):
            with socket.create_connection(("127.0.0.1", port), timeout=CALL_TIMEOUT) as s:
                s.settimeout(10)  # bounded: a daemon that holds the socket fails, not hangs
                start = time.monotonic()
                closed = False
                try:
                    # The server speaks first (its SETTINGS): read until it hangs up.
                    while not closed:
                        closed = s.recv(4096) == b""
                except ConnectionResetError:
                    closed = True
                except socket.timeout:
                    pass
                held = time.monotonic() - start
            self.assertTrue(closed, f"port {port}: a silent socket was still open after {held:.1f} s")
            self.assertLess(held, 5, f"port {port}")
        # A real client still gets through.
        with grpc.insecure_channel(daemon.worker_address) as channel:
            self.assertEqual(sr.health_check(channel, timeout=CALL_TIMEOUT), sr.HEALTH_SERVING)

    def test_startup_line_names_the_listeners_that_are_off(self):
        daemon = self.start(["--metrics_listen="])
        line = next(l for l in daemon.stderr_text.splitlines() if "serving:" in l)
        self.assertIsNone(daemon.metrics_port, line)
        self.assertNotIn("metrics on port", line)  # was "metrics on port 0"
        self.assertIn("; off: metrics (--metrics_listen), health-only port (--health_listen)",
                      line)
        daemon = self.start(["--health_listen=127.0.0.1:0"])
        line = next(l for l in daemon.stderr_text.splitlines() if "serving:" in l)
        self.assertIsNotNone(daemon.metrics_port, line)
        self.assertNotIn("off:", line)

    def test_health_port_serves_health_and_nothing_else(self):
        daemon = self.start(["--health_listen=127.0.0.1:0"])
        self.assertIsNotNone(daemon.health_port, daemon.stderr_text)
        identity = lambda b: b  # noqa: E731
        with grpc.insecure_channel(f"127.0.0.1:{daemon.health_port}") as channel:
            self.assertEqual(sr.health_check(channel, timeout=CALL_TIMEOUT), sr.HEALTH_SERVING)
            for service in ("spgate.v1.GateService", "spgate.v1.AdminService"):
                self.assertEqual(sr.health_check(channel, service, timeout=CALL_TIMEOUT),
                                 sr.HEALTH_SERVING, service)
            # The plaintext port must not describe the API (reflection) or serve it.
            for call in (lambda: sr.Reflection(channel, CALL_TIMEOUT).list_services(),
                         lambda: channel.unary_unary(
                             "/spgate.v1.AdminService/GetGateConfig",
                             request_serializer=identity,
                             response_deserializer=identity)(b"", timeout=CALL_TIMEOUT)):
                with self.assertRaises(grpc.RpcError) as refused:
                    call()
                self.assertEqual(refused.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
        # The same daemon's API ports still answer reflection.
        for address, service in ((daemon.worker_address, "spgate.v1.GateService"),
                                 (daemon.admin_address, "spgate.v1.AdminService")):
            with grpc.insecure_channel(address) as channel:
                listed = sr.Reflection(channel, CALL_TIMEOUT).list_services()
            self.assertIn(service, listed, address)
            self.assertIn("grpc.reflection.v1alpha.ServerReflection", listed, address)

    def test_sigterm_drains_streams_exits_zero_and_keeps_pins(self):
        daemon = self.start(["--health_listen=127.0.0.1:0"])
        self.assertIsNotNone(daemon.health_port, daemon.stderr_text)
        with grpc.insecure_channel(f"127.0.0.1:{daemon.health_port}") as channel:
            self.assertEqual(sr.health_check(channel, timeout=CALL_TIMEOUT), sr.HEALTH_SERVING)
        gate = sr.connect(daemon.worker_address, "spgate.v1.GateService", CALL_TIMEOUT)
        admin = sr.connect(daemon.admin_address, "spgate.v1.AdminService", CALL_TIMEOUT)
        session = gate.call("Register", job_id="drain-job", incarnation=INCARNATION, launch_credential=LAUNCH_CREDENTIAL, group=0,
                            rank_in_group=0,
                            group_size=1, global_rank=0, host="test").session_id
        stream = gate.bidi("Connect", timeout=30)
        hello = gate.new("WorkerMessage", session_id=session)
        hello.heartbeat.telemetry_sent = 0
        stream.send(hello)
        self.assertTrue(stream.recv(CALL_TIMEOUT).HasField("ack"))
        admin.call("PinMode", admin.new("PinModeRequest", job_id="drain-job", group=0,
                                        mode="TENSOR_PARALLEL_ONLY",
                                        duration=admin.new("google.protobuf.Duration",
                                                           seconds=3600)))

        rc = daemon.terminate(timeout=15)
        self.assertEqual(rc, 0, daemon.stderr_text)
        # The open stream was ended by the daemon, with UNAVAILABLE (retry elsewhere).
        with self.assertRaises(grpc.RpcError) as ended:
            stream.recv(CALL_TIMEOUT)
        self.assertEqual(ended.exception.code(), grpc.StatusCode.UNAVAILABLE)
        gate.channel.close()
        admin.channel.close()

        daemon = self.start()
        admin = sr.connect(daemon.admin_address, "spgate.v1.AdminService", CALL_TIMEOUT)
        gate = sr.connect(daemon.worker_address, "spgate.v1.GateService", CALL_TIMEOUT)
        job = admin.call("GetJob", job_id="drain-job")
        self.assertEqual(len(job.pins), 1, job)
        self.assertEqual(admin.enum_name("Mode", job.pins[0].mode), "TENSOR_PARALLEL_ONLY")
        plan = gate.new("BatchPlan", job_id="drain-job", group=0, step=0, lengths=[4096])
        decision = gate.call("Decide", gate.new("DecideRequest", plan=plan,
                                                session_id=leader_session(gate, "drain-job", 0)))
        self.assertEqual(gate.enum_name("Reason", decision.reason), "PINNED")
        gate.channel.close()
        admin.channel.close()

    def test_admin_roles_guard_reads_and_changes(self):
        admin_file = os.path.join(self.tmp, "admin-token")
        with open(admin_file, "w") as f:
            f.write("s3cret-token\n")  # a bare token: named after the file
        reader_file = os.path.join(self.tmp, "reader-tokens")
        with open(reader_file, "w") as f:
            f.write("grafana:reader-token\n")
        daemon = self.start([f"--admin_token_file={admin_file}",
                             f"--reader_token_file={reader_file}"])
        admin = sr.connect(daemon.admin_address, "spgate.v1.AdminService", CALL_TIMEOUT)
        as_reader = (("authorization", "Bearer reader-token"),)
        as_admin = (("authorization", "Bearer s3cret-token"),)
        with self.assertRaises(grpc.RpcError) as caught:
            admin.call("GetGateConfig")  # with credentials configured, reads need one
        self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        version = admin.call("GetGateConfig", metadata=as_reader).version
        request = admin.new("UpdateGateConfigRequest",
                            config=admin.new("GateConfig", max_length_cv=0.25))
        request.update_mask.paths.append("max_length_cv")
        for metadata, code in ((None, grpc.StatusCode.UNAUTHENTICATED),
                               ((("authorization", "Bearer wrong"),),
                                grpc.StatusCode.PERMISSION_DENIED),
                               (as_reader, grpc.StatusCode.PERMISSION_DENIED)):
            with self.subTest(metadata=metadata):
                with self.assertRaises(grpc.RpcError) as caught:
                    admin.call("UpdateGateConfig", request, metadata=metadata)
                self.assertEqual(caught.exception.code(), code, caught.exception.details())
        self.assertEqual(admin.call("GetGateConfig", metadata=as_reader).version, version)
        updated = admin.call("UpdateGateConfig", request, metadata=as_admin)
        self.assertAlmostEqual(updated.config.max_length_cv, 0.25)
        # The audit trail names the principal (the token file's name), never the token.
        history = admin.call("ListConfigHistory", metadata=as_reader)
        self.assertEqual(len(history.entries), 1, history)
        self.assertEqual(history.entries[0].principal, "admin-token")
        self.assertEqual(history.entries[0].version, updated.version)
        with open(os.path.join(self.state_dir, "audit.log")) as f:
            self.assertNotIn("s3cret", f.read())
        admin.channel.close()

    def test_corrupt_state_file_stops_startup_naming_the_file(self):
        daemon = self.start()
        admin = sr.connect(daemon.admin_address, "spgate.v1.AdminService", CALL_TIMEOUT)
        self.update(admin, max_length_cv=0.3)
        admin.channel.close()
        daemon.kill()
        files = [f for f in os.listdir(self.state_dir)
                 if os.path.isfile(os.path.join(self.state_dir, f)) and f != "audit.log"]
        self.assertEqual(len(files), 1, f"expected one state file, found {files}")
        path = os.path.join(self.state_dir, files[0])
        corruptions = {
            "truncated text": "version_counter: 3\nglobal_overrides { max_length_cv: 0.",
            "binary garbage": "\x00\x01\x02\xff not a textproto \x7f",
            "value out of range": "version_counter: 1\nglobal_version: 1\n"
                                  "global_overrides { max_length_cv: -1 }\n",
        }
        for what, text in corruptions.items():
            with self.subTest(corruption=what):
                with open(path, "w", encoding="latin-1") as f:
                    f.write(text)
                d = _daemon(self.state_dir)
                self.daemons.append(d)
                rc, stderr = d.launch().wait_exit(timeout=10)
                self.assertNotEqual(rc, 0, stderr)
                self.assertIn(path, stderr)
                self.assertNotIn("serving:", stderr)
                with open(path, encoding="latin-1") as f:
                    self.assertEqual(f.read(), text, "the corrupt file was replaced")


def main():
    global SPGATED
    if len(sys.argv) < 2 or not os.access(sys.argv[1], os.X_OK):
        sys.exit(f"usage: {sys.argv[0]} PATH/TO/spgated [unittest args]")
    SPGATED = os.path.abspath(sys.argv.pop(1))
    # Bounded in time whatever hangs: dump every thread's stack and exit (the daemons
    # die with this process, see spgate_reflect._die_with_parent).
    faulthandler.dump_traceback_later(WHOLE_TEST_TIMEOUT, exit=True)
    unittest.main(verbosity=2)


if __name__ == "__main__":
    main()
