"""An L3 URL taken apart, with typed parameter getters whose errors name the URL and every
accepted form."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

from clairvoyant.core.logs import mask_url

ACCEPTED_FORMS = (
    "file:///ABSOLUTE/DIR[?max_gb=G]",
    "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB][?ttl_s=S&prefix=P]",
    "mooncake://MASTER_HOST[:PORT][?metadata=http://HOST:PORT/metadata&segment_mb=M&buffer_mb=M"
    "&protocol=tcp|rdma&rdma_devices=D&local_hostname=H]",
    "memory://[?capacity_pages=N]",
)


class L3Url:
    """``scheme://netloc/path?params`` of one L3 URL.  Each getter raises ValueError naming the
    URL (password masked) and the accepted forms; ``check_params`` rejects unknown parameters."""

    def __init__(self, text: str) -> None:
        self.text = text
        parts = urlsplit(text)
        self.scheme = parts.scheme.lower()
        self.path = parts.path
        self.netloc = parts.netloc
        self.hostname = parts.hostname or ""
        self.username = parts.username
        self.password = parts.password
        try:
            self.port = parts.port
        except ValueError:
            raise self.error(f"bad port in {parts.netloc!r}") from None
        self.params: dict[str, str] = {}
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name in self.params:
                raise self.error(f"parameter {name!r} is given twice")
            self.params[name] = value

    def error(self, why: str) -> ValueError:
        forms = "; ".join(ACCEPTED_FORMS)
        return ValueError(f"bad L3 URL {mask_url(self.text)!r}: {why} (accepted forms: {forms})")

    def check_params(self, *allowed: str) -> None:
        unknown = sorted(set(self.params) - set(allowed))
        if unknown:
            known = ", ".join(allowed) or "none"
            raise self.error(f"unknown parameter(s) {', '.join(unknown)}; {self.scheme}:// takes: {known}")

    def text_param(self, name: str, default: str) -> str:
        value = self.params.get(name, default)
        if not value:
            raise self.error(f"parameter {name!r} is empty")
        return value

    def number(self, name: str, default: float | None, *, minimum: float, exclusive: bool = False) -> float | None:
        """The parameter as a float >= ``minimum`` (> with ``exclusive``), ``default`` if absent."""
        if name not in self.params:
            return default
        raw = self.params[name]
        try:
            value = float(raw)
        except ValueError:
            raise self.error(f"parameter {name}={raw!r} is not a number") from None
        if value != value or value in (float("inf"), float("-inf")) or value < minimum \
                or (exclusive and value == minimum):
            bound = f"> {minimum:g}" if exclusive else f">= {minimum:g}"
            raise self.error(f"parameter {name}={raw!r} must be {bound}")
        return value

    def integer(self, name: str, default: int, *, minimum: int) -> int:
        raw = self.params.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise self.error(f"parameter {name}={raw!r} is not an integer") from None
        if value < minimum:
            raise self.error(f"parameter {name}={raw!r} must be >= {minimum}")
        return value
