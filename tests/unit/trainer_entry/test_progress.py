"""status.progress patches: body, path, auth, and the 5-second throttle."""

import json
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from trainer_entry.progress import ApiTarget, ProgressReporter, progress_patch, status_path


class FakeApi(BaseHTTPRequestHandler):
    seen: list = []
    code = 200
    codes: list = []  # answered first, one per request, before falling back to `code`

    def do_PATCH(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        FakeApi.seen.append((self.path, dict(self.headers), json.loads(body)))
        self.send_response(FakeApi.codes.pop(0) if FakeApi.codes else FakeApi.code)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        return


@pytest.fixture
def api():
    FakeApi.seen, FakeApi.code, FakeApi.codes = [], 200, []
    server = HTTPServer(("127.0.0.1", 0), FakeApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield ApiTarget(base_url=f"http://127.0.0.1:{server.server_port}", token="tok", ssl_context=None)
    server.shutdown()


def test_patch_body_is_only_progress():
    body = progress_patch(7, 100, 0.4567891, datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert body == {
        "status": {
            "progress": {
                "step": 7,
                "totalSteps": 100,
                "rewardMean": 0.456789,
                "lastUpdateTime": "2026-01-02T03:04:05Z",
            }
        }
    }
    assert status_path("rl", "j") == "/apis/toolrl.dev/v1alpha1/namespaces/rl/toolrljobs/j/status"


def test_throttled_to_the_interval_and_flushed_at_the_end(api):
    now = [100.0]
    reporter = ProgressReporter(api, "rl", "j", min_interval=5.0, clock=lambda: now[0])
    assert reporter.update(1, 10, 0.1)
    now[0] += 2
    assert not reporter.update(2, 10, 0.2)
    now[0] += 2
    assert not reporter.update(3, 10, 0.3)
    now[0] += 1.5
    assert reporter.update(4, 10, 0.4)
    assert not reporter.update(5, 10, 0.5)
    assert reporter.flush()
    steps = [body["status"]["progress"]["step"] for _, _, body in FakeApi.seen]
    assert steps == [1, 4, 5]
    path, headers, _ = FakeApi.seen[0]
    assert path == "/apis/toolrl.dev/v1alpha1/namespaces/rl/toolrljobs/j/status"
    assert headers["Authorization"] == "Bearer tok"
    assert headers["Content-Type"] == "application/merge-patch+json"


def test_refused_patch_is_logged_not_raised(api, caplog):
    FakeApi.code = 403
    reporter = ProgressReporter(api, "rl", "j")
    assert not reporter.update(1, 10, 0.0)
    assert "J-trainer Role" in caplog.text


def test_failed_patch_keeps_the_progress_for_the_next_call(api):
    now = [100.0]
    reporter = ProgressReporter(api, "rl", "j", min_interval=5.0, clock=lambda: now[0])
    FakeApi.code = 500
    assert not reporter.update(9, 10, 0.9, force=True)
    assert not reporter.flush()
    FakeApi.code = 200
    assert reporter.flush()
    assert not reporter.flush()  # sent once: nothing pending any more
    steps = [
        (b["status"]["progress"]["step"], b["status"]["progress"]["rewardMean"]) for *_, b in FakeApi.seen
    ]
    assert steps == [(9, 0.9), (9, 0.9), (9, 0.9)] and reporter.sent == 1


def test_final_patch_is_retried_once(api):
    reporter = ProgressReporter(api, "rl", "j", min_interval=5.0, clock=lambda: 0.0)
    assert reporter.update(1, 10, 0.1) and not reporter.update(10, 10, 0.5)
    FakeApi.codes = [503]
    assert reporter.finish()
    assert [body["status"]["progress"]["step"] for *_, body in FakeApi.seen][-2:] == [10, 10]
    FakeApi.codes = [503, 503, 503]
    assert not reporter.update(11, 10, 0.6, force=True)
    assert not reporter.finish()  # one retry only: 3 attempts in all, then the run ends
    assert len(FakeApi.seen) == 6


def test_outside_a_pod(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(RuntimeError, match="not in a Kubernetes pod"):
        ApiTarget.in_cluster()


def _self_signed_ca(cn: str) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def test_in_cluster_reads_the_mounted_token_and_ca(tmp_path, monkeypatch):
    (tmp_path / "token").write_text("sa-token\n")
    (tmp_path / "ca.crt").write_bytes(_self_signed_ca("unit-test-ca"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    target = ApiTarget.in_cluster(sa_dir=str(tmp_path))
    assert target.base_url == "https://10.0.0.1:6443"
    assert target.token == "sa-token"
    subjects = [dict(x[0] for x in ca["subject"]) for ca in target.ssl_context.get_ca_certs()]
    assert {"commonName": "unit-test-ca"} in subjects


def test_a_rotated_service_account_token_is_used_for_the_next_patch(tmp_path, monkeypatch):
    """The kubelet rewrites the projected token before it expires; read once, reporting would stop
    being accepted after the first rotation of a long run."""
    (tmp_path / "ca.crt").write_bytes(_self_signed_ca("unit-test-ca"))
    (tmp_path / "token").write_text("first\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    target = ApiTarget.in_cluster(str(tmp_path))
    assert target.merge_patch("/x", {}).get_header("Authorization") == "Bearer first"
    (tmp_path / "token").write_text("rotated\n")
    assert target.merge_patch("/x", {}).get_header("Authorization") == "Bearer rotated"
