"""[protocol] What a host name in a network request means, before anything judges it (stdlib only).

The C library reads more spellings of an address than ``ipaddress`` does: ``inet_aton`` takes
``127.1``, ``0177.0.0.1``, ``0x7f000001`` and ``2130706433`` as 127.0.0.1, and Linux connects
``0.0.0.0`` and ``::`` to this machine, ``::ffff:127.0.0.1`` to IPv4 loopback. A judge that compares
the literal misses all of them, and a person asked about ``2130706433`` cannot know it is their own
machine. So every name is read here first, once, into what it means (``Target.host``: an address in
its standard form, ``localhost``, or the DNS name as given) and where that is (``Target.place``).
The allow list, the question, the grant and the connection all use the meaning.

A name that is neither an address nor a DNS name (spaces, control characters, ``_`` aside from
labels, more than 253 characters) is not a host at all: ``HostNameError``.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

THIS_MACHINE = "this machine"
PRIVATE = "a private address on your network"
LINK_LOCAL = "a link-local address on your network (where cloud metadata services answer)"
SHARED = "an address on your provider's shared network"
RESERVED = "a reserved address"
LOCALHOST = "localhost"

# A DNS name as resolvers take it: labels of letters, digits, '-' and '_' (SRV-style names), 1-63
# characters each, 253 in all. Anything else (a space, a NUL, an escape sequence) is refused.
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\Z")
_MAX_NAME = 253
# NAT64 prefixes (RFC 6052 well-known, RFC 8215 local use): the last 32 bits are an IPv4 address.
_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))
# SIIT's IPv4-translated form (RFC 2765) and the deprecated IPv4-compatible one (::a.b.c.d).
_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
_COMPATIBLE = ipaddress.IPv6Network("::/96")
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")
_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")


class HostNameError(ValueError):
    """The text is not a host name or address."""


@dataclass(frozen=True)
class Target:
    written: str  # as the code wrote it: lower case, no brackets, no trailing dot
    host: str  # what it means: an address in standard form, "localhost", or the DNS name
    place: str | None  # THIS_MACHINE, PRIVATE, ...; None: a public name or address

    @property
    def this_machine(self) -> bool:
        return self.place == THIS_MACHINE

    @property
    def numeric(self) -> bool:
        return _address(self.host) is not None

    @property
    def local(self) -> bool:
        """This machine or the person's network: each port there is a different program."""
        return self.place is not None

    def describe(self, port: int | None) -> str:
        """``127.0.0.1, this machine, written as 2130706433, port 5432``."""
        parts = [self.host]
        if self.place:
            parts.append(self.place)
        if self.written != self.host:
            parts.append(f"written as {self.written}")
        if port is not None:
            parts.append(f"port {port}")
        return ", ".join(parts)


def normalize(text: str) -> Target:
    """Read a host name (as a URL, ``CONNECT`` or ``socket.connect`` gives it) into what it means."""
    if not isinstance(text, str):
        raise HostNameError("a host name must be text")
    written = text.strip("[]").lower()
    if written.endswith(".") and not written.endswith(".."):
        written = written[:-1]
    if not written or len(written) > _MAX_NAME + 1:
        raise HostNameError("the host name is empty or longer than 253 characters")
    address = _address(written)
    if address is not None:
        return Target(written, str(address), _place(address))
    if not written.isascii():
        try:
            written = written.encode("idna").decode("ascii")
        except UnicodeError:
            raise HostNameError("the host name is not a valid international name") from None
    labels = written.split(".")
    if len(written) > _MAX_NAME or not all(_LABEL.match(label) for label in labels):
        raise HostNameError("the host name has characters no host name has")
    if labels[-1].isdigit():  # 256.1.1.1, 1.2.3.4.5: no DNS name ends in a number (RFC 3696)
        raise HostNameError("the host name looks like an address but is not one")
    if labels[-1] == LOCALHOST:  # RFC 6761: localhost and every name under it are this machine
        return Target(written, LOCALHOST, THIS_MACHINE)
    return Target(written, written, None)


def is_this_machine(text: str) -> bool:
    """Whether connecting to this name reaches this machine (loopback, unspecified, localhost)."""
    try:
        return normalize(text).this_machine
    except HostNameError:
        return False


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address this text spells, in every form the C library reads, IPv6 mapped forms unwrapped."""
    if ":" in text:
        try:
            v6 = ipaddress.IPv6Address(text.split("%", 1)[0])
        except ValueError:
            return None
        return _embedded_v4(v6) or v6
    return _inet_aton(text)


def _embedded_v4(v6: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if v6.ipv4_mapped is not None:
        return v6.ipv4_mapped
    if v6.sixtofour is not None:
        return v6.sixtofour
    for network in (*_NAT64, _TRANSLATED):
        if v6 in network:
            return ipaddress.IPv4Address(int(v6) & 0xFFFFFFFF)
    if v6 in _COMPATIBLE and int(v6) >> 24:  # ::a.b.c.d, a not 0 (::, ::1 and ::2 are IPv6's own)
        return ipaddress.IPv4Address(int(v6))
    return None


def _inet_aton(text: str) -> ipaddress.IPv4Address | None:
    """inet_aton(3)'s reading: 1-4 parts, each decimal, octal (leading 0) or hex (0x); the last part
    fills the bytes that are left (``127.1`` is 127.0.0.1, ``2130706433`` is one 32-bit number)."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values: list[int] = []
    for part in parts:
        value = _number(part)
        if value is None:
            return None
        values.append(value)
    *leading, last = values
    if any(v > 0xFF for v in leading) or last >= 1 << (8 * (4 - len(leading))):
        return None
    number = 0
    for v in leading:
        number = number << 8 | v
    return ipaddress.IPv4Address(number << (8 * (4 - len(leading))) | last)


def _number(part: str) -> int | None:
    if part[:2] in ("0x", "0X"):
        digits, base = part[2:], 16
        if digits == "":
            return 0  # glibc reads a bare "0x" as zero
    elif len(part) > 1 and part.startswith("0"):
        digits, base = part[1:], 8
    else:
        digits, base = part, 10
    if not digits or not all(c in "0123456789abcdef"[:base] for c in digits):
        return None
    return int(digits, base)


def _place(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if address.is_loopback or address.is_unspecified:
        return THIS_MACHINE
    if isinstance(address, ipaddress.IPv4Address) and address in _THIS_NETWORK:
        # "This network" (RFC 1122): Linux connects only 0.0.0.0 itself to this host, but no address
        # in it is anybody else's, so all of it is judged as this machine.
        return THIS_MACHINE
    if address.is_link_local:
        return LINK_LOCAL
    if isinstance(address, ipaddress.IPv4Address) and address in _SHARED:
        return SHARED
    if address.is_multicast or address.is_reserved:
        return RESERVED
    if address.is_private:
        return PRIVATE
    return None if address.is_global else RESERVED
