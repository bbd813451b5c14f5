"""What a cluster exposes: local clusters listen on 127.0.0.1 only, and attaching to a scheduler
speaks TLS with the profile's certificates or dask's, or fails with a message (exit 2)."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import xarray as xr

from pipeline.exec.cluster import load_profile, open_cluster

from .cluster_runs import FLOW, cli, expected_anomaly



def _listening(pids: set[int]) -> set[tuple[int, str, int]]:
    return {(c.pid, c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.pid in pids}


def _family(process: psutil.Process) -> set[int]:
    return {process.pid} | {p.pid for p in process.children(recursive=True)}


def _host_addresses() -> list[str]:
    return [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback]


def test_a_local_cluster_listens_on_loopback_only():
    """The local-cpu profile once served its dashboard on 0.0.0.0: anyone reaching the machine
    could see it and run code through it. Every socket its scheduler, nannies, workers and
    dashboard listen on is 127.0.0.1's, and the dashboard does not answer on the host's address."""
    import urllib.parse
    import urllib.request

    me = psutil.Process()
    before = _listening(_family(me))
    with open_cluster(load_profile("local-cpu")) as client:
        opened = _listening(_family(me)) - before
        assert client.submit(lambda: 6 * 7).result() == 42
        link = urllib.parse.urlsplit(client.dashboard_link)
        assert link.hostname == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{link.port}/health", timeout=10) as answer:
            assert answer.status == 200
        for host in _host_addresses():
            with pytest.raises(OSError):
                socket.create_connection((host, link.port), timeout=2).close()
    assert (me.pid, "127.0.0.1", link.port) in opened
    assert {pid for pid, _, _ in opened} - {me.pid}, f"no worker process listened: {opened}"
    assert {ip for _, ip, _ in opened} == {"127.0.0.1"}, opened


# --- TLS -----------------------------------------------------------------------------------------


def _certificates(directory: Path, ca_name: str = "pipeline test CA") -> dict[str, str]:
    """A CA, and a server and a client certificate it signed (for 127.0.0.1 and localhost), as PEM
    files in ``directory``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    name = lambda cn: x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])  # noqa: E731

    def write(stem, key, cert):
        (directory / f"{stem}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        (directory / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name(ca_name)).issuer_name(name(ca_name))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    write("ca", ca_key, ca)
    for role in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(f"pipeline test {role}")).issuer_name(ca.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        write(role, key, cert)
    return {"ca": str(directory / "ca.pem"), **{f"{r}_{k}": str(directory / f"{r}.{ext}")
                                               for r in ("server", "client") for k, ext in (("cert", "pem"), ("key", "key"))}}


def _wait_for_file(path: Path, procs, seconds: float = 60) -> None:
    deadline = time.time() + seconds
    while not path.exists():
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args} exited with {p.returncode}")
        if time.time() > deadline:
            raise TimeoutError(f"{path} did not appear in {seconds} s")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def tls_scheduler(tmp_path_factory):
    """A real ``dask scheduler`` and one ``dask worker`` speaking TLS on 127.0.0.1, as subprocesses;
    yields the scheduler file, its address and the certificates."""
    from distributed import Client
    from distributed.security import Security

    root = tmp_path_factory.mktemp("tls")
    certs = _certificates(root / "certs")
    tls = ["--tls-ca-file", certs["ca"], "--tls-cert", certs["server_cert"], "--tls-key", certs["server_key"]]
    scheduler_file = root / "scheduler.json"
    env = {**os.environ, "DASK_PIPELINE__BACKEND": "cpu"}
    log = open(root / "dask.log", "w")  # noqa: SIM115 (closed below); a pipe could fill and block them
    procs = [subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--protocol", "tls", "--host", "127.0.0.1",
                               "--port", "0", "--no-dashboard", "--scheduler-file", scheduler_file, *tls],
                              env=env, cwd=root, stdout=log, stderr=log)]
    try:
        _wait_for_file(scheduler_file, procs)
        time.sleep(0.2)  # the file is written in one go, but give the writer its close
        procs.append(subprocess.Popen([sys.executable, "-m", "dask", "worker", "--scheduler-file", scheduler_file,
                                       "--host", "127.0.0.1", "--nthreads", "2", "--no-dashboard", *tls],
                                      env=env, cwd=root, stdout=log, stderr=log))
        address = json.loads(scheduler_file.read_text())["address"]
        assert address.startswith("tls://127.0.0.1:")
        security = Security(tls_ca_file=certs["ca"], tls_client_cert=certs["client_cert"],
                            tls_client_key=certs["client_key"], require_encryption=True)
        with Client(address, security=security, timeout=30) as client:
            client.wait_for_workers(1, timeout=60)
        yield {"file": scheduler_file, "address": address, **certs}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    r = cli("demo", "small.zarr", "--size", "1MB", "--seed", "5", cwd=root)
    assert r.returncode == 0, r.stderr
    return root / "small.zarr"


def test_a_flow_runs_through_a_tls_scheduler_with_the_profiles_certificates(tmp_path, tls_scheduler, small_store):
    profile = tmp_path / "tls.yaml"
    profile.write_text(f"kind: scheduler\nscheduler_file: {tls_scheduler['file']}\n"
                       f"tls_ca_file: {tls_scheduler['ca']}\ntls_client_cert: {tls_scheduler['client_cert']}\n"
                       f"tls_client_key: {tls_scheduler['client_key']}\n")
    r = cli("run", FLOW, "--cluster", profile, "--input", small_store, "--output", "out/tls.zarr", "--report", "rep.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "rep.json").read_text())
    assert report["cluster"]["scheduler"] == tls_scheduler["address"] and report["cluster"]["workers"] == 1
    got = xr.open_zarr(tmp_path / "out" / "tls.zarr")["weighted_mean"].values
    np.testing.assert_allclose(got, expected_anomaly(small_store), rtol=1e-5, atol=1e-6)


def test_scheduler_option_takes_the_certificates_of_dasks_config(tmp_path, tls_scheduler, small_store):
    env = {"DASK_DISTRIBUTED__COMM__TLS__CA_FILE": tls_scheduler["ca"],
           "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": tls_scheduler["client_cert"],
           "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": tls_scheduler["client_key"]}
    r = cli("run", FLOW, "--scheduler", tls_scheduler["address"], "--input", small_store, "--output", "out/cfg.zarr", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    got = xr.open_zarr(tmp_path / "out" / "cfg.zarr")["weighted_mean"].values
    np.testing.assert_allclose(got, expected_anomaly(small_store), rtol=1e-5, atol=1e-6)


def test_a_tls_scheduler_without_the_certificates_exits_2_naming_the_address(tmp_path, tls_scheduler, small_store):
    address = tls_scheduler["address"]
    # none at all: refused before connecting, naming the settings to give
    r = cli("run", FLOW, "--scheduler", address, "--input", small_store, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert address in r.stderr and "tls_ca_file" in r.stderr and "distributed.comm.tls.ca-file" in r.stderr
    assert "Traceback" not in r.stderr
    # a certificate the scheduler does not trust (another CA signed it): the handshake fails until the timeout
    other = _certificates(tmp_path / "other", ca_name="another CA")
    profile = tmp_path / "untrusted.yaml"
    profile.write_text(f"kind: scheduler\naddress: {address}\ntimeout: 2s\ntls_ca_file: {tls_scheduler['ca']}\n"
                       f"tls_client_cert: {other['client_cert']}\ntls_client_key: {other['client_key']}\n")
    start = time.monotonic()
    r = cli("run", FLOW, "--cluster", profile, "--input", small_store, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert time.monotonic() - start < 30
    assert f"no dask scheduler answered at {address} within 2 s" in r.stderr and "trusts this certificate" in r.stderr
    assert "Traceback" not in r.stderr
    # a certificate file that is not there: named with its key
    profile.write_text(f"kind: scheduler\naddress: {address}\ntls_ca_file: {tmp_path / 'nowhere.pem'}\n"
                       f"tls_client_cert: {other['client_cert']}\n")
    r = cli("run", FLOW, "--cluster", profile, "--input", small_store, cwd=tmp_path)
    assert r.returncode == 2 and f"tls_ca_file: {tmp_path / 'nowhere.pem'}: no such file" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


