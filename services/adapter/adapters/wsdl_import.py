"""Load a WSDL with zeep (offline by default) and map every loading failure to a structured error."""

from __future__ import annotations

import hashlib
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from lxml import etree
from zeep import Settings
from zeep.exceptions import Error as ZeepError
from zeep.exceptions import LookupError as ZeepLookupError
from zeep.exceptions import XMLParseError, XMLSyntaxError
from zeep.wsdl import Document
from zeep.wsdl.bindings.soap import SoapBinding

from libs.errors import Unavailable, ValidationFailed
from services.adapter.adapters.wsdl_loader import DocumentRefused, OfflineTransport
from services.adapter.adapters.wsdl_missing import MissingImports, stand_in
from services.adapter.adapters.wsdl_repairs import drop_elements

__all__ = ["LoadedWsdl", "WsdlSource", "load_wsdl", "upload_location"]

XSD = "http://www.w3.org/2001/XMLSchema"
WSDL = "http://schemas.xmlsoap.org/wsdl/"
SOAP11 = "http://schemas.xmlsoap.org/wsdl/soap/"
SOAP12 = "http://schemas.xmlsoap.org/wsdl/soap12/"
_MAX_REPAIRS = 20


@dataclass(frozen=True)
class WsdlSource:
    """Exactly one of url, document, path; `documents` holds companions keyed by absolute location."""

    url: str = ""
    document: bytes = b""
    path: str = ""
    base_url: str = ""  # where an uploaded document lives, so relative imports resolve
    documents: dict[str, bytes] = field(default_factory=dict)

    def field_name(self) -> str:
        return "url" if self.url else "path" if self.path else "document"


@dataclass
class LoadedWsdl:
    document: Document
    location: str
    documents: dict[str, bytes]  # every document read, to store and re-import offline
    wsdl_hash: str
    warnings: list[str]
    missing: MissingImports = field(default_factory=MissingImports)  # companions that could not be read


def upload_location(backend_id: str) -> str:
    """Where an uploaded document without a base URL is said to live (relative imports resolve beside it)."""
    return f"file:///mnemesh-upload/{backend_id}/service.wsdl"


def _hash(documents: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for location in sorted(documents):
        digest.update(location.encode() + b"\0" + hashlib.sha256(documents[location]).digest())
    return digest.hexdigest()


def _missing_type(message: str) -> etree.QName | None:
    """zeep names the type only in its message: 'Unable to resolve type {ns}Name in ...'."""
    match = re.search(r"Unable to resolve type (\{[^}]*\}[^\s.]+|[^\s{}.]+)", message)
    return etree.QName(match.group(1)) if match else None


def _names(node, value: str, qname) -> bool:
    prefix, _, local = value.rpartition(":")
    return local == qname.localname and node.nsmap.get(prefix or None) == qname.namespace


def _untype(documents: dict[str, bytes], qname) -> dict[str, bytes]:
    """Copies of `documents` where references to the undefined type `qname` become the most general
    type: `type` attributes are removed (xs:anyType), extension and restriction bases become
    xs:anyType (complex content) or xs:anySimpleType (simple content and simple types)."""
    changed = {}
    for location, content in documents.items():
        try:
            root = etree.fromstring(content, etree.XMLParser(resolve_entities=False, no_network=True))
        except etree.XMLSyntaxError:
            continue
        hit = False
        for node in root.iter(f"{{{XSD}}}element", f"{{{XSD}}}attribute"):
            if _names(node, node.get("type") or "", qname):
                del node.attrib["type"]
                hit = True
        for node in root.iter(f"{{{XSD}}}extension", f"{{{XSD}}}restriction"):
            if _names(node, node.get("base") or "", qname):
                complex_ = node.getparent() is not None and node.getparent().tag == f"{{{XSD}}}complexContent"
                prefix = f"{node.prefix}:" if node.prefix else ""
                node.set("base", prefix + ("anyType" if complex_ else "anySimpleType"))
                hit = True
        if hit:
            changed[location] = etree.tostring(root, xml_declaration=True, encoding="utf-8")
    return changed


_UNDEFINED = re.compile(r"No definition '(\{[^}]*\}[^']+)' in '(port_types|messages)' found")
_REFERENCES = {  # what refers to an undefined definition, and may be left out without it
    "port_types": ((f"{{{WSDL}}}binding",), "type",
                   "binding(s) of portType {qname}, which no document defines, are left out with their ports"),
    "messages": ((f"{{{SOAP11}}}header", f"{{{SOAP12}}}header", f"{{{SOAP11}}}headerfault",
                  f"{{{SOAP12}}}headerfault"), "message",
                 "SOAP header message {qname} is defined in no document: the header is left out of the operations "
                 "that declare it"),
}


def _undefined_reference(message: str, documents: dict[str, bytes]) -> tuple[dict[str, bytes], str] | None:
    match = _UNDEFINED.search(message)
    if match is None:
        return None
    qname = etree.QName(match.group(1))
    tags, attribute, note = _REFERENCES[match.group(2)]
    changed = drop_elements(documents, tags, attribute, qname)
    return (changed, note.format(qname=qname.text)) if changed else None


def _load_error(exc: Exception, location: str, source: WsdlSource, field_name: str) -> Exception:
    if isinstance(exc, DocumentRefused):
        if exc.location == location and source.url and "cannot be fetched" in exc.reason:
            return Unavailable(f"the WSDL {exc.reason}", field=field_name, hint=exc.hint)
        what = "the WSDL" if exc.location == location else f"the import {exc.location}"
        return ValidationFailed(f"{what} {exc.reason}", field=field_name, hint=exc.hint)
    if isinstance(exc, (XMLSyntaxError, etree.XMLSyntaxError)):
        return ValidationFailed(f"a document is not well-formed XML: {getattr(exc, 'message', exc)}",
                                field=field_name, hint="check that the URL or file really holds a WSDL")
    if isinstance(exc, XMLParseError):
        where = f" ({exc.filename}, line {exc.sourceline})" if exc.filename else ""
        return ValidationFailed(f"the WSDL or one of its schemas is invalid{where}: {exc.message}",
                                field=field_name, hint="fix the document; the adapter names the first problem")
    if isinstance(exc, ZeepError):
        return ValidationFailed(f"the WSDL cannot be loaded: {exc.__class__.__name__}: {exc}", field=field_name,
                                hint="check the document and its imports")
    if isinstance(exc, (KeyError, AttributeError, IndexError, TypeError, ValueError)):
        # zeep trips on some malformed documents with plain Python errors; say so instead of a 500.
        return ValidationFailed(f"the WSDL cannot be loaded: {exc.__class__.__name__}: {exc}", field=field_name,
                                hint="is it a WSDL 1.1 document? (WSDL 2.0 is not supported)")
    return exc


def load_wsdl(source: WsdlSource, backend_id: str, *, allow_remote: bool = False,
              file_roots: tuple[Path, ...] | None = (), timeout: float = 30.0) -> LoadedWsdl:
    """Blocking (zeep parses synchronously): run it in a worker thread."""
    given = [bool(source.url), bool(source.document), bool(source.path)]
    if sum(given) != 1:
        raise ValidationFailed("give exactly one of url, document or path", field="source",
                               hint="url: fetched by the adapter; document: the WSDL text; path: a file on the adapter")
    documents = dict(source.documents)
    if source.url:
        if urlsplit(source.url).scheme not in ("http", "https", "file"):
            raise ValidationFailed(f"{source.url!r} is not an http(s) or file URL", field="url")
        location = source.url
    elif source.path:
        location = Path(source.path).resolve().as_uri()
    else:
        location = source.base_url or upload_location(backend_id)
        documents[location] = source.document
    settings = Settings(strict=True, xml_huge_tree=False, forbid_dtd=True, forbid_entities=True)
    field_name = source.field_name()
    repairs: list[str] = []
    missing, stand_ins, originals, refused = MissingImports(), {}, {}, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(_MAX_REPAIRS):
            transport = OfflineTransport(documents=documents, origin=location, allow_remote=allow_remote,
                                         file_roots=file_roots, timeout=timeout, stand_ins=stand_ins)
            try:
                document = Document(location, transport, settings=settings)
                break
            except DocumentRefused as exc:
                # A companion that cannot be read must not sink the operations that never use it.
                found = stand_in(transport.loaded, exc.location) if exc.location != location else None
                if found is None or exc.location in stand_ins:
                    raise _load_error(exc, location, source, field_name) from None
                refused = refused or exc
                stand_ins[exc.location], namespace = found
                missing.add(exc.location, namespace, exc.reason, exc.hint)
                for url, content in transport.loaded.items():
                    originals.setdefault(url, content)
                documents.update(transport.loaded)
            except ZeepLookupError as exc:
                # One undefined type must not sink every operation: elements typed with it become
                # untyped (any value), and the import says so by name.
                qname = exc.qname or _missing_type(str(exc))
                changed = _untype(transport.loaded, qname) if qname is not None else {}
                if not changed:
                    raise _load_error(exc, location, source, field_name) from None
                for url, content in transport.loaded.items():
                    originals.setdefault(url, content)
                documents.update(transport.loaded)
                documents.update(changed)
                repairs.append(f"type {qname} is defined in no loaded schema; what uses it accepts any value")
            except IndexError as exc:
                # A binding of an undefined portType, or a SOAP header of an undefined message, sinks
                # the whole document in zeep: leave that binding (or header) out, say so, and go on.
                repair = _undefined_reference(str(exc), transport.loaded)
                if repair is None:
                    raise _load_error(exc, location, source, field_name) from None
                changed, note = repair
                for url, content in transport.loaded.items():
                    originals.setdefault(url, content)
                documents.update(transport.loaded)
                documents.update(changed)
                repairs.append(note)
            except Exception as exc:  # noqa: BLE001 - mapped by _load_error, which re-raises what it does not know
                raise _load_error(exc, location, source, field_name) from None
        else:
            raise ValidationFailed(f"the WSDL references more than {_MAX_REPAIRS} undefined types or definitions",
                                   field=field_name, hint="import the schemas and documents that define them")
    notes = list(dict.fromkeys(missing.notes() + transport.repairs + repairs + [str(w.message) for w in caught]))
    # What is stored is what was read (repairs are made again at each load), so that a restart finds
    # the same problems and names them the same way.
    loaded = {url: originals.get(url, content) for url, content in transport.loaded.items()}
    # Missing companions are stored empty, so a restart (offline) finds them missing without fetching.
    loaded.update({url: b"" for url in missing.documents if url not in loaded})
    if not any(document.services.values()) and not any(isinstance(b, SoapBinding)
                                                       for b in document.bindings.values()):
        if refused is not None:  # nothing to call without it: the missing document is the problem to name
            raise _load_error(refused, location, source, field_name)
        raise ValidationFailed("the WSDL declares no service (wsdl:service) and no SOAP binding, so there is "
                               "nothing to call", field=field_name,
                               hint="import the WSDL that holds the binding, service and port definitions")
    if missing.documents:
        missing.trace(loaded)  # as read: before undefined types were loosened to "any value"
    return LoadedWsdl(document, location, loaded, _hash(loaded), notes, missing)
