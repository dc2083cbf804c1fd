"""Throw-away X.509 material for TLS tests: a CA and the certificates it signs, made with the
`openssl` command line in a temporary folder (nothing is checked in, nothing outlives the run).

Keys are P-256 and unencrypted PKCS#8, which Python's ssl module and Kafka's PEM key stores
(`ssl.keystore.type=PEM`) both read.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

_KEY_ARGS = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


class CertificateError(RuntimeError):
    pass


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60)
    if result.returncode != 0:
        raise CertificateError(f"openssl {' '.join(args)} failed:\n{result.stderr}")


@dataclass(frozen=True)
class IssuedCertificate:
    cert: Path  # the leaf certificate, PEM
    key: Path  # its private key, PEM PKCS#8
    # Key then certificate in one file: what Kafka's PEM key store reads.
    key_and_cert: Path


@dataclass(frozen=True)
class CertificateAuthority:
    directory: Path
    cert: Path
    key: Path

    @classmethod
    def create(cls, directory: Path, name: str = "kqp test CA", days: int = 2) -> CertificateAuthority:
        directory.mkdir(parents=True, exist_ok=True)
        stem = name.replace(" ", "-")
        cert, key = directory / f"{stem}.pem", directory / f"{stem}.key"
        _openssl("req", "-x509", *_KEY_ARGS, "-keyout", str(key), "-out", str(cert), "-days", str(days),
                 "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)
        return cls(directory, cert, key)

    def issue(self, name: str, subject: str, san: str = "DNS:localhost,IP:127.0.0.1",
              days: int = 2) -> IssuedCertificate:
        """A certificate for both server and client use; `subject` in openssl's /K=V/... form."""
        key, csr, cert = (self.directory / f"{name}.{suffix}" for suffix in ("key", "csr", "pem"))
        extensions = self.directory / f"{name}.ext"
        extensions.write_text(
            "basicConstraints=CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth,clientAuth\n"
            f"subjectAltName={san}\n"
        )
        _openssl("req", "-new", *_KEY_ARGS, "-keyout", str(key), "-out", str(csr), "-subj", subject,
                 "-utf8", cwd=self.directory)
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey", str(self.key),
                 "-CAcreateserial", "-out", str(cert), "-days", str(days), "-extfile", str(extensions),
                 cwd=self.directory)
        bundle = self.directory / f"{name}.keystore.pem"
        bundle.write_text(key.read_text() + cert.read_text())
        return IssuedCertificate(cert, key, bundle)


@dataclass(frozen=True)
class SslMaterial:
    """What a broker needs for an SSL listener: its certificate and the CA it trusts."""

    ca: CertificateAuthority
    broker: IssuedCertificate
    # Require client certificates on the broker's SSL listener (mTLS).
    client_auth: bool = False

    @classmethod
    def create(cls, directory: Path, client_auth: bool = False) -> SslMaterial:
        ca = CertificateAuthority.create(directory)
        return cls(ca, ca.issue("broker", "/CN=localhost/OU=brokers/O=kqp"), client_auth)
