"""Load WSDL and XSD documents for zeep without surprise network traffic.

zeep asks its transport for every document it meets (the WSDL, wsdl:import, xsd:import and
xsd:include). This transport answers in this order:

1. the standard schemas (SOAP 1.1/1.2 envelope and encoding, WS-Addressing, xml.xsd, WSDL,
   xmlmime) from the copies bundled in ``standard_schemas/``, never from the network;
2. documents handed in with the import (an uploaded WSDL and its companions, or the documents
   stored by an earlier import, which is how a restart re-imports offline; an empty one is a
   companion that was missing then, refused again without looking for it);
3. files, when the import names a file and the path lies under an allowed root;
4. http(s): the URL the import names and documents on the same origin (that is what asking to
   import a URL means), any other host only when the import sets ``allow_remote``.

Anything else is refused with ``DocumentRefused`` naming the location. Every document served
is recorded (``loaded``) so that the import can be stored and replayed without the network.
Imports of a standard namespace that omit ``schemaLocation`` (common in rpc/encoded WSDLs) get
one pointing at the bundled copy, so references such as ``soapenc:Array`` resolve.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx
from lxml import etree
from zeep.transports import Transport

from services.adapter.adapters.wsdl_repairs import repair_document

__all__ = ["STANDARD_NAMESPACES", "DocumentRefused", "OfflineTransport", "standard_schema"]

XSD_NS = "http://www.w3.org/2001/XMLSchema"
WSDL_NS = "http://schemas.xmlsoap.org/wsdl/"

# namespace -> bundled file
STANDARD_NAMESPACES: dict[str, str] = {
    "http://schemas.xmlsoap.org/soap/encoding/": "soap11_encoding.xsd",
    "http://schemas.xmlsoap.org/soap/envelope/": "soap11_envelope.xsd",
    "http://www.w3.org/2003/05/soap-encoding": "soap12_encoding.xsd",
    "http://www.w3.org/2003/05/soap-envelope": "soap12_envelope.xsd",
    "http://www.w3.org/XML/1998/namespace": "xml.xsd",
    "http://www.w3.org/2005/08/addressing": "ws_addressing_2005.xsd",
    "http://schemas.xmlsoap.org/ws/2004/08/addressing": "ws_addressing_2004.xsd",
    "http://schemas.xmlsoap.org/wsdl/": "wsdl11.xsd",
    "http://www.w3.org/2005/05/xmlmime": "xmlmime.xsd",
}
# Other published locations of the same schemas (normalised: no scheme, no trailing slash).
_ALIASES = {
    "www.w3.org/2001/xml.xsd": "xml.xsd",
    "www.w3.org/2009/01/xml.xsd": "xml.xsd",
    "www.w3.org/2005/08/addressing/ws-addr.xsd": "ws_addressing_2005.xsd",
    "www.w3.org/2006/03/addressing/ws-addr.xsd": "ws_addressing_2005.xsd",
    "schemas.xmlsoap.org/ws/2004/08/addressing/addressing.xsd": "ws_addressing_2004.xsd",
    "www.w3.org/2003/05/soap-envelope/soap-envelope.xsd": "soap12_envelope.xsd",
    "www.w3.org/2005/05/xmlmime/xmlmime.xsd": "xmlmime.xsd",
    "schemas.xmlsoap.org/wsdl/wsdl.xsd": "wsdl11.xsd",
}


def _normalise(url: str) -> str:
    parts = urlsplit(url)
    return (parts.netloc.lower() + parts.path).rstrip("/")


_BY_LOCATION = {_normalise(ns): name for ns, name in STANDARD_NAMESPACES.items()} | _ALIASES


class DocumentRefused(Exception):
    """A document the import may not or cannot load; `location` names it."""

    def __init__(self, location: str, reason: str, hint: str = "") -> None:
        super().__init__(f"{location}: {reason}")
        self.location, self.reason, self.hint = location, reason, hint


def standard_schema(location: str) -> bytes | None:
    """The bundled copy of a standard schema published at `location`, if it is one."""
    if urlsplit(location).scheme not in ("http", "https"):
        return None
    name = _BY_LOCATION.get(_normalise(location))
    if name is None:
        return None
    return (resources.files("services.adapter.adapters") / "standard_schemas" / name).read_bytes()


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme.replace("https", "http"), parts.netloc.lower()


def _prepare(content: bytes, notes: list[str]) -> bytes:
    """The repairs of `wsdl_repairs` (named in `notes`); then give location-less imports of standard
    namespaces a location, and import the standard namespaces a schema references without importing
    them. Unparseable content is returned as is: zeep reports the syntax error with its position."""
    try:
        root = etree.fromstring(content, etree.XMLParser(resolve_entities=False, no_network=True))
    except etree.XMLSyntaxError:
        return content
    repaired_root, repaired = repair_document(root, content)
    notes.extend(n for n in repaired if n not in notes)
    changed, root = bool(repaired) or repaired_root is not root, repaired_root
    for schema in root.iter(f"{{{XSD_NS}}}schema"):
        imported = {imp.get("namespace"): imp for imp in schema.findall(f"{{{XSD_NS}}}import")}
        wanted = set()
        for node in schema.iter():
            for attr in ("type", "base", "ref", "itemType", f"{{{WSDL_NS}}}arrayType"):
                value = node.get(attr) if isinstance(node.tag, str) else None
                if value and ":" in value:
                    namespace = node.nsmap.get(value.split(":", 1)[0])
                    if namespace in STANDARD_NAMESPACES:
                        wanted.add(namespace)
            if isinstance(node.tag, str) and any(name.startswith(f"{{{WSDL_NS}}}") for name in node.attrib):
                wanted.add(WSDL_NS)  # e.g. wsdl:arrayType on a soapenc:Array restriction
        target = schema.get("targetNamespace")
        for namespace in sorted(wanted - {target}):
            existing = imported.get(namespace)
            if existing is None:
                existing = etree.Element(f"{{{XSD_NS}}}import", namespace=namespace)
                schema.insert(0, existing)
            elif existing.get("schemaLocation"):
                continue
            existing.set("schemaLocation", namespace)
            changed = True
        for namespace, existing in imported.items():
            if namespace in STANDARD_NAMESPACES and not existing.get("schemaLocation"):
                existing.set("schemaLocation", namespace)
                changed = True
    return etree.tostring(root, xml_declaration=True, encoding="utf-8") if changed else content


class OfflineTransport(Transport):
    """A zeep transport for imports: bundled standards, given documents, allowed files and origins."""

    def __init__(self, *, documents: dict[str, bytes] | None = None, origin: str | None = None,
                 allow_remote: bool = False, file_roots: tuple[Path, ...] | None = (),
                 timeout: float = 30.0, stand_ins: dict[str, bytes] | None = None) -> None:
        super().__init__(timeout=timeout)
        self.documents = dict(documents or {})
        # Imports that cannot be read, answered with an empty document of the imported namespace so that
        # the rest of the WSDL loads; not recorded in `loaded` (what is stored is what was really read).
        self.stand_ins = dict(stand_ins or {})
        self.origin = _origin(origin) if origin and urlsplit(origin).scheme in ("http", "https") else None
        self.allow_remote = allow_remote
        self.file_roots = file_roots  # None: any file (operator configuration); () : none
        self.loaded: dict[str, bytes] = {}
        self.repairs: list[str] = []  # what wsdl_repairs changed, for the import's notes

    def load(self, url: str) -> bytes:
        if not url:
            raise DocumentRefused("(empty)", "an import names no location")
        bundled = standard_schema(url)
        if bundled is not None:
            return bundled
        if url in self.stand_ins:
            return self.stand_ins[url]
        content = self.documents.get(url)
        if content == b"":  # stored by an earlier import as missing: refused again, offline
            raise DocumentRefused(url, "was missing when the WSDL was imported",
                                  "import the WSDL again once the document is available")
        if content is None:
            content = self._fetch(url)
        self.loaded[url] = content
        return _prepare(content, self.repairs)

    def _fetch(self, url: str) -> bytes:
        scheme = urlsplit(url).scheme
        if scheme in ("http", "https"):
            if not self.allow_remote and _origin(url) != self.origin:
                raise DocumentRefused(url, "is on another host than the imported WSDL and remote fetches are off",
                                      "set options.allow_remote to fetch it, or upload it with the WSDL")
            try:
                response = httpx.get(url, timeout=self.load_timeout, follow_redirects=True)
            except httpx.HTTPError as exc:
                raise DocumentRefused(url, f"cannot be fetched: {exc.__class__.__name__}: {exc}",
                                      "check the URL and that the host is reachable from the adapter") from None
            if response.status_code >= 400:
                raise DocumentRefused(url, f"answered HTTP {response.status_code}", "check the URL")
            return response.content
        path = Path(unquote(urlsplit(url).path)) if scheme == "file" else Path(url)
        if self.file_roots is not None and not any(path.resolve().is_relative_to(r.resolve())
                                                   for r in self.file_roots):
            raise DocumentRefused(url, "is not among the documents of this import and files outside "
                                  "MNEMESH_ADAPTER_WSDL_DIR are not read",
                                  "upload it with the WSDL (CLI: import-wsdl --file bundles companions)")
        try:
            return path.read_bytes()
        except OSError as exc:
            raise DocumentRefused(url, f"cannot be read: {exc.strerror or exc}", "check the path") from None
