"""TLS for the worker's own server: a given certificate, or a self-signed one for this machine.

Browsers give the microphone only to secure contexts, so a phone on the LAN needs
HTTPS. ``--tls-self-signed`` makes an ECDSA P-256 certificate naming every address of
this machine (kept and reused while it is valid and still names them all), and says
what the phone will show and which fingerprint to compare.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

VALIDITY = datetime.timedelta(days=30)
#: A certificate this close to expiry is replaced.
RENEW_BEFORE = datetime.timedelta(days=1)


@dataclass(frozen=True)
class ServerCertificate:
    cert_path: Path
    key_path: Path
    self_signed: bool = False

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_path, self.key_path)
        return context

    def fingerprint_sha256(self) -> str:
        """The certificate's SHA-256 fingerprint as browsers show it (AA:BB:...)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes

        cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
        return ":".join(f"{b:02X}" for b in cert.fingerprint(hashes.SHA256()))

    def spki_sha256_base64(self) -> str:
        """Base64 SHA-256 of the public key (what Chromium's --ignore-certificate-errors-spki-list takes)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization

        cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
        spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                              serialization.PublicFormat.SubjectPublicKeyInfo)
        digest = hashes.Hash(hashes.SHA256())
        digest.update(spki)
        return base64.b64encode(digest.finalize()).decode("ascii")

    def names(self) -> list[str]:
        from cryptography import x509

        cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return [str(v) for v in alt.get_values_for_type(x509.IPAddress)] + alt.get_values_for_type(x509.DNSName)


def machine_addresses() -> list[str]:
    """Every IP address of this machine's interfaces (loopback included), IPv4 first."""
    import ifaddr

    found: list[str] = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            text = ip.ip if isinstance(ip.ip, str) else ip.ip[0]
            address = ipaddress.ip_address(text.split("%")[0])
            if not address.is_link_local and str(address) not in found:
                found.append(str(address))
    return sorted(found, key=lambda a: (":" in a, a))


def default_tls_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "duplex-agent" / "tls"


def self_signed_certificate(directory: Path, addresses: list[str] | None = None) -> tuple[ServerCertificate, bool]:
    """The certificate in ``directory`` if it still fits, else a new one; (certificate, made_now)."""
    addresses = machine_addresses() if addresses is None else addresses
    hostnames = sorted({"localhost", socket.gethostname()})
    existing = ServerCertificate(directory / "cert.pem", directory / "key.pem", self_signed=True)
    if _still_fits(existing, set(addresses) | set(hostnames)):
        return existing, False
    _write_self_signed(existing, addresses, hostnames)
    return existing, True


def _still_fits(certificate: ServerCertificate, names: set[str]) -> bool:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(certificate.cert_path.read_bytes())
        if not certificate.key_path.is_file():
            return False
        covered = set(certificate.names())
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    return left > RENEW_BEFORE and names <= covered


def _write_self_signed(certificate: ServerCertificate, addresses: list[str], hostnames: list[str]) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"duplex-agent on {socket.gethostname()}")])
    now = datetime.datetime.now(datetime.UTC)
    alt_names = [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses] + [x509.DNSName(h) for h in hostnames]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    certificate.cert_path.parent.mkdir(parents=True, exist_ok=True)
    key_bytes = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())
    fd = os.open(certificate.key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key_bytes)
    certificate.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def what_the_phone_shows(certificate: ServerCertificate, urls: list[str]) -> str:
    """The lines ``serve --tls-self-signed`` prints for the person holding the phone."""
    lines = [
        "duplex-agent: self-signed certificate " + str(certificate.cert_path),
        "  SHA-256 fingerprint: " + certificate.fingerprint_sha256(),
        "  open on the phone: " + "  ".join(urls),
        "  The phone will warn first: Chrome says \"Your connection is not private\" (NET::ERR_CERT_AUTHORITY_INVALID),",
        "  Safari says \"This Connection Is Not Private\". Compare the fingerprint above with the one in the",
        "  certificate's details, then continue (Chrome: Advanced > Proceed; Safari: Show Details > visit this website).",
    ]
    return "\n".join(lines)


def server_certificate(tls_cert: str, tls_key: str, self_signed: bool, tls_dir: str) -> tuple[ServerCertificate, bool]:
    """The certificate the settings ask for; (certificate, made_now)."""
    if tls_cert:
        if not tls_key:
            raise ValueError("--tls-cert needs --tls-key (the certificate's private key)")
        return ServerCertificate(Path(tls_cert), Path(tls_key)), False
    if not self_signed:
        raise ValueError("no certificate configured")
    return self_signed_certificate(Path(tls_dir) if tls_dir else default_tls_dir())
