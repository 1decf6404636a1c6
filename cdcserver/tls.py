"""The listener's TLS context from `[tls]` (what mongod's net.tls options do)."""

from __future__ import annotations

import ssl

from cdcserver.config import TlsConfig


class TlsConfigError(ValueError):
    pass


def server_context(tls: TlsConfig) -> ssl.SSLContext | None:
    """An SSLContext for the wire listener, or None when TLS is off.

    TLS 1.2 at least (mongod 8.0 refuses 1.0/1.1 by default). With `ca_file`, client
    certificates are asked for and verified against it; `require_client_certificate`
    refuses clients without one (mongod's `allowConnectionsWithoutCertificates` false).
    """
    if not tls.enabled:
        return None
    if not tls.certificate_file:
        raise TlsConfigError("tls.certificate_file: required when tls.enabled is true")
    if tls.require_client_certificate and not tls.ca_file:
        raise TlsConfigError("tls.require_client_certificate: needs tls.ca_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls.certificate_file, tls.key_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"tls.certificate_file/key_file: {exc}") from None
    if tls.ca_file:
        try:
            context.load_verify_locations(cafile=tls.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(f"tls.ca_file: {exc}") from None
        context.verify_mode = (
            ssl.CERT_REQUIRED if tls.require_client_certificate else ssl.CERT_OPTIONAL
        )
    return context
