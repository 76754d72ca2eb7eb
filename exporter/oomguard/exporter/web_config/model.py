"""The web configuration file's model: the Prometheus exporter toolkit's format, the keys oomguard serves.

One file can serve node_exporter and oomguard. A key the toolkit knows but oomguard cannot
honour faithfully is refused by name rather than ignored: ignoring a security setting would
serve with less protection than the file asks for. Relative paths are read from the file's
folder, as the toolkit does.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator

from oomguard.common import bounded_yaml
from oomguard.exporter.config import ConfigError, StrictModel, explain

ClientAuthType = Literal[
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "RequireClientCert",  # the toolkit's older name of RequireAnyClientCert
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
]
TlsVersionName = Literal["TLS10", "TLS11", "TLS12", "TLS13"]
TLS_VERSION_ORDER: tuple[str, ...] = ("TLS10", "TLS11", "TLS12", "TLS13")

# The toolkit lets users set only these headers, and these values where it lists some.
ALLOWED_HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}

# bcrypt's modular crypt format: $2a$, $2b$ or $2y$, a two-digit cost, 22 characters of salt, 31 of hash.
_BCRYPT_HASH = re.compile(r"\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}")

# Keys of the toolkit's format oomguard refuses, and why (the error says it).
_NOT_SERVED = {
    "tls_server_config.cert": "inline PEM is not read; put the certificate in cert_file",
    "tls_server_config.key": "inline PEM is not read; put the key in key_file",
    "tls_server_config.client_ca": "inline PEM is not read; put the CA certificates in client_ca_file",
    "tls_server_config.cipher_suites": "Go's cipher suite names have no exact OpenSSL equivalent; remove it "
    "(OpenSSL's defaults apply, and TLS 1.3's suites are not configurable in either)",
    "tls_server_config.curve_preferences": "Python's ssl cannot set a list of curves; remove it",
    "tls_server_config.client_allowed_sans": "not implemented: restrict clients with client_ca_file "
    "(a CA that signs only the clients allowed)",
}

# The file is a few hundred bytes; a bound keeps a huge or endless file (/dev/zero) from filling memory.
MAX_FILE_BYTES = 1 << 20
# bcrypt doubles its work per cost step: cost 10 took 125 ms, 14 1.5 s on a shared test core, 31 days. Above 14
# one check holds a core for seconds (every wrong guess costs as much), so such a hash is refused at load.
MAX_BCRYPT_COST = 14
# Go's time.Duration text, as the toolkit reads rate_limit.interval: "1s", "250ms", "1m30s".
_GO_DURATION = re.compile(r"(?:(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class TlsServerConfig(StrictModel):
    cert_file: str | None = Field(None, description="Server certificate (PEM), with its chain.")
    key_file: str | None = Field(None, description="The certificate's private key (PEM, unencrypted).")
    client_ca_file: str | None = Field(None, description="CA certificates that client certificates must chain to.")
    client_auth_type: ClientAuthType | None = Field(None, description="Client certificate policy (Go's names).")
    min_version: TlsVersionName = "TLS12"
    max_version: TlsVersionName = "TLS13"
    prefer_server_cipher_suites: bool = True
    # Declared so that the error can say why they are refused (_NOT_SERVED), not "unknown key".
    cert: Any = None
    key: Any = None
    client_ca: Any = None
    cipher_suites: Any = None
    curve_preferences: Any = None
    client_allowed_sans: Any = None

    @property
    def enabled(self) -> bool:
        """TLS is served when any of these is set; a block with only versions stays plain HTTP, as in the toolkit."""
        return any(v is not None for v in (self.cert_file, self.key_file, self.client_ca_file, self.client_auth_type))


class HttpServerConfig(StrictModel):
    # aiohttp speaks HTTP/1.1 only: http2 is read so the file is shared, and has no effect.
    http2: bool = True
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _allowed(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if name not in ALLOWED_HEADERS:
                close = difflib.get_close_matches(name, list(ALLOWED_HEADERS), n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ValueError(
                    f"header {name!r} cannot be set (the exporter toolkit refuses it too); {hint}"
                    f"allowed: {', '.join(ALLOWED_HEADERS)}"
                )
            allowed = ALLOWED_HEADERS[name]
            if allowed and value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
            if any(ord(c) < 0x20 or c == "\x7f" for c in value):
                raise ValueError(f"{name}'s value holds a control character (a line break would split the response)")
        return headers


def go_duration_seconds(text: str) -> float:
    """Seconds of a Go duration ("1s", "1m30s"; "0" is zero); ValueError names the format."""
    if text.strip() == "0":
        return 0.0
    if not _GO_DURATION.fullmatch(text.strip()):
        raise ValueError(f"{text!r} is not a duration; write it as Go does: 1s, 250ms, 1m30s")
    return sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _DURATION_PART.findall(text.strip()))


class RateLimit(StrictModel):
    """The toolkit's `rate_limit`: one token bucket for the whole listener, a token every `interval`."""

    interval: str = Field("0", description="A token every INTERVAL (a Go duration); 0 turns the limit off.")
    burst: int = Field(0, ge=0, description="Tokens the bucket holds: requests allowed at once.")

    @field_validator("interval", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> str:
        text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
        if text is None:
            raise ValueError("must be a duration such as 1s or 250ms")
        go_duration_seconds(text)
        return text

    @property
    def interval_seconds(self) -> float:
        return go_duration_seconds(self.interval)


class WebConfigFile(StrictModel):
    tls_server_config: TlsServerConfig | None = None
    http_server_config: HttpServerConfig | None = None
    # Values are secrets: checked after validation, by messages that never print them.
    basic_auth_users: dict[str, str] | None = None
    rate_limit: RateLimit | None = None


def bcrypt_cost(hashed: str) -> int | None:
    """The cost of a bcrypt hash, or None when `hashed` is not one."""
    match = _BCRYPT_HASH.fullmatch(hashed)
    cost = int(match.group(1)) if match else None
    return cost if cost is not None and 4 <= cost <= 31 else None


def resolve(base: Path, name: str) -> Path:
    path = Path(name).expanduser()
    return path if path.is_absolute() else base / path


def read_regular(path: Path, what: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """A regular file's bytes, at most `limit`. Opened non-blocking and checked with fstat, so a FIFO,
    a device or a socket at the path is an error at once instead of a read that never returns."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{path}: the {what} is not a regular file (a FIFO, device or socket?); point at a file")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise ConfigError(f"{path}: the {what} is over {limit} bytes; is it the right file?")
    return b"".join(chunks)


def read_yaml(path: Path) -> dict[str, Any]:
    """The file's top-level mapping; every failure, whatever the bytes, is a ConfigError (never another exception)."""
    raw = read_regular(path, "web configuration file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 (byte {exc.start} is {raw[exc.start]:#04x}); save it as UTF-8") from None
    try:
        loaded = bounded_yaml.load(text)
    except bounded_yaml.YamlRefused as exc:
        raise ConfigError(f"{path}: the web configuration file is refused: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML: nested too deep") from None
    except Exception as exc:  # a parser bug on hostile bytes must not escape a reload
        raise ConfigError(f"{path}: cannot be read as YAML: {type(exc).__name__}: {exc}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping (keys such as tls_server_config:, basic_auth_users:)"
        )
    return loaded


def parse(path: Path) -> WebConfigFile:
    """Read and check `path`; a ConfigError names the file, the key and the fix."""
    try:
        model = WebConfigFile.model_validate(read_yaml(path))
    except ValidationError as exc:
        raise ConfigError(explain(exc, str(path), WebConfigFile, what="web configuration")) from None
    except RecursionError:
        raise ConfigError(f"{path}: the web configuration is nested too deep") from None
    problems = _problems(model)
    if problems:
        raise ConfigError("\n".join([f"{path}: the web configuration is not valid:", *(f"  {p}" for p in problems)]))
    return model


def _problems(model: WebConfigFile) -> list[str]:
    out: list[str] = []
    tls = model.tls_server_config
    set_keys = {f"tls_server_config.{k}" for k in (tls.model_fields_set if tls else ())}
    out += [f"{key}: known to the exporter toolkit, not served by oomguard: {why}"
            for key, why in _NOT_SERVED.items() if key in set_keys]  # fmt: skip
    if tls is not None and tls.enabled:
        if not tls.cert_file:
            out.append("tls_server_config.cert_file: missing; TLS needs the server's certificate")
        if not tls.key_file:
            out.append("tls_server_config.key_file: missing; TLS needs the certificate's key")
        if tls.client_ca_file and tls.client_auth_type in (None, "NoClientCert"):
            out.append(
                "tls_server_config.client_ca_file: set, but client_auth_type is NoClientCert, so no client "
                "certificate is asked for; set client_auth_type: RequireAndVerifyClientCert "
                "(the toolkit refuses this too)"
            )
    if tls is not None and TLS_VERSION_ORDER.index(tls.min_version) > TLS_VERSION_ORDER.index(tls.max_version):
        out.append(f"tls_server_config.min_version: {tls.min_version} is above max_version {tls.max_version}")
    for user, hashed in (model.basic_auth_users or {}).items():
        if ":" in user:
            out.append(f"basic_auth_users.{user}: a user name cannot hold ':' (basic auth splits on it)")
        cost = bcrypt_cost(hashed)
        if cost is None:
            out.append(
                f"basic_auth_users.{user}: not a bcrypt hash ($2y$, $2b$ or $2a$, cost 4-31; value not shown); "
                "make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n'"
            )
        elif cost > MAX_BCRYPT_COST:
            out.append(
                f"basic_auth_users.{user}: bcrypt cost {cost} is above {MAX_BCRYPT_COST} (each check would take "
                f"seconds, each wrong guess too); make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n'"
            )
    limit = model.rate_limit
    if limit is not None and limit.interval_seconds > 0 and limit.burst < 1:
        out.append("rate_limit.burst: 0 would refuse every request; set burst: 1 or more (or interval: 0 for no limit)")
    return out
